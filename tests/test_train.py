"""Training: parallel layouts agree, resume is exact after kill -9, the model learns, bad runs stop."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from flax import nnx

from headspec.cli.quickstart import quickstart_config
from headspec.errors import UserError
from headspec.model.config import from_section
from headspec.model.transformer import Transformer
from headspec.runs import checkpoints
from headspec.runs import directory as runs
from headspec.train.loop import train_and_evaluate

REPO = pathlib.Path(__file__).resolve().parents[1]


def tiny_config(data_dir, kind="encoder", steps=4):
  c = quickstart_config(kind)
  c.data_dir = str(data_dir)
  c.data.vocab_size = 512
  c.model.d_model, c.model.d_head, c.model.d_ff, c.model.num_heads = 32, 8, 64, 4
  c.train.steps = steps
  c.train.batch_size = 16
  c.train.seq_len = 32
  c.train.log_every = 1
  c.train.eval_every = 0
  c.train.diversity_every = 0
  c.train.checkpoint_every = 2
  c.train.keep_steps = ()
  return c


def losses(workdir):
  records = [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  return [r["loss"] for r in records if "loss" in r]


def test_jit_mesh_pmap_and_single_device_agree(synthetic_data_dir, tmp_path):
  assert jax.device_count() == 2
  config = tiny_config(synthetic_data_dir, "encoder")
  train_and_evaluate(config, tmp_path / "jit")
  train_and_evaluate(config, tmp_path / "one", devices=jax.devices()[:1])
  config.parallelism = "pmap"
  train_and_evaluate(config, tmp_path / "pmap")
  jit, one, pmap = losses(tmp_path / "jit"), losses(tmp_path / "one"), losses(tmp_path / "pmap")
  assert len(jit) == 4 and len(set(jit)) > 1
  np.testing.assert_allclose(one, jit, rtol=2e-5)
  np.testing.assert_allclose(pmap, jit, rtol=2e-5)
  config.parallelism, config.mesh = "jit", "fsdp=2"  # parameters and Adam state split over both devices
  train_and_evaluate(config, tmp_path / "fsdp")
  np.testing.assert_allclose(losses(tmp_path / "fsdp"), jit, rtol=1e-4)
  restored = [np.asarray(x) for x in _params(tmp_path / "fsdp", 4)]  # saved sharded, restored on one device
  assert all(len(x.devices()) == 1 for x in _params(tmp_path / "fsdp", 4))
  np.testing.assert_allclose(np.concatenate([x.ravel() for x in restored]),
                             np.concatenate([np.asarray(x).ravel() for x in _params(tmp_path / "jit", 4)]), atol=1e-5)  # fmt: skip
  config.parallelism = "pmap"
  with pytest.raises(UserError, match="config.parallelism='pmap' copies the model to every device"):
    train_and_evaluate(config, tmp_path / "refused")


def _params(workdir, step):
  model, _ = runs.load_run_model(workdir, step)
  return jax.tree.leaves(model)


def _cli(*args, env=None):
  return [sys.executable, "-m", "headspec", *args]


@pytest.mark.slow
def test_kill_9_then_resume_is_bit_identical(synthetic_data_dir, tmp_path):
  steps = 12
  config = tiny_config(synthetic_data_dir, "decoder", steps=steps)
  train_and_evaluate(config, tmp_path / "straight")

  overrides = [
    f"--config.data_dir={synthetic_data_dir}",
    "--config.data.vocab_size=512",
    "--config.model.d_model=32",
    "--config.model.d_head=8",
    "--config.model.d_ff=64",
    f"--config.train.steps={steps}",
    "--config.train.batch_size=16",
    "--config.train.seq_len=32",
    "--config.train.log_every=1",
    "--config.train.eval_every=0",
    "--config.train.diversity_every=0",
    "--config.train.checkpoint_every=2",
    "--config.train.keep_steps=()",
  ]
  cmd = _cli("train", "--config=quickstart:decoder", f"--workdir={tmp_path / 'killed'}", *overrides)
  proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
  deadline = time.time() + 240
  while time.time() < deadline and proc.poll() is None:
    if [s for s in checkpoints.saved_steps(tmp_path / "killed") if 2 <= s < steps]:
      break
    time.sleep(0.05)
  assert proc.poll() is None, f"training ended before it could be killed: {proc.stderr.read().decode()[-2000:]}"
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  killed_at = checkpoints.saved_steps(tmp_path / "killed")
  assert killed_at and max(killed_at) < steps
  done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  for a, b in zip(_params(tmp_path / "straight", steps), _params(tmp_path / "killed", steps), strict=True):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_sigterm_saves_and_exits_cleanly(synthetic_data_dir, tmp_path):
  cmd = _cli(
    "train",
    "--config=quickstart:decoder",
    f"--workdir={tmp_path}",
    f"--config.data_dir={synthetic_data_dir}",
    "--config.data.vocab_size=512",
    "--config.train.steps=100000",
    "--config.train.checkpoint_every=100000",
    "--config.train.eval_every=0",
    "--config.train.diversity_every=0",
    "--config.train.log_every=1",
    "--config.train.keep_steps=()",
  )
  proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  metrics = tmp_path / "metrics.jsonl"
  deadline = time.time() + 240
  while time.time() < deadline and not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
    time.sleep(0.1)
  proc.send_signal(signal.SIGTERM)
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 0, err[-2000:]
  saved = checkpoints.saved_steps(tmp_path)
  assert saved and saved[-1] >= 3
  assert saved[-1] == max(json.loads(line)["step"] for line in metrics.read_text().splitlines())


def test_decoder_learns_below_unigram_entropy(synthetic_data_dir, tmp_path):
  config = tiny_config(synthetic_data_dir, "decoder", steps=200)
  config.model.d_model, config.model.d_head, config.model.d_ff = 64, 16, 256
  config.train.seq_len = 64
  config.train.learning_rate = 3e-3
  config.train.warmup_steps = 20
  config.train.eval_every = 200
  config.train.eval_batches = 4
  config.train.log_every, config.train.checkpoint_every = 50, 200  # not a save and a host read every step
  train_and_evaluate(config, tmp_path)
  records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  eval_loss = [r["eval/loss"] for r in records if "eval/loss" in r][-1]
  valid_NT = np.load(tmp_path / "cache" / "valid_tokens.npy")
  counts = np.bincount(valid_NT.ravel()).astype(float)
  p = counts[counts > 0] / counts.sum()
  unigram_entropy = float(-(p * np.log(p)).sum())  # nats, the loss of the best context-free model
  assert eval_loss < 0.8 * unigram_entropy, (eval_loss, unigram_entropy)


def test_nan_loss_stops_with_a_clear_message(synthetic_data_dir, tmp_path):
  config = tiny_config(synthetic_data_dir, "decoder", steps=50)
  config.train.learning_rate = 1e12
  config.train.warmup_steps = 0
  with pytest.raises(UserError, match=r"loss became (nan|inf).*Last good checkpoint"):
    train_and_evaluate(config, tmp_path)
  for step in checkpoints.saved_steps(tmp_path):  # what was kept is finite
    assert all(np.isfinite(np.asarray(x)).all() for x in _params(tmp_path, step))


def test_workdir_with_another_model_shape_is_refused(synthetic_data_dir, tmp_path):
  config = tiny_config(synthetic_data_dir, "decoder", steps=2)
  train_and_evaluate(config, tmp_path)
  before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
  config.model.d_model = 48
  with pytest.raises(UserError, match="different model: model.d_model"):
    train_and_evaluate(config, tmp_path)
  config.model.d_model = json.loads((tmp_path / "config.json").read_text())["model"]["d_model"]
  config.model.mlp = False  # attention-only: other parameters, same sizes
  with pytest.raises(UserError, match="different model: model.mlp is True there, False in this config"):
    train_and_evaluate(config, tmp_path)
  after = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
  assert before == after


def test_cli_errors_are_one_line(tmp_path):
  env = dict(os.environ, HEADSPEC_DATA_DIR=str(tmp_path / "nowhere"))
  cases = [
    ["train", "--config=quickstart", f"--workdir={tmp_path}/w", "--config.model.nope=1"],
    ["train", f"--config={REPO}/configs/missing.py", f"--workdir={tmp_path}/w"],
    ["train", "--config=quickstart", f"--workdir={tmp_path}/w"],
    ["train", "--config=quickstart", f"--workdir={tmp_path}/w", f"--config.data_dir={tmp_path}"],
    ["frobnicate"],
  ]
  for args in cases:
    done = subprocess.run(_cli(*args), cwd=REPO, capture_output=True, text=True, env=env, timeout=120)
    lines = [l for l in done.stderr.splitlines() if l.strip() and "WARNING" not in l]
    assert done.returncode == 2, (args, done.stderr)
    assert len(lines) == 1 and lines[0].startswith("headspec: error:"), (args, done.stderr)
    assert "Traceback" not in done.stderr
  assert not (tmp_path / "w" / "checkpoints").exists()


def test_step_0_in_keep_steps_saves_the_initial_parameters(synthetic_data_dir, tmp_path):
  config = tiny_config(synthetic_data_dir, "decoder", steps=2)
  config.train.keep_steps = (0,)
  train_and_evaluate(config, tmp_path)
  assert checkpoints.saved_steps(tmp_path) == [0, 2]
  cfg = from_section(config.model, runs.load_run_model(tmp_path, 0)[1].vocab_size, config.train.seq_len)
  initial = jax.tree.leaves(Transformer(cfg, rngs=nnx.Rngs(params=config.seed)))
  for saved, fresh in zip(_params(tmp_path, 0), initial):
    np.testing.assert_array_equal(np.asarray(saved), np.asarray(fresh))
  assert any(
    not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(_params(tmp_path, 0), _params(tmp_path, 2))
  )


def test_a_second_training_of_the_same_shapes_compiles_no_step(synthetic_data_dir, tmp_path):
  """The jitted step is kept per (graph, objective, optimizer, layout): the same run again, in another
  workdir, reuses its compiled train and eval steps; another learning rate compiles a new step."""
  from headspec.parallel.compilations import Compilations

  config = tiny_config(synthetic_data_dir, "decoder", steps=2)
  config.train.eval_every, config.train.eval_batches = 2, 1
  train_and_evaluate(config, tmp_path / "first")
  with Compilations() as again:
    train_and_evaluate(config, tmp_path / "again")
  compiled = lambda c, name: sum(n for k, n in c.counts.items() if name in k)
  assert compiled(again, "train_step") == compiled(again, "eval_step") == 0, again.counts
  np.testing.assert_array_equal(losses(tmp_path / "again"), losses(tmp_path / "first"))
  config.train.learning_rate *= 2
  with Compilations() as other:
    train_and_evaluate(config, tmp_path / "other")
  assert compiled(other, "train_step") == 1, other.counts
