"""Two processes on this machine run as one program over their devices, as TPU workers or SLURM nodes do.

The processes join through `jax.distributed` (coordinator on 127.0.0.1, CPU collectives over gloo). Training
(each process loads only its half of every batch) follows one process with the same global batch, and its
checkpoint restores anywhere; SIGTERM to both processes saves one checkpoint at one step, and a restart
resumes it; the analyses (`--config.multihost=True`) write what one process writes.
"""

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pandas as pd
import pytest

from headspec.cli.quickstart import quickstart_config
from headspec.data import text_tfds
from headspec.parallel import mesh
from headspec.runs import checkpoints, targets
from headspec.runs import directory as runs
from headspec.train.loop import train_and_evaluate

pytestmark = [pytest.mark.slow, pytest.mark.e2e]
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


def _start(workdir, data_dir, settings, n=2, devices=1):
  """`n` CLI processes of one multi-process run, `devices` CPU devices each."""
  config = quickstart_config("encoder")
  text_tfds.prepare_corpus(data_dir, config.data.corpus, tfds_dir=targets.tfds_dir(data_dir))  # once, not racing
  port = _free_port()
  flags = [f"--config.{k}={v}" for k, v in settings.items()]
  procs = []
  for i in range(n):
    env = dict(
      os.environ,
      XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
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
  """Two processes of two devices each, one mesh over the four (`fsdp=2,tensor=2`: parameters split across
  the processes, heads within each), follow one process's losses; the checkpoint they save together
  restores on one device and on another mesh bit for bit."""
  procs = _start(tmp_path / "two", synthetic_data_dir, {**SETTINGS, "mesh": "fsdp=2,tensor=2"}, devices=2)
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
  on_one_device = jax.tree.leaves(runs.load_run_model(tmp_path / "two", 6)[0])
  for a, b in zip(jax.tree.leaves(runs.load_run_model(tmp_path / "one", 6)[0]), on_one_device, strict=True):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)
  with mesh.using(mesh.parse("tensor=2", jax.devices()[:2])):
    on_a_mesh = jax.tree.leaves(runs.load_run_model(tmp_path / "two", 6)[0])
  assert any(len(x.sharding.device_set) == 2 and not x.is_fully_replicated for x in on_a_mesh)
  assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(on_one_device, on_a_mesh, strict=True))


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


ANALYSES = {  # command -> (config, mesh, flags): each crosses the two processes another way
  "ablate": (  # parameters and batch rows split across the processes (fsdp): `mesh.to_host`, `mesh.readable`
    "configs/ablate.py",
    "fsdp=2",
    [
      "--config.methods=zero,magnitude,pruning",
      "--config.pruning.rankings=magnitude,random",
      "--config.pruning.random_seeds=2",
      "--config.num_tokens=512",
      "--config.bootstrap_resamples=20",
    ],
  ),  # fmt: skip
  "patch": (  # the patches split over the data devices, one a process (`mesh.split_over_data`)
    "configs/patch_induction.py",
    "data=2",
    ["--config.count=8", "--config.sites=z,resid_pre", "--config.attribution=False"],
  ),
  "diversity": (  # mesh '': one process runs on one device, two on both processes' devices on `data`
    "configs/diversity.py",
    "",
    ["--config.data_dir={data}", "--config.num_tokens=256"],
  ),
  "probe": (  # a sharded feature extraction, then the probe groups split over the processes (fanout.py)
    "configs/probe_synthetic.py:{data}",
    "data=2",
    [
      "--config.probe.tasks=upos",
      "--config.probe.max_train_words=2000",
      "--config.probe.random_baseline=False",
      "--config.probe.bootstrap_resamples=20",
      "--config.probe.l2_grid=1e-3",
    ],
  ),  # fmt: skip
}


def _analysis_argv(command, workdir, data_dir):
  config, mesh, flags = ANALYSES[command]
  return [command, f"--config={REPO}/{config.format(data=data_dir)}", f"--workdir={workdir}",
          f"--config.mesh={mesh}", *[f.format(data=data_dir) for f in flags]]  # fmt: skip


def _tables(folder) -> dict:
  return {p.relative_to(folder).as_posix(): p.read_text() for p in folder.rglob("*.csv")}


def test_analyses_run_as_one_program_over_two_processes(train_tiny_decoder, synthetic_data_dir, tmp_path):
  """`headspec ablate|patch|diversity|probe --config.multihost=True` on two processes of one CPU device each (the
  devices of one mesh, as TPU workers or SLURM nodes are) write what one process with both devices writes:
  ablation and patching the same tables byte for byte, diversity the same values to float32 rounding, probing
  the same features and, its groups fitted half on each process, probes equal to the fitter's tolerance.
  Process 1 prints nothing: process 0 reports and writes."""
  run = train_tiny_decoder(20, name="multihost")
  for command in ANALYSES:
    one, two = tmp_path / command / "one" / "tiny", tmp_path / command / "two" / "tiny"  # the tables' model: tiny
    shutil.copytree(run, one)
    shutil.copytree(run, two)
    port = _free_port()
    procs = [
      subprocess.Popen(
        [
          sys.executable,
          "-m",
          "headspec",
          *_analysis_argv(command, two, synthetic_data_dir),
          "--config.multihost=True",
        ],
        cwd=REPO,
        env=dict(
          os.environ,
          XLA_FLAGS="--xla_force_host_platform_device_count=1",
          JAX_PLATFORMS="cpu",
          JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
          JAX_NUM_PROCESSES="2",
          JAX_PROCESS_ID=str(i),
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
      )
      for i in range(2)
    ]
    done = subprocess.run(  # the reference: one process, both devices of the suite, the same mesh
      [sys.executable, "-m", "headspec", *_analysis_argv(command, one, synthetic_data_dir)],
      cwd=REPO, env=dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2"), capture_output=True,
      text=True, timeout=300,
    )  # fmt: skip
    outs = _finish(procs, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    said = [[line for line in out.splitlines() if not line.startswith("[Gloo]")] for out, _ in outs]
    assert said[0] and not said[1], said[1][-5:]
    a, b = _tables(one), _tables(two)
    assert a.keys() == b.keys() and len(a) >= 2, (a.keys(), b.keys())
    if command == "diversity":  # another device count, another order of float32 sums
      rows = [pd.read_csv(folder / "diversity" / "results.csv") for folder in (one, two)]
      assert len(rows[0]) > 50 and rows[0].drop(columns="value").equals(rows[1].drop(columns="value"))
      np.testing.assert_allclose(rows[1]["value"], rows[0]["value"], rtol=1e-5, atol=1e-6)
      continue
    if command != "probe":
      assert a == b, command
      continue
    # a cache folder's name ends in a hash of the run's path: matched without it
    cached = [
      {f.parent.name.rsplit("-", 1)[0] + "/" + f.name: f for f in (d / "probes" / "cache").rglob("*.npy")}
      for d in (one, two)
    ]
    assert len(cached[0]) >= 3 and cached[0].keys() == cached[1].keys()
    assert all(np.array_equal(np.load(cached[0][k]), np.load(cached[1][k])) for k in cached[0])
    rows = [
      pd.read_csv(folder / "probes" / "results.csv").set_index(["task", "layer", "head"]) for folder in (one, two)
    ]
    assert len(rows[0]) > 10 and rows[0].index.equals(rows[1].index)
    gap = (rows[0]["accuracy"] - rows[1]["accuracy"]).abs()
    assert gap.max() < 0.01, gap.max()  # the L-BFGS tolerance: the same groups split in two move it as much
