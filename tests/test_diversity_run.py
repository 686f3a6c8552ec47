"""`headspec diversity`: the results table (contract, values, replacement), the figures, bad input."""

import csv
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from headspec.diversity import metrics as diversity
from headspec.diversity.run import read_results
from headspec.diversity.run import run as run_diversity
from headspec.errors import UserError
from headspec.io import tables
from headspec.pretrained import load_pretrained
from headspec.runs import directory as runs
from headspec.runs.evaltext import evaluation_tokens

REPO = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "configs"))
import diversity as diversity_config  # noqa: E402  configs/diversity.py

STEPS = [1, 2, 4, 6]
L, H = 2, 4


@pytest.fixture(scope="module")
def run_dir(train_tiny_decoder):
  """A tiny decoder trained 6 steps, checkpoints kept at 1, 2, 4 and 6."""
  workdir = train_tiny_decoder(6, (1, 2, 4))
  assert runs.resolve_steps(workdir, "all") == STEPS
  return workdir


def small_config(**changes):
  c = diversity_config.get_config(None)
  c.num_tokens = 300  # 9 full rows of 32 and a partial one: 3 batches of 4 rows, the last padded
  c.batch_size = 4
  for key, value in changes.items():
    c[key] = value
  return c


def snapshot(path: pathlib.Path) -> dict:
  return {p: p.read_bytes() for p in path.rglob("*") if p.is_file()}


def test_table_contract_values_figures_and_rerun(run_dir):
  results = run_diversity(small_config(), run_dir)
  assert results == run_dir / "diversity" / "results.csv"
  with open(results, newline="") as f:
    assert (
      tuple(next(csv.reader(f)))
      == tables.DIVERSITY.columns
      == ("model", "step", "layer", "head_i", "head_j", "metric", "value")
    )
  table = read_results(results)

  # One row per (step, layer, pair or head, metric); head_j = -1 exactly for per-head metrics.
  keys = [r[:5] for r in table]
  assert len(keys) == len(set(keys))
  expected = {
    (s, l, i, j, m)
    for s in STEPS
    for l in range(L)
    for m in diversity.METRICS
    for i in range(H)
    for j in (range(H) if m in diversity.PAIR_METRICS else [-1])
  }
  assert set(keys) == expected
  assert all((r[3] == -1) == (r[4] in diversity.HEAD_METRICS) for r in table)
  described = {r["metric"]: r for r in tables.read(run_dir / "diversity/metrics.csv", tables.DIVERSITY_METRICS)}
  assert set(described) == set(diversity.METRICS)  # every metric in results.csv, once, with its basis label
  dependent = {m for m, r in described.items() if r["basis_dependent"] == "1"}
  assert dependent == {"query_orthogonality", "context_nonorthogonality", "linear_cka"}, dependent
  assert all(r["doc"] and r["kind"] in ("pair", "head") for r in described.values())

  # Values: diversity.compute in one pass over the same tokens (the run's first 300 validation tokens).
  model, tokenizer = runs.load_run_model(run_dir, 4)
  tokens_NT, valid_NT = evaluation_tokens(small_config(), run_dir, tokenizer)
  cached = np.load(run_dir / "cache" / "valid_tokens.npy")
  np.testing.assert_array_equal(tokens_NT.ravel()[:300], cached[:300])
  assert valid_NT.sum() == 300 and valid_NT.shape == (10, 32)
  _, inter = model(jnp.asarray(tokens_NT), valid_BT=jnp.asarray(valid_NT), capture=diversity.CAPTURE)
  want = jax.device_get(diversity.compute(inter, jnp.asarray(valid_NT), causal=True))
  got = {}
  for step, layer, i, j, metric, value in table:
    if step == 4:
      got.setdefault(metric, np.full(want[metric].shape, np.nan))[(layer, i) if j == -1 else (layer, i, j)] = value
  for metric in diversity.METRICS:
    np.testing.assert_allclose(got[metric], want[metric], rtol=2e-4, atol=2e-6, err_msg=metric)

  # Figures, and a GIF with one frame per checkpoint.
  out = run_dir / "diversity"
  for name in ["curves.png", "heads.png", *(f"matrix_{m}.png" for m in diversity.PAIR_METRICS)]:
    assert (out / name).stat().st_size > 1000, name
  with Image.open(out / "output_dissimilarity.gif") as gif:
    assert gif.n_frames == len(STEPS)

  # Rerunning one step replaces its rows (new evaluation set: new values) and keeps the others.
  run_diversity(small_config(steps="6", num_tokens=200), run_dir)
  again = read_results(results)
  assert sorted(r[:5] for r in again) == sorted(keys)
  old, new = ({r[:5]: r[5] for r in t} for t in (table, again))
  assert all(old[k] == new[k] for k in old if k[0] != 6)
  assert any(old[k] != new[k] for k in old if k[0] == 6)


def test_bad_input_raises_one_line_and_writes_nothing(run_dir, tmp_path):
  (tmp_path / "empty").mkdir()
  with pytest.raises(UserError, match="not a headspec run directory"):
    run_diversity(small_config(), tmp_path / "empty")
  no_ckpt = tmp_path / "no_ckpt"
  no_ckpt.mkdir()
  (no_ckpt / "config.json").write_bytes((run_dir / "config.json").read_bytes())
  with pytest.raises(UserError, match="no checkpoint"):
    run_diversity(small_config(), no_ckpt)
  assert sorted(p.name for p in tmp_path.rglob("*")) == ["config.json", "empty", "no_ckpt"]

  before = snapshot(run_dir)
  for config, message in [
    (small_config(steps="3"), r"step\(s\) \[3\] not saved"),
    (small_config(steps="1,x"), "comma-separated list"),
    (small_config(num_tokens=0), "num_tokens=0"),
    (small_config(sample="middle"), "sample='middle'"),
  ]:
    with pytest.raises(UserError, match=message) as e:
      run_diversity(config, run_dir)
    assert "\n" not in str(e.value)
  assert snapshot(run_dir) == before


@pytest.mark.slow
def test_cli(run_dir):
  def cli(*overrides):
    return subprocess.run(
      [
        sys.executable,
        "-m",
        "headspec",
        "diversity",
        f"--config={REPO}/configs/diversity.py",
        f"--workdir={run_dir}",
        "--config.num_tokens=64",
        *overrides,
      ],
      cwd=REPO,
      capture_output=True,
      text=True,
      timeout=300,
      env=dict(os.environ),
    )

  done = cli("--config.steps=last")
  assert done.returncode == 0, done.stderr[-2000:]
  assert f"{run_dir / 'diversity' / 'results.csv'}" in done.stdout
  assert "step 6:" in done.stderr and "model steps" in done.stderr  # absl INFO lines and the progress bar
  assert "Logging before flag parsing" not in done.stderr
  bad = cli("--config.steps=5")
  lines = [l for l in bad.stderr.splitlines() if l.strip() and "WARNING" not in l and "warn" not in l.lower()]
  assert bad.returncode == 2 and len(lines) == 1 and lines[0].startswith("headspec: error: step(s) [5]"), bad.stderr


@pytest.mark.slow
def test_pretrained_minilm_step_0(synthetic_data_dir, tmp_path):
  config = small_config(num_tokens=100, data_dir=str(synthetic_data_dir), corpus="synthetic", seq_len=50)
  config.model.pretrained = "minilm"
  bad = small_config(steps="5")
  bad.model.pretrained = "minilm"
  with pytest.raises(UserError, match="only step 0"):
    run_diversity(bad, tmp_path)
  results = run_diversity(config, tmp_path)
  table = read_results(results)
  assert {r[0] for r in table} == {0}
  assert len(table) == 6 * (len(diversity.PAIR_METRICS) * 12 * 12 + len(diversity.HEAD_METRICS) * 12)
  _, tokenizer = load_pretrained("minilm")
  tokens_NT, valid_NT = evaluation_tokens(config, tmp_path, tokenizer)
  assert (tokens_NT[:, 0] == tokenizer.prefix_ids[0]).all() and (tokens_NT[:, -1] == tokenizer.suffix_ids[0]).all()
  assert valid_NT.sum() == 100


def test_two_models_at_step_0_in_one_workdir_keep_every_row(run_dir, tmp_path, monkeypatch):
  """Diversity/results.csv is keyed by model, so a second model analysed into the same workdir
  (two pretrained models at step 0) adds its rows beside the first's instead of replacing them, and
  `read_results(path, model)` (what the figures draw) gives one model's rows."""
  import dataclasses
  import shutil

  from headspec.diversity import run as diversity_run
  from headspec.runs import targets

  workdir = tmp_path / "run"
  shutil.copytree(run_dir, workdir, ignore=shutil.ignore_patterns("diversity"))  # the module's run stays as it is
  plan = targets.plan

  def analyse(name, step):  # checkpoint `step` standing in for a model `name` at step 0
    renamed = lambda *a, **k: [dataclasses.replace(plan(*a, **k)[0], name=name, step=0)]
    monkeypatch.setattr(diversity_run.targets, "plan", renamed)
    return run_diversity(small_config(steps=str(step)), workdir)

  results = analyse("first", 1)
  first = tables.read(results, tables.DIVERSITY)
  assert len(first) == L * (len(diversity.PAIR_METRICS) * H * H + len(diversity.HEAD_METRICS) * H)
  analyse("second", 6)
  both = tables.read(results, tables.DIVERSITY)
  lost = [r for r in first if r not in both]
  assert not lost, f"{len(lost)} of the first model's {len(first)} rows deleted by the second model's run"
  assert len(both) == 2 * len(first) and sorted({r["model"] for r in both}) == ["first", "second"]
  drawn = read_results(results, "second")
  assert len(drawn) == len(first) and {r[0] for r in drawn} == {0} and drawn != read_results(results, "first")
