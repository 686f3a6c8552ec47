"""analysis/ scripts on fixture runs: each writes PNG and SVG (and its CSV), numbers checked where the
fixture fixes them; importing them (and headspec.io.tables, headspec.atlas) never imports JAX."""

import csv
import pathlib
import statistics
import subprocess
import sys

import pytest
from test_atlas_fixtures import write_run

from headspec.errors import UserError

ANALYSIS = pathlib.Path(__file__).resolve().parents[1] / "analysis"
SCRIPTS = ("probe_heatmaps", "specialization", "diversity_curves", "pruning_curves", "probe_spread", "compare_runs")
sys.path.insert(0, str(ANALYSIS))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("runs")
  a = write_run(root / "drophead_off", layers=3, heads=4, steps=(0, 100, 1000, 10000))
  b = write_run(root / "drophead_on", layers=3, heads=4, steps=(0, 100, 1000, 10000), seed=1, shift=0.1)
  return a, b


def _rows(path):
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def _figures(paths, *stems):
  names = {pathlib.Path(p).name for p in paths}
  for stem in stems:
    assert {f"{stem}.png", f"{stem}.svg"} <= names, (stem, names)
    png = next(pathlib.Path(p) for p in paths if pathlib.Path(p).name == f"{stem}.png")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_probe_heatmaps(runs, tmp_path):
  import probe_heatmaps

  written = probe_heatmaps.main([*map(str, runs), "--out", str(tmp_path)])
  _figures(written, "probe_heatmaps_upos_selectivity", "probe_heatmaps_arc_selectivity")
  written = probe_heatmaps.main([str(runs[0]), "--out", str(tmp_path), "--value", "accuracy", "--split", "test"])
  _figures(written, "probe_heatmaps_upos_accuracy")
  with pytest.raises(UserError, match="no split 'train'"):
    probe_heatmaps.main([str(runs[0]), "--out", str(tmp_path), "--split", "train"])


def test_specialization_selects_on_dev_and_reports_on_test(runs, tmp_path):
  import specialization

  written = specialization.main([*map(str, runs), "--out", str(tmp_path), "--threshold", "0.1"])
  _figures(written, "specialization")
  rows = _rows(tmp_path / "specialization.csv")
  upos = [r for r in rows if r["run"] == "drophead_off" and r["task"] == "upos"]
  assert [int(r["step"]) for r in upos] == [0, 100, 1000, 10000]
  last = upos[-1]
  assert (last["best_layer"], last["best_head"]) == ("1", "2")  # the fixture's specialised head
  assert (last["select_split"], last["report_split"]) == ("synth/dev", "synth/test")
  assert float(last["ci_low"]) < float(last["selectivity"]) < float(last["ci_high"])
  assert int(last["heads_above_low"]) <= int(last["heads_above"]) <= int(last["heads_above_high"])
  assert int(last["heads_above"]) >= 1


def test_specialization_without_test_split_reports_dev(tmp_path):
  import specialization

  run = write_run(tmp_path / "devonly", test_split=False, diversity=False, ablation=False, attention=False)
  specialization.main([str(run), "--out", str(tmp_path / "out")])
  assert {r["report_split"] for r in _rows(tmp_path / "out" / "specialization.csv")} == {"synth/dev"}


def test_diversity_curves(runs, tmp_path):
  import diversity_curves

  written = diversity_curves.main([*map(str, runs), "--out", str(tmp_path)])
  _figures(written, "diversity_curves")
  rows = _rows(tmp_path / "diversity_curves.csv")
  assert {r["metric"] for r in rows} == {"attention_entropy", "attention_distance", "js_distance"}
  assert {r["run"] for r in rows} == {"drophead_off", "drophead_on"}
  assert all(float(r["value"]) > 0 for r in rows if r["metric"] == "js_distance")  # the diagonal is left out
  with pytest.raises(UserError, match="no diversity metric nope"):
    diversity_curves.main([str(runs[0]), "--out", str(tmp_path), "--metrics", "nope"])


def test_diversity_scripts_read_the_runs_own_model(tmp_path):
  """Diversity/results.csv may hold another model analysed into the folder; diversity_curves and
  compare_runs read the run's own (most frequent, not `-random`) model only."""
  import compare_runs
  import diversity_curves

  from headspec.io import tables

  run = write_run(tmp_path / "own", layers=2, heads=2, steps=(0, 100), probes=False, ablation=False, attention=False)
  before = (diversity_curves.main([str(run), "--out", str(tmp_path / "a")]), compare_runs.quantities(run))
  path = tables.path_of(run, tables.DIVERSITY)
  rows = tables.read(path, tables.DIVERSITY)  # another model: one metric's rows at every step (fewer than own)
  other = [r | {"model": "minilm", "value": "9.0"} for r in rows if r["metric"] == "attention_entropy"]
  tables.merge(path, other, tables.DIVERSITY)
  diversity_curves.main([str(run), "--out", str(tmp_path / "b")])
  assert _rows(tmp_path / "b" / "diversity_curves.csv") == _rows(tmp_path / "a" / "diversity_curves.csv")
  after = compare_runs.quantities(run)
  assert {k: v[:3] for k, v in after.items()} == {k: v[:3] for k, v in before[1].items()}


def test_pruning_curves_and_ranking_comparison(runs, tmp_path):
  import pruning_curves

  written = pruning_curves.main([*map(str, runs), "--out", str(tmp_path)])
  _figures(written, "pruning_curves", "pruning_rankings")
  rows = {(r["run"], r["ranking"]): r for r in _rows(tmp_path / "pruning_rankings.csv")}
  # The fixture's importance order degrades the loss more slowly than random orders.
  for run in ("drophead_off", "drophead_on"):
    assert float(rows[(run, "importance")]["curve_mean"]) < float(rows[(run, "random")]["curve_mean"])
    assert rows[(run, "random")]["seeds"] == "3"
  assert pruning_curves.curve_mean(
    __import__("pandas").DataFrame({"fraction_pruned": [0.0, 0.5, 1.0], "value": [1.0, 2.0, 3.0]})
  ) == pytest.approx(2.0)


def test_compare_runs_differences_with_cis(runs, tmp_path):
  import compare_runs

  written = compare_runs.main([*map(str, runs), "--out", str(tmp_path)])
  _figures(written, "compare")
  rows = _rows(tmp_path / "compare.csv")
  on = {r["quantity"].split(" (")[0]: r for r in rows if r["run"] == "drophead_on"}
  mean_sel = on["probe upos: mean selectivity over heads"]
  assert mean_sel["ci"] == "bootstrap over heads"
  assert 0 < float(mean_sel["diff_ci_low"]) < float(mean_sel["difference"]) < float(mean_sel["diff_ci_high"])
  best = on["probe upos: best head selectivity"]
  assert best["ci"].startswith("per-head bootstrap CIs")
  half = (float(best["diff_ci_high"]) - float(best["diff_ci_low"])) / 2
  assert half == pytest.approx((2 * 0.02**2) ** 0.5, abs=1e-4)  # fixture CIs are ±0.02
  assert on["final training loss"]["ci"] == "none"
  assert "bootstrap over heads" in (tmp_path / "compare.md").read_text()
  with pytest.raises(UserError, match="at least two runs"):
    compare_runs.main([str(runs[0]), "--out", str(tmp_path)])


def test_probe_spread_over_seeds(tmp_path):
  """Three seeds of one model: the strongly selective head (L1H2 on upos, fixture) is top in every run,
  per-head sds are the sample sds of the runs' values, and the CI half-width comes from selectivity.csv."""
  import probe_spread

  from headspec.io import tables

  runs = [
    write_run(tmp_path / f"s{seed}", seed=seed, diversity=False, ablation=False, attention=False) for seed in range(3)
  ]
  for run in runs:
    rows = [
      dict(model=run.name, step=1000, task="upos", layer=layer, head=head, split="synth/test", selectivity=0.1,
           selectivity_ci_low=0.09, selectivity_ci_high=0.11, dev_rank=1, delta_next=0, delta_next_ci_low=0,
           delta_next_ci_high=0, n=1000)
      for layer in range(3) for head in range(4)
    ]  # fmt: skip
    tables.write(tables.path_of(run, tables.PROBE_SELECTIVITY), rows, tables.PROBE_SELECTIVITY)
  written = probe_spread.main([*map(str, runs), "--out", str(tmp_path / "spread")])
  _figures(written, "spread_upos", "spread_arc")
  rows = _rows(tmp_path / "spread/spread.csv")
  assert len(rows) == 2 * 3 * 4
  for r in rows:
    values = [float(r[f"s{seed}"]) for seed in range(3)]
    assert float(r["sd"]) == pytest.approx(statistics.stdev(values), abs=1e-9)
  text = (tmp_path / "spread/spread.md").read_text()
  upos = next(l for l in text.splitlines() if l.startswith("| upos |"))
  assert "3/3 (L1H2)" in upos and "| 0.0100 |" in upos, upos
  arc = next(l for l in text.splitlines() if l.startswith("| arc |"))
  assert "| nan |" in arc  # no selectivity.csv rows for arcs: no CI half-width
  with pytest.raises(UserError, match="at least two runs"):
    probe_spread.main([str(runs[0]), "--out", str(tmp_path)])


def test_missing_inputs_are_one_line(tmp_path, runs):
  for script in SCRIPTS[:-1]:
    result = subprocess.run(
      [sys.executable, str(ANALYSIS / f"{script}.py"), str(tmp_path / "nope"), "--out", str(tmp_path)],
      capture_output=True,
      text=True,
    )
    assert result.returncode == 2 and result.stderr.startswith("error: ") and "no such run directory" in result.stderr
  empty = tmp_path / "empty"
  empty.mkdir()
  import pruning_curves

  with pytest.raises(UserError, match="ablation/pruning.csv"):
    pruning_curves.main([str(empty), "--out", str(tmp_path)])


def test_no_jax_imported():
  code = (
    "import sys; sys.path.insert(0, sys.argv[1])\n"
    "import headspec, headspec.io.tables, headspec.atlas\n"
    f"for name in {SCRIPTS!r}: __import__(name)\n"
    "headspec.build_atlas\n"
    "heavy = sorted(m for m in ('jax', 'flax', 'tensorflow', 'orbax') if m in sys.modules)\n"
    "assert not heavy, heavy\n"
  )
  subprocess.run([sys.executable, "-c", code, str(ANALYSIS)], check=True)
