"""Probe complexity sweep (Hewitt & Liang 2019, "Designing and Interpreting Probes with Control Tasks",
EMNLP, §4 and Fig. 3): accuracy, control accuracy and selectivity of every probe at every L2 penalty λ.

A probe's complexity is its capacity to memorise; for the linear softmax probe here it is controlled by
λ (larger λ = simpler probe). Hewitt & Liang show that accuracy alone rewards complex probes, which also
fit the control task (each word type mapped to a random label), while selectivity = accuracy − control
accuracy peaks at a moderate complexity and is the number to compare representations by. The suite
fits every (group, task, λ) probe to convergence anyway (probe.fit_softmax_probes, then keeps the λ with
the best dev accuracy); with `probe.complexity=True` it also writes all of them, so the choice of λ can
be inspected: probes/complexity.csv (tables.COMPLEXITY) and probes/complexity_<task>.png.

Numbers are on the tuning (dev) split, where λ is chosen: this table describes the choice, it does not
report results (those are on test in results.csv). Softmax tasks only (upos, xpos, deprel); the arc
probe's complexity is its rank (`probe.arc_rank`).
"""

from __future__ import annotations

import numpy as np

from headspec.io import remote, tables


def complexity_rows(model: str, step: int, task: str, layer: int, heads, fitted, split: str, n: int) -> list[dict]:
  """probes/complexity.csv rows of one feature source (`layer`, its `heads`; -1 = residual) and one
  softmax task, from its FittedProbes: dev accuracy of the task and its control at every λ."""
  accuracy_GP = np.asarray(fitted.dev_accuracy[task], np.float64)
  control_GP = np.asarray(fitted.dev_accuracy[f"{task}/control"], np.float64)
  l2_P = sorted(fitted.l2_grid)
  rows = []
  for g, head in enumerate(heads):
    for p, l2 in enumerate(l2_P):
      rows.append(
        dict(
          model=model,
          step=step,
          task=task,
          layer=layer,
          head=head,
          split=split,
          l2=float(f"{float(l2):.6g}"),  # the grid as configured, not its float32 rounding
          accuracy=accuracy_GP[g, p],
          control_accuracy=control_GP[g, p],
          selectivity=accuracy_GP[g, p] - control_GP[g, p],
          n=n,
        )
      )
  return rows


def figure(rows: list[dict], path) -> None:
  """complexity_<task>.png of one task at one (model, step): accuracy, control accuracy and selectivity
  against λ; heads as thin grey lines with their mean in black, residual streams coloured by layer."""
  import matplotlib

  from headspec.words import figures

  l2 = sorted({float(r["l2"]) for r in rows})
  groups = sorted({(int(r["layer"]), int(r["head"])) for r in rows})
  value = {(int(r["layer"]), int(r["head"]), float(r["l2"]), m): float(r[m]) for r in rows for m in _METRICS}
  fig, axes = figures.new_figure(1, 3, figsize=(13, 3.8), sharex=True)
  cmap = matplotlib.colormaps["viridis"]
  layers = sorted({g[0] for g in groups})
  for ax, metric in zip(axes, _METRICS):
    heads = [[value[(ly, h, x, metric)] for x in l2] for ly, h in groups if h >= 0]
    for line in heads:
      ax.plot(l2, line, color="0.75", lw=0.6)
    if heads:
      ax.plot(l2, np.mean(heads, 0), color="black", lw=2, label="heads (mean)")
    for ly, h in groups:
      if h < 0:
        color = cmap(layers.index(ly) / max(len(layers) - 1, 1))
        ax.plot(l2, [value[(ly, h, x, metric)] for x in l2], color=color, lw=1.5, label=f"residual L{ly}")
    ax.set_xscale("log")
    ax.set_xlabel("L2 penalty λ (larger = simpler probe)")
    ax.set_title(metric.replace("_", " "))
  axes[0].legend(fontsize=7)
  r = rows[0]
  fig.suptitle(
    f"{r['model']} step {r['step']} — {r['task']}: complexity sweep on {r['split']} (Hewitt & Liang 2019)",
    parse_math=False,  # a model or split name with `$` is drawn as written, not as mathtext
  )
  fig.tight_layout()
  remote.save_figure(fig, path, dpi=100)


_METRICS = ("accuracy", "control_accuracy", "selectivity")


def write_figures(out_dir) -> list:
  """complexity_<task>.png for the latest step of the first model in probes/complexity.csv."""
  rows = tables.read(remote.run_path(out_dir) / "complexity.csv", tables.COMPLEXITY)
  if not rows:
    return []
  model = rows[0]["model"]
  step = max(int(r["step"]) for r in rows if r["model"] == model)
  made = []
  for task in dict.fromkeys(r["task"] for r in rows):
    mine = [r for r in rows if r["model"] == model and int(r["step"]) == step and r["task"] == task]
    path = remote.run_path(out_dir) / f"complexity_{task}.png"
    figure(mine, path)
    made.append(path)
  return made
