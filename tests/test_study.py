"""The study: its experiment config, the launcher's resumable experiment stages, and `headspec study`'s tables."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from headspec import launch, study
from headspec.ablation.run import check_config as check_ablate
from headspec.attention.config import check_config as check_attention
from headspec.cli import stage
from headspec.diversity.run import _check_config as check_diversity
from headspec.io import tables
from headspec.launch import experiments
from headspec.probing.plan import check_config as check_probe
from headspec.sae.run import check_config as check_sae

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPEC = "configs/experiments/specialization.py"


def _module():
  spec = importlib.util.spec_from_file_location("specialization", os.path.join(REPO, SPEC))  # configs/ at the top
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize("small", ["", "small,"])
def test_experiment_config_every_stage_checks(small):
  m = _module()
  for condition in m.CONDITIONS:
    c = m.get_config(f"{small}condition={condition},seed=2")
    assert (c.seed, c.model.num_layers, c.model.num_heads, c.data.corpus) == (2, 6, 8, "wikitext_103")
    assert 0 in c.train.keep_steps and c.train.steps in c.train.keep_steps
  assert m.get_config(f"{small}condition=drophead").train.regularizers.drophead > 0
  assert m.get_config(f"{small}condition=disagreement").train.regularizers.output > 0
  for name, check in (("probe", check_probe), ("attention", check_attention), ("diversity", check_diversity)):
    check(m.get_config(f"{small}{name}"))
  check_ablate(m.get_config(f"{small}ablate"))
  sae = m.get_config(f"{small}sae")  # every layer's z at every kept step, after the probe it sits beside
  check_sae(sae)
  assert (sae.steps, sae.layers, sae.sae.kind) == ("all", "all", "topk")
  assert [a for a, _ in m.experiment(small.rstrip(",")).analyses][-3:] == ["ablate", "sae", "atlas"]
  exp = m.experiment(small.rstrip(","))
  # 3 seeds per condition in both settings (claims that compare conditions need them), run in parts if need be
  assert all(sorted(r.seed for r in exp.runs if r.condition == c) == [0, 1, 2] for c in m.CONDITIONS)
  part = m.experiment(f"{small}condition=drophead,seed=1")
  assert [(r.name, r.config) for r in part.runs] == [(r.name, r.config) for r in exp.runs if r.name == "drophead_s1"]
  assert m.experiment(f"{small}seed=2").runs == tuple(r for r in exp.runs if r.seed == 2)
  assert part.analyses == exp.analyses and [r[0] for r in exp.references] == ["minilm", "minilm"]
  assert part.references == ()  # MiniLM with the whole command only: parts may run side by side
  for single in ("probe", "minilm"):  # single-config arguments
    with pytest.raises(ValueError, match="not for the experiment"):
      m.experiment(f"{small}{single}")
  with pytest.raises(ValueError, match="bad argument 'conditon=x'"):
    m.get_config("conditon=x")


def _dry(*argv):
  done = subprocess.run(
    [sys.executable, "-m", "headspec.launch", *argv],
    cwd=REPO,
    capture_output=True,
    text=True,
    env={**os.environ, "HEADSPEC_DATA_DIR": "/data"},
    timeout=60,
  )
  return done.returncode, done.stdout, done.stderr


def test_launch_experiment_plans_every_stage_in_order():
  code, out, err = _dry("local", "--dry-run", f"--experiment={SPEC}:small", "--workdir=root")
  assert code == 0, err
  lines = [line for line in out.splitlines() if not line.startswith("#")]
  runs = [r.name for r in _module().experiment("small").runs]
  assert len(lines) == len(runs) * 7 + 2 + 1  # train, 5 analyses, atlas per run; 2 MiniLM analyses; report
  first = lines[:7]
  assert "headspec train" in first[0] and f"--workdir=root/{runs[0]}" in first[0]
  for line, analysis in zip(first[1:], ("probe", "diversity", "attention", "ablate", "sae", "atlas")):
    assert f"headspec.cli.stage root/stages/{runs[0]}-{analysis}.done -- {analysis}" in line
  assert first[6].endswith(f"-- atlas --workdir=root/{runs[0]}")  # no --config: atlas takes none
  assert "minilm-probe.done -- probe" in lines[-3] and "--workdir=root/minilm" in lines[-3]
  assert lines[-1].endswith("headspec study --workdir=root")


@pytest.mark.parametrize(
  "argv, message",
  [
    ([f"--experiment={SPEC}:smal", "--workdir=r"], "bad argument 'smal'"),
    (["--experiment=configs/quickstart.py", "--workdir=r"], "defines no experiment"),
    ([f"--experiment={SPEC}", "--workdir=r", "--study"], "drop --study"),
    ([f"--experiment={SPEC}"], "needs --workdir"),
  ],
)
def test_launch_experiment_bad_input_is_one_line(argv, message):
  code, out, err = _dry("local", "--dry-run", *argv)
  assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and not out


def test_stage_runs_once_and_records_only_success(tmp_path, monkeypatch):
  from headspec.cli import main as cli

  calls = []
  codes = iter([1, 0])
  monkeypatch.setattr(cli, "main", lambda argv: calls.append(argv) or next(codes))
  marker = tmp_path / "stages" / "r-probe.done"
  assert stage.run_stage(str(marker), ["probe", "--workdir=r"]) == 1  # failed: no marker, runs again
  assert not marker.exists()
  assert stage.run_stage(str(marker), ["probe", "--workdir=r"]) == 0
  assert marker.read_text() == "probe --workdir=r\n"
  assert stage.run_stage(str(marker), ["probe", "--workdir=r"]) == 0  # done already: not run again
  assert len(calls) == 2


def test_spearman_and_permutation_p():
  x = np.arange(20.0)
  rho, p = study.spearman(x, x**3)
  assert rho == pytest.approx(1.0) and p < 0.001
  rho, _ = study.spearman(x, -x)
  assert rho == pytest.approx(-1.0)
  rng = np.random.default_rng(0)
  rho, p = study.spearman(rng.normal(size=48), rng.normal(size=48))
  assert abs(rho) < 0.4 and p > 0.01


def _selectivity_rows(model, step, dev_test_by_head):
  """selectivity.csv rows: {(layer, head): (dev, test, test_ci_low)}; dev_rank from dev."""
  order = sorted((k for k in dev_test_by_head if k[1] >= 0), key=lambda k: -dev_test_by_head[k][0])
  rows = []
  for (layer, head), (dev, test, low) in dev_test_by_head.items():
    rank = order.index((layer, head)) + 1 if head >= 0 else -1
    for split, value, lo in (("en_ewt/dev", dev, dev - 0.01), ("en_ewt/test", test, low)):
      rows.append(
        dict(
          model=model, step=step, task="upos", layer=layer, head=head, split=split, selectivity=value,
          selectivity_ci_low=lo, selectivity_ci_high=value + 0.01, dev_rank=rank, delta_next=np.nan,
          delta_next_ci_low=np.nan, delta_next_ci_high=np.nan, n=100,
        )
      )  # fmt: skip
  return rows


def test_study_chooses_on_dev_reports_test_and_counts_selective_heads(tmp_path):
  root = tmp_path / "exp"
  exp = experiments.Experiment(runs=(experiments.Run("baseline_s0", "c.py", "baseline", 0),), analyses=())
  experiments.write_plan(root, exp, "c.py")
  run = root / "baseline_s0"
  # step 0: nothing selective; step 100: head (1,0) best on dev but (1,1) best on test; layer 0 selective too
  step0 = {
    (0, 0): (0.01, 0.0, -0.02),
    (0, 1): (0.0, 0.01, -0.01),
    (1, 0): (0.02, 0.0, -0.03),
    (1, 1): (0.0, 0.0, -0.01),
  }
  step100 = {
    (0, 0): (0.05, 0.04, 0.01),
    (0, 1): (0.0, 0.0, -0.01),
    (1, 0): (0.30, 0.20, 0.15),
    (1, 1): (0.1, 0.35, 0.3),
  }
  step100[(1, -1)] = (0.5, 0.45, 0.4)  # a residual stream: never the best head
  rows = _selectivity_rows("baseline_s0", 0, step0) + _selectivity_rows("baseline_s0", 100, step100)
  tables.write(tables.path_of(run, tables.PROBE_SELECTIVITY), rows, tables.PROBE_SELECTIVITY)
  div = [  # the diagonal is 0 and must not pull the mean down; another model's rows are not the run's
    dict(model=m, step=s, layer=0, head_i=i, head_j=j, metric="js_distance", value=0.0 if i == j else v + w)
    for m, w in (("baseline_s0", 0.0), ("minilm", 0.3))
    for s, v in ((0, 0.1), (100, 0.5))
    for i in range(2)
    for j in range(2)
  ]
  tables.write(tables.path_of(run, tables.DIVERSITY), div, tables.DIVERSITY)
  lines = [{"step": 50, "loss": 6.5}, {"step": 100, "loss": 6.0}, {"step": 100, "eval/loss": 6.1}]
  (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))

  summary = study.write_study(root)
  out = root / "study"
  em = pd.read_csv(out / "emergence.csv")
  last = em[em["step"] == 100].iloc[0]
  assert (last["best_layer"], last["best_head"]) == (1, 0)  # dev's choice, not test's (1, 1)
  # the study's tables are tables.py's (headspec.TABLES 'study_*'), written by its writer and read back by its reader
  assert tables.TABLES["study_emergence"] is tables.STUDY["emergence"] and list(tables.STUDY) == list(study.COLUMNS)
  read = tables.read_frame(out / "emergence.csv", tables.STUDY["emergence"])
  assert read["step"].tolist() == em["step"].tolist() and read["task"].tolist() == ["upos", "upos"]
  assert last["selectivity"] == pytest.approx(0.20)
  assert last["median_selectivity"] == pytest.approx((0.04 + 0.20) / 2)  # of the 4 heads' test values
  assert last["selective_heads"] == 3 and last["heads"] == 4  # (0,0), (1,0), (1,1) have test CI > 0
  assert last["init_best"] == pytest.approx(0.01)  # step 0's best test selectivity, (0, 1)
  assert last["above_init_heads"] == 2  # (1,0) and (1,1): CI low above 0.01; (0,0)'s is 0.01, not above
  assert last["residual_layer"] == 1 and last["residual_selectivity"] == pytest.approx(0.45)
  assert em[em["step"] == 0].iloc[0]["selective_heads"] == 0
  layers = pd.read_csv(out / "layers.csv")
  assert sorted(zip(layers["layer"], layers["first_step"])) == [(1, 100)]
  d = pd.read_csv(out / "diversity.csv")
  assert d.set_index("step")["value"].to_dict() == pytest.approx({0: 0.1, 100: 0.5})
  tr = pd.read_csv(out / "training.csv")
  assert tr[["step", "loss"]].values.tolist() == [[50, 6.5], [100, 6.0]] and tr["eval_loss"].iloc[1] == 6.1
  for figure in ("emergence.png", "diversity.png", "loss.png"):
    assert (out / figure).exists()
  text = summary.read_text()
  assert "Best head's test selectivity by step" in text and "| baseline | upos | 100 | 0.200 |" in text
  # a second seed (here a copy): the figure draws the mean with its t band, summary.md the t interval
  shutil.copytree(run, root / "baseline_s1")
  runs = (exp.runs[0], experiments.Run("baseline_s1", "c.py", "baseline", 1))
  experiments.write_plan(root, experiments.Experiment(runs=runs, analyses=()), "c.py")
  text = study.write_study(root).read_text()
  assert "| baseline | upos | 100 | 0.200 | 0.200 | 0.200 | 0.200 | 0.200 | 2 |" in text


def test_study_draws_every_registered_probe_task(tmp_path, monkeypatch):
  """A probe task added to the probing registry (headspec/probing/tasks.py) reaches the study: its rows are
  collected and the emergence figure gets its panel, with no task list in the study to extend."""
  from headspec.probing import tasks as probe_tasks

  monkeypatch.setitem(probe_tasks.REGISTRY, "toy", probe_tasks.REGISTRY["upos"])
  root = tmp_path / "exp"
  exp = experiments.Experiment(runs=(experiments.Run("baseline_s0", "c.py", "baseline", 0),), analyses=())
  experiments.write_plan(root, exp, "c.py")
  heads = {(0, 0): (0.1, 0.2, 0.15), (0, 1): (0.0, 0.0, -0.01)}
  rows = [dict(r, task=task) for task in ("upos", "toy") for r in _selectivity_rows("baseline_s0", 0, heads)]
  run = root / "baseline_s0"
  tables.write(tables.path_of(run, tables.PROBE_SELECTIVITY), rows, tables.PROBE_SELECTIVITY)
  em = pd.DataFrame(study.collect(root)["emergence"])
  assert sorted(em["task"]) == ["toy", "upos"]
  assert study.tasks()[-1] == "toy" and study.figure_tasks(em) == ["upos", "toy"]  # the registry's order
  study.write_study(root)
  assert "| baseline | toy | 0 |" in (root / "study/summary.md").read_text()


def test_study_without_probe_results_is_one_line(tmp_path):
  exp = experiments.Experiment(runs=(experiments.Run("a", "c.py", "baseline", 0),), analyses=())
  experiments.write_plan(tmp_path, exp, "c.py")
  done = subprocess.run(
    [sys.executable, "-m", "headspec", "study", f"--workdir={tmp_path}"], capture_output=True, text=True, cwd=REPO
  )
  assert done.returncode == 2 and "no run has probes/selectivity.csv" in done.stderr
  assert len(done.stderr.strip().splitlines()) == 1
  assert json.loads((tmp_path / "experiment.json").read_text())["runs"][0]["name"] == "a"


def test_launch_experiment_loads_through_the_library():
  exp = launch.load_experiment(f"{SPEC}:small")
  assert {r.condition for r in exp.runs} == {"baseline", "drophead", "disagreement"}


def test_stage_with_another_command_line_runs_again(tmp_path, monkeypatch):
  from headspec.cli import main as cli

  calls = []
  monkeypatch.setattr(cli, "main", lambda argv: calls.append(argv) or 0)
  marker = tmp_path / "m.done"
  stage.run_stage(str(marker), ["probe", "--config=a.py:small,probe"])
  stage.run_stage(str(marker), ["probe", "--config=a.py:probe"])  # the config changed: not done
  assert len(calls) == 2 and marker.read_text() == "probe --config=a.py:probe\n"


@pytest.mark.parametrize(
  "argv, message",
  [
    (["local", "--analyses=probe"], "drop --analyses"),
    (["local", "--probe-config=configs/probe_minilm_ewt.py"], "drop --probe-config"),
    (["tpu", "--tpu-name=t", "--zone=z", "--data=gs://b/d"], "needs a gs:// --workdir"),
  ],
)
def test_launch_experiment_refuses_what_it_would_ignore(argv, message):
  code, out, err = _dry(*argv, "--dry-run", f"--experiment={SPEC}:small", "--workdir=r")
  assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_local_launcher_stops_after_a_signal(tmp_path):
  """A SIGTERM while training runs: training saves and exits 0, and the analyses after it do not start."""
  # like training: it handles SIGTERM (saves a checkpoint) and exits 0
  kill_parent = (
    "import os, signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); os.kill(os.getppid(), signal.SIGTERM)"
  )
  after = tmp_path / "analysis-ran"
  steps = [
    launch.Step("local", (sys.executable, "-c", kill_parent)),
    launch.Step("local", (sys.executable, "-c", f"open({str(after)!r}, 'w')")),
  ]
  assert launch.run_local(steps) == 128 + 15
  assert not after.exists()


def test_within_layer_permutation_keeps_layer_levels_and_holm():
  """Two measures that differ by layer but not within it: the all-heads ρ is large, the within-layer ρ is not,
  and its permutation p (heads shuffled within layers) does not call it significant."""
  rng = np.random.default_rng(0)
  layer = np.repeat(np.arange(6), 8)
  x, y = layer + 0.1 * rng.normal(size=48), layer + 0.1 * rng.normal(size=48)
  rho, p = study.spearman(x, y, permutations=2000)
  assert rho > 0.9 and p < 0.01
  w_rho, w_p = study.within_layer_spearman(x, y, layer, permutations=2000)
  assert abs(w_rho) < 0.3 and w_p > 0.05
  w_rho, w_p = study.within_layer_spearman(x, x + 0.01 * rng.normal(size=48), layer, permutations=2000)
  assert w_rho > 0.9 and w_p < 0.01
  np.testing.assert_allclose(study.holm([0.01, 0.04, 0.03, np.nan]), [0.03, 0.06, 0.06, np.nan])


def _structural_rows(model, step, by_group):
  """probes/structural.csv rows of the distance probe's UUAS: {(layer, head): (dev value, dev control, test
  value, test control)}."""
  rows = []
  for (layer, head), (dev, dev_control, test, control) in by_group.items():
    for split, value, ctl in (("en_ewt/dev", dev, dev_control), ("en_ewt/test", test, control)):
      rows.append(
        dict(
          model=model, step=step, task="distance", layer=layer, head=head, split=split, metric="uuas", value=value,
          ci_low=value - 0.02, ci_high=value + 0.02, control_value=ctl, selectivity=value - ctl, rank=8, n=80,
        )
      )  # fmt: skip
  return rows


def test_study_reports_structural_probes_chosen_on_dev_beside_control_and_linear(tmp_path):
  """study/structural.csv: per run and step, both choices named in `choice`: the head and the
  residual stream of highest DEV value (best_value) and of highest DEV selectivity (most_selective), never
  test's, reported on test (value, CI, control, selectivity) beside the linear baseline on test; the embeddings
  and random-weights rows are not candidates; reference.csv compares the best-value head's raw value with the
  linear baseline, and summary.md's by-step value is the best-value head's."""
  root = tmp_path / "exp"
  exp = experiments.Experiment(
    runs=(experiments.Run("baseline_s0", "c.py", "baseline", 0),), analyses=(), references=(("ref", "probe", ""),)
  )
  experiments.write_plan(root, exp, "c.py")
  step0 = {(0, 0): (0.51, 0.5, 0.50, 0.49), (0, 1): (0.5, 0.5, 0.52, 0.50)}
  step100 = {
    (0, 0): (0.80, 0.75, 0.61, 0.50),  # the best dev value (best_value), selectivity only 0.05
    (0, 1): (0.70, 0.50, 0.70, 0.52),  # the best dev selectivity (most_selective)
    (1, 0): (0.60, 0.50, 0.90, 0.50),  # the best on test, not chosen
    (0, -1): (0.80, 0.50, 0.75, 0.50),  # the best residual stream on dev
    (1, -1): (0.75, 0.50, 0.80, 0.50),
    (-1, -1): (0.99, 0.10, 0.95, 0.10),  # the embeddings: never chosen
  }
  for folder, name in ((root / "baseline_s0", "baseline_s0"), (root / "ref", "ref")):
    rows = _structural_rows(name, 0, step0) + _structural_rows(name, 100, step100)
    rows += _structural_rows(f"{name}-random", 100, {(1, 1): (0.99, 0.0, 0.99, 0.0)})  # a control model: left out
    tables.write(tables.path_of(folder, tables.PROBE_STRUCTURAL), rows, tables.PROBE_STRUCTURAL)
    base = [
      dict(task="distance", split=s, baseline="linear_uuas", accuracy=a, n=80)
      for s, a in (("en_ewt/dev", 0.3), ("en_ewt/test", 0.45))
    ]
    tables.write(tables.path_of(folder, tables.PROBE_BASELINES), base, tables.PROBE_BASELINES)
  sel = _selectivity_rows("baseline_s0", 100, {(0, 0): (0.1, 0.1, 0.05)})
  tables.write(tables.path_of(root / "baseline_s0", tables.PROBE_SELECTIVITY), sel, tables.PROBE_SELECTIVITY)

  summary = study.write_study(root).read_text()
  st = pd.read_csv(root / "study/structural.csv")
  assert list(st.columns) == study.COLUMNS["structural"].split(",")
  assert len(st) == 2 * (1 + 2) and set(st["run"]) == {"baseline_s0"}  # per choice; step 0: a head; 100: both
  assert set(st["choice"]) == {"best_value", "most_selective"}
  last = st[st["step"] == 100].set_index(["source", "choice"])
  sel, val = ("head", "most_selective"), ("head", "best_value")
  assert (last.loc[sel, "layer"], last.loc[sel, "head"]) == (0, 1)  # dev's choice, not test's (1, 0)
  assert last.loc[sel, ["value", "control_value"]].tolist() == pytest.approx([0.70, 0.52])
  assert last.loc[sel, "selectivity"] == pytest.approx(0.18)
  assert last.loc[sel, ["ci_low", "ci_high"]].tolist() == pytest.approx([0.68, 0.72])
  assert (last.loc[val, "layer"], last.loc[val, "head"]) == (0, 0)  # the best dev value, not test's (1, 0)
  assert last.loc[val, "value"] == pytest.approx(0.61)
  for choice in ("best_value", "most_selective"):
    assert (last.loc[("residual", choice), "layer"], last.loc[("residual", choice), "head"]) == (0, -1)
    assert last.loc[("residual", choice), "value"] == pytest.approx(0.75)  # not the embeddings
  assert (st["linear"] == 0.45).all() and (st["metric"] == "uuas").all() and (st["n"] == 80).all()
  assert list(st[st["step"] == 0]["source"]) == ["head", "head"]  # no residual rows at step 0
  ref = pd.read_csv(root / "study/reference.csv")
  ref = ref[ref["kind"] == "structural"].set_index("run")
  assert sorted(ref.index) == ["baseline_s0", "ref"] and (ref["what"] == "uuas").all()
  assert ref.loc["ref", ["layer", "head"]].tolist() == [0, 0] and ref.loc["ref", "value"] == pytest.approx(0.61)
  assert ref.loc["ref", "baseline"] == pytest.approx(0.45)
  assert "## Structural probes (Hewitt & Manning 2019)" in summary
  assert (
    "| baseline_s0 | uuas | head | most_selective | 0 | 1 | 0.700 | 0.680 | 0.720 | 0.520 | 0.180 | 0.450 |" in summary
  )
  assert "| baseline_s0 | uuas | head | best_value | 0 | 0 | 0.610 | 0.590 | 0.630 | 0.500 | 0.110 | 0.450 |" in summary
  by_step = summary.split("the best head's test value by step")[1].split("##")[0]
  assert "| baseline | uuas | 100 | 0.610 |" in by_step  # the best-value head's raw value, not the selective one's


def test_formation_step_per_head_roles_causal_power_and_statistics(tmp_path):
  """formation.csv: per head the first kept step whose CI low end lies above step 0's best head (the rule of
  above_init_heads), NaN when never, for probe selectivity and role scores; causal.csv's mde; summary.md's
  formation, conditions (one seed: NaN interval) and statistics sections."""
  root = tmp_path / "exp"
  runs = (experiments.Run("baseline_s0", "c.py", "baseline", 0), experiments.Run("drophead_s0", "c.py", "drophead", 0))
  experiments.write_plan(root, experiments.Experiment(runs=runs, analyses=()), "c.py")
  step0 = {(0, 0): (0.01, 0.05, 0.0), (0, 1): (0.0, 0.0, -0.01)}  # init_best 0.05 (a point value, not a CI)
  step10 = {(0, 0): (0.2, 0.2, 0.06), (0, 1): (0.1, 0.1, 0.05)}  # (0, 1)'s CI low 0.05 is not above 0.05
  step100 = {(0, 0): (0.3, 0.3, 0.2), (0, 1): (0.1, 0.1, 0.04)}  # (0, 1) never forms
  for name, shift in (("baseline_s0", 0.0), ("drophead_s0", 0.1)):
    rows = []
    for step, heads in ((0, step0), (10, step10), (100, step100)):
      heads = {k: (d, t + shift * (step > 0), lo) for k, (d, t, lo) in heads.items()}
      rows += _selectivity_rows(name, step, heads)
    tables.write(tables.path_of(root / name, tables.PROBE_SELECTIVITY), rows, tables.PROBE_SELECTIVITY)
  roles = [  # induction: head (0, 1) forms at step 100 (CI low 0.5 > step 0's best score 0.3); (0, 0) never
    dict(model="baseline_s0", step=s, data="repeated_random", layer=0, head=h, role="induction", score=v,
         ci_low=v - 0.1, ci_high=v + 0.1)
    for s, h, v in ((0, 0, 0.3), (0, 1, 0.1), (10, 0, 0.35), (10, 1, 0.3), (100, 0, 0.3), (100, 1, 0.6))
  ]  # fmt: skip
  tables.write(tables.path_of(root / "baseline_s0", tables.ROLES), roles, tables.ROLES)
  causal = [
    dict(model="baseline_s0", step=100, kind="probe_selective", task="upos", k=2, selection="top", seed=0,
         metric="probe_accuracy_vs_random", value=-0.05, ci_low=-0.09, ci_high=-0.01)
  ]  # fmt: skip
  tables.write(tables.path_of(root / "baseline_s0", tables.ABLATION_CAUSAL), causal, tables.ABLATION_CAUSAL)

  summary = study.write_study(root).read_text()
  fo = pd.read_csv(root / "study/formation.csv")
  assert list(fo.columns) == study.COLUMNS["formation"].split(",")
  base = fo[fo["run"] == "baseline_s0"].set_index(["source", "task", "head"])
  assert base.loc[("probe", "upos", 0), "formation_step"] == 10
  assert np.isnan(base.loc[("probe", "upos", 1), "formation_step"])
  assert base.loc[("probe", "upos", 0), "init_best"] == pytest.approx(0.05)
  assert base.loc[("role", "induction", 1), "formation_step"] == 100
  assert np.isnan(base.loc[("role", "induction", 0), "formation_step"])
  em = pd.read_csv(root / "study/emergence.csv")  # the same rule: heads above init at step 10 == formed by 10
  assert em[(em["run"] == "baseline_s0") & (em["step"] == 10)]["above_init_heads"].item() == 1
  ro = pd.read_csv(root / "study/roles.csv").set_index("step")
  assert (ro.loc[100, "head"], ro.loc[100, "score"], ro.loc[100, "median_score"]) == (1, 0.6, pytest.approx(0.45))
  c = pd.read_csv(root / "study/causal.csv")
  assert c["mde"].item() == pytest.approx((1.96 + 0.8416) * 0.04 / 1.96)
  assert "| baseline_s0 | upos | 2 | probe_accuracy_vs_random | -0.0500 | -0.0900 | -0.0100 | 0.0572 |" in summary
  assert "DECODABILITY AFTER ABLATION" in summary  # the refitted probe is named for what it measures
  # per layer, 2 heads, one never formed: the median is never (NaN), 1 seed formed
  assert "| baseline | probe | upos | 0 | nan | nan | nan | 1 | 1 |" in summary
  assert "| baseline | role | induction | 0 | nan | nan | nan | 1 | 1 |" in summary
  co = pd.read_csv(root / "study/conditions.csv").set_index("measure")
  assert co.loc["selectivity", "difference"] == pytest.approx(0.1) and co.loc["selectivity", "seeds"] == 1
  assert np.isnan(co.loc["selectivity", "ci_low"]) and np.isnan(co.loc["selectivity", "ci_high"])
  assert "## Statistics: families of tests and their corrections" in summary and "Holm" in summary


def test_conditions_pair_seeds_with_a_t_interval():
  """conditions(): condition − baseline paired by seed (an unpaired seed is left out), mean ± t·sd/√n."""
  em = pd.DataFrame(
    [
      dict(run=f"{c}_s{s}", condition=c, seed=s, step=100, task="upos", selectivity=v, median_selectivity=0.0)
      for c, s, v in [("baseline", 0, 0.1), ("baseline", 1, 0.5), ("baseline", 2, 0.2)]
      + [("drophead", 0, 0.2), ("drophead", 1, 0.7), ("drophead", 2, 0.5), ("drophead", 3, 9.0)]
    ]
  )
  rows = {r["measure"]: r for r in study.conditions(em)}
  d = np.array([0.1, 0.2, 0.3])  # seed 3 has no baseline: unpaired
  half = 4.302653 * d.std(ddof=1) / np.sqrt(3)  # t_0.975 with 2 degrees of freedom
  r = rows["selectivity"]
  assert r["seeds"] == 3 and r["difference"] == pytest.approx(0.2)
  assert (r["ci_low"], r["ci_high"]) == pytest.approx((0.2 - half, 0.2 + half))
  assert rows["best_minus_median"]["difference"] == pytest.approx(0.2)
  assert study.conditions(em[em["condition"] != "baseline"]) == []  # no baseline: nothing to pair with
  # the diversity metrics at each run's last step, paired the same way (task ''); earlier steps ignored
  div = pd.DataFrame(
    [
      dict(run=f"{c}_s{s}", condition=c, seed=s, step=step, metric=m, value=v + (step == 100) * (m == "cka") * s)
      for c, s, v in [("baseline", 0, 0.1), ("baseline", 1, 0.5), ("drophead", 0, 0.2), ("drophead", 1, 0.7)]
      for m in ("cka", "js_distance")
      for step in (0, 100)
    ]
  )
  rows = {r["measure"]: r for r in study.conditions(em, div) if r["task"] == ""}
  assert set(rows) == {"cka", "js_distance"} and rows["cka"]["seeds"] == 2
  assert rows["js_distance"]["difference"] == pytest.approx(0.15)  # (0.1 + 0.2) / 2
  assert rows["cka"]["difference"] == pytest.approx(0.15)  # the seed offsets cancel in the pairs
  half = 12.7062 * np.std([0.1, 0.2], ddof=1) / np.sqrt(2)
  assert (rows["cka"]["ci_low"], rows["cka"]["ci_high"]) == pytest.approx((0.15 - half, 0.15 + half), rel=1e-4)


def test_formation_summary_median_over_heads_range_over_seeds():
  """Per seed the median over a layer's heads (never = later than every step: a seed where most heads never
  formed has no median), then the median, min and max over seeds and the seeds where any head formed."""
  steps = {0: [10, 20, np.nan], 1: [5, np.nan, np.nan], 2: [100, 100, 200]}
  fo = pd.DataFrame(
    [
      dict(condition="baseline", source="probe", task="upos", layer=0, head=h, seed=s, formation_step=v)
      for s, values in steps.items()
      for h, v in enumerate(values)
    ]
  )
  r = study._formation_summary(fo).iloc[0]
  assert (r["median"], r["min"], r["max"]) == (60, 20, 100)  # seed 1's median is never: left out
  assert (r["seeds_formed"], r["seeds"]) == (3, 3)


def test_per_condition_tables_carry_a_t_interval_over_seeds():
  """summary.md's per-condition figures: mean, its 95% t interval over seeds, min, max, count (NaN bounds
  with one seed)."""
  em = pd.DataFrame(
    [dict(condition="baseline", task="upos", step=9, selectivity=v) for v in (0.1, 0.2, 0.6)]
    + [dict(condition="drophead", task="upos", step=9, selectivity=0.3)]
  )
  t = study._by_condition(em, ["task", "step"], "selectivity").set_index("condition")
  half = 4.302653 * np.std([0.1, 0.2, 0.6], ddof=1) / np.sqrt(3)
  assert list(t.columns) == ["task", "step", "mean", "t_low", "t_high", "min", "max", "count"]
  assert (t.loc["baseline", "t_low"], t.loc["baseline", "t_high"]) == pytest.approx((0.3 - half, 0.3 + half))
  assert (t.loc["baseline", "min"], t.loc["baseline", "max"], t.loc["baseline", "count"]) == (0.1, 0.6, 3)
  assert np.isnan(t.loc["drophead", "t_low"]) and t.loc["drophead", "mean"] == 0.3


def test_parts_of_a_setting_add_their_runs_to_the_plan(tmp_path):
  """A part (`grammar.py:seed=1`) keeps the runs of earlier parts of the same setting in experiment.json,
  so each part's report covers every run done so far; the whole setting, or another one, replaces them."""
  run = lambda name: experiments.Run(name, f"g.py:{name}", name.split("_")[0], int(name[-1]))
  part = lambda *names: experiments.Experiment(runs=tuple(run(n) for n in names), analyses=())
  experiments.write_plan(tmp_path, part("baseline_s0", "drophead_s0"), "g.py:seed=0")
  experiments.write_plan(tmp_path, part("baseline_s1"), "g.py:condition=baseline,seed=1")
  plan = experiments.read_plan(tmp_path)
  assert [r["name"] for r in plan["runs"]] == ["baseline_s0", "drophead_s0", "baseline_s1"]
  assert plan["experiment"] == "g.py:condition=baseline,seed=1"
  experiments.write_plan(tmp_path, part("baseline_s7"), "./g.py:seed=7")  # the same file, spelled otherwise
  assert [r["name"] for r in experiments.read_plan(tmp_path)["runs"]][-1] == "baseline_s7"
  assert len(experiments.read_plan(tmp_path)["runs"]) == 4
  # A packaged setting by its `configs/` path, its absolute path in another checkout, or its name: one setting.
  spellings = (
    "configs/experiments/induction.py",
    "/elsewhere/configs/experiments/induction.py",
    "experiments/induction",
  )
  for seed, spelling in enumerate(spellings):
    experiments.write_plan(tmp_path / "ind", part(f"L2_mlp_s{seed}"), f"{spelling}:condition=L2_mlp,seed={seed}")
  assert [r["name"] for r in experiments.read_plan(tmp_path / "ind")["runs"]] == ["L2_mlp_s0", "L2_mlp_s1", "L2_mlp_s2"]
  experiments.write_plan(tmp_path, part("baseline_s0"), "g.py")  # the whole setting lists its own runs only
  assert [r["name"] for r in experiments.read_plan(tmp_path)["runs"]] == ["baseline_s0"]
  experiments.write_plan(tmp_path, part("tiny_s0"), "g.py:tiny,seed=0")  # a part of another setting: replaces
  assert [r["name"] for r in experiments.read_plan(tmp_path)["runs"]] == ["tiny_s0"]
  experiments.write_plan(tmp_path, part("other_s0"), "h.py:seed=0")
  assert [r["name"] for r in experiments.read_plan(tmp_path)["runs"]] == ["other_s0"]
  assert not list(tmp_path.glob(".*.lock"))  # the plan's lock is gone after each write


def test_induction_table_drop_formation_and_causal_by_step(tmp_path):
  """induction.csv: the repeated sequences' copy losses, the ICL score and the induction causal check at every
  kept step (other icl kinds and causal selections left out); formation.csv's repeat_drop row: the first step
  whose CI low lies above step 0's drop; summary.md's induction section and induction.png."""
  root = tmp_path / "exp"
  experiments.write_plan(
    root, experiments.Experiment(runs=(experiments.Run("L2_s0", "c.py", "L2", 0),), analyses=()), "c.py"
  )
  run = root / "L2_s0"
  tables.write(tables.path_of(run, tables.PROBE_SELECTIVITY), _selectivity_rows("L2_s0", 0, {(0, 0): (0.0, 0.0, -0.1)}),
               tables.PROBE_SELECTIVITY)  # fmt: skip
  # 100: CI low above step 0's 0.01 but not by a nat; 300: 1.4 > 0.01 + 1 (study.DROP_FORMED)
  drops = {0: (0.01, -0.02, 0.04), 100: (0.9, 0.8, 1.0), 300: (1.6, 1.4, 1.8)}
  icl = [dict(model="L2_s0", step=s, kind="repeat_drop", position="", value=v, ci_low=lo, ci_high=hi)
         for s, (v, lo, hi) in drops.items()]  # fmt: skip
  icl += [dict(model="L2_s0", step=0, kind="loss_at_position", position=1, value=6.0, ci_low=5.9, ci_high=6.1)]
  tables.write(tables.path_of(run, tables.ICL), icl, tables.ICL)
  causal = [
    dict(model="L2_s0", step=s, kind="induction", task=f"repeated_random/{a}", k=1, selection=sel, seed=-1,
         metric=m, value=v, ci_low=v - 0.1, ci_high=v + 0.1)
    for s, v in ((0, 0.0), (300, 0.5))
    for a in ("zero", "mean")
    for sel, m in (("top_induction", "loss_delta_second_vs_random"), ("top_induction", "loss_delta_first"),
                   ("top_induction", "loss_delta_second_vs_unlabelled"), ("random_layer_matched", "loss_delta_second"))
  ]  # fmt: skip
  tables.write(tables.path_of(run, tables.ABLATION_CAUSAL), causal, tables.ABLATION_CAUSAL)
  roles = [dict(model="L2_s0", step=s, data="repeated_random", layer=1, head=0, role="induction", score=v,
                ci_low=v - 0.01, ci_high=v + 0.01) for s, v in ((0, 0.05), (100, 0.3), (300, 0.45))]  # fmt: skip
  tables.write(tables.path_of(run, tables.ROLES), roles, tables.ROLES)

  summary = study.write_study(root).read_text()
  assert "| L2 | induction | 300 | 300 | 300 | 1 | 1 |" in summary  # the first step at the 0.4 label
  ind = pd.read_csv(root / "study/induction.csv")
  assert sorted(set(ind["measure"])) == [
    "loss_delta_second_vs_random (mean)",
    "loss_delta_second_vs_random (zero)",
    "loss_delta_second_vs_unlabelled (mean)",
    "loss_delta_second_vs_unlabelled (zero)",
    "repeat_drop",
  ]
  assert len(ind) == 3 + 8 and ind[ind["measure"] == "repeat_drop"]["k"].isna().all()
  zero = ind[ind["measure"] == "loss_delta_second_vs_random (zero)"].set_index("step")
  assert zero.loc[300, "value"] == pytest.approx(0.5) and zero.loc[300, "k"] == 1
  assert zero.loc[300, "mde"] == pytest.approx(study.mde(0.4, 0.6), rel=1e-5)  # written with 6 digits
  fo = pd.read_csv(root / "study/formation.csv")
  drop = fo[fo["source"] == "loss"].iloc[0]
  assert (drop["task"], drop["layer"], drop["head"], drop["formation_step"]) == ("repeat_drop", -1, -1, 300)
  assert drop["init_best"] == pytest.approx(0.01)
  assert "## Induction by step" in summary and "| L2 | repeat_drop | 300 | 1.600 |" in summary
  assert "| L2 | loss_delta_second_vs_unlabelled (zero) | 300 | 0.500 |" in summary
  assert (root / "study/induction.png").exists()
  # the first step a head reaches the label threshold (0.4), over seeds
  roles = [dict(run="a", condition="L2", seed=0, step=s, role="induction", layer=1, head=0, score=v)
           for s, v in ((0, 0.05), (100, 0.41), (300, 0.9))]  # fmt: skip
  roles += [dict(run="b", condition="L2", seed=1, step=s, role="induction", layer=1, head=0, score=v)
            for s, v in ((0, 0.05), (100, 0.2), (300, 0.5))]  # fmt: skip
  roles += [
    dict(run="c", condition="L2", seed=2, step=s, role="induction", layer=1, head=0, score=0.1) for s in (0, 300)
  ]
  got = study._label_steps(pd.DataFrame(roles)).iloc[0]
  assert (got["median"], got["min"], got["max"], got["seeds_reached"], got["seeds"]) == (200, 100, 300, 2, 3)


def _sae_head_rows(model, step, by_head, sae="topk-f64-k4"):
  """sae/heads.csv rows: {(layer, head): (specialization, exclusive_features)}."""
  rows = []
  for (layer, head), (spec, exclusive) in by_head.items():
    for metric, value in (("specialization", spec), ("exclusive_features", exclusive), ("features_carried", 9)):
      rows.append(dict(model=model, step=step, site="z", layer=layer, sae=sae, head=head, metric=metric, value=value))
  return rows


def test_sae_specialization_by_step_and_its_rank_correlation_with_selectivity(tmp_path):
  """study/sae_heads.csv holds each head's S_h and exclusive features per step; sae.csv their mean, max and sum,
  and per step Spearman's ρ over heads of S_h with test selectivity, within layers, and of their changes."""
  root = tmp_path / "exp"
  exp = experiments.Experiment(runs=(experiments.Run("baseline_s0", "c.py", "baseline", 0),), analyses=())
  experiments.write_plan(root, exp, "c.py")
  run = root / "baseline_s0"
  heads = [(l, h) for l in range(2) for h in range(3)]
  sel0 = {k: (0.0, 0.0, -0.01) for k in heads}
  sel100 = {k: (0.1 * i, 0.1 * i, 0.1 * i - 0.02) for i, k in enumerate(heads)}  # rises with the head's index
  tables.write(tables.path_of(run, tables.PROBE_SELECTIVITY),
               _selectivity_rows("baseline_s0", 0, sel0) + _selectivity_rows("baseline_s0", 100, sel100),
               tables.PROBE_SELECTIVITY)  # fmt: skip
  sae0 = {k: (0.3, 0) for k in heads}
  sae100 = {k: (0.3 + 0.05 * i, i % 2) for i, k in enumerate(heads)}  # S_h rises where selectivity does
  rows = _sae_head_rows("baseline_s0", 0, sae0) + _sae_head_rows("baseline_s0", 100, sae100)
  rows += _sae_head_rows("baseline_s0-random", 100, {k: (0.9, 5) for k in heads})  # a control: not the run's
  tables.write(tables.path_of(run, tables.SAE_HEADS), rows, tables.SAE_HEADS)

  summary = study.write_study(root).read_text()
  out = root / "study"
  per_head = pd.read_csv(out / "sae_heads.csv")
  assert len(per_head) == 12 and set(per_head["step"]) == {0, 100}
  assert per_head.set_index(["step", "layer", "head"]).loc[(100, 1, 2), "specialization"] == pytest.approx(0.55)
  s = pd.read_csv(out / "sae.csv").fillna({"task": ""})
  value = {(r.step, r.measure, r.task): r.value for r in s.itertuples()}
  assert value[(100, "specialization_mean", "")] == pytest.approx(0.3 + 0.05 * 2.5)
  assert value[(100, "specialization_max", "")] == pytest.approx(0.55)
  assert value[(100, "exclusive_features", "")] == 3 and value[(100, "heads_with_exclusive", "")] == 3
  assert value[(0, "exclusive_features", "")] == 0
  assert value[(100, "spearman_selectivity", "upos")] == pytest.approx(1.0)
  assert value[(100, "within_layer_spearman", "upos")] == pytest.approx(1.0)
  assert value[(100, "spearman_change", "upos")] == pytest.approx(1.0)
  assert (0, "spearman_change", "upos") not in value  # no change at the first step
  rho = s[s["measure"] == "spearman_selectivity"]
  assert (rho["heads"] == 6).all() and (rho["p_holm"] >= rho["p_value"]).all()
  assert "## Heads through SAE features, by step" in summary and "spearman_change" in summary
  assert (out / "sae.png").exists()
