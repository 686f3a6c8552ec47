"""Figures and summary of a probing run, read only from probes/results.csv and probes/baselines.csv.

heatmap_<task>.png: for the latest step of the first model in results.csv, on the primary split (the
test split when it was scored: chosen on dev, reported on test), two
panels (accuracy, selectivity = accuracy − control accuracy, Hewitt & Liang 2019), each a layer × head
grid annotated with its values, with the residual stream (head -1) as a separate column and the
embedding output (layer -1) as a separate row. summary.md: per model, step and task, the most selective
heads ranked on dev and reported on test, with accuracy, 95% CI, control accuracy and selectivity, the
paired selectivity CIs of probes/selectivity.csv, against the majority (or head-offset) baseline and
the embedding layer; and the MDL table when probes/mdl.csv exists. The probes/ folder may be a URL
(gs://bucket/run/probes): every file is read and written whole through etils.epath. Tables are read by
`headspec.io.tables.read`, which checks every row: a bad one is one line `file:line: what is wrong`.
"""

from __future__ import annotations

import matplotlib
import numpy as np
from etils import epath

from headspec.errors import UserError
from headspec.io import remote, tables
from headspec.words import figures


def _grid(rows: list[dict], key: str):
  """(L, H) head grid, (L,) residual column and the embedding value of one (model, step, task, split)."""
  layers = sorted({int(r["layer"]) for r in rows if int(r["layer"]) >= 0})
  heads = sorted({int(r["head"]) for r in rows if int(r["head"]) >= 0})
  grid = np.full((len(layers), len(heads)), np.nan)
  residual = np.full(len(layers), np.nan)
  embedding = np.nan
  for r in rows:
    layer, head, value = int(r["layer"]), int(r["head"]), float(r[key])
    if layer == -1:
      embedding = value
    elif head == -1:
      residual[layers.index(layer)] = value
    else:
      grid[layers.index(layer), heads.index(head)] = value
  return grid, residual, embedding


@matplotlib.rc_context({"text.parse_math": False})  # names and words drawn as written: `$` is not mathtext
def heatmap(rows: list[dict], title: str, path) -> None:
  """Writes the two-panel (accuracy, selectivity) layer × head heatmap of one (model, step, task, split)."""
  fig, axes = figures.new_figure(
    1,
    2,
    figsize=(
      2 + 1.6 * (1 + max(1, len({r["head"] for r in rows}))),
      1.5 + 0.55 * (2 + len({r["layer"] for r in rows})),
    ),
    squeeze=False,
  )
  for ax, key, cmap in zip(axes[0], ("accuracy", "selectivity"), ("viridis", "magma")):
    grid, residual, embedding = _grid(rows, key)
    L, H = grid.shape
    # Columns 0..H-1 heads, H a gap, H+1 the residual stream; rows 0..L-1 layers, L a gap, L+1 embeddings.
    canvas = np.full((L + 2, H + 2), np.nan)
    canvas[:L, :H] = grid
    canvas[:L, H + 1] = residual
    canvas[L + 1, H + 1] = embedding
    values = canvas[np.isfinite(canvas)]
    vmin, vmax = (values.min(), values.max()) if values.size else (0, 1)
    image = ax.imshow(np.ma.masked_invalid(canvas), cmap=cmap, vmin=vmin, vmax=vmax, aspect="auto")
    for (i, j), v in np.ndenumerate(canvas):
      if np.isfinite(v):
        dark = (v - vmin) / max(vmax - vmin, 1e-12) < 0.6
        ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="white" if dark else "black")
    ax.set_xticks(list(range(H)) + [H + 1], [str(h) for h in range(H)] + ["resid"])
    ax.set_yticks(list(range(L)) + [L + 1], [str(l) for l in range(L)] + ["emb"])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(key)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
  fig.suptitle(title, fontsize=10)
  fig.tight_layout()
  remote.save_figure(fig, path, dpi=110)


def _ranking_values(rows: list[dict], task: str, value: str, select_split: str, primary_split: str):
  """({(layer, head): value on select_split} of one task's groups of one (model, step), note): the values
  heads and residual streams are ranked by. A group scored on primary_split without a select_split row is
  refused (one line naming it: a ranking must not fall back to the split it reports); a task with no
  select_split row at all (dev not among `probe.eval_splits`) is ranked on primary_split, and the note
  says so for the summary."""
  groups = lambda split: {
    (r["layer"], r["head"]): float(r[value]) for r in rows if r["task"] == task and r["split"] == split
  }
  chosen, shown = groups(select_split), groups(primary_split)
  if select_split == primary_split:
    return chosen, ""
  if not chosen:
    note = (
      f"**{task}: no `{select_split}` rows, so ranked on `{primary_split}` itself** (the split it reports: "
      f"optimistic; add the dev split to `probe.eval_splits` to rank on it)."
    )
    return shown, note
  missing = [g for g in shown if g not in chosen]
  if missing:
    (layer, head), model, step = missing[0], rows[0]["model"], rows[0]["step"]
    source = "embeddings" if int(layer) == -1 else (f"layer {layer} residual" if int(head) < 0 else f"L{layer}H{head}")
    raise UserError(
      f"probes summary: {model} step {step}, task {task}, {source}: a `{primary_split}` row but no `{select_split}` "
      f"row to rank it by ({len(missing)} such group(s)); probe the (model, step) again"
    )
  return chosen, ""


def _fmt(r: dict) -> str:
  return (
    f"{float(r['accuracy']):.3f} | [{float(r['ci_low']):.3f}, {float(r['ci_high']):.3f}] | "
    f"{float(r['control_accuracy']):.3f} | {float(r['selectivity']):+.3f}"
  )


def _selectivity(path) -> dict:
  rows = tables.read(path, tables.PROBE_SELECTIVITY)
  return {(r["model"], r["step"], r["task"], r["layer"], r["head"], r["split"]): r for r in rows}


def summary(
  rows: list[dict],
  baselines: list[dict],
  primary_split: str,
  top_k: int,
  select_split: str | None = None,
  selectivity: dict | None = None,
) -> str:
  """Markdown: for each model and step, per task, the top-k heads by selectivity on `select_split`
  (the dev split the probes were tuned on; default primary_split), reported on `primary_split` (test),
  with their dev selectivity beside; `selectivity` (probes/selectivity.csv rows by key) adds the paired
  CI of each head's selectivity and of its difference to the next-ranked head."""
  select_split = select_split or primary_split
  selectivity = selectivity or {}
  lines = [
    "# Probing summary",
    "",
    f"Heads ranked by selectivity on `{select_split}` (where L2 was chosen), reported on `{primary_split}`. "
    "selectivity = accuracy − control accuracy (Hewitt & Liang 2019); 95% bootstrap CIs over sentences "
    "(selectivity: task and control on the same resampled sentences; Δ next: paired difference to the "
    "next head in the dev ranking). layer -1 = embeddings, head -1 = the layer's residual stream.",
    "",
  ]
  base = {(b["task"], b["split"]): b for b in baselines}
  models = list(dict.fromkeys(r["model"] for r in rows))
  sections, most_selective = 0, []  # (model, step, task, row of the most selective head)

  def extra(r):
    s = selectivity.get((r["model"], r["step"], r["task"], r["layer"], r["head"], r["split"]))
    if not s:
      return " | |"
    ci = f"[{float(s['selectivity_ci_low']):+.3f}, {float(s['selectivity_ci_high']):+.3f}]"
    d = float(s["delta_next"])
    dn = "" if d != d else f"{d:+.3f} [{float(s['delta_next_ci_low']):+.3f}, {float(s['delta_next_ci_high']):+.3f}]"
    return f" {ci} | {dn} |"

  for model in models:
    steps = sorted({int(r["step"]) for r in rows if r["model"] == model})
    for step in steps:
      sections += 1
      lines += [f"## {model}, step {step}", ""]
      mine = [r for r in rows if r["model"] == model and int(r["step"]) == step]
      sel = [r for r in mine if r["split"] == primary_split]
      lines += overview(mine, base, primary_split, select_split, selectivity)
      for task in dict.fromkeys(r["task"] for r in sel):
        task_rows = [r for r in sel if r["task"] == task]
        dev, note = _ranking_values(mine, task, "selectivity", select_split, primary_split)
        dev_acc, _ = _ranking_values(mine, task, "accuracy", select_split, primary_split)
        heads = sorted((r for r in task_rows if int(r["head"]) >= 0), key=lambda r: -dev[(r["layer"], r["head"])])
        if heads:
          most_selective.append((model, step, task, heads[0]))
        residual = [r for r in task_rows if int(r["head"]) == -1 and int(r["layer"]) >= 0]
        embedding = [r for r in task_rows if int(r["layer"]) == -1]
        b = base.get((task, primary_split))
        header = f"### {task}"
        if b:
          header += f" — {b['baseline']} baseline {float(b['accuracy']):.3f}"
        if embedding:
          header += f", embeddings {float(embedding[0]['accuracy']):.3f}"
        if residual:
          # Chosen on the selection split (dev), reported here: the max of noisy test accuracies is biased upwards.
          best = max(residual, key=lambda r: dev_acc[(r["layer"], r["head"])])
          on = "dev" if not note else primary_split
          header += f", best residual layer (chosen on {on}) {best['layer']} {float(best['accuracy']):.3f}"
        lines += [header, ""] + ([note, ""] if note else [])
        lines += [
          "| layer | head | accuracy | 95% CI | control | selectivity | dev selectivity | selectivity 95% CI | Δ next [95% CI] |",
          "|---|---|---|---|---|---|---|---|---|",
        ]
        lines += [
          f"| {r['layer']} | {r['head']} | {_fmt(r)} | "
          + (f"{dev[(r['layer'], r['head'])]:+.3f} |" if not note else " |")
          + extra(r)
          for r in heads[:top_k]
        ]
        lines.append("")
  if sections > 1:
    lines += [
      "## Most selective head per task",
      "",
      "| model | step | task | layer | head | accuracy | 95% CI | control | selectivity |",
      "|---|---|---|---|---|---|---|---|---|",
    ]
    lines += [
      f"| {model} | {step} | {task} | {r['layer']} | {r['head']} | {_fmt(r)} |"
      for model, step, task, r in most_selective
    ]
    lines.append("")
  return "\n".join(lines)


def overview(rows: list[dict], base: dict, primary_split: str, select_split: str, selectivity: dict) -> list[str]:
  """Markdown lines: one row per task of one (model, step): its baseline, the embeddings, the residual
  stream with the best `select_split` accuracy and the head with the best `select_split` selectivity,
  each reported on `primary_split` as accuracy / control accuracy (the headline table of docs/results.md)."""
  lines = [
    f"Per task on `{primary_split}` (accuracy / control accuracy; residual stream and head chosen on `{select_split}`):",
    "",
    "| task | baseline | embeddings | best residual stream | best head by selectivity | its selectivity [95% CI] |",
    "|---|---|---|---|---|---|",
  ]
  report = [r for r in rows if r["split"] == primary_split]
  pair = lambda r: f"{float(r['accuracy']):.3f} / {float(r['control_accuracy']):.3f}"
  key = lambda r: (r["layer"], r["head"])
  notes = []
  for task in dict.fromkeys(r["task"] for r in report):
    mine = [r for r in report if r["task"] == task]
    dev_acc, note = _ranking_values(rows, task, "accuracy", select_split, primary_split)
    dev_sel, _ = _ranking_values(rows, task, "selectivity", select_split, primary_split)
    notes += [note] if note else []
    embedding = next((pair(r) for r in mine if int(r["layer"]) == -1), "")
    residual = [r for r in mine if int(r["head"]) == -1 and int(r["layer"]) >= 0]
    heads = [r for r in mine if int(r["head"]) >= 0]
    b = base.get((task, primary_split))
    cells = [task, f"{float(b['accuracy']):.3f} ({b['baseline']})" if b else "", embedding]
    if residual:
      r = max(residual, key=lambda r: dev_acc.get(key(r), float("-inf")))
      cells.append(f"{pair(r)} (layer {r['layer']})")
    else:
      cells.append("")
    if heads:
      r = max(heads, key=lambda r: dev_sel.get(key(r), float("-inf")))
      s = selectivity.get((r["model"], r["step"], task, r["layer"], r["head"], primary_split))
      ci = f" [{float(s['selectivity_ci_low']):+.3f}, {float(s['selectivity_ci_high']):+.3f}]" if s else ""
      cells += [f"{pair(r)} (L{r['layer']} H{r['head']})", f"{float(r['selectivity']):+.3f}{ci}"]
    else:
      cells += ["", ""]
    lines.append("| " + " | ".join(cells) + " |")
  return lines + [""] + [line for note in notes for line in (note, "")]


def write_report(out_dir, *, primary_split: str, top_k: int = 5, select_split: str | None = None, skipped=()) -> None:
  """summary.md and heatmap_<task>.png (on primary_split) in out_dir (a run's probes/ folder) from its CSVs;
  heads are ranked on select_split (default primary_split). skipped: a line per split that lost sentences
  the model cannot represent (align.Representable.summary), listed under the tables."""
  out_dir = epath.Path(out_dir)
  rows = tables.read(out_dir / "results.csv", tables.PROBES)
  baselines = tables.read(out_dir / "baselines.csv", tables.PROBE_BASELINES)
  text = summary(rows, baselines, primary_split, top_k, select_split, _selectivity(out_dir / "selectivity.csv"))
  if skipped:
    text += "\n## Skipped sentences\n\nThe model cannot represent these; every number above is over the others.\n\n"
    text += "".join(f"- {line}\n" for line in skipped)
  structural = tables.read(out_dir / "structural.csv", tables.PROBE_STRUCTURAL)
  if structural:
    text += structural_summary(structural, baselines, primary_split, select_split or primary_split, top_k)
  mdl = tables.read(out_dir / "mdl.csv", tables.MDL)
  if mdl:
    text += mdl_summary(mdl)
  remote.write_bytes_atomic(out_dir / "summary.md", text.encode())
  _structural_heatmaps(structural, out_dir, primary_split)
  if not rows:
    return
  model, step = _last_step_of_trained(rows)
  for task in dict.fromkeys(r["task"] for r in rows):
    sel = [
      r
      for r in rows
      if r["model"] == model and int(r["step"]) == step and r["task"] == task and r["split"] == primary_split
    ]
    if sel:
      heatmap(sel, f"{model} step {step}: {task} probes on {primary_split}", out_dir / f"heatmap_{task}.png")


def _last_step_of_trained(rows: list[dict]) -> tuple[str, int]:
  """(model, step) the heatmaps draw: the first model that is not a random baseline, at its last step."""
  models = list(dict.fromkeys(r["model"] for r in rows))
  model = next((m for m in models if not m.endswith("-random")), models[0])
  return model, max(int(r["step"]) for r in rows if r["model"] == model)


def _structural_heatmaps(rows: list[dict], out_dir, split: str) -> None:
  """heatmap_<metric>.png (uuas, dspr, root_acc, nspr) of the trained model's last step on `split`."""
  if not rows:
    return
  model, step = _last_step_of_trained(rows)
  for metric in dict.fromkeys(r["metric"] for r in rows):
    sel = [
      dict(r, accuracy=r["value"])
      for r in rows
      if (r["model"], int(r["step"]), r["metric"], r["split"]) == (model, step, metric, split)
    ]
    if sel:
      task = sel[0]["task"]
      heatmap(
        sel, f"{model} step {step}: {task} probe {metric} on {split}", epath.Path(out_dir) / f"heatmap_{metric}.png"
      )


def structural_summary(rows: list[dict], baselines: list[dict], split: str, select_split: str, top_k: int) -> str:
  """Markdown: per model, step and metric, the embeddings, every residual stream and the top_k heads
  (ranked on select_split, reported on split) with CI, control-tree value and selectivity; the
  linear-structure baseline beside each metric."""
  linear = {(b["task"], b["baseline"]): float(b["accuracy"]) for b in baselines if b["split"] == split}
  lines = ["## Structural probes (Hewitt & Manning 2019)", ""]
  lines += [
    f"On {split}; heads ranked on {select_split}. control: the same probe fitted to control trees "
    "(probing/controls.py); linear: distances |i − j|, depth = position (H&M's linear baseline).",
    "",
    "| model | step | metric | source | value | 95% CI | control | selectivity | linear |",
    "|---|---|---|---|---|---|---|---|---|",
  ]
  notes = []
  for model, step, metric in dict.fromkeys((r["model"], r["step"], r["metric"]) for r in rows):
    mine = [r for r in rows if (r["model"], r["step"], r["metric"]) == (model, step, metric)]
    here = [r for r in mine if r["split"] == split]
    value, note = _ranking_values(mine, mine[0]["task"], "value", select_split, split)
    notes += [f"{model} step {step}, {metric}: {note}"] if note else []
    heads = sorted((r for r in here if int(r["head"]) >= 0), key=lambda r: -value[(r["layer"], r["head"])])
    picked = [r for r in here if int(r["head"]) < 0] + heads[:top_k]
    for r in picked:
      layer, head = int(r["layer"]), int(r["head"])
      source = "embeddings" if layer == -1 else (f"layer {layer} residual" if head < 0 else f"L{layer}H{head}")
      base = linear.get((r["task"], f"linear_{metric}"), float("nan"))
      lines.append(
        f"| {model} | {step} | {metric} | {source} | {float(r['value']):.3f} | [{float(r['ci_low']):.3f}, "
        f"{float(r['ci_high']):.3f}] | {float(r['control_value']):.3f} | {float(r['selectivity']):+.3f} | {base:.3f} |"
      )
  return "\n".join(lines + [""] + [line for note in notes for line in (note, "")])


def mdl_summary(rows: list[dict]) -> str:
  """Markdown: per model, step and task, the groups with the highest MDL compression (Voita & Titov 2020)."""
  lines = ["## MDL (online code, Voita & Titov 2020)", ""]
  lines += [
    "| model | step | task | layer | head | codelength (kbits) | compression | control compression |",
    "|---|---|---|---|---|---|---|---|",
  ]
  keys = dict.fromkeys((r["model"], r["step"], r["task"]) for r in rows)
  for model, step, task in keys:
    mine = [r for r in rows if (r["model"], r["step"], r["task"]) == (model, step, task)]
    for r in sorted(mine, key=lambda r: -float(r["compression"]))[:3]:
      lines.append(
        f"| {model} | {step} | {task} | {r['layer']} | {r['head']} | {float(r['codelength_bits']) / 1e3:.1f} | "
        f"{float(r['compression']):.2f} | {float(r['control_compression']):.2f} |"
      )
  return "\n".join(lines + [""])
