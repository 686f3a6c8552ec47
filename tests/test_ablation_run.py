"""`headspec ablate` end to end on a tiny trained run: every table's contract and known values, bad input."""

import csv
import pathlib
import shutil
import sys

import numpy as np
import pytest

from headspec.ablation import core, gates, metrics, pruning
from headspec.ablation.run import evaluation_set
from headspec.ablation.run import quickstart as ablate_quickstart
from headspec.ablation.run import run as run_ablation
from headspec.cli.main import main
from headspec.io import tables
from headspec.runs import directory as runs

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "configs"))
import ablate as ablate_config  # noqa: E402  configs/ablate.py

L, H = 2, 4


@pytest.fixture(scope="module")
def run_dir(train_tiny_decoder):
  """A tiny decoder trained 30 steps (checkpoints 20 and 30) on the synthetic text."""
  workdir = train_tiny_decoder(30, (20,))
  return workdir


def small_config(**changes):
  c = ablate_config.get_config(None)
  c.num_tokens, c.batch_size, c.bootstrap_resamples = 256, 4, 100
  c.gates.penalties, c.gates.steps = (0.0, 1.0), 30
  c.causal.random_seeds, c.causal.max_train_words, c.causal.max_eval_words = 2, 600, 300
  c.causal.refine_samples, c.causal.l2_grid = 0, (1e-3,)
  c.pruning.random_seeds = 5
  for key, value in changes.items():
    c[key] = value
  return c


def fake_probe_results(workdir, name, steps, layers=L, heads=H):
  """probes/results.csv rows for every head (dev and test), selectivity decreasing with layer·H + head."""
  rows = []
  for step in steps:
    for task in ("upos", "arc"):
      for layer in range(layers):
        for head in range(heads):
          for split in ("synthetic/dev", "synthetic/test"):
            sel = 1.0 - (layer * heads + head) / (layers * heads)
            rows.append(
              dict(model=name, step=step, task=task, layer=layer, head=head, split=split, accuracy=0.5, ci_low=0.4,
                   ci_high=0.6, control_accuracy=0.5 - sel / 2, selectivity=sel, n=100)
            )  # fmt: skip
  tables.write(tables.path_of(workdir, tables.PROBES), rows, tables.PROBES)


def read(workdir, table):
  with open(tables.path_of(workdir, table), newline="") as f:
    reader = csv.DictReader(f)
    assert tuple(reader.fieldnames) == table.columns
    return list(reader)


def snapshot(path: pathlib.Path) -> dict:
  return {p: p.read_bytes() for p in path.rglob("*") if p.is_file()}


def test_every_table_and_known_values(run_dir):
  fake_probe_results(run_dir, run_dir.name, [20, 30])
  out = run_ablation(small_config(steps="last"), run_dir)
  assert out == run_dir / "ablation"
  heads = read(run_dir, tables.ABLATION_HEADS)
  assert {r["step"] for r in heads} == {"30"}
  methods = {(r["method"], r["metric"]) for r in heads}
  assert methods == {
    ("zero", "loss_delta"), ("zero", "accuracy_delta"), ("mean", "loss_delta"), ("mean", "accuracy_delta"),
    ("keep_only", "loss_delta"), ("keep_only", "accuracy_delta"), ("importance", "score"),
    ("importance", "raw_score"), ("magnitude", "score"), ("entropy", "score"),
  }  # fmt: skip
  for method, metric in methods:
    assert len([r for r in heads if (r["method"], r["metric"]) == (method, metric)]) == L * H
  for r in heads:
    if r["method"] in ("zero", "mean", "keep_only"):
      assert float(r["ci_low"]) <= float(r["value"]) + 1e-9 <= float(r["ci_high"]) + 2e-9

  # Known values: zero ablation of one head against a direct evaluation of the masked model.
  model, tokenizer = runs.load_run_model(run_dir, 30)
  config = small_config()
  from headspec.runs.targets import run_targets

  es = evaluation_set(config, run_dir, run_targets(run_dir, "last")[0], tokenizer, model.cfg)
  zero = core.zero_replacement(model)
  base = metrics.values("lm", core.run_one(model, es, np.ones((L, H)), zero))
  mask = np.ones((L, H))
  mask[1, 2] = 0
  ablated = metrics.values("lm", core.run_one(model, es, mask, zero))
  row = next(r for r in heads if (r["method"], r["metric"], r["layer"], r["head"]) == ("zero", "loss_delta", "1", "2"))
  assert float(row["value"]) == pytest.approx(ablated["loss"] - base["loss"], abs=1e-5)

  # Pruning: 0% reproduces the unablated loss; 11 points per ranking; 5 random seeds; probe ranking present.
  pruning_rows = read(run_dir, tables.ABLATION_PRUNING)
  counts = pruning.schedule(L * H, 0.1)
  assert {r["ranking"] for r in pruning_rows} == set(pruning.RANKINGS)
  assert {int(r["seed"]) for r in pruning_rows if r["ranking"] == "random"} == set(range(5))
  for r in pruning_rows:
    if int(r["heads_pruned"]) == 0 and r["metric"] == "loss":
      assert float(r["value"]) == pytest.approx(base["loss"], abs=1e-5)
  assert {int(r["heads_pruned"]) for r in pruning_rows} == set(counts)
  # `ablation` prunes the head with the smallest single-head zero-ablation effect first, so its first point is
  # the smallest one-head loss, at or below the random orders' mean (it once pruned the largest first).
  zero_delta = [float(r["value"]) for r in heads if (r["method"], r["metric"]) == ("zero", "loss_delta")]
  first = lambda ranking: [
    float(r["value"]) for r in pruning_rows if (r["ranking"], r["heads_pruned"], r["metric"]) == (ranking, "1", "loss")
  ]
  assert first("ablation") == [pytest.approx(base["loss"] + min(zero_delta), abs=1e-5)]
  assert first("ablation")[0] <= np.mean(first("random")) + 1e-6

  # Gates: a huge penalty closes gates (fewer expected open gates than λ = 0).
  gate_rows = read(run_dir, tables.ABLATION_GATES)
  l0 = {float(r["penalty"]): float(r["value"]) for r in gate_rows if r["metric"] == "expected_l0"}
  assert l0[1.0] < l0[0.0]

  # Causal: upos only (arc is skipped), k = 1, 2, 4, selective + 2 random seeds, vs-random rows.
  causal_rows = read(run_dir, tables.ABLATION_CAUSAL)
  assert {r["task"] for r in causal_rows} == {"upos"} and {r["kind"] for r in causal_rows} == {"probe_selective"}
  assert {int(r["k"]) for r in causal_rows} == {0, 1, 2, 4}
  assert {r["selection"] for r in causal_rows} == {"selective", "random_layer_matched"}
  assert {r["metric"] for r in causal_rows} >= {"probe_accuracy", "probe_accuracy_fixed", "loss_delta",
                                                 "probe_accuracy_vs_random", "loss_delta_vs_random"}  # fmt: skip
  # Interactions: all pairs of the top min(12, L·H) heads.
  inter = read(run_dir, tables.ABLATION_INTERACTIONS)
  assert len(inter) == L * H * (L * H - 1) // 2
  for r in inter:
    assert float(r["interaction"]) == pytest.approx(float(r["joint"]) - float(r["sum_of_singles"]), abs=1e-5)
  for name in ("heads", "pruning", "gates", "causal", "interactions"):
    assert (out / f"{name}_{run_dir.name}_step30.png").stat().st_size > 1000

  # A rerun of step 20 keeps step 30's rows.
  run_ablation(small_config(steps="20", methods="zero,magnitude"), run_dir)
  again = read(run_dir, tables.ABLATION_HEADS)
  assert {r["step"] for r in again} == {"20", "30"}
  assert [r for r in again if r["step"] == "30"] == heads


def test_l0_penalty_lowers_open_gates(run_dir):
  model, tokenizer = runs.load_run_model(run_dir, 30)
  from headspec.runs.targets import run_targets

  es = evaluation_set(small_config(), run_dir, run_targets(run_dir, "last")[0], tokenizer, model.cfg)
  fit = lambda lam: gates.fit_gates(model, es, lam, steps=40, learning_rate=0.1, init_log_alpha=1.0, seed=0)
  assert float(gates.open_probability(fit(0.5)).sum()) < float(gates.open_probability(fit(0.0)).sum()) - 1.0


def test_quickstart_ablation(run_dir, synthetic_data_dir):
  text = ablate_quickstart(run_dir, synthetic_data_dir)
  assert "layer" in text and "head" in text


def config_file(tmp_path, arg="", **overrides) -> str:
  """A config file that is configs/ablate.py[:arg] with `overrides` (key path -> value) applied.

  (In-process `headspec.cli.main.main` does not apply --config.key=value overrides: the lead knows.)
  """
  name = f"cfg_{len(list(tmp_path.glob('cfg_*.py')))}.py"
  lines = [
    f"import sys\nsys.path.insert(0, {str(REPO / 'headspec' / 'configs')!r})\nimport ablate\n\n",
    "def get_config(a=None):",
  ]
  lines.append(f"  c = ablate.get_config({arg!r} or None)")
  lines += [f"  c.{key.replace('__', '.')} = {value!r}" for key, value in overrides.items()]
  lines.append("  return c\n")
  (tmp_path / name).write_text("\n".join(lines))
  return f"--config={tmp_path / name}"


def ablate(tmp_path, workdir, arg="", **overrides) -> int:
  return main(["headspec", "ablate", config_file(tmp_path, arg, **overrides), f"--workdir={workdir}"])


def test_bad_input_one_line_nothing_lost(run_dir, tmp_path, capsys):
  fake_probe_results(run_dir, run_dir.name, [20, 30])
  before = snapshot(run_dir)
  cases = [
    (dict(methods="zero,ablate_everything"), "unknown method"),
    (dict(pruning__rankings="importance,coin"), "unknown ranking"),
    (dict(steps="7"), "step(s) [7] not saved"),
  ]
  for overrides, message in cases:
    assert ablate(tmp_path, run_dir, **overrides) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
  # probe results of another architecture
  fake_probe_results(run_dir, run_dir.name, [30], layers=3)
  assert ablate(tmp_path, run_dir, steps="last") == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "layers × 4 heads" in err[0], err
  fake_probe_results(run_dir, run_dir.name, [20, 30])
  assert snapshot(run_dir) == before
  # a run with no checkpoints
  (tmp_path / "no_ckpt").mkdir()
  (tmp_path / "no_ckpt" / "config.json").write_bytes((run_dir / "config.json").read_bytes())
  assert ablate(tmp_path, tmp_path / "no_ckpt") == 2
  assert "no checkpoint" in capsys.readouterr().err
  # a foreign table file is refused before any work
  foreign = tmp_path / "foreign"
  shutil.copytree(run_dir, foreign, ignore=shutil.ignore_patterns("ablation", "probes"))
  (foreign / "ablation").mkdir()
  (foreign / "ablation" / "pruning.csv").write_text("a,b\n1,2\n")
  assert ablate(tmp_path, foreign) == 2
  assert "move the file away" in capsys.readouterr().err
  assert sorted(p.name for p in (foreign / "ablation").iterdir()) == ["pruning.csv"]
  assert (foreign / "ablation" / "pruning.csv").read_text() == "a,b\n1,2\n"


@pytest.mark.slow
def test_minilm_gates_refused_and_shift(tmp_path, capsys):
  out = tmp_path / "minilm"
  assert ablate(tmp_path, out, "minilm", methods="zero,gates") == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and "L0 gates need a trained LM head" in err[0]
  assert not (out / "ablation").exists()
  assert (
    ablate(
      tmp_path, out, "minilm", methods="zero,importance", num_sentences=8, batch_tokens=256, bootstrap_resamples=50
    )
    == 0
  )
  rows = read(out, tables.ABLATION_HEADS)
  assert {(r["method"], r["metric"]) for r in rows} == {
    ("zero", "embedding_shift"),
    ("importance", "score"),
    ("importance", "raw_score"),
  }
  assert len(rows) == 3 * 6 * 12
  assert all(float(r["value"]) >= -1e-6 for r in rows)


def test_causal_test_reads_words_where_the_probe_ranked_them(run_dir, synthetic_data_dir):
  """causal.pooling 'auto' (the default) is the probe's: a decoder's words at their LAST piece, not the first."""
  from headspec.ablation import causal

  model, tokenizer = runs.load_run_model(run_dir, 30)
  pools = {}
  for pooling in ("auto", "last", "first"):
    c = small_config()
    c.causal.pooling = pooling
    (data,) = causal.load_task_data(synthetic_data_dir, "synthetic", ["upos"], tokenizer, model.cfg, c)
    pools[pooling] = np.concatenate([inputs[3].reshape(-1) for inputs, _ in data.test.batches])
  assert ablate_config.get_config(None).causal.pooling == "auto"
  np.testing.assert_array_equal(pools["auto"], pools["last"])
  assert not np.array_equal(pools["last"], pools["first"])  # words of several pieces exist
