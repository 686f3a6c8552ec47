"""Launchers: run any headspec command, a pipeline, a sweep or an experiment on this machine, a multi-GPU
host, SLURM or Cloud TPU.

  headspec launch TARGET [options] [--dry-run] -- COMMAND ARGS...      # any headspec command
  headspec launch TARGET [options] --pipeline --config=C --workdir=W [-- TRAIN OVERRIDES]
  headspec launch TARGET [options] --grid KEY=V1,V2 [--seeds 0,1] [--pipeline] --config=C --workdir=ROOT
  headspec launch TARGET [options] --experiment=configs/experiments/NAME.py[:ARG] --workdir=ROOT

(`python -m headspec.launch ...` is the same command line.)

TARGET: local (this machine; --processes N runs N jax.distributed processes on it), multi-gpu (one
host, every GPU), slurm (an sbatch script: srun on every node, SIGTERM before the time limit, requeue;
sweeps as a job array), tpu (a Cloud TPU VM or pod slice: optionally created, headspec installed from a
wheel built here, data staged on every worker, training and analyses on all workers as one program each,
an experiment's resumable stages on worker 0).

A pipeline is train, then probe, diversity, attention and ablate at every kept checkpoint, as one
submission (`--study`, its former name, still works and warns). A sweep is one run (or pipeline) per grid
point and seed, each in ROOT/<name> (`drophead=0.1,seed=1`), with ROOT/sweep.csv listing them and, after
each run, their last losses (headspec/launch/sweeps.py). An experiment is the runs, analyses and reference models
its config's `experiment()` lists, then `headspec study` on ROOT; its stages are resumable: the same command
again skips what finished (headspec/launch/experiments.py). `--dry-run` prints the exact commands per host and
starts nothing. Bad input is one line, exit 2.

One module per job: args (the command line), plan (what runs, in which order), local, slurm, tpu (how).
"""

from __future__ import annotations

import os
import subprocess
import sys

from headspec.errors import UserError
from headspec.launch import experiments, sweeps
from headspec.launch.args import ANALYSES, PROG, TARGETS, deprecated_given, parse
from headspec.launch.local import local_steps, run_local
from headspec.launch.plan import Stage, Step, load_experiment, plan_runs
from headspec.launch.slurm import slurm_script
from headspec.launch.tpu import tpu_steps, wheel_name

__all__ = [
  "ANALYSES",
  "TARGETS",
  "Stage",
  "Step",
  "build",
  "load_experiment",
  "local_steps",
  "main",
  "plan_runs",
  "run_local",
  "slurm_script",
  "tpu_steps",
  "wheel_name",
]


def build(argv: list[str], prog: str = PROG):
  """(opts, steps or sbatch script text, sweep runs) for argv; raises UserError on bad input. A deprecated
  flag warns on stderr once the plan stands (bad input stays one line)."""
  opts, rest = parse(argv, prog)
  plans, sweep_runs = plan_runs(opts, rest)
  if opts.target in ("local", "multi-gpu"):
    work = local_steps(opts, plans)
  elif opts.target == "slurm":
    if opts.nodes < 1:
      raise UserError(f"--nodes={opts.nodes}: must be at least 1")
    work = slurm_script(opts, plans)
  else:
    work = tpu_steps(opts, plans)
  for warning in deprecated_given(opts):
    print(f"headspec launch: warning: {warning}", file=sys.stderr)
  return opts, work, sweep_runs


def _write_plans(opts, sweep_runs) -> None:
  """ROOT/sweep.csv or ROOT/experiment.json, before anything starts."""
  if sweep_runs:
    print(sweeps.write_plan(opts.workdir, sweep_runs))
  if opts.experiment:
    print(experiments.write_plan(opts.workdir, load_experiment(opts.experiment), opts.experiment))


def _submit_slurm(opts, script_text: str, sweep_runs) -> int:
  script = opts.script or f"slurm/{opts.job_name}.sbatch"
  if opts.dry_run:
    print(f"# host: local (writes {script}, then:)\nsbatch {script}\n# {script}:\n{script_text}", end="")
    return 0
  os.makedirs(os.path.dirname(script) or ".", exist_ok=True)
  with open(script, "w") as f:  # a local file: the script sbatch reads, not a run directory
    f.write(script_text)
  _write_plans(opts, sweep_runs)
  return subprocess.call(["sbatch", script])


def command(args: list[str]) -> int:
  """`headspec launch ARGS` = `python -m headspec.launch ARGS` (same output, same one-line errors, exit 2)."""
  return main(args, prog="headspec launch")


def main(argv: list[str], prog: str = PROG) -> int:
  """The launcher's command line (`python -m headspec.launch ARGS`, `headspec launch ARGS`): argv without
  the program name; `prog` names it in --help."""
  try:
    opts, work, sweep_runs = build(argv, prog)
  except UserError as e:
    print(f"headspec launch: error: {e}", file=sys.stderr)
    return 2
  except SystemExit as e:  # --help
    return e.code or 0
  try:
    if opts.target == "slurm":
      return _submit_slurm(opts, work, sweep_runs)
    if opts.dry_run:
      for step in work:
        print(f"# host: {step.host}\n{step.text()}")
      return 0
    _write_plans(opts, sweep_runs)
  except UserError as e:  # writing the plan: a plan damaged since planning, a folder that cannot be written
    print(f"headspec launch: error: {e}", file=sys.stderr)
    return 2
  if opts.target == "tpu":
    for step in work:
      code = subprocess.call(list(step.argv), env={**os.environ, **dict(step.env)})
      if code:
        return code
    return 0
  return run_local(work)
