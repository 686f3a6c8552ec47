"""A run's results tables -> the JSON the atlas page draws (pure Python: no JAX, no pandas, no NumPy).

The page needs, per run, the layer × head grid shape, one entry per *metric* (a number per head, at one
or more steps, optionally with a 95% CI and notes), the heads' role labels and best-matched dependency
relations, their strongest SAE features (sae/*.csv) and circuit edges (circuit/edges.csv), and the attention
pictures found under RUN/attention/. Tables are read only through
`headspec.io.tables.read`; a run may have any subset of them.

Metric ids are shared across runs so `--compare` can show the same metric side by side: the run's own
model (its primary model) has plain ids, its random-weights control (`<model>-random`) gets the suffix
`@random`, any other model `@<name>`. A run directory may be a URL (gs://bucket/run): everything is
read through etils.epath.

The grid's shape is the run's (config.json: model.num_layers × model.num_heads); without one (a folder of
a pretrained model's analyses) it is the largest layer and head in the tables, up to tables.MAX_GRID. Rows
outside the grid, and lines of metrics.jsonl that are not a record, are left out with one warning per
file on stderr: the page is still written. Temporary folders (`*.tmp-<pid>`, left by a killed writer)
are never read.
"""

from __future__ import annotations

import base64
import collections
import math
import re
import sys

from etils import epath

from headspec.errors import UserError
from headspec.io import filenames, metrics, remote, tables

# Per-head tables the atlas draws (the others are per-run curves, drawn by analysis/ scripts).
HEAD_TABLES = (
  tables.PROBES,
  tables.MDL,
  tables.DIVERSITY,
  tables.ABLATION_HEADS,
  tables.ABLATION_GATES,
  tables.ABLATION_INTERACTIONS,
  tables.CLARK,
  tables.ROLES,
  tables.LABELS,
  tables.PROBE_STRUCTURAL,
  tables.PATCHING,
  tables.SAE_HEADS,
  tables.SAE_FEATURES,
  tables.CIRCUIT_EDGES,
)
# The SAE tables the cards read beside sae/heads.csv and features.csv (run-level or per feature).
SAE_AUX_TABLES = (tables.SAE_METRICS, tables.SAE_CONTEXTS, tables.SAE_LABELS, tables.SAE_HISTOGRAMS, tables.SAE_SHARES,
                  tables.SAE_LOGITS)  # fmt: skip
# Patching sites with a head axis (headspec.model.transformer.SITES; JAX-free copy): the others are per layer.
PATCHING_HEAD_SITES = ("q_in", "k_in", "v_in", "q", "k", "v", "attn_scores", "pattern", "z", "head_out")
# Attention pictures embedded at most (base64 grows them by a third): the page must stay openable.
MAX_IMAGE_BYTES = 24 * 2**20
TOP_RELATIONS = 5
TOP_INTERACTIONS = 5
TOP_FEATURES = 5  # SAE features per head and SAE on its card
TOP_CONTEXTS = 3  # ... each with its highest-activating contexts
TOP_LABELS = 3  # ... and its most frequent labels per label set
MORE_FEATURES = 20  # links to the head's further carried features, after the TOP_FEATURES
FEATURE_PAGES = "atlas_features"  # RUN/atlas_features/<SAE>/f<feature>.html (headspec/atlas/features.py)
TOP_EDGES = 5  # circuit edges into and out of a head, per task
# headspec/patching/edges.py: what an edge enters, and the methods' names (JAX-free copy).
EDGE_INPUTS = ("q", "k", "v", "mlp", "logits")
EDGE_METHODS = {"exact": "exact", "eap_ig": "EAP-IG", "eap": "EAP"}  # the order of preference for ranking
# Largest grid inferred from tables alone (no config.json): above any published model (Llama 3 405B:
# 126 layers × 128 heads), far below what a stray row (layer=100000) would allocate.
# The layer and head columns of each per-head table, with their smallest value: -1 marks the embedding
# output / residual stream (probes, mdl), a per-head metric (diversity head_j), a per-λ row (gates), a site
# without heads (sae top_head) or a node that is no head (circuit: the embeddings, MLPs, logits). A pair
# (smallest, past) lets the column go `past` beyond the grid's last: the logits are circuit layer L.
_GRID_COLUMNS = {
  tables.PROBES.path: {"layer": -1, "head": -1},
  tables.MDL.path: {"layer": -1, "head": -1},
  tables.DIVERSITY.path: {"layer": 0, "head_i": 0, "head_j": -1},
  tables.ABLATION_HEADS.path: {"layer": 0, "head": 0},
  tables.ABLATION_GATES.path: {"layer": -1, "head": -1},
  tables.ABLATION_INTERACTIONS.path: {"layer_a": 0, "head_a": 0, "layer_b": 0, "head_b": 0},
  tables.CLARK.path: {"layer": 0, "head": 0},
  tables.ROLES.path: {"layer": 0, "head": 0},
  tables.LABELS.path: {"layer": 0, "head": 0},
  tables.PROBE_STRUCTURAL.path: {"layer": -1, "head": -1},
  tables.PATCHING.path: {"layer": 0, "head": -1},
  tables.SAE_HEADS.path: {"layer": 0, "head": 0},
  tables.SAE_FEATURES.path: {"layer": 0, "top_head": -1},
  tables.SAE_METRICS.path: {"layer": 0},
  tables.SAE_CONTEXTS.path: {"layer": 0},
  tables.SAE_LABELS.path: {"layer": 0},
  tables.SAE_HISTOGRAMS.path: {"layer": 0},
  tables.SAE_SHARES.path: {"layer": 0, "head": 0},
  tables.SAE_LOGITS.path: {"layer": 0},
  tables.CIRCUIT_EDGES.path: {
    "upstream_layer": -1,
    "upstream_head": -1,
    "downstream_layer": (0, 1),
    "downstream_head": -1,
  },
}

_DIVERGING = {"selectivity", "loss_delta", "accuracy_delta", "interaction"}
_HEAD_IN_NAME = re.compile(r"(?:^|[^a-z0-9])(?:l|layer)[_-]?(\d+)[_-]?(?:h|head)[_-]?(\d+)(?=[^0-9]|$)", re.I)


def _warn(message: str) -> None:
  """One line on stderr for something the page leaves out (the page is still written)."""
  print(f"headspec: warning: {message}", file=sys.stderr, flush=True)


def _int(value) -> int | None:
  """A CSV cell or JSON value as an int; None for anything else (1.5, 'x', '', true)."""
  if isinstance(value, bool):
    return None
  if isinstance(value, float):
    return int(value) if value.is_integer() else None
  try:
    return int(value)
  except (TypeError, ValueError):
    return None


def _num(value: str):
  """A CSV cell as a JSON number; NaN and empty cells as None (JSON has no NaN)."""
  try:
    x = float(value)
  except (TypeError, ValueError):
    return None
  return x if math.isfinite(x) else None


def _bounds(table: tables.Table, column: str) -> tuple[int, int, int]:
  """(axis, smallest, past) of a grid column of `table` (`_GRID_COLUMNS`): axis 0 for layers, 1 for heads."""
  spec = _GRID_COLUMNS[table.path][column]
  low, past = spec if isinstance(spec, tuple) else (spec, 0)
  return (0 if "layer" in column else 1), low, past


def _feature_heads(cell: str) -> list[int] | None:
  """sae/features.csv's `heads` cell ('2;0', '' for none) as head numbers; None if it is not that."""
  try:
    return [int(h) for h in cell.split(";")] if cell else []
  except ValueError:
    return None


def _short_split(split: str) -> str:
  return split.rsplit("/", 1)[-1]


class _Metric:
  """One colourable quantity: value (and CI, notes) per (step, layer, head)."""

  def __init__(
    self, mid: str, group: str, label: str, description: str, *, diverging=False, categorical=False, integer=False
  ):
    self.spec = {
      "id": mid,
      "group": group,
      "label": label,
      "description": description,
      "diverging": diverging or any(k in mid for k in _DIVERGING),
      "categorical": categorical,
      "integer": integer,  # a count: written without decimals
    }
    self.cells: dict[int, dict[tuple[int, int], dict]] = collections.defaultdict(dict)

  def set(self, step: int, layer: int, head: int, value, ci=None, note: str = "") -> None:
    cell = {"v": value}
    if ci is not None and ci[0] is not None and ci[1] is not None:
      cell["ci"] = list(ci)
    if note:
      cell["note"] = note
    self.cells[step][(layer, head)] = cell

  def to_json(self, num_layers: int, num_heads: int) -> dict:
    steps = sorted(self.cells)
    grids = {}
    for step in steps:
      grid = [[None] * num_heads for _ in range(num_layers)]
      for (layer, head), cell in self.cells[step].items():
        grid[layer][head] = cell
      grids[str(step)] = grid
    return dict(self.spec, steps=steps, grids=grids)


class _RunData:
  def __init__(self, workdir: epath.Path, pages: bool = False, quiet: bool = False):
    self.workdir = workdir
    self.pages = pages  # link the SAE features on the cards to their pages (written for the page's own run)
    self.quiet = quiet  # leave bad rows out without a warning (a second reader of the same tables)
    self.rows = {t.path: tables.read(tables.path_of(workdir, t), t) for t in HEAD_TABLES}
    self.shape, self.source = self._grid_shape()
    self.rows = {t.path: self._in_grid(t, self.source) for t in HEAD_TABLES}
    self.primary = self._primary_model()
    self.metrics: dict[str, _Metric] = {}
    self.extras: dict[str, dict] = {}  # "layer,head" -> {role, relations, interactions, images}
    self.layer_notes: dict[str, dict] = {}  # metric id -> {"residual": {step: [L]}, "embedding": {step: x}}

  def _grid_shape(self) -> tuple[tuple[int, int], str]:
    """(layers, heads) of the run's config.json; without one, 1 + the largest layer and head of the tables
    the grid colours (at most tables.MAX_GRID). Also says where the shape comes from, for warnings."""
    shape = tables.grid_shape(self.workdir)
    if shape is not None:
      return shape, str(self.workdir / "config.json")
    most = [0, 0]
    for table in (t for t in HEAD_TABLES if t is not tables.ABLATION_INTERACTIONS):  # the tables the grid colours
      for r in self.rows[table.path]:
        for column in _GRID_COLUMNS[table.path]:
          axis, _, past = _bounds(table, column)
          value = _int(r[column])
          if value is not None and value - past < tables.MAX_GRID[axis]:
            most[axis] = max(most[axis], value + 1 - past)
    return (max(most[0], 1), max(most[1], 1)), "the tables (no config.json)"

  def _in_grid(self, table: tables.Table, source: str, rows: list[dict] | None = None) -> list[dict]:
    """The rows of `table` (read by __init__, or `rows`) whose integer columns hold integers, whose layers
    and heads lie in the grid and whose cells the atlas reads are what the contract says; the others are
    left out with one warning naming the table's file, its first such line and why."""
    kept, bad, why = [], 0, ""
    for line, r in enumerate(self.rows[table.path] if rows is None else rows, start=2):  # line 1 is the header
      wrong = [f"{c}={r[c]!r} is not an integer" for c in table.int_columns if _int(r[c]) is None]
      for c in _GRID_COLUMNS[table.path]:
        axis, low, past = _bounds(table, c)
        if not wrong and not low <= int(r[c]) < self.shape[axis] + past:
          wrong.append(f"{c}={r[c]} is outside the {self.shape[axis]} {('layers', 'heads')[axis]} of {source}")
      if not wrong:
        wrong = self._cells(table, r, source)
      if not wrong:
        kept.append(r)
        continue
      bad += 1
      why = why or f"{tables.path_of(self.workdir, table)}:{line}: {wrong[0]}"
    if bad and not self.quiet:
      _warn(f"{why}; left out {bad} row(s) of this table")
    return kept

  def _cells(self, table: tables.Table, r: dict, source: str) -> list[str]:
    """What is wrong with the text cells of row `r` that the atlas reads (sae/features.csv's `heads`, a
    circuit edge's `input`); [] for a good row or another table."""
    if table is tables.SAE_FEATURES:
      heads = _feature_heads(r["heads"])
      if heads is None:
        return [f"heads={r['heads']!r} is not ';'-separated head numbers"]
      if any(not 0 <= h < self.shape[1] for h in heads):
        return [f"heads={r['heads']!r} names a head outside the {self.shape[1]} heads of {source}"]
    if table is tables.CIRCUIT_EDGES and r["input"] not in EDGE_INPUTS:
      return [f"input={r['input']!r} is not one of {', '.join(EDGE_INPUTS)}"]
    return []

  def _aux(self, table: tables.Table) -> list[dict]:
    """A table read beside the per-head ones (sae/metrics.csv, contexts.csv, labels.csv), checked as they are."""
    return self._in_grid(table, self.source, tables.read(tables.path_of(self.workdir, table), table))

  def _primary_model(self) -> str:
    counts = collections.Counter(
      r["model"] for rows in self.rows.values() for r in rows if "model" in r and not r["model"].endswith("-random")
    )
    return counts.most_common(1)[0][0] if counts else self.workdir.name

  def _suffix(self, model: str) -> str:
    if model == self.primary:
      return ""
    if model == f"{self.primary}-random":
      return "@random"
    return f"@{model}"

  def _model_label(self, model: str) -> str:
    suffix = self._suffix(model)
    return "" if not suffix else " — random-weights control" if suffix == "@random" else f" — model {model}"

  def metric(self, mid: str, group: str, label: str, description: str, **kw) -> _Metric:
    if mid not in self.metrics:
      self.metrics[mid] = _Metric(mid, group, label, description, **kw)
    return self.metrics[mid]

  def extra(self, layer: int, head: int) -> dict:
    return self.extras.setdefault(f"{layer},{head}", {})

  def layer_note(self, m: _Metric, step: int, layer: int, value) -> None:
    """A value of the embedding output (layer −1) or of layer `layer`'s residual stream: beside the grid."""
    notes = self.layer_notes.setdefault(m.spec["id"], {"residual": {}, "embedding": {}})
    if layer < 0:
      notes["embedding"][str(step)] = value
    else:
      notes["residual"].setdefault(str(step), {})[str(layer)] = value

  # --- one reader per table ---------------------------------------------------------------------------
  def probes(self) -> None:
    for r in self.rows[tables.PROBES.path]:
      layer, head, step = int(r["layer"]), int(r["head"]), int(r["step"])
      task, split, sfx = r["task"], r["split"], self._suffix(r["model"])
      ml = self._model_label(r["model"])
      n = f"n={r['n']} words"
      acc = self.metric(
        f"probe/{task}/{split}/accuracy{sfx}",
        "Probe accuracy",
        f"{task} accuracy · {_short_split(split)}{ml}",
        f"Accuracy of the {task} probe on {split} (95% bootstrap CI over sentences).",
      )
      sel = self.metric(
        f"probe/{task}/{split}/selectivity{sfx}",
        "Probe selectivity",
        f"{task} selectivity · {_short_split(split)}{ml}",
        f"Selectivity on {split}: accuracy − control-task accuracy (Hewitt & Liang 2019).",
      )
      a, lo, hi, c = (_num(r[k]) for k in ("accuracy", "ci_low", "ci_high", "control_accuracy"))
      control = f"control {c:.3f}" if c is not None else ""
      if layer < 0 or head < 0:  # the embedding output or a layer's residual stream: beside the grid
        for m, v in ((acc, a), (sel, _num(r["selectivity"]))):
          self.layer_note(m, step, layer, v)
        continue
      acc.set(step, layer, head, a, (lo, hi), f"{control}; {n}")
      sel.set(step, layer, head, _num(r["selectivity"]), None, f"accuracy {a:.3f} − {control}" if a is not None else "")

  def structural(self) -> None:
    """Hewitt & Manning (2019)'s structural probes (probes/structural.csv): one metric per task, split and tree
    metric (UUAS, DSpr, root accuracy, NSpr), with its bootstrap CI; residual stream and embeddings beside."""
    for r in self.rows[tables.PROBE_STRUCTURAL.path]:
      layer, head, step = int(r["layer"]), int(r["head"]), int(r["step"])
      task, split, name = r["task"], r["split"], r["metric"]
      m = self.metric(
        f"structural/{task}/{split}/{name}{self._suffix(r['model'])}",
        "Structural probe",
        f"{task} {name} · {_short_split(split)}{self._model_label(r['model'])}",
        f"Structural probe ({task}, Hewitt & Manning 2019): {name} on {split} (95% bootstrap CI over sentences;"
        " docs/probing.md).",
      )
      value = _num(r["value"])
      if layer < 0 or head < 0:
        self.layer_note(m, step, layer, value)
        continue
      control, sel = _num(r["control_value"]), _num(r["selectivity"])
      note = f"control {control:.3f}; selectivity {sel:+.3f}; " if control is not None and sel is not None else ""
      m.set(
        step,
        layer,
        head,
        value,
        (_num(r["ci_low"]), _num(r["ci_high"])),
        f"{note}rank {r['rank']}; n={r['n']} sentences",
      )

  def patching(self) -> None:
    """Activation, attribution and path patching (patching/results.csv): per task, site, method and direction,
    each head's effect as the fraction of the logit difference it restores, (value − base) / (source − base)
    (Wang et al. 2022; attribution's value is already a change), at its strongest position, with every
    position's on the card; resid_pre patching is the layer's residual-stream column. base and source (the
    unpatched corrupted and clean runs) are summary.csv's; rows without them are left out with a warning."""
    rows = self.rows[tables.PATCHING.path]
    if not rows:
      return
    summary_path = tables.path_of(self.workdir, tables.PATCHING_SUMMARY)
    runs = {}  # (model, step, task, direction) -> (base, source), the same for every site
    for r in tables.read(summary_path, tables.PATCHING_SUMMARY):
      if r["metric"] in ("base", "source"):
        runs.setdefault((r["model"], int(r["step"]), r["task"], r["direction"]), {})[r["metric"]] = _num(r["value"])
    effects = collections.defaultdict(dict)  # (model, step, task, method, direction, site, layer, head) -> {pos: x}
    missing = 0
    for r in rows:
      ends = runs.get((r["model"], int(r["step"]), r["task"], r["direction"]), {})
      base, source, value = ends.get("base"), ends.get("source"), _num(r["value"])
      if base is None or source is None:
        missing += 1
        continue
      change = value if r["method"] == "attribution" or value is None else value - base
      fraction = change / (source - base) if change is not None and abs(source - base) > 1e-9 else None
      key = (r["model"], int(r["step"]), r["task"], r["method"], r["direction"], r["site"], int(r["layer"]))
      effects[key + (int(r["head"]),)][int(r["position"])] = fraction
    if missing:
      _warn(f"{summary_path}: no base and source logit difference for {missing} row(s) of patching/results.csv")
    resid = {k[:5] + (k[6],): v for k, v in effects.items() if k[5] == "resid_pre"}
    last = {}  # the primary model's last step per (task, method, direction, site): its positions go on the card
    for model, step, task, method, direction, site, _layer, head in effects:
      if model == self.primary and head >= 0:
        last[(task, method, direction, site)] = max(step, last.get((task, method, direction, site), step))
    for (model, step, task, method, direction, site, layer, head), by_position in effects.items():
      if site not in PATCHING_HEAD_SITES or head < 0:
        continue
      what = "paths to the logits through no other head" if method == "path_logits" else f"{site} · {method}"
      m = self.metric(
        f"patching/{task}/{site}/{method}/{direction}{self._suffix(model)}",
        "Patching",
        f"{task} · {what} ({direction}){self._model_label(model)}",
        f"Fraction of the {task} logit difference restored by patching the head's {site} ({method}, {direction};"
        " docs/patching.md) at its strongest position; the resid column: the residual stream entering the layer.",
        diverging=True,
      )
      position, best = max(by_position.items(), key=lambda pv: abs(pv[1]) if pv[1] is not None else -1)
      where = "all positions" if position < 0 else f"position {position}"
      m.set(step, layer, head, best, None, f"{where} of 0–{len(by_position) - 1}" if position >= 0 else where)
      stream = resid.get((model, step, task, method, direction, layer))
      if stream:
        self.layer_note(m, step, layer, max(stream.values(), key=lambda v: abs(v) if v is not None else -1))
      if model == self.primary and last[(task, method, direction, site)] == step and position >= 0:
        self.extra(layer, head).setdefault("patching", []).append(
          {
            "label": f"{task} · {what} ({direction})",
            "step": step,
            "positions": [[t, x] for t, x in sorted(by_position.items())],
          }
        )

  # --- sparse autoencoders and circuits --------------------------------------------------------------
  def sae(self) -> None:
    """`headspec sae` (SAEs on a layer's concatenated z, features attributed to heads by their decoder norm,
    Kissane et al. 2024; docs/sae.md): every per-head number of sae/heads.csv is a metric per site and SAE
    (the SAE's quality from metrics.csv in the note; probe_selectivity_* is probes/results.csv's own metric),
    and the card lists, per SAE of the head's layer at the primary model's latest step, the strongest live
    features the head carries with their contexts and label profiles (`_sae_cards`)."""
    head_rows, feature_rows = self.rows[tables.SAE_HEADS.path], self.rows[tables.SAE_FEATURES.path]
    if not head_rows and not feature_rows:
      return
    quality = collections.defaultdict(dict)  # (model, step, site, layer, sae) -> {metric: value}
    for r in self._aux(tables.SAE_METRICS):
      quality[_sae_key(r)][r["metric"]] = _num(r["value"])
    numbers = collections.defaultdict(dict)  # ((model, step, site, layer, sae), head) -> {metric: value}
    for r in head_rows:
      name, key = r["metric"], _sae_key(r)
      numbers[(key, int(r["head"]))][name] = _num(r["value"])
      if name.startswith("probe_selectivity_"):
        continue
      label, description = _sae_metric_text(name)
      self.metric(
        f"sae/{r['site']}/{r['sae']}/{name}{self._suffix(r['model'])}",
        "SAE features",
        f"{label} · {r['sae']} on {r['site']}{self._model_label(r['model'])}",
        description,
        integer=name in ("features_carried", "exclusive_features") or name.startswith("selective_features_"),
      ).set(int(r["step"]), int(r["layer"]), int(r["head"]), _num(r["value"]), None, _sae_quality(quality.get(key)))
    self._sae_cards(feature_rows, quality, numbers)

  def _sae_cards(self, feature_rows: list[dict], quality: dict, numbers: dict) -> None:
    """Per head, per SAE of its layer (the primary model's latest step): the live features (firing on the
    evaluation tokens) it carries (sae/features.csv `heads`), first those whose largest decoder-norm share a_fh
    is the head's, by that share (Kissane et al. 2024 rank a head's features so), then those it carries with
    a smaller share (by its place in `heads`; the table gives only the largest share), each with its
    contexts (contexts.csv, rank 0 first), label profiles (labels.csv, most frequent first) and page
    (`feature_page`); then links to the next MORE_FEATURES it carries."""
    keys = self.sae_card_keys(feature_rows)
    carried = collections.defaultdict(list)  # (key, head) -> [(order, feature, place in `heads`, feature row)]
    for r in feature_rows:
      key = _sae_key(r)
      if key not in keys or not (_num(r["firing_rate"]) or 0.0) > 0:
        continue  # another model or step, or a dead feature (its decoder is its initialisation)
      top = _num(r["top_head_fraction"]) or 0.0
      for place, head in enumerate(_feature_heads(r["heads"])):
        carried[(key, head)].append(((0, -top) if place == 0 else (place, top), int(r["feature"]), place, r))
    ranked = {kh: sorted(items, key=lambda x: x[:2]) for kh, items in carried.items()}
    shown = {kh: items[:TOP_FEATURES] for kh, items in ranked.items()}
    page = lambda key, feature: feature_page(key, feature) if self.pages else None
    wanted = {(kh[0], item[1]) for kh, items in shown.items() for item in items}
    contexts, profiles = collections.defaultdict(list), collections.defaultdict(lambda: collections.defaultdict(list))
    if wanted:
      for r in self._aux(tables.SAE_CONTEXTS):
        if (_sae_key(r), int(r["feature"])) in wanted:
          contexts[(_sae_key(r), int(r["feature"]))].append((int(r["rank"]), r["context"], _num(r["activation"])))
      for r in self._aux(tables.SAE_LABELS):
        if (_sae_key(r), int(r["feature"])) in wanted:
          item = (-(_num(r["fraction"]) or 0.0), r["label"], _num(r["fraction"]), int(r["count"]))
          profiles[(_sae_key(r), int(r["feature"]))][r["label_set"]].append(item)
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
            "selectivity": _num(r.get(f"{s}_selectivity")),
            "top": [[label, fraction] for _, label, fraction, _ in sorted(profile[s])[:TOP_LABELS]],
          }
          for s in sets
        ]
        features.append(
          {
            "feature": feature,
            "share": _num(r["top_head_fraction"]) if place == 0 else None,
            "place": place,
            "heads": _feature_heads(r["heads"]),
            "firing_rate": _num(r["firing_rate"]),
            "mean_activation": _num(r["mean_activation"]),
            "entropy_bits": _num(r["entropy_bits"]),
            "labels": labels,
            "contexts": [[c, a] for _, c, a in sorted(contexts[(key, feature)])[:TOP_CONTEXTS]],
            "page": page(key, feature),
          }
        )
      more = ranked.get((key, head), [])[TOP_FEATURES : TOP_FEATURES + MORE_FEATURES]
      mine = numbers.get((key, head), {})
      self.extra(layer, head).setdefault("sae", []).append(
        {
          "site": site,
          "sae": name,
          "layer": layer,
          "step": step,
          "quality": _sae_quality(quality.get(key)),
          "specialization": mine.get("specialization"),
          "exclusive_features": mine.get("exclusive_features"),
          "carried": len(carried.get((key, head), ())),
          "features": features,
          "more": [[item[1], page(key, item[1])] for item in more],  # further carried features, in that order
        }
      )

  def sae_card_keys(self, feature_rows: list[dict]) -> set[tuple]:
    """The SAEs on the cards (`_sae_key`): per (site, layer, sae), the primary model's latest step."""
    last = {}  # (site, layer, sae) -> the primary model's latest step
    for r in feature_rows:
      if r["model"] == self.primary:
        what = (r["site"], int(r["layer"]), r["sae"])
        last[what] = max(last.get(what, -1), int(r["step"]))
    return {(self.primary, step, *what) for what, step in last.items()}

  def circuit(self) -> None:
    """`headspec circuit` (circuit/edges.csv; docs/circuits.md): every edge's score by EAP (Syed et al. 2023),
    EAP-IG (Hanna et al. 2024) or exact edge patching, the change of the logit difference when that edge alone
    carries its corrupted value in the clean run (noising, the papers' convention; a `*_denoising` method: its
    clean value in the corrupted run), estimated or measured. Per task and method, the grid has
    each head's strongest (largest |score|) incoming edge — into its query, key or value input; a
    grouped-query head's key and value inputs are its K/V group's, shared — and its strongest outgoing edge;
    the card lists the primary model's latest step's top edges each way, ranked by the most exact method
    there (exact, then EAP-IG, then EAP), every method's score beside."""
    rows = self.rows[tables.CIRCUIT_EDGES.path]
    if not rows:
      return
    heads = self.shape[1]
    groups = {}  # model -> its number of K/V groups, from its k/v edges into L<l>G<g> nodes (none: not grouped)
    for r in rows:
      if r["input"] in ("k", "v") and _GROUP_NODE.fullmatch(r["downstream"]):
        groups[r["model"]] = max(groups.get(r["model"], 0), int(r["downstream_head"]) + 1)
    bad = sorted(model for model, g in groups.items() if heads % g)
    if bad:
      _warn(
        f"{tables.path_of(self.workdir, tables.CIRCUIT_EDGES)}: {bad[0]}'s {groups[bad[0]]} K/V groups do not divide"
        f" the {heads} heads; its key and value edges are left off the heads"
      )
    incoming, outgoing = collections.defaultdict(list), collections.defaultdict(list)
    for r in rows:  # (model, step, task, method, steps, layer, head) -> [(upstream, downstream, input, score)]
      at = (r["model"], int(r["step"]), r["task"], r["method"], int(r["steps"]))
      edge = (r["upstream"], r["downstream"], r["input"], _num(r["score"]))
      if int(r["upstream_head"]) >= 0:
        outgoing[at + (int(r["upstream_layer"]), int(r["upstream_head"]))].append(edge)
      if r["input"] not in ("q", "k", "v"):
        continue
      layer, target, g = int(r["downstream_layer"]), int(r["downstream_head"]), groups.get(r["model"])
      if r["input"] != "q" and _GROUP_NODE.fullmatch(r["downstream"]):  # a K/V group: each of its heads
        if g is None or heads % g:
          continue
        targets = range(target * (heads // g), (target + 1) * (heads // g))
      else:
        targets = (target,)
      for head in targets:
        incoming[at + (layer, head)].append(edge)
    for side, by_head in (("incoming", incoming), ("outgoing", outgoing)):
      for (model, step, task, method, steps, layer, head), edges in by_head.items():
        u, d, inp, score = max(edges, key=lambda e: -1 if e[3] is None else abs(e[3]))
        if side == "incoming":  # into this head's input, or its K/V group's
          where = f"from {u} into {inp}" + (f" of {d}" if d != f"L{layer}H{head}" else "")
        else:  # into a later head's q, k or v, an MLP or the logits
          where = f"into {d}'s {inp}" if inp in ("q", "k", "v") else f"into {d}"
        self.metric(
          f"circuit/{task}/{_method_id(method, steps)}/{side}{self._suffix(model)}",
          "Circuit edges",
          f"{task} · strongest {side} edge · {_method_label(method, steps)}{self._model_label(model)}",
          f"Score of the head's strongest {side} edge (largest |score|; "
          + (
            "into its query, key or value input, a grouped-query head's key and value through its K/V group"
            if side == "incoming"
            else "from its output into any later node"
          )
          + f") on {task} by {_method_label(method, steps)}: the change of the logit difference when that edge"
          " alone carries its corrupted value in the clean run (noising; a *_denoising method: its clean value in"
          " the corrupted run; estimated; exact: measured; docs/circuits.md).",
          diverging=True,
        ).set(step, layer, head, score, None, f"{where}; {len(edges)} {side} edges")
    self._circuit_cards(incoming, outgoing)

  def _circuit_cards(self, incoming: dict, outgoing: dict) -> None:
    """Per head and task (the primary model's latest step): its TOP_EDGES incoming and outgoing edges by |score|
    of the first of the methods there (`_method_order`), each edge with every method's score."""
    last = {}  # task -> the primary model's latest step
    for model, step, task, *_ in [*incoming, *outgoing]:
      if model == self.primary:
        last[task] = max(last.get(task, -1), step)
    for task, step in sorted(last.items()):
      here = [k for k in [*incoming, *outgoing] if k[:3] == (self.primary, step, task)]
      methods = sorted({k[3:5] for k in here}, key=_method_order)
      for layer, head in sorted({k[5:] for k in here}):
        entry = {"task": task, "step": step, "methods": [_method_label(*m) for m in methods]}
        for side, by_head in (("incoming", incoming), ("outgoing", outgoing)):
          scores = {}  # (upstream, downstream, input) -> the score of each method
          for i, (method, steps) in enumerate(methods):
            for u, d, inp, score in by_head.get((self.primary, step, task, method, steps, layer, head), ()):
              scores.setdefault((u, d, inp), [None] * len(methods))[i] = score
          ranked = sorted(scores.items(), key=lambda e: (e[1][0] is None, -abs(e[1][0] or 0.0), e[0]))
          entry[side] = [
            {"upstream": u, "downstream": d, "input": inp, "scores": s} for (u, d, inp), s in ranked[:TOP_EDGES]
          ]
          entry[f"{side}_total"] = len(scores)
        self.extra(layer, head).setdefault("circuit", []).append(entry)

  def mdl(self) -> None:
    for r in self.rows[tables.MDL.path]:
      layer, head = int(r["layer"]), int(r["head"])
      if layer < 0 or head < 0:
        continue
      m = self.metric(
        f"mdl/{r['task']}/compression{self._suffix(r['model'])}",
        "Probe MDL",
        f"{r['task']} MDL compression{self._model_label(r['model'])}",
        "Online-code compression (uniform bits / codelength bits; Voita & Titov 2020).",
      )
      control = _num(r["control_compression"])
      m.set(int(r["step"]), layer, head, _num(r["compression"]), None, f"control {control:.3f}" if control else "")

  def diversity(self) -> None:
    pairs = collections.defaultdict(list)  # (model, metric, step, layer, head) -> values vs the layer's other heads
    for r in self.rows[tables.DIVERSITY.path]:
      step, layer, i, j = int(r["step"]), int(r["layer"]), int(r["head_i"]), int(r["head_j"])
      name, model = r["metric"], r["model"]
      if j == -1:
        self.metric(
          f"diversity/{name}{self._suffix(model)}",
          "Diversity (per head)",
          f"{name.replace('_', ' ')}{self._model_label(model)}",
          f"{name} of the head (docs/diversity.md).",
        ).set(step, layer, i, _num(r["value"]))
      elif i != j:
        pairs[(model, name, step, layer, i)].append(_num(r["value"]))
    for (model, name, step, layer, head), values in sorted(pairs.items()):
      values = [v for v in values if v is not None]
      self.metric(
        f"diversity/{name}/mean_other{self._suffix(model)}",
        "Diversity (mean over the layer's other heads)",
        f"{name.replace('_', ' ')} · mean vs other heads{self._model_label(model)}",
        f"Mean {name} between this head and each other head of its layer (docs/diversity.md).",
      ).set(step, layer, head, sum(values) / len(values) if values else None, None, f"over {len(values)} heads")

  def ablation(self) -> None:
    for r in self.rows[tables.ABLATION_HEADS.path]:
      self.metric(
        f"ablation/{r['method']}/{r['metric']}{self._suffix(r['model'])}",
        "Ablation",
        f"{r['method']} · {r['metric'].replace('_', ' ')}{self._model_label(r['model'])}",
        f"Ablation method {r['method']}, metric {r['metric']} (docs/ablation.md); 95% CI where measured.",
      ).set(int(r["step"]), int(r["layer"]), int(r["head"]), _num(r["value"]), (_num(r["ci_low"]), _num(r["ci_high"])))
    for r in self.rows[tables.ABLATION_GATES.path]:
      if int(r["layer"]) < 0 or int(r["head"]) < 0:  # a per-λ row (expected_l0, loss, ...), not a head
        continue
      self.metric(
        f"gates/{r['penalty']}/open{self._suffix(r['model'])}",
        "Ablation",
        f"gate open probability · penalty {r['penalty']}{self._model_label(r['model'])}",
        "Probability the head's L0 gate is open after training the gates (Voita et al. 2019).",
      ).set(
        int(r["step"]),
        int(r["layer"]),
        int(r["head"]),
        _num(r["gate_open_probability"]),
        None,
        f"{r['heads_kept']} heads kept; {r['metric']} {r['value']}",
      )
    by_head = collections.defaultdict(list)
    for r in self.rows[tables.ABLATION_INTERACTIONS.path]:
      if r["model"] != self.primary:
        continue
      a, b = (int(r["layer_a"]), int(r["head_a"])), (int(r["layer_b"]), int(r["head_b"]))
      item = {"metric": r["metric"], "step": int(r["step"]), "interaction": _num(r["interaction"])}
      item.update(joint=_num(r["joint"]), sum_of_singles=_num(r["sum_of_singles"]))
      by_head[a].append(dict(item, other=list(b)))
      by_head[b].append(dict(item, other=list(a)))
    for (layer, head), items in by_head.items():
      items.sort(key=lambda x: -abs(x["interaction"] or 0))
      self.extra(layer, head)["interactions"] = items[:TOP_INTERACTIONS]

  def attention(self) -> None:
    baselines = {}
    for r in tables.read(tables.path_of(self.workdir, tables.CLARK_BASELINES), tables.CLARK_BASELINES):
      if r["model"] == self.primary:
        key = (int(r["step"]), r["split"], r["relation"], r["direction"])
        baselines[key] = {"offset": int(r["offset"]), "accuracy": _num(r["accuracy"])}
    best = collections.defaultdict(list)
    for r in self.rows[tables.CLARK.path]:
      step, layer, head = int(r["step"]), int(r["layer"]), int(r["head"])
      rel, direction, split = r["relation"], r["direction"], r["split"]
      arrow = "dep→head" if direction == "dependent_to_head" else "head→dep"
      base = baselines.get((step, split, rel, direction))
      note = f"best fixed offset {base['offset']:+d}: {base['accuracy']:.3f}" if base and base["accuracy"] else ""
      note = "; ".join(x for x in (note, f"n={r['n']}") if x)
      self.metric(
        f"clark/{split}/{rel}/{direction}{self._suffix(r['model'])}",
        "Clark et al. accuracy",
        f"{rel} {arrow} · {_short_split(split)}{self._model_label(r['model'])}",
        f"Fraction of {rel} words whose most-attended word is their {'head' if arrow == 'dep→head' else 'dependent'}"
        f" (Clark et al. 2019), on {split}.",
      ).set(step, layer, head, _num(r["accuracy"]), None, note)
      if r["model"] == self.primary and rel != "all":
        best[(layer, head)].append(
          {
            "relation": rel,
            "direction": arrow,
            "split": split,
            "step": step,
            "accuracy": _num(r["accuracy"]),
            "baseline": base,
          }
        )
    for (layer, head), items in best.items():
      last = max(x["step"] for x in items)
      items = [x for x in items if x["step"] == last]
      items.sort(key=lambda x: -(x["accuracy"] or 0))
      self.extra(layer, head)["relations"] = items[:TOP_RELATIONS]
    for r in self.rows[tables.ROLES.path]:
      self.metric(
        f"role/{r['data']}/{r['role']}{self._suffix(r['model'])}",
        "Attention roles",
        f"{r['role'].replace('_', ' ')} score · {r['data']}{self._model_label(r['model'])}",
        f"Score of role {r['role']} measured on {r['data']} input (docs/attention.md), 95% CI.",
      ).set(int(r["step"]), int(r["layer"]), int(r["head"]), _num(r["score"]), (_num(r["ci_low"]), _num(r["ci_high"])))
    for r in self.rows[tables.LABELS.path]:
      self.metric(
        f"label{self._suffix(r['model'])}",
        "Attention roles",
        f"role label{self._model_label(r['model'])}",
        "The head's role label and the rule that gave it (docs/attention.md).",
        categorical=True,
      ).set(int(r["step"]), int(r["layer"]), int(r["head"]), r["label"], None, r["rule"])

  def images(self) -> tuple[list[dict], int]:
    """Attention pictures under RUN/attention/ (any PNG, any name) as data: URIs; the per-head ones (a
    name with layer and head numbers, e.g. `L3H5`, `layer3_head5`) go to the head's card."""
    folder = self.workdir / "attention"
    run_level, budget, skipped = [], MAX_IMAGE_BYTES, 0
    pngs = [p for p in remote.files_under(folder) if p.suffix == ".png"]
    for path in (p for p in pngs if not any(remote.TEMP_NAME.search(part) for part in p.relative_to(folder).parts)):
      size = path.stat().length
      if size > budget:
        skipped += 1
        continue
      budget -= size
      image = {"name": path.relative_to(folder).as_posix(), "src": _data_uri(path)}
      match = _HEAD_IN_NAME.search(path.stem)
      if match:
        layer, head = int(match.group(1)), int(match.group(2))
        if layer >= self.shape[0] or head >= self.shape[1]:
          continue  # a picture of another model's head: no card to put it on
        self.extra(layer, head).setdefault("images", []).append(image)
      else:
        run_level.append(image)
    return run_level, skipped

  def training(self) -> list[dict]:
    """(step, loss) points from metrics.jsonl (not a table: one JSON object per line, at least `step`).
    A line that is no such record (cut off by a killed run, not UTF-8, a step that is not an integer) is
    left out, with one warning naming the file and its first such line; records without a loss (eval
    lines) are skipped quietly."""
    records = metrics.read_metrics(self.workdir)  # the one reader: it skips and warns
    return [{"step": r["step"], "loss": _num(r["loss"])} for r in records if _num(r.get("loss")) is not None]


SAE_LABEL_SETS = ("upos", "deprel", "head_distance")  # sae/features.csv's label columns (headspec/sae/labels.py)
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
_GROUP_NODE = re.compile(r"L\d+G\d+")  # circuit/edges.csv: a grouped-query model's K/V group (downstream of k, v)


def _sae_key(r: dict) -> tuple:
  """(model, step, site, layer, sae): which SAE a row of an sae/*.csv table belongs to."""
  return r["model"], int(r["step"]), r["site"], int(r["layer"]), r["sae"]


def feature_page(key: tuple, feature: int) -> str:
  """The page of a feature of SAE `key` (`_sae_key`), relative to the run directory (and so to atlas.html):
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


def _sae_quality(values: dict | None) -> str:
  """The SAE's quality from sae/metrics.csv, for a cell's note and the card: 'SAE FVU 0.120, L0 16.0, 3.1% dead'."""
  values = values or {}
  parts = [f"{name} {fmt.format(values[key])}" for key, name, fmt in (("fvu", "FVU", "{:.3f}"), ("l0", "L0", "{:.1f}"))
           if values.get(key) is not None]  # fmt: skip
  if values.get("dead_fraction") is not None:
    parts.append(f"{100 * values['dead_fraction']:.1f}% dead")
  if values.get("features") is not None:
    parts.append(f"{values['features']:.0f} features")
  return ("SAE " + ", ".join(parts)) if parts else ""


def _method_label(method: str, steps: int) -> str:
  """An edge-scoring method as the card names it: 'EAP', 'EAP-IG (5 steps)', 'exact'."""
  return EDGE_METHODS.get(method, method) + (f" ({steps} steps)" if method == "eap_ig" else "")


def _method_id(method: str, steps: int) -> str:
  """A method in a metric id: 'eap', 'exact', 'eap_ig-5' (EAP-IG runs with other steps are their own)."""
  return method if method in ("eap", "exact") else f"{method}-{steps}"


def _method_order(method_steps: tuple[str, int]) -> tuple:
  """Most exact first: exact edge patching, EAP-IG (more steps first), EAP, any other by name."""
  method, steps = method_steps
  return (list(EDGE_METHODS).index(method) if method in EDGE_METHODS else len(EDGE_METHODS), -steps, method)


def _kv_groups(workdir: epath.Path, num_heads: int) -> list[int] | None:
  """Each head's K/V group for a run trained with grouped-query attention (config.json model.num_kv_heads,
  head h in group h // (H / num_kv_heads), as ModelConfig.kv_group_of_head); None otherwise (every head its
  own K/V, or no config.json: a pretrained model's folder)."""
  if tables.grid_shape(workdir) is None:
    return None
  groups = remote.read_json(workdir / "config.json")["model"].get("num_kv_heads") or num_heads
  if not isinstance(groups, int) or groups >= num_heads or num_heads % groups:
    return None
  return [h // (num_heads // groups) for h in range(num_heads)]


def _data_uri(path: epath.Path) -> str:
  return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def run_data(workdir, pages: bool = True) -> dict:
  """The page's JSON for one run directory. Raises UserError if it is not a directory or has no
  per-head table at all. `pages`: the cards link each SAE feature to its page (`feature_page`, relative to
  the run directory; headspec/atlas/features.py writes them)."""
  workdir = remote.run_path(workdir)
  if not workdir.is_dir():
    raise UserError(f"{workdir}: no such run directory")
  run = _RunData(workdir, pages)
  if not any(run.rows.values()):
    names = ", ".join(t.path for t in HEAD_TABLES)
    raise UserError(
      f"{workdir}: no results tables ({names}); run `headspec probe`, `diversity`, `ablate`, `attention`, `patch`,"
      " `sae` or `circuit` first"
    )
  run.probes()
  run.structural()
  run.mdl()
  run.diversity()
  run.ablation()
  run.attention()
  run.patching()
  run.sae()
  run.circuit()
  num_layers, num_heads = run.shape
  images, skipped = run.images()
  found = [t.path for t in HEAD_TABLES if run.rows[t.path]]
  return {
    "name": workdir.name,
    "path": str(workdir),  # local: absolute, symlinks resolved (remote.run_path)
    "model": run.primary,
    "layers": num_layers,
    "heads": num_heads,
    "kv_groups": _kv_groups(workdir, num_heads),
    "tables": found,
    "metrics": [m.to_json(num_layers, num_heads) for m in run.metrics.values()],
    "layer_notes": run.layer_notes,
    "heads_extra": run.extras,
    "images": images,
    "images_skipped": skipped,
    "training": run.training(),
  }


def atlas_data(workdir, compare=()) -> dict:
  """The JSON blob of the page: one entry per run, the first the run the page is written into."""
  compare = list(compare)
  for other in compare:
    remote.check_url(other, "--compare")
    if not remote.run_path(other).is_dir():
      raise UserError(f"--compare: no such run directory {other}")
  return {"runs": [run_data(w, pages=i == 0) for i, w in enumerate([workdir, *compare])]}  # pages: the first's
