"""Shared helpers of the analysis/ scripts: read run outputs (only through headspec.io.tables, plus
metrics.jsonl), pick a run's model and splits, and save each figure as PNG and SVG.

No JAX, no model code, no checkpoints: `pip install -e ".[analysis]"` is enough (pandas, matplotlib).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["text.parse_math"] = False  # run, model and split names drawn as written: `$` is not mathtext
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from headspec.errors import UserError  # noqa: E402
from headspec.io import metrics, tables  # noqa: E402

BOOTSTRAP_DRAWS = 2000


def parser(description: str, *, several: bool = True) -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(description=description)
  p.add_argument("runs", nargs="+" if several else 1, help="run directories (headspec --workdir)")
  p.add_argument("--out", required=True, help="folder for the figures (PNG and SVG) and tables")
  return p


def run_dirs(paths) -> list[pathlib.Path]:
  runs = [pathlib.Path(p) for p in paths]
  for run in runs:
    if not run.is_dir():
      raise UserError(f"{run}: no such run directory")
  return runs


def frame(run: pathlib.Path, table: tables.Table):
  """The table as a DataFrame, or None when the run has not written it."""
  path = tables.path_of(run, table)
  return tables.read_frame(path, table) if path.exists() else None


def need(frames: dict, table: tables.Table):
  """Fails with one line when none of the runs has `table`."""
  if all(f is None for f in frames.values()):
    raise UserError(f"none of {', '.join(str(r) for r in frames)} has {table.path}")


def primary_model(df) -> str:
  """The run's own model: the most frequent `model` that is not a `-random` control."""
  models = df.loc[~df["model"].str.endswith("-random"), "model"]
  return (models if len(models) else df["model"]).value_counts().index[0]


def select_and_report_splits(splits) -> tuple[str, str]:
  """(selection split, report split): the dev split selects, the test split reports when there is one
  (selecting and reporting on one split is biased upward); with no test split both are dev."""
  splits = sorted(set(splits))
  dev = next((s for s in splits if s.endswith("/dev")), splits[0])
  test = next((s for s in splits if s.endswith("/test") and s.rsplit("/", 1)[0] == dev.rsplit("/", 1)[0]), dev)
  return dev, test


def heads_only(df):
  return df[(df["layer"] >= 0) & (df["head"] >= 0)]


def in_grid(df, run: pathlib.Path, table: tables.Table):
  """(the rows of a per-head frame inside the model's grid, the grid's (layers, heads)): the run's
  config.json (`tables.grid_shape`), else 1 + the largest layer and head below `tables.MAX_GRID`. Rows
  outside (another model's, a hand-edited layer=100000 that would allocate 10^10 cells) are left out with
  one warning naming the table's file and its first such line."""
  shape = tables.grid_shape(run)
  bound = shape or tables.MAX_GRID
  inside = df["layer"].between(0, bound[0] - 1) & df["head"].between(0, bound[1] - 1)
  if not inside.all():
    first = df[~inside].iloc[0]
    line = int(df.index[~inside][0]) + 2  # read_frame's index is the row's position; line 1 is the header
    source = run / "config.json" if shape else "the largest grid sized from the rows (no config.json)"
    print(
      f"headspec: warning: {tables.path_of(run, table)}:{line}: layer={first['layer']}, head={first['head']} "
      f"is outside the {bound[0]} layers × {bound[1]} heads of {source}; left out {int((~inside).sum())} row(s)",
      file=sys.stderr,
      flush=True,
    )
    df = df[inside]
  if shape is None:
    shape = (int(df["layer"].max()) + 1, int(df["head"].max()) + 1) if len(df) else (0, 0)
  return df, shape


def training_metrics(run: pathlib.Path) -> list[dict]:
  """metrics.jsonl: one JSON object per line (a line cut by an interrupted run, not UTF-8 or without an
  integer step is skipped with one warning: `headspec.io.metrics.read_metrics`, every reader's)."""
  return metrics.read_metrics(run)


def bootstrap_mean_ci(values, *, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
  """Percentile bootstrap CI of the mean, resampling the values (heads) with replacement."""
  values = np.asarray(values, dtype=float)
  values = values[np.isfinite(values)]
  if values.size == 0:
    return float("nan"), float("nan")
  rng = np.random.default_rng(seed)
  means = rng.choice(values, size=(BOOTSTRAP_DRAWS, values.size), replace=True).mean(axis=1)
  return tuple(float(q) for q in np.quantile(means, [(1 - level) / 2, (1 + level) / 2]))


def bootstrap_diff_ci(a, b, *, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
  """Percentile bootstrap CI of mean(b) − mean(a), resampling each run's heads independently."""
  a, b = (np.asarray(x, dtype=float) for x in (a, b))
  a, b = a[np.isfinite(a)], b[np.isfinite(b)]
  if a.size == 0 or b.size == 0:
    return float("nan"), float("nan")
  rng = np.random.default_rng(seed)
  diffs = rng.choice(b, (BOOTSTRAP_DRAWS, b.size)).mean(1) - rng.choice(a, (BOOTSTRAP_DRAWS, a.size)).mean(1)
  return tuple(float(q) for q in np.quantile(diffs, [(1 - level) / 2, (1 + level) / 2]))


def step_axis(ax, steps) -> None:
  """Log-scale step axis that still shows step 0 (symmetric log, linear below the first saved step)."""
  positive = sorted(s for s in set(steps) if s > 0)
  ax.set_xscale("symlog", linthresh=positive[0] if positive else 1)
  ax.set_xlabel("step (log scale)")


def save(fig, out: pathlib.Path, stem: str) -> list[pathlib.Path]:
  """Writes OUT/STEM.png and OUT/STEM.svg and closes the figure."""
  out.mkdir(parents=True, exist_ok=True)
  paths = [out / f"{stem}.png", out / f"{stem}.svg"]
  for path in paths:
    fig.savefig(path, dpi=150, bbox_inches="tight")
  plt.close(fig)
  return paths


def main_guard(main) -> None:
  """Runs `main()`; a UserError is one line on stderr and exit status 2 (as the headspec CLI does)."""
  import sys

  try:
    for path in main():
      print(path)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
