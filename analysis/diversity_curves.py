"""Head-diversity curves over training for several runs: per metric, the mean over layers (thick) and
each layer (thin) against the step (log scale).

  python analysis/diversity_curves.py RUN_A RUN_B --out DIR [--metrics js_distance,linear_cka]

A layer's value is the mean over its heads (per-head metrics, head_j = -1) or over its ordered pairs of
distinct heads (pairwise metrics); docs/diversity.md defines each metric. Reads RUN/diversity/results.csv.
Each run's own model only (the most frequent `model` that is not a `-random` control: a workdir may hold
other models' rows). Writes DIR/diversity_curves.{png,svg} and DIR/diversity_curves.csv.
"""

from __future__ import annotations

import math
import pathlib

from _common import frame, main_guard, need, parser, primary_model, run_dirs, save, step_axis

from headspec.errors import UserError
from headspec.io import tables


def layer_means(df):
  """(metric, step, layer) -> mean over heads (per-head metrics) or over distinct-head pairs."""
  per_head = df[df["head_j"] == -1]
  pairs = df[(df["head_j"] >= 0) & (df["head_i"] != df["head_j"])]
  both = [d.groupby(["metric", "step", "layer"], as_index=False)["value"].mean() for d in (per_head, pairs)]
  import pandas as pd

  return pd.concat(both, ignore_index=True)


def main(argv=None) -> list:
  p = parser(__doc__.splitlines()[0])
  p.add_argument("--metrics", default="", help="comma-separated metric names (default: all)")
  args = p.parse_args(argv)
  import matplotlib.pyplot as plt
  import pandas as pd

  runs = run_dirs(args.runs)
  frames = {run: frame(run, tables.DIVERSITY) for run in runs}
  need(frames, tables.DIVERSITY)
  frames = {run: df if df is None or df.empty else df[df["model"] == primary_model(df)] for run, df in frames.items()}
  means = pd.concat(
    [layer_means(df).assign(run=run.name) for run, df in frames.items() if df is not None], ignore_index=True
  )
  metrics = sorted(set(means["metric"]))
  if args.metrics:
    wanted = [m for m in args.metrics.split(",") if m]
    unknown = sorted(set(wanted) - set(metrics))
    if unknown:
      raise UserError(f"no diversity metric {', '.join(unknown)}; the runs have {', '.join(metrics)}")
    metrics = wanted
  cols = min(4, len(metrics))
  rows = math.ceil(len(metrics) / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.8 * rows), squeeze=False, layout="constrained")
  colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for ax, metric in zip(axes.flat, metrics):
    for k, run in enumerate(frames):
      sub = means[(means["run"] == run.name) & (means["metric"] == metric)]
      if sub.empty:
        continue
      c = colours[k % len(colours)]
      for _, layer in sub.groupby("layer"):
        layer = layer.sort_values("step")
        ax.plot(layer["step"], layer["value"], color=c, lw=0.6, alpha=0.35)
      overall = sub.groupby("step", as_index=False)["value"].mean()
      ax.plot(overall["step"], overall["value"], "o-", color=c, lw=2, ms=3, label=run.name)
    step_axis(ax, means.loc[means["metric"] == metric, "step"])
    ax.set_title(metric, fontsize=9)
    ax.legend(fontsize=6)
  for ax in list(axes.flat)[len(metrics) :]:
    ax.set_visible(False)
  fig.suptitle("diversity over training: mean over layers (thick), each layer (thin)", fontsize=9)
  out = pathlib.Path(args.out)
  written = save(fig, out, "diversity_curves")
  means[means["metric"].isin(metrics)][["run", "metric", "step", "layer", "value"]].to_csv(
    out / "diversity_curves.csv", index=False
  )
  return [*written, out / "diversity_curves.csv"]


if __name__ == "__main__":
  main_guard(main)
