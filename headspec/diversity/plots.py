"""Figures of diversity/results.csv: metric curves over training, H×H matrices per layer, an animation.

Reads only the table (rows `step,layer,head_i,head_j,metric,value`), never a model. Drawn with
matplotlib's object API on the Agg canvas (no pyplot state, no display needed); the GIF is written by
matplotlib's PillowWriter.
"""

from __future__ import annotations

import math
import pathlib
import sys
from collections import defaultdict

import matplotlib
import numpy as np
from matplotlib import animation
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from headspec.diversity.metrics import HEAD_METRICS, METRICS, PAIR_METRICS, REGISTRY
from headspec.io import remote
from headspec.words import figures

GIF_METRIC = "output_dissimilarity"
_LOG_Y_SPAN = 100.0  # log y-axis when a metric's positive values span at least two decades


def tables(rows, shape: tuple[int, int] | None = None) -> dict[str, dict[int, np.ndarray]]:
  """{metric: {step: [L,H,H] (pairs) or [L,H] (heads)}} from table rows (NaN where a cell is missing).

  `shape`: the model's (L, H). Rows outside it (another model's, a hand-edited table: layer=100000 would
  allocate a 10^15-cell array) are left out with one warning. Without it, each (metric, step) is as large
  as its rows."""
  grouped, outside = defaultdict(list), []
  for step, layer, i, j, metric, value in rows:
    L, H = shape or (math.inf, math.inf)
    if 0 <= layer < L and 0 <= i < H and -1 <= j < H:
      grouped[metric, step].append((layer, i, j, value))
    else:
      outside.append((step, layer, i, j, metric))
  if outside:
    grid = f"the model's {shape[0]} layers × {shape[1]} heads" if shape else "the grid (a negative index)"
    print(
      f"headspec: warning: diversity/results.csv: {len(outside)} row(s) outside {grid} left out of the figures "
      f"(the first: step, layer, head_i, head_j, metric = {outside[0]})",
      file=sys.stderr,
      flush=True,
    )
  out = defaultdict(dict)
  for (metric, step), cells in grouped.items():
    layer, i, j, value = (np.array(c) for c in zip(*cells))
    L, H = shape or (int(layer.max()) + 1, int(i.max()) + 1)
    if metric in HEAD_METRICS or (j < 0).all():
      arr = np.full((L, H), np.nan)
      arr[layer, i] = value
    else:
      arr = np.full((L, H, H), np.nan)
      arr[layer, i, j] = value
    out[metric][step] = arr
  return dict(out)


def layer_means(arr: np.ndarray) -> np.ndarray:
  """[L]: mean over heads, or over off-diagonal pairs i ≠ j (as metrics.summarize)."""
  if arr.ndim == 3:
    H = arr.shape[-1]
    return arr[:, ~np.eye(H, dtype=bool)].mean(-1)
  return arr.mean(-1)


def _title(metric: str) -> str:
  """The metric's name in words, marked when it compares heads' own coordinates (`Metric.basis_dependent`)."""
  basis = metric in REGISTRY and REGISTRY[metric].basis_dependent
  return metric.replace("_", " ") + (" (basis-dependent)" if basis else "")


def _figure(nrows: int, ncols: int, width: float, height: float):
  fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
  FigureCanvasAgg(fig)
  return fig, fig.subplots(nrows, ncols, squeeze=False)


def _set_step_axis(ax, steps) -> None:
  """Log x for steps (symlog when step 0 is present, linear below the first positive step)."""
  positive = [s for s in steps if s > 0]
  if len(steps) < 2 or not positive:
    return
  figures.log_x(ax, linthresh=None if len(positive) == len(steps) else min(positive))
  if len(steps) <= 8:
    ax.set_xticks(steps)  # each checkpoint labelled, also within one decade


@matplotlib.rc_context({"text.parse_math": False})  # names and words drawn as written: `$` is not mathtext
def plot_curves(data, path) -> pathlib.Path:
  """One panel per metric: each layer's mean over heads (or off-diagonal pairs) against the step."""
  names = [m for m in METRICS if m in data] + sorted(set(data) - set(METRICS))
  ncols = min(4, len(names))
  fig, axes = _figure(math.ceil(len(names) / ncols), ncols, 3.6, 2.8)
  for ax in axes.flat[len(names) :]:
    ax.set_visible(False)
  for ax, name in zip(axes.flat, names):
    steps = sorted(data[name])
    means_by_step = np.stack([layer_means(data[name][s]) for s in steps])
    colors = [f"C{l % 10}" for l in range(means_by_step.shape[1])]
    for l in range(means_by_step.shape[1]):
      ax.plot(steps, means_by_step[:, l], marker="o", markersize=3, color=colors[l], label=f"layer {l}")
    _set_step_axis(ax, steps)
    finite = means_by_step[np.isfinite(means_by_step)]
    if finite.size and finite.min() > 0 and finite.max() / finite.min() >= _LOG_Y_SPAN:
      ax.set_yscale("log")
    else:
      ax.ticklabel_format(axis="y", useOffset=False)  # plain values, not "1e-5 + 2.5388"
    ax.set_title(_title(name), fontsize=10)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  axes.flat[0].legend(fontsize=7)
  fig.suptitle("per-layer mean over heads (pairs i≠j for pair metrics)")
  remote.save_figure(fig, path, dpi=100)
  return pathlib.Path(path)


def _matrix_panels(fig, axes, arr_LHH, vmin, vmax, cmap="viridis"):
  """One H×H heatmap per layer; the diagonal (a head with itself) is blanked so it does not set the scale."""
  L, H = arr_LHH.shape[:2]
  image = None
  for ax in axes.flat[L:]:
    ax.set_visible(False)
  for l, ax in enumerate(axes.flat[:L]):
    shown = np.where(np.eye(H, dtype=bool), np.nan, arr_LHH[l])
    image = ax.imshow(shown, vmin=vmin, vmax=vmax, cmap=cmap)
    ax.set_title(f"layer {l}", fontsize=9)
    ax.set_xticks(range(H))
    ax.set_yticks(range(H))
    ax.tick_params(labelsize=6)
    ax.set_xlabel("head j", fontsize=7)
    ax.set_ylabel("head i", fontsize=7)
  return image


def _off_diagonal_range(arrays) -> tuple[float, float]:
  vals = np.concatenate([a[:, ~np.eye(a.shape[-1], dtype=bool)].ravel() for a in arrays])
  vals = vals[np.isfinite(vals)]
  if not vals.size:
    return 0.0, 1.0
  lo, hi = float(vals.min()), float(vals.max())
  return (lo, hi) if hi > lo else (lo - 0.5, hi + 0.5)


def _grid(L: int) -> tuple[int, int]:
  ncols = min(L, 4)
  return math.ceil(L / ncols), ncols


@matplotlib.rc_context({"text.parse_math": False})
def plot_matrix(arr_LHH: np.ndarray, metric: str, step: int, path) -> pathlib.Path:
  """The H×H matrix of a pair metric, one panel per layer, at one step."""
  fig, axes = _figure(*_grid(arr_LHH.shape[0]), 2.6, 2.4)
  vmin, vmax = _off_diagonal_range([arr_LHH])
  image = _matrix_panels(fig, axes, arr_LHH, vmin, vmax)
  fig.colorbar(image, ax=axes, shrink=0.8)
  fig.suptitle(f"{metric.replace('_', ' ')}, step {step} (diagonal blank)")
  remote.save_figure(fig, path, dpi=100)
  return pathlib.Path(path)


@matplotlib.rc_context({"text.parse_math": False})
def plot_heads(data, step: int, path) -> pathlib.Path:
  """Per-head metrics at one step: an L×H heatmap per metric."""
  names = [m for m in HEAD_METRICS if m in data and step in data[m]]
  fig, axes = _figure(1, len(names), 3.6, 2.8)
  for ax, name in zip(axes.flat, names):
    arr_LH = data[name][step]
    image = ax.imshow(arr_LH, aspect="auto", cmap="magma")
    ax.set_title(name.replace("_", " "), fontsize=10)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_xticks(range(arr_LH.shape[1]))
    ax.set_yticks(range(arr_LH.shape[0]))
    fig.colorbar(image, ax=ax).formatter.set_useOffset(False)
  fig.suptitle(f"per-head attention statistics, step {step}")
  remote.save_figure(fig, path, dpi=100)
  return pathlib.Path(path)


@matplotlib.rc_context({"text.parse_math": False})
def animate_matrix(per_step: dict[int, np.ndarray], metric: str, path, fps: float = 2.0) -> pathlib.Path:
  """GIF, one frame per step (ascending), of the per-layer H×H matrices on one fixed colour scale."""
  steps = sorted(per_step)
  arrays = [per_step[s] for s in steps]
  fig, axes = _figure(*_grid(arrays[0].shape[0]), 2.6, 2.4)
  vmin, vmax = _off_diagonal_range(arrays)
  writer = animation.PillowWriter(fps=fps)
  with writer.saving(fig, str(path), dpi=80):
    for step, arr in zip(steps, arrays):
      for ax in axes.flat:
        ax.clear()
      image = _matrix_panels(fig, axes, arr, vmin, vmax)
      if step == steps[0]:
        fig.colorbar(image, ax=axes, shrink=0.8)
      fig.suptitle(f"{metric.replace('_', ' ')}, step {step}")
      writer.grab_frame()
  return pathlib.Path(path)


def plot_all(rows, out_dir, shape: tuple[int, int] | None = None) -> list[pathlib.Path]:
  """Every figure of a results table into out_dir: curves.png, matrix_<metric>.png (last step),
  heads.png (last step) and <GIF_METRIC>.gif (all steps). `shape`: the model's (L, H), see `tables`."""
  out_dir = pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  data = tables(rows, shape)
  if not data:
    return []
  written = [plot_curves(data, out_dir / "curves.png")]
  for metric in PAIR_METRICS:
    if metric in data:
      last = max(data[metric])
      written.append(plot_matrix(data[metric][last], metric, last, out_dir / f"matrix_{metric}.png"))
  head_steps = [max(data[m]) for m in HEAD_METRICS if m in data]
  if head_steps:
    written.append(plot_heads(data, max(head_steps), out_dir / "heads.png"))
  if GIF_METRIC in data:
    written.append(animate_matrix(data[GIF_METRIC], GIF_METRIC, out_dir / f"{GIF_METRIC}.gif"))
  return written
