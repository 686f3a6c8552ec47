"""SLURM: one sbatch script (a job array for a sweep) with srun on every node, SIGTERM before the time limit
and a requeue, so training resumes from its checkpoint."""

from __future__ import annotations

import shlex

from headspec.errors import UserError
from headspec.launch.plan import headspec_argv, multihost_extra, train_extra


def _sbatch_value(flag: str, value: str) -> str:
  """`value` for an `#SBATCH` line: sbatch reads one word there, and a newline would start a script line."""
  if not value or any(c.isspace() or not c.isprintable() or c in "'\"#$`\\" for c in value):
    raise UserError(f"--{flag}={value!r}: one word without spaces, quotes, #, $ or backslashes for #SBATCH")
  return value


def _header(opts, n_plans: int) -> list[str]:
  """The #SBATCH lines, the data directory and the preemption handler (SIGUSR1 -> SIGTERM the step, requeue)."""
  for flag in ("job_name", "time", "partition", "account"):
    if getattr(opts, flag) or flag in ("job_name", "time"):
      _sbatch_value(flag.replace("_", "-"), getattr(opts, flag))
  lines = [
    "#!/usr/bin/env bash",
    f"#SBATCH --job-name={opts.job_name}",
    f"#SBATCH --nodes={opts.nodes}",
    "#SBATCH --ntasks-per-node=1",
    f"#SBATCH --time={opts.time}",
    "#SBATCH --signal=B:USR1@120",
    "#SBATCH --requeue",
    "#SBATCH --open-mode=append",
  ]
  if opts.gpus_per_node:
    lines.append(f"#SBATCH --gpus-per-node={opts.gpus_per_node}")
  if opts.partition:
    lines.append(f"#SBATCH --partition={opts.partition}")
  if opts.account:
    lines.append(f"#SBATCH --account={opts.account}")
  if n_plans > 1:
    lines.append(f"#SBATCH --array=0-{n_plans - 1}")
  return lines + [
    "set -euo pipefail",
    f"export HEADSPEC_DATA_DIR={shlex.quote(opts.data)}" if opts.data else ': "${HEADSPEC_DATA_DIR:?set it}"',
    "step_pid=",
    "preempted() {",
    '  echo "headspec: time limit near: checkpointing and requeueing $SLURM_JOB_ID"',
    '  [ -n "$step_pid" ] && kill -TERM "$step_pid" && wait "$step_pid" || true',
    '  scontrol requeue "${SLURM_ARRAY_JOB_ID:-$SLURM_JOB_ID}${SLURM_ARRAY_TASK_ID:+_$SLURM_ARRAY_TASK_ID}"',
    "  exit 0",
    "}",
    "trap preempted USR1",
    'run() { "$@" & step_pid=$!; wait "$step_pid"; step_pid=; }',
  ]


def slurm_script(opts, plans) -> str:
  """An sbatch script: training and analyses as `srun` over every node (one task per node; jax.distributed
  reads SLURM's variables), an experiment's resumable stages and report as one task; SIGUSR1 two minutes
  before the limit goes to the batch shell, which passes SIGTERM to the step (headspec saves and exits)
  and requeues the job, which then resumes.
  Every value from the command line is quoted (shell lines) or checked to be one word (#SBATCH lines)."""
  lines = _header(opts, len(plans))
  gpu_extra = ["--config.model.dtype=bfloat16"] if opts.gpus_per_node else []

  def body(stages) -> list[str]:
    out = []
    for stage in stages:
      argv = headspec_argv(stage)
      if stage.distributed:
        extra = train_extra(stage, gpu_extra) + multihost_extra(stage)
        out.append(f"run srun --nodes={opts.nodes} --ntasks-per-node=1 --kill-on-bad-exit=1 {shlex.join(argv + extra)}")
      else:
        out.append(f"run srun --nodes=1 --ntasks=1 {shlex.join(argv)}")
    return out

  if len(plans) == 1:
    lines += body(plans[0])
  else:
    lines.append('case "$SLURM_ARRAY_TASK_ID" in')
    for i, stages in enumerate(plans):
      lines.append(f"  {i})")
      lines += ["    " + line for line in body(stages)]
      lines.append("    ;;")
    lines.append("esac")
  return "\n".join(lines) + "\n"
