"""Probe heatmaps of several runs side by side: per task, one layer × head grid per run (its own model
at its last step, or --step), on one shared colour scale.

  python analysis/probe_heatmaps.py RUN_A RUN_B --out DIR [--value selectivity] [--split dev]

Reads RUN/probes/results.csv; each grid is the model's (RUN/config.json), rows outside it are left out with
one warning. Writes DIR/probe_heatmaps_<task>_<value>.{png,svg}.
"""

from __future__ import annotations

import pathlib

import numpy as np
from _common import frame, heads_only, in_grid, main_guard, need, parser, primary_model, run_dirs, save

from headspec.errors import UserError
from headspec.io import tables


def grid(df, shape: tuple[int, int]) -> np.ndarray:
  """The layer × head array of `df`'s values; `shape` is the model's (`_common.in_grid`), never the rows'."""
  values = np.full(shape, np.nan)
  values[df["layer"].to_numpy(), df["head"].to_numpy()] = df["value"].to_numpy()
  return values


def main(argv=None) -> list:
  p = parser(__doc__.splitlines()[0])
  p.add_argument("--value", default="selectivity", choices=("accuracy", "selectivity", "control_accuracy"))
  p.add_argument("--split", default="dev", help="split name or suffix (dev, test, en_ewt/dev); default: dev")
  p.add_argument("--step", type=int, default=None, help="checkpoint step (default: each run's last)")
  args = p.parse_args(argv)
  import matplotlib.pyplot as plt

  runs = run_dirs(args.runs)
  frames = {run: frame(run, tables.PROBES) for run in runs}
  need(frames, tables.PROBES)
  panels = {}  # task -> [(title, grid)]
  for run, df in frames.items():
    if df is None:
      continue
    model = primary_model(df)
    df, shape = in_grid(heads_only(df[df["model"] == model]), run, tables.PROBES)
    split = next((s for s in sorted(set(df["split"])) if s == args.split or s.endswith("/" + args.split)), None)
    if split is None:
      raise UserError(
        f"{run}: no split {args.split!r} in probes/results.csv (has {', '.join(sorted(set(df['split'])))})"
      )
    step = args.step if args.step is not None else int(df["step"].max())
    for task in sorted(set(df["task"])):
      sub = df[(df["task"] == task) & (df["split"] == split) & (df["step"] == step)]
      if len(sub):
        panels.setdefault(task, []).append(
          (f"{run.name} ({model}, step {step}, {split})", grid(sub.assign(value=sub[args.value]), shape))
        )
  written = []
  for task, items in panels.items():
    finite = np.concatenate([g[np.isfinite(g)] for _, g in items])
    diverging = args.value == "selectivity"
    vmax = float(np.abs(finite).max()) if diverging else float(finite.max())
    vmin = -vmax if diverging else float(finite.min())
    fig, axes = plt.subplots(
      1,
      len(items),
      figsize=(0.9 + 3.6 * len(items), 0.6 + 0.28 * max(g.shape[0] for _, g in items) + 1.2),
      squeeze=False,
      layout="constrained",
    )
    for ax, (title, g) in zip(axes[0], items):
      image = ax.imshow(g, cmap="RdBu_r" if diverging else "viridis", vmin=vmin, vmax=vmax, aspect="auto")
      if g.size <= 144:
        for (i, j), v in np.ndenumerate(g):
          if np.isfinite(v):
            ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=6)
      ax.set_xticks(range(g.shape[1]))
      ax.set_yticks(range(g.shape[0]))
      ax.tick_params(labelsize=6 if max(g.shape) > 8 else 8)
      ax.set_title(title, fontsize=8)
      ax.set_xlabel("head")
      ax.set_ylabel("layer")
    fig.colorbar(image, ax=list(axes[0]), fraction=0.03, pad=0.02, label=f"{task} {args.value}")
    written += save(fig, pathlib.Path(args.out), f"probe_heatmaps_{task}_{args.value}")
  return written


if __name__ == "__main__":
  main_guard(main)
