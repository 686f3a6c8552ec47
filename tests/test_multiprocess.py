"""Two processes on this machine train data-parallel like one process with the same global batch.

The processes join through `jax.distributed` (coordinator on 127.0.0.1, CPU collectives over gloo),
each with one CPU device and only its half of every batch; the single-process reference has two
devices. Also: SIGTERM to both processes saves one checkpoint at one step, and a restart resumes it.
"""

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from headspec import checkpoints, runs, targets
from headspec.data import text_tfds
from headspec.quickstart import quickstart_config
from headspec.train import train_and_evaluate

pytestmark = pytest.mark.slow
REPO = pathlib.Path(__file__).resolve().parents[1]

SETTINGS = {
  "data.vocab_size": 512,
  "model.d_model": 32,
  "model.d_head": 8,
  "model.d_ff": 64,
  "model.num_heads": 4,
  "train.steps": 6,
  "train.batch_size": 16,
  "train.seq_len": 32,
  "train.log_every": 1,
  "train.eval_every": 3,
  "train.eval_batches": 2,
  "train.diversity_every": 0,
  "train.checkpoint_every": 2,
  "train.keep_steps": (),
}


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start(workdir, data_dir, settings, n=2):
  """`n` CLI processes of one multi-process run, one CPU device each."""
  config = quickstart_config("encoder")
  text_tfds.prepare_corpus(data_dir, config.data.corpus, tfds_dir=targets.tfds_dir(data_dir))  # once, not racing
  port = _free_port()
  flags = [f"--config.{k}={v}" for k, v in settings.items()]
  procs = []
  for i in range(n):
    env = dict(
      os.environ,
      XLA_FLAGS="--xla_force_host_platform_device_count=1",
      JAX_PLATFORMS="cpu",
      JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
      JAX_NUM_PROCESSES=str(n),
      JAX_PROCESS_ID=str(i),
    )
    cmd = [
      sys.executable,
      "-m",
      "headspec",
      "train",
      f"--config={REPO}/configs/quickstart.py:encoder",
      f"--workdir={workdir}",
      f"--config.data_dir={data_dir}",
      "--config.multihost=True",
      *flags,
    ]
    procs.append(subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
  return procs


def _finish(procs, timeout=150):
  outs = [p.communicate(timeout=timeout) for p in procs]
  for i, (p, (_out, err)) in enumerate(zip(procs, outs)):
    assert p.returncode == 0, f"process {i} exited {p.returncode}:\n{err[-3000:]}"
  return outs


def _records(workdir):
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


def test_two_processes_match_one_process(synthetic_data_dir, tmp_path):
  procs = _start(tmp_path / "two", synthetic_data_dir, SETTINGS)
  config = quickstart_config("encoder")
  config.data_dir = str(synthetic_data_dir)
  for key, value in SETTINGS.items():
    section, name = key.split(".")
    config[section][name] = value
  train_and_evaluate(config, tmp_path / "one", devices=jax.devices()[:2])  # while the two processes run
  _finish(procs)

  one, two = _records(tmp_path / "one"), _records(tmp_path / "two")
  for key in ("loss", "eval/loss"):
    a, b = [r[key] for r in one if key in r], [r[key] for r in two if key in r]
    assert len(a) == (6 if key == "loss" else 2) and len(b) == len(a), (key, a, b)
    np.testing.assert_allclose(b, a, rtol=2e-5)
  assert checkpoints.saved_steps(tmp_path / "two") == [2, 4, 6]
  for a, b in zip(
    jax.tree.leaves(runs.load_run_model(tmp_path / "one", 6)[0]),
    jax.tree.leaves(runs.load_run_model(tmp_path / "two", 6)[0]),
    strict=True,
  ):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)


def test_sigterm_to_both_saves_one_checkpoint_and_resumes(synthetic_data_dir, tmp_path):
  endless = {**SETTINGS, "train.steps": 100000, "train.checkpoint_every": 100000, "train.eval_every": 0}
  procs = _start(tmp_path, synthetic_data_dir, endless)
  metrics = tmp_path / "metrics.jsonl"
  deadline = time.time() + 120
  while time.time() < deadline and not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 3):
    assert all(p.poll() is None for p in procs), procs[0].stderr.read()[-3000:]
    time.sleep(0.1)
  for p in procs:  # as a scheduler does: each process gets its own signal, not at the same instant
    p.send_signal(signal.SIGTERM)
    time.sleep(0.05)
  outs = _finish(procs, timeout=120)
  saved = checkpoints.saved_steps(tmp_path)
  assert len(saved) == 1 and saved[0] >= 3, saved
  stopped = saved[0]
  assert max(r["step"] for r in _records(tmp_path)) == stopped
  assert f"preempted: saved step {stopped}" in outs[0][0]

  _finish(_start(tmp_path, synthetic_data_dir, {**endless, "train.steps": stopped + 2}))
  steps = [r["step"] for r in _records(tmp_path) if "loss" in r]
  assert steps == list(range(1, stopped + 3)), steps  # resumed at stopped + 1: no step repeated or skipped
  assert checkpoints.saved_steps(tmp_path)[-1] == stopped + 2
