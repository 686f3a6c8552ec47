"""The atlas's reader of `headspec sae`'s tables (sae/*.csv; docs/sae.md): the per-head numbers as metrics, and
on each head's card the strongest live features it carries, with their contexts and label profiles, linked to
their feature pages (`feature_page`; headspec/atlas/features.py writes them from the same tables).
"""

from __future__ import annotations

import collections

from headspec.atlas.grid import RunData, feature_heads, num
from headspec.io import filenames, tables

# The SAE tables the cards read beside sae/heads.csv and features.csv (run-level or per feature).
SAE_AUX_TABLES = (tables.SAE_METRICS, tables.SAE_CONTEXTS, tables.SAE_LABELS, tables.SAE_HISTOGRAMS, tables.SAE_SHARES,
                  tables.SAE_LOGITS)  # fmt: skip
SAE_LABEL_SETS = ("upos", "deprel", "head_distance")  # sae/features.csv's label columns (headspec/sae/labels.py)
TOP_FEATURES = 5  # SAE features per head and SAE on its card
TOP_CONTEXTS = 3  # ... each with its highest-activating contexts
TOP_LABELS = 3  # ... and its most frequent labels per label set
MORE_FEATURES = 20  # links to the head's further carried features, after the TOP_FEATURES
FEATURE_PAGES = "atlas_features"  # RUN/atlas_features/<SAE>/f<feature>.html (headspec/atlas/features.py)
_SAE_METRICS = {  # sae/heads.csv metric -> (label, description); docs/sae.md has the formulas
  "features_carried": (
    "features carried",
    "Live SAE features the head carries: its decoder-norm share a_fh ≥ analysis.carry_min",
  ),
  "exclusive_features": (
    "exclusive features",
    "Live SAE features exclusive to the head: a_fh ≥ analysis.exclusive_min",
  ),
  "specialization": (
    "feature specialization S_h",
    "Feature specialization S_h = Σ_f a_fh² / Σ_f a_fh over the live features: the share a_fh of the head's average feature (1: every feature it writes is its alone; 1/H: spread evenly)",
  ),
  "mean_entropy_bits": (
    "mean head entropy of its features (bits)",
    "Mean head-attribution entropy H_f (bits) of the features the head carries: 0 for features of one head",
  ),
}


def sae(run: RunData) -> None:
  """`headspec sae` (SAEs on a layer's concatenated z, features attributed to heads by their decoder norm,
  Kissane et al. 2024; docs/sae.md): every per-head number of sae/heads.csv is a metric per site and SAE
  (the SAE's quality from metrics.csv in the note; probe_selectivity_* is probes/results.csv's own metric),
  and the card lists, per SAE of the head's layer at the primary model's latest step, the strongest live
  features the head carries with their contexts and label profiles (`_sae_cards`)."""
  head_rows, feature_rows = run.rows[tables.SAE_HEADS.path], run.rows[tables.SAE_FEATURES.path]
  if not head_rows and not feature_rows:
    return
  quality = collections.defaultdict(dict)  # (model, step, site, layer, sae) -> {metric: value}
  for r in run.aux(tables.SAE_METRICS):
    quality[sae_key(r)][r["metric"]] = num(r["value"])
  numbers = collections.defaultdict(dict)  # ((model, step, site, layer, sae), head) -> {metric: value}
  for r in head_rows:
    name, key = r["metric"], sae_key(r)
    numbers[(key, int(r["head"]))][name] = num(r["value"])
    if name.startswith("probe_selectivity_"):
      continue
    label, description = _sae_metric_text(name)
    run.metric(
      f"sae/{r['site']}/{r['sae']}/{name}{run.suffix(r['model'])}",
      "SAE features",
      f"{label} · {r['sae']} on {r['site']}{run.model_label(r['model'])}",
      description,
      integer=name in ("features_carried", "exclusive_features") or name.startswith("selective_features_"),
    ).set(int(r["step"]), int(r["layer"]), int(r["head"]), num(r["value"]), None, sae_quality(quality.get(key)))
  _sae_cards(run, feature_rows, quality, numbers)


def _sae_cards(run: RunData, feature_rows: list[dict], quality: dict, numbers: dict) -> None:
  """Per head, per SAE of its layer (the primary model's latest step): the live features (firing on the
  evaluation tokens) it carries (sae/features.csv `heads`), first those whose largest decoder-norm share a_fh
  is the head's, by that share (Kissane et al. 2024 rank a head's features so), then those it carries with
  a smaller share (by its place in `heads`; the table gives only the largest share), each with its
  contexts (contexts.csv, rank 0 first), label profiles (labels.csv, most frequent first) and page
  (`feature_page`); then links to the next MORE_FEATURES it carries."""
  keys = sae_card_keys(run, feature_rows)
  carried = collections.defaultdict(list)  # (key, head) -> [(order, feature, place in `heads`, feature row)]
  for r in feature_rows:
    key = sae_key(r)
    if key not in keys or not (num(r["firing_rate"]) or 0.0) > 0:
      continue  # another model or step, or a dead feature (its decoder is its initialisation)
    top = num(r["top_head_fraction"]) or 0.0
    for place, head in enumerate(feature_heads(r["heads"])):
      carried[(key, head)].append(((0, -top) if place == 0 else (place, top), int(r["feature"]), place, r))
  ranked = {kh: sorted(items, key=lambda x: x[:2]) for kh, items in carried.items()}
  shown = {kh: items[:TOP_FEATURES] for kh, items in ranked.items()}
  page = lambda key, feature: feature_page(key, feature) if run.pages else None
  wanted = {(kh[0], item[1]) for kh, items in shown.items() for item in items}
  contexts, profiles = collections.defaultdict(list), collections.defaultdict(lambda: collections.defaultdict(list))
  if wanted:
    for r in run.aux(tables.SAE_CONTEXTS):
      if (sae_key(r), int(r["feature"])) in wanted:
        contexts[(sae_key(r), int(r["feature"]))].append((int(r["rank"]), r["context"], num(r["activation"])))
    for r in run.aux(tables.SAE_LABELS):
      if (sae_key(r), int(r["feature"])) in wanted:
        item = (-(num(r["fraction"]) or 0.0), r["label"], num(r["fraction"]), int(r["count"]))
        profiles[(sae_key(r), int(r["feature"]))][r["label_set"]].append(item)
  for key, head in sorted(set(shown) | {kh for kh in numbers if kh[0] in keys}):
    _, step, site, layer, name = key
    features = []
    for _, feature, place, r in shown.get((key, head), ()):
      profile = profiles[(key, feature)]
      sets = [s for s in SAE_LABEL_SETS if r[s] or s in profile] + sorted(set(profile) - set(SAE_LABEL_SETS))
      labels = [
        {
          "set": s,
          "best": r.get(s, ""),
          "selectivity": num(r.get(f"{s}_selectivity")),
          "top": [[label, fraction] for _, label, fraction, _ in sorted(profile[s])[:TOP_LABELS]],
        }
        for s in sets
      ]
      features.append(
        {
          "feature": feature,
          "share": num(r["top_head_fraction"]) if place == 0 else None,
          "place": place,
          "heads": feature_heads(r["heads"]),
          "firing_rate": num(r["firing_rate"]),
          "mean_activation": num(r["mean_activation"]),
          "entropy_bits": num(r["entropy_bits"]),
          "labels": labels,
          "contexts": [[c, a] for _, c, a in sorted(contexts[(key, feature)])[:TOP_CONTEXTS]],
          "page": page(key, feature),
        }
      )
    more = ranked.get((key, head), [])[TOP_FEATURES : TOP_FEATURES + MORE_FEATURES]
    mine = numbers.get((key, head), {})
    run.extra(layer, head).setdefault("sae", []).append(
      {
        "site": site,
        "sae": name,
        "layer": layer,
        "step": step,
        "quality": sae_quality(quality.get(key)),
        "specialization": mine.get("specialization"),
        "exclusive_features": mine.get("exclusive_features"),
        "carried": len(carried.get((key, head), ())),
        "features": features,
        "more": [[item[1], page(key, item[1])] for item in more],  # further carried features, in that order
      }
    )


def sae_card_keys(run: RunData, feature_rows: list[dict]) -> set[tuple]:
  """The SAEs on the cards (`sae_key`): per (site, layer, sae), the primary model's latest step."""
  last = {}  # (site, layer, sae) -> the primary model's latest step
  for r in feature_rows:
    if r["model"] == run.primary:
      what = (r["site"], int(r["layer"]), r["sae"])
      last[what] = max(last.get(what, -1), int(r["step"]))
  return {(run.primary, step, *what) for what, step in last.items()}


def sae_key(r: dict) -> tuple:
  """(model, step, site, layer, sae): which SAE a row of an sae/*.csv table belongs to."""
  return r["model"], int(r["step"]), r["site"], int(r["layer"]), r["sae"]


def feature_page(key: tuple, feature: int) -> str:
  """The page of a feature of SAE `key` (`sae_key`), relative to the run directory (and so to atlas.html):
  atlas_features/<model>_step<step>_<site><layer>_<sae>/f<feature>.html, each name one file-name component."""
  model, step, site, layer, sae = key
  folder = f"{filenames.component(model)}_step{step}_{filenames.component(site)}{layer}_{filenames.component(sae)}"
  return f"{FEATURE_PAGES}/{folder}/f{feature}.html"


def _sae_metric_text(name: str) -> tuple[str, str]:
  """(label, description) of an sae/heads.csv metric."""
  if name in _SAE_METRICS:
    label, description = _SAE_METRICS[name]
  elif name.startswith("max_feature_selectivity_"):
    s = name.removeprefix("max_feature_selectivity_")
    label, description = (
      f"best {s} selectivity of its features",
      f"Largest {s} selectivity max_y P(y | fires) − P(y) of a feature the head carries",
    )
  elif name.startswith("selective_features_"):
    s = name.removeprefix("selective_features_")
    label, description = (
      f"{s}-selective features",
      f"Features the head carries with {s} selectivity ≥ analysis.selective_min",
    )
  else:
    label, description = name.replace("_", " "), f"sae/heads.csv metric {name}"
  return label, f"{description} (headspec sae; Kissane et al. 2024; docs/sae.md)."


def sae_quality(values: dict | None) -> str:
  """The SAE's quality from sae/metrics.csv, for a cell's note and the card: 'SAE FVU 0.120, L0 16.0, 3.1% dead'."""
  values = values or {}
  parts = [f"{name} {fmt.format(values[key])}" for key, name, fmt in (("fvu", "FVU", "{:.3f}"), ("l0", "L0", "{:.1f}"))
           if values.get(key) is not None]  # fmt: skip
  if values.get("dead_fraction") is not None:
    parts.append(f"{100 * values['dead_fraction']:.1f}% dead")
  if values.get("features") is not None:
    parts.append(f"{values['features']:.0f} features")
  return ("SAE " + ", ".join(parts)) if parts else ""
