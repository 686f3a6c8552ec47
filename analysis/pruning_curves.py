"""Pruning curves and the comparison of head rankings, from ablation/pruning.csv, for several runs.

  python analysis/pruning_curves.py RUN [RUN_B ...] --out DIR

Curves: per run (columns) and metric (rows), the metric against the fraction of heads pruned, one line
per ranking (`headspec ablate` prunes heads in ranking order); rankings with several seeds (random
orders) are drawn as their mean with a min–max band over seeds. Each run's last step, or --step.

Ranking comparison: each ranking's mean metric over the pruning curve (trapezoidal area under the
curve divided by the range of fractions pruned; for a loss lower is better, for an accuracy higher),
as points with the min–max over seeds, and as DIR/pruning_rankings.csv.

Writes DIR/pruning_curves.{png,svg}, DIR/pruning_rankings.{png,svg}, DIR/pruning_rankings.csv.
"""

from __future__ import annotations

import pathlib

import numpy as np
from _common import frame, main_guard, need, parser, primary_model, run_dirs, save

from headspec.io import tables


def curve_mean(sub) -> float:
  """Area under value(fraction_pruned) over the fraction range: the curve's mean value."""
  sub = sub.sort_values("fraction_pruned")
  x, y = sub["fraction_pruned"].to_numpy(), sub["value"].to_numpy()
  if len(x) < 2 or x[-1] == x[0]:
    return float(y.mean())
  return float(np.sum((y[1:] + y[:-1]) / 2 * np.diff(x)) / (x[-1] - x[0]))


def main(argv=None) -> list:
  p = parser(__doc__.splitlines()[0])
  p.add_argument("--step", type=int, default=None, help="checkpoint step (default: each run's last)")
  args = p.parse_args(argv)
  import matplotlib.pyplot as plt
  import pandas as pd

  runs = run_dirs(args.runs)
  frames = {run: frame(run, tables.ABLATION_PRUNING) for run in runs}
  need(frames, tables.ABLATION_PRUNING)
  picked = {}
  for run, df in frames.items():
    if df is None:
      continue
    df = df[df["model"] == primary_model(df)]
    step = args.step if args.step is not None else int(df["step"].max())
    picked[run] = df[df["step"] == step]
  metrics = sorted(set().union(*(set(df["metric"]) for df in picked.values())))
  colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  rankings = sorted(set().union(*(set(df["ranking"]) for df in picked.values())))
  colour_of = {r: colours[i % len(colours)] for i, r in enumerate(rankings)}
  fig, axes = plt.subplots(
    len(metrics), len(picked), figsize=(3.8 * len(picked), 2.8 * len(metrics)), squeeze=False, layout="constrained"
  )
  summary = []
  for j, (run, df) in enumerate(picked.items()):
    for i, metric in enumerate(metrics):
      ax = axes[i][j]
      for ranking, sub in df[df["metric"] == metric].groupby("ranking"):
        by_fraction = sub.groupby("fraction_pruned")["value"]
        mean, low, high = by_fraction.mean(), by_fraction.min(), by_fraction.max()
        seeds = sorted(set(sub["seed"]))
        label = ranking + (f" (mean of {len(seeds)} seeds)" if len(seeds) > 1 else "")
        ax.plot(mean.index, mean.to_numpy(), "-", color=colour_of[ranking], label=label)
        if len(seeds) > 1:
          ax.fill_between(mean.index, low.to_numpy(), high.to_numpy(), color=colour_of[ranking], alpha=0.2)
        per_seed = [curve_mean(s) for _, s in sub.groupby("seed")]
        summary.append(
          dict(
            run=run.name,
            step=int(sub["step"].iloc[0]),
            metric=metric,
            ranking=ranking,
            seeds=len(seeds),
            curve_mean=float(np.mean(per_seed)),
            seed_min=float(np.min(per_seed)),
            seed_max=float(np.max(per_seed)),
          )
        )
      ax.set_title(f"{run.name}: {metric}", fontsize=9)
      ax.set_xlabel("fraction of heads pruned")
      ax.set_ylabel(metric)
      ax.legend(fontsize=6)
  out = pathlib.Path(args.out)
  written = save(fig, out, "pruning_curves")
  table = pd.DataFrame(summary)
  table.to_csv(out / "pruning_rankings.csv", index=False)
  fig, axes = plt.subplots(
    1, len(metrics), figsize=(1.5 + 1.2 * len(picked) * len(rankings), 3.2), squeeze=False, layout="constrained"
  )
  width = 0.8 / len(rankings)
  for ax, metric in zip(axes[0], metrics):
    sub = table[table["metric"] == metric]
    for k, ranking in enumerate(rankings):
      rows = [sub[(sub["run"] == run.name) & (sub["ranking"] == ranking)] for run in picked]
      x = np.arange(len(picked)) + k * width
      y = [r["curve_mean"].iloc[0] if len(r) else np.nan for r in rows]
      err = [
        [y0 - r["seed_min"].iloc[0] if len(r) else 0 for y0, r in zip(y, rows)],
        [r["seed_max"].iloc[0] - y0 if len(r) else 0 for y0, r in zip(y, rows)],
      ]
      ax.errorbar(x, y, yerr=err, fmt="o", color=colour_of[ranking], label=ranking, capsize=3)
    ax.set_xticks(np.arange(len(picked)) + width * (len(rankings) - 1) / 2, [r.name for r in picked], fontsize=8)
    ax.set_ylabel(f"mean {metric} over the pruning curve")
    ax.legend(fontsize=6)
  written += save(fig, out, "pruning_rankings")
  return [*written, out / "pruning_rankings.csv"]


if __name__ == "__main__":
  main_guard(main)
