"""Probe complexity sweep (Hewitt & Liang 2019): rows from fitted probes, the known trade-off on a
synthetic control task, and the figure."""

import numpy as np
import pytest

from headspec.io import tables
from headspec.probing import complexity, probe

GRID = (1e-6, 1e-2, 1.0, 3.0)


def _word_types(seed=0, n=12000, types=150, k=48):
  """Words of `types` types: features identify the type (so a complex probe can memorise a random label
  per type, the control task) plus one weak shared direction per task class (what a simple probe reads)."""
  rng = np.random.default_rng(seed)
  type_N = rng.integers(0, types, n)
  task_T = rng.integers(0, 3, types)  # the task label is a property of the type (as a POS tag mostly is)
  control_T = rng.integers(0, 3, types)  # Hewitt & Liang's control: a random label per type
  class_CK = rng.standard_normal((3, k))
  x = rng.standard_normal((types, k))[type_N] + 0.8 * class_CK[task_T[type_N]] + 0.5 * rng.standard_normal((n, k))
  return x[:, None].astype(np.float32), task_T[type_N].astype(np.int32), control_T[type_N].astype(np.int32)


@pytest.fixture(scope="module")
def fitted():
  x, y, c = _word_types()
  tr, dev = slice(0, 9000), slice(9000, None)
  specs = [probe.ProbeSpec("pos", 3, y[tr], y[dev]), probe.ProbeSpec("pos/control", 3, c[tr], c[dev])]
  return probe.fit_softmax_probes(x[tr], x[dev], specs, l2_grid=GRID, refine_samples=0)


def test_rows_are_the_fitted_dev_accuracies(fitted):
  rows = complexity.complexity_rows("m", 7, "pos", 2, [-1], fitted, "ewt/dev", 3000)
  assert [r["l2"] for r in rows] == sorted(GRID) and len(rows) == len(GRID)
  for p, r in enumerate(rows):
    assert set(r) == set(tables.COMPLEXITY.columns)
    assert r["accuracy"] == pytest.approx(fitted.dev_accuracy["pos"][0, p])
    assert r["selectivity"] == pytest.approx(r["accuracy"] - fitted.dev_accuracy["pos/control"][0, p])


def test_simpler_probes_are_more_selective(fitted):
  """The control task is only solvable by memorising word types: it loses more than the task as λ grows."""
  rows = complexity.complexity_rows("m", 0, "pos", 0, [-1], fitted, "dev", 3000)
  by_l2 = {r["l2"]: r for r in rows}
  weak, strong = by_l2[1e-6], by_l2[3.0]
  assert weak["control_accuracy"] > strong["control_accuracy"] + 0.1
  assert strong["selectivity"] > weak["selectivity"] + 0.1 and strong["accuracy"] > 0.9


def test_figure_is_written(fitted, tmp_path):
  rows = []
  for layer, heads in ((0, [0]), (0, [-1])):
    rows += complexity.complexity_rows("m", 5, "pos", layer, heads, fitted, "dev", 3000)
  tables.write(tmp_path / "complexity.csv", rows, tables.COMPLEXITY)
  made = complexity.write_figures(tmp_path)
  assert [p.name for p in made] == ["complexity_pos.png"] and (tmp_path / "complexity_pos.png").stat().st_size > 10_000
