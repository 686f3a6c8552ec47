"""This machine and one multi-GPU host: the steps (one process per stage, or N jax.distributed processes for
training), and a runner that forwards SIGTERM/SIGINT to them."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

from headspec.errors import UserError
from headspec.launch.plan import Step, headspec_argv, multihost_extra, train_extra


def local_steps(opts, plans) -> list[Step]:
  if opts.processes < 1:
    raise UserError(f"--processes={opts.processes}: must be at least 1")
  env = (("HEADSPEC_DATA_DIR", opts.data),) if opts.data else ()
  gpu = opts.target == "multi-gpu"
  if gpu:
    env += (("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.9"),)
  steps = []
  for stages in plans:
    for stage in stages:
      extra = train_extra(stage, ["--config.model.dtype=bfloat16"]) if gpu else []
      argv = [*headspec_argv(stage, sys.executable), *extra]
      n = opts.processes if stage.distributed else 1
      if n == 1:
        steps.append(Step("local", tuple(argv), env))
        continue
      port = _free_port()
      for i in range(n):  # one CPU device each (or set XLA_FLAGS yourself)
        proc_env = env + (
          ("XLA_FLAGS", os.environ.get("XLA_FLAGS", "--xla_force_host_platform_device_count=1")),
          ("JAX_COORDINATOR_ADDRESS", f"127.0.0.1:{port}"),
          ("JAX_NUM_PROCESSES", str(n)),
          ("JAX_PROCESS_ID", str(i)),
        )
        steps.append(Step(f"local process {i} of {n}", (*argv, *multihost_extra(stage)), proc_env))
  return steps


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run_local(steps: list[Step]) -> int:
  """Runs steps in order; consecutive 'local process i of n' steps run together. SIGTERM/SIGINT reach the
  children (training saves a checkpoint and exits 0), so this launcher can itself run under a scheduler."""
  groups, i = [], 0
  while i < len(steps):
    n = int(steps[i].host.rsplit(" ", 1)[1]) if steps[i].host.startswith("local process") else 1
    groups.append(steps[i : i + n])
    i += n
  signalled = []
  for group in groups:
    procs = [subprocess.Popen(list(s.argv), env={**os.environ, **dict(s.env)}) for s in group]

    def forward(signum, frame, procs=procs):
      signalled.append(signum)
      for p in procs:
        if p.poll() is None:
          p.send_signal(signum)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
      codes = [p.wait() for p in procs]
    finally:
      for s, handler in previous.items():
        signal.signal(s, handler)
    if any(codes):
      return next(c for c in codes if c)
    if signalled:  # training saved and exited 0: the steps after it (analyses of a half-trained run) wait
      print("headspec launch: stopped by a signal; the same command resumes", file=sys.stderr)
      return 128 + signalled[0]
  return 0
