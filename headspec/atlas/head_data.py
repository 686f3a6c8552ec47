"""The atlas's readers of the per-head tables of probing, diversity, ablation, attention and patching: each
turns its table's rows (checked by `grid.RunData`) into metrics on the grid, notes beside it and card entries.
"""

from __future__ import annotations

import collections

from headspec.atlas.grid import RunData, num, short_split, warn
from headspec.io import tables

# Patching sites with a head axis (headspec.model.sites.SITES; JAX-free copy): the others are per layer.
PATCHING_HEAD_SITES = ("q_in", "k_in", "v_in", "q", "k", "v", "attn_scores", "pattern", "z", "head_out")
TOP_RELATIONS = 5  # best-matched dependency relations on a head's card
TOP_INTERACTIONS = 5  # strongest pairwise ablation interactions on a head's card


def probes(run: RunData) -> None:
  """Probe accuracy and selectivity (probes/results.csv) per task and split; residual stream and embeddings beside."""
  for r in run.rows[tables.PROBES.path]:
    layer, head, step = int(r["layer"]), int(r["head"]), int(r["step"])
    task, split, sfx = r["task"], r["split"], run.suffix(r["model"])
    ml = run.model_label(r["model"])
    n = f"n={r['n']} words"
    acc = run.metric(
      f"probe/{task}/{split}/accuracy{sfx}",
      "Probe accuracy",
      f"{task} accuracy · {short_split(split)}{ml}",
      f"Accuracy of the {task} probe on {split} (95% bootstrap CI over sentences).",
    )
    sel = run.metric(
      f"probe/{task}/{split}/selectivity{sfx}",
      "Probe selectivity",
      f"{task} selectivity · {short_split(split)}{ml}",
      f"Selectivity on {split}: accuracy − control-task accuracy (Hewitt & Liang 2019).",
    )
    a, lo, hi, c = (num(r[k]) for k in ("accuracy", "ci_low", "ci_high", "control_accuracy"))
    control = f"control {c:.3f}" if c is not None else ""
    if layer < 0 or head < 0:  # the embedding output or a layer's residual stream: beside the grid
      for m, v in ((acc, a), (sel, num(r["selectivity"]))):
        run.layer_note(m, step, layer, v)
      continue
    acc.set(step, layer, head, a, (lo, hi), f"{control}; {n}")
    sel.set(step, layer, head, num(r["selectivity"]), None, f"accuracy {a:.3f} − {control}" if a is not None else "")


def structural(run: RunData) -> None:
  """Hewitt & Manning (2019)'s structural probes (probes/structural.csv): one metric per task, split and tree
  metric (UUAS, DSpr, root accuracy, NSpr), with its bootstrap CI; residual stream and embeddings beside."""
  for r in run.rows[tables.PROBE_STRUCTURAL.path]:
    layer, head, step = int(r["layer"]), int(r["head"]), int(r["step"])
    task, split, name = r["task"], r["split"], r["metric"]
    m = run.metric(
      f"structural/{task}/{split}/{name}{run.suffix(r['model'])}",
      "Structural probe",
      f"{task} {name} · {short_split(split)}{run.model_label(r['model'])}",
      f"Structural probe ({task}, Hewitt & Manning 2019): {name} on {split} (95% bootstrap CI over sentences;"
      " docs/probing.md).",
    )
    value = num(r["value"])
    if layer < 0 or head < 0:
      run.layer_note(m, step, layer, value)
      continue
    control, sel = num(r["control_value"]), num(r["selectivity"])
    note = f"control {control:.3f}; selectivity {sel:+.3f}; " if control is not None and sel is not None else ""
    m.set(
      step,
      layer,
      head,
      value,
      (num(r["ci_low"]), num(r["ci_high"])),
      f"{note}rank {r['rank']}; n={r['n']} sentences",
    )


def patching(run: RunData) -> None:
  """Activation, attribution and path patching (patching/results.csv): per task, site, method and direction,
  each head's effect as the fraction of the logit difference it restores, (value − base) / (source − base)
  (Wang et al. 2022; attribution's value is already a change), at its strongest position, with every
  position's on the card; resid_pre patching is the layer's residual-stream column. base and source (the
  unpatched corrupted and clean runs) are summary.csv's; rows without them are left out with a warning."""
  rows = run.rows[tables.PATCHING.path]
  if not rows:
    return
  summary_path = tables.path_of(run.workdir, tables.PATCHING_SUMMARY)
  runs = {}  # (model, step, task, direction) -> (base, source), the same for every site
  for r in tables.read(summary_path, tables.PATCHING_SUMMARY):
    if r["metric"] in ("base", "source"):
      runs.setdefault((r["model"], int(r["step"]), r["task"], r["direction"]), {})[r["metric"]] = num(r["value"])
  effects = collections.defaultdict(dict)  # (model, step, task, method, direction, site, layer, head) -> {pos: x}
  missing = 0
  for r in rows:
    ends = runs.get((r["model"], int(r["step"]), r["task"], r["direction"]), {})
    base, source, value = ends.get("base"), ends.get("source"), num(r["value"])
    if base is None or source is None:
      missing += 1
      continue
    change = value if r["method"] == "attribution" or value is None else value - base
    fraction = change / (source - base) if change is not None and abs(source - base) > 1e-9 else None
    key = (r["model"], int(r["step"]), r["task"], r["method"], r["direction"], r["site"], int(r["layer"]))
    effects[key + (int(r["head"]),)][int(r["position"])] = fraction
  if missing:
    warn(f"{summary_path}: no base and source logit difference for {missing} row(s) of patching/results.csv")
  resid = {k[:5] + (k[6],): v for k, v in effects.items() if k[5] == "resid_pre"}
  last = {}  # the primary model's last step per (task, method, direction, site): its positions go on the card
  for model, step, task, method, direction, site, _layer, head in effects:
    if model == run.primary and head >= 0:
      last[(task, method, direction, site)] = max(step, last.get((task, method, direction, site), step))
  for (model, step, task, method, direction, site, layer, head), by_position in effects.items():
    if site not in PATCHING_HEAD_SITES or head < 0:
      continue
    what = "paths to the logits through no other head" if method == "path_logits" else f"{site} · {method}"
    m = run.metric(
      f"patching/{task}/{site}/{method}/{direction}{run.suffix(model)}",
      "Patching",
      f"{task} · {what} ({direction}){run.model_label(model)}",
      f"Fraction of the {task} logit difference restored by patching the head's {site} ({method}, {direction};"
      " docs/patching.md) at its strongest position; the resid column: the residual stream entering the layer.",
      diverging=True,
    )
    position, best = max(by_position.items(), key=lambda pv: abs(pv[1]) if pv[1] is not None else -1)
    where = "all positions" if position < 0 else f"position {position}"
    m.set(step, layer, head, best, None, f"{where} of 0–{len(by_position) - 1}" if position >= 0 else where)
    stream = resid.get((model, step, task, method, direction, layer))
    if stream:
      run.layer_note(m, step, layer, max(stream.values(), key=lambda v: abs(v) if v is not None else -1))
    if model == run.primary and last[(task, method, direction, site)] == step and position >= 0:
      run.extra(layer, head).setdefault("patching", []).append(
        {
          "label": f"{task} · {what} ({direction})",
          "step": step,
          "positions": [[t, x] for t, x in sorted(by_position.items())],
        }
      )


def mdl(run: RunData) -> None:
  """Online-code MDL compression (probes/mdl.csv) per task."""
  for r in run.rows[tables.MDL.path]:
    layer, head = int(r["layer"]), int(r["head"])
    if layer < 0 or head < 0:
      continue
    m = run.metric(
      f"mdl/{r['task']}/compression{run.suffix(r['model'])}",
      "Probe MDL",
      f"{r['task']} MDL compression{run.model_label(r['model'])}",
      "Online-code compression (uniform bits / codelength bits; Voita & Titov 2020).",
    )
    control = num(r["control_compression"])
    m.set(int(r["step"]), layer, head, num(r["compression"]), None, f"control {control:.3f}" if control else "")


def diversity(run: RunData) -> None:
  """Diversity (diversity/results.csv): per-head metrics, and pairwise ones as the mean over the layer's other heads."""
  pairs = collections.defaultdict(list)  # (model, metric, step, layer, head) -> values vs the layer's other heads
  for r in run.rows[tables.DIVERSITY.path]:
    step, layer, i, j = int(r["step"]), int(r["layer"]), int(r["head_i"]), int(r["head_j"])
    name, model = r["metric"], r["model"]
    if j == -1:
      run.metric(
        f"diversity/{name}{run.suffix(model)}",
        "Diversity (per head)",
        f"{name.replace('_', ' ')}{run.model_label(model)}",
        f"{name} of the head (docs/diversity.md).",
      ).set(step, layer, i, num(r["value"]))
    elif i != j:
      pairs[(model, name, step, layer, i)].append(num(r["value"]))
  for (model, name, step, layer, head), values in sorted(pairs.items()):
    values = [v for v in values if v is not None]
    run.metric(
      f"diversity/{name}/mean_other{run.suffix(model)}",
      "Diversity (mean over the layer's other heads)",
      f"{name.replace('_', ' ')} · mean vs other heads{run.model_label(model)}",
      f"Mean {name} between this head and each other head of its layer (docs/diversity.md).",
    ).set(step, layer, head, sum(values) / len(values) if values else None, None, f"over {len(values)} heads")


def ablation(run: RunData) -> None:
  """Ablation effects (ablation/heads.csv), L0 gates (gates.csv) and, on the cards, the strongest interactions."""
  for r in run.rows[tables.ABLATION_HEADS.path]:
    run.metric(
      f"ablation/{r['method']}/{r['metric']}{run.suffix(r['model'])}",
      "Ablation",
      f"{r['method']} · {r['metric'].replace('_', ' ')}{run.model_label(r['model'])}",
      f"Ablation method {r['method']}, metric {r['metric']} (docs/ablation.md); 95% CI where measured.",
    ).set(int(r["step"]), int(r["layer"]), int(r["head"]), num(r["value"]), (num(r["ci_low"]), num(r["ci_high"])))
  for r in run.rows[tables.ABLATION_GATES.path]:
    if int(r["layer"]) < 0 or int(r["head"]) < 0:  # a per-λ row (expected_l0, loss, ...), not a head
      continue
    run.metric(
      f"gates/{r['penalty']}/open{run.suffix(r['model'])}",
      "Ablation",
      f"gate open probability · penalty {r['penalty']}{run.model_label(r['model'])}",
      "Probability the head's L0 gate is open after training the gates (Voita et al. 2019).",
    ).set(
      int(r["step"]),
      int(r["layer"]),
      int(r["head"]),
      num(r["gate_open_probability"]),
      None,
      f"{r['heads_kept']} heads kept; {r['metric']} {r['value']}",
    )
  by_head = collections.defaultdict(list)
  for r in run.rows[tables.ABLATION_INTERACTIONS.path]:
    if r["model"] != run.primary:
      continue
    a, b = (int(r["layer_a"]), int(r["head_a"])), (int(r["layer_b"]), int(r["head_b"]))
    item = {"metric": r["metric"], "step": int(r["step"]), "interaction": num(r["interaction"])}
    item.update(joint=num(r["joint"]), sum_of_singles=num(r["sum_of_singles"]))
    by_head[a].append(dict(item, other=list(b)))
    by_head[b].append(dict(item, other=list(a)))
  for (layer, head), items in by_head.items():
    items.sort(key=lambda x: -abs(x["interaction"] or 0))
    run.extra(layer, head)["interactions"] = items[:TOP_INTERACTIONS]


def attention(run: RunData) -> None:
  """Clark et al. accuracies (with the best fixed offset's), head role scores and labels; the cards list the
  primary model's best-matched relations at its latest step."""
  baselines = {}
  for r in tables.read(tables.path_of(run.workdir, tables.CLARK_BASELINES), tables.CLARK_BASELINES):
    if r["model"] == run.primary:
      key = (int(r["step"]), r["split"], r["relation"], r["direction"])
      baselines[key] = {"offset": int(r["offset"]), "accuracy": num(r["accuracy"])}
  best = collections.defaultdict(list)
  for r in run.rows[tables.CLARK.path]:
    step, layer, head = int(r["step"]), int(r["layer"]), int(r["head"])
    rel, direction, split = r["relation"], r["direction"], r["split"]
    arrow = "dep→head" if direction == "dependent_to_head" else "head→dep"
    base = baselines.get((step, split, rel, direction))
    note = f"best fixed offset {base['offset']:+d}: {base['accuracy']:.3f}" if base and base["accuracy"] else ""
    note = "; ".join(x for x in (note, f"n={r['n']}") if x)
    run.metric(
      f"clark/{split}/{rel}/{direction}{run.suffix(r['model'])}",
      "Clark et al. accuracy",
      f"{rel} {arrow} · {short_split(split)}{run.model_label(r['model'])}",
      f"Fraction of {rel} words whose most-attended word is their {'head' if arrow == 'dep→head' else 'dependent'}"
      f" (Clark et al. 2019), on {split}.",
    ).set(step, layer, head, num(r["accuracy"]), None, note)
    if r["model"] == run.primary and rel != "all":
      best[(layer, head)].append(
        {
          "relation": rel,
          "direction": arrow,
          "split": split,
          "step": step,
          "accuracy": num(r["accuracy"]),
          "baseline": base,
        }
      )
  for (layer, head), items in best.items():
    last = max(x["step"] for x in items)
    items = [x for x in items if x["step"] == last]
    items.sort(key=lambda x: -(x["accuracy"] or 0))
    run.extra(layer, head)["relations"] = items[:TOP_RELATIONS]
  for r in run.rows[tables.ROLES.path]:
    run.metric(
      f"role/{r['data']}/{r['role']}{run.suffix(r['model'])}",
      "Attention roles",
      f"{r['role'].replace('_', ' ')} score · {r['data']}{run.model_label(r['model'])}",
      f"Score of role {r['role']} measured on {r['data']} input (docs/attention.md), 95% CI.",
    ).set(int(r["step"]), int(r["layer"]), int(r["head"]), num(r["score"]), (num(r["ci_low"]), num(r["ci_high"])))
  for r in run.rows[tables.LABELS.path]:
    run.metric(
      f"label{run.suffix(r['model'])}",
      "Attention roles",
      f"role label{run.model_label(r['model'])}",
      "The head's role label and the rule that gave it (docs/attention.md).",
      categorical=True,
    ).set(int(r["step"]), int(r["layer"]), int(r["head"]), r["label"], None, r["rule"])
