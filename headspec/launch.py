"""Launchers: run any headspec command, a study or a sweep on this machine, a multi-GPU host, SLURM or Cloud TPU.

  headspec launch TARGET [options] [--dry-run] -- COMMAND ARGS...      # any headspec command
  headspec launch TARGET [options] --study --config=C --workdir=W [-- TRAIN OVERRIDES]
  headspec launch TARGET [options] --grid KEY=V1,V2 [--seeds 0,1] [--study] --config=C --workdir=ROOT
  headspec launch TARGET [options] --experiment=configs/experiments/NAME.py[:ARG] --workdir=ROOT

(`python -m headspec.launch ...` is the same command line.)

TARGET: local (this machine; --processes N runs N jax.distributed processes on it), multi-gpu (one
host, every GPU), slurm (an sbatch script: srun on every node, SIGTERM before the time limit, requeue;
sweeps as a job array), tpu (a Cloud TPU VM or pod slice: optionally created, headspec installed from a
wheel built here, data staged on every worker, training on all workers, analyses on worker 0).

A study is train, then probe, diversity, attention and ablate at every kept checkpoint, as one
submission. A sweep is one run (or study) per grid point and seed, each in ROOT/<name> (`drophead=0.1,seed=1`),
with ROOT/sweep.csv listing them and, after each run, their last losses (headspec/sweeps.py). An
experiment is the runs, analyses and reference models its config's `experiment()` lists, then `headspec
study` on ROOT; its stages are resumable: the same command again skips what finished (headspec/experiments.py).
`--dry-run` prints the exact commands per host and starts nothing. Bad input is one line, exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import os
import shlex
import signal
import socket
import subprocess
import sys

from headspec import configs, experiments, remote, sweeps
from headspec.errors import UserError

TARGETS = ("local", "multi-gpu", "slurm", "tpu")
ANALYSES = {  # analysis -> (default config, override that picks the steps to analyse)
  "probe": ("configs/probe_ewt.py", "--config.probe.steps=all"),
  "diversity": ("configs/diversity.py", "--config.steps=all"),
  "attention": ("configs/attention_ewt.py", "--config.steps=all"),
  "ablate": ("configs/ablate.py", "--config.steps=all"),
}
REMOTE_HOME = "~/headspec"  # on TPU workers: the wheel (configs inside) and data/ go here
WHEEL = "headspec-0.1.0-py3-none-any.whl"


@dataclasses.dataclass(frozen=True)
class Stage:
  """One headspec invocation; `distributed`: runs as one process per node/worker/--processes (training)."""

  args: tuple[str, ...]
  distributed: bool = False


@dataclasses.dataclass(frozen=True)
class Step:
  """What the launcher runs: `argv` on `host` ('local', or where it ends up: 'every TPU worker', ...)."""

  host: str
  argv: tuple[str, ...]
  env: tuple[tuple[str, str], ...] = ()

  def text(self) -> str:
    return " ".join([*(f"{k}={shlex.quote(v)}" for k, v in self.env), shlex.join(self.argv)])


class _Parser(argparse.ArgumentParser):
  def error(self, message):  # one line, not argparse's usage block
    raise UserError(message)


def _parser(prog: str = "python -m headspec.launch") -> argparse.ArgumentParser:
  p = _Parser(prog=prog, description=__doc__.split("\n\n")[0])
  p.add_argument("target", choices=TARGETS)
  p.add_argument("--dry-run", action="store_true", help="print the commands per host, start nothing")
  p.add_argument("--study", action="store_true", help="train, then every analysis at the kept checkpoints")
  p.add_argument("--experiment", default="", help="configs/experiments/NAME.py[:ARG]: its runs, analyses, report")
  p.add_argument("--analyses", default="probe,diversity,attention,ablate", help="a study's analyses, in order")
  for name, (default, _) in ANALYSES.items():
    p.add_argument(f"--{name}-config", default=default, help=f"config of a study's {name} stage")
  p.add_argument("--grid", action="append", default=[], help="sweep: KEY=V1,V2 (repeat for a grid)")
  p.add_argument("--seeds", default="", help="sweep: comma-separated seeds")
  p.add_argument("--config", help="train config of a study or sweep (configs/NAME.py[:ARG])")
  p.add_argument("--workdir", help="run directory of a study; root of a sweep's run directories")
  p.add_argument("--data", default=os.environ.get("HEADSPEC_DATA_DIR", ""), help="data dir (default HEADSPEC_DATA_DIR)")
  g = p.add_argument_group("local")
  g.add_argument("--processes", type=int, default=1, help="jax.distributed processes on this machine")
  g = p.add_argument_group("slurm")
  g.add_argument("--nodes", type=int, default=1)
  g.add_argument("--gpus-per-node", type=int, default=0)
  g.add_argument("--time", default="24:00:00")
  g.add_argument("--partition", default="")
  g.add_argument("--account", default="")
  g.add_argument("--job-name", default="headspec")
  g.add_argument("--script", default="", help="where to write the sbatch script (default slurm/JOB_NAME.sbatch)")
  g = p.add_argument_group("tpu")
  g.add_argument("--tpu-name", default=os.environ.get("TPU_NAME", ""))
  g.add_argument("--zone", default=os.environ.get("ZONE", ""))
  g.add_argument("--project", default=os.environ.get("PROJECT", ""))
  g.add_argument("--create", action="store_true", help="create the TPU VM first")
  g.add_argument("--accelerator-type", default=os.environ.get("ACCELERATOR_TYPE", ""), help="e.g. v4-8, v5litepod-16")
  g.add_argument("--runtime-version", default=os.environ.get("RUNTIME_VERSION", ""), help="e.g. tpu-ubuntu2204-base")
  g.add_argument("--spot", action="store_true")
  return p


def _load_module(spec: str, flag: str = "--config"):
  path, _, arg = configs.resolve(spec).partition(":")  # a packaged config by name or configs/NAME.py
  if not os.path.isfile(path):
    raise UserError(f"{flag}: no such config file {path}")
  module_spec = importlib.util.spec_from_file_location("_headspec_launch_config", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module, arg or None


def _load_config(spec: str):
  module, arg = _load_module(spec)
  return module.get_config(arg) if arg else module.get_config()


def load_experiment(spec: str) -> experiments.Experiment:
  """The Experiment of `spec` (configs/experiments/NAME.py[:ARG]), its config specs checked to load."""
  module, arg = _load_module(spec, "--experiment")
  if not hasattr(module, "experiment"):
    raise UserError(f"--experiment={spec}: the file defines no experiment(arg) (configs/experiments/)")
  try:
    exp = module.experiment(arg)
    for config in [r.config for r in exp.runs] + [c for _, c in exp.analyses] + [c for _, _, c in exp.references]:
      if config:  # '' for a command without a config (atlas)
        _load_config(config)
  except (AttributeError, KeyError, TypeError, ValueError) as e:
    raise UserError(f"--experiment={spec}: {e}") from None
  experiments.check(exp, f"--experiment={spec}")
  return exp


def experiment_plans(opts, rest: list[str]) -> list[list[Stage]]:
  """One plan (a single job, in order): every run's training then its analyses, the references, the report."""
  if not opts.workdir:
    raise UserError("an experiment needs --workdir=ROOT (every run goes to ROOT/<run>)")
  defaults = _parser().parse_args([opts.target])
  given = [
    f"--{name.replace('_', '-')}"
    for name in ("study", "grid", "seeds", "config", "analyses", *(f"{a}_config" for a in ANALYSES))
    if getattr(opts, name) != getattr(defaults, name)
  ]
  if given:
    raise UserError(f"--experiment takes its runs and analyses from the experiment file: drop {', '.join(given)}")
  if opts.target == "tpu" and not remote.is_remote(opts.workdir):
    raise UserError("a TPU experiment needs a gs:// --workdir (the report runs on worker 0 and reads every run)")
  for a in rest:
    if not a.startswith("--config."):
      raise UserError(f"an experiment takes only --config.KEY=VALUE train overrides after --, got {a}")
  remote.check_url(opts.workdir)
  exp = load_experiment(opts.experiment)
  root = opts.workdir.rstrip("/")

  def resumable(name: str, command: str, config: str) -> Stage:  # `command` on ROOT/<name>, with its marker
    args = (command, *([f"--config={config}"] if config else []), f"--workdir={root}/{name}")
    return Stage(("@stage", *experiments.stage_argv(root, f"{name}-{command}", args)))

  stages = []
  for run in exp.runs:
    stages.append(Stage(("train", f"--config={run.config}", f"--workdir={root}/{run.name}", *rest), distributed=True))
    stages += [resumable(run.name, command, config) for command, config in exp.analyses]
  stages += [resumable(name, command, config) for name, command, config in exp.references]
  stages.append(Stage(("study", f"--workdir={root}")))
  return [stages]  # one job: the report needs every run


def _flag(args, name: str) -> str | None:
  for i, a in enumerate(args):
    if a.startswith(f"--{name}="):
      return a.split("=", 1)[1]
    if a == f"--{name}" and i + 1 < len(args):
      return args[i + 1]
  return None


def plan_runs(opts, rest: list[str]) -> tuple[list[list[Stage]], list[sweeps.Run]]:
  """The runs of a submission (each a list of stages, run in order) and, for a sweep, its Runs."""
  if opts.experiment:
    return experiment_plans(opts, rest), []
  study_or_sweep = opts.study or opts.grid or opts.seeds
  if not study_or_sweep:
    if not rest:
      raise UserError("nothing to run: give a headspec command after --, or --study, or --grid")
    workdir = _flag(rest, "workdir")
    if workdir:
      remote.check_url(workdir)
    return [[Stage(tuple(rest), distributed=rest[0] == "train")]], []
  if not opts.config or not opts.workdir:
    raise UserError("a study or sweep needs --config=TRAIN_CONFIG and --workdir=DIR")
  remote.check_url(opts.workdir)
  analyses = [a for a in opts.analyses.split(",") if a] if opts.study else []
  unknown = [a for a in analyses if a not in ANALYSES]
  if unknown:
    raise UserError(f"--analyses: unknown {', '.join(unknown)} (choose from {', '.join(ANALYSES)})")
  config = _load_config(opts.config)
  for a in rest:
    if not a.startswith("--config."):
      raise UserError(f"a study or sweep takes only --config.KEY=VALUE train overrides after --, got {a}")
  sweep_runs = []
  if opts.grid or opts.seeds:
    sweep_runs = sweeps.expand(config, sweeps.parse_grid(opts.grid, opts.seeds), opts.workdir)
    targets = [(r.workdir, r.flags) for r in sweep_runs]
  else:
    targets = [(opts.workdir.rstrip("/"), [])]
  plans = []
  for workdir, flags in targets:
    stages = [Stage(("train", f"--config={opts.config}", f"--workdir={workdir}", *flags, *rest), distributed=True)]
    for a in analyses:
      stages.append(Stage((a, f"--config={getattr(opts, a + '_config')}", f"--workdir={workdir}", ANALYSES[a][1])))
    if sweep_runs:
      stages.append(Stage(("@summarize", opts.workdir)))
    plans.append(stages)
  return plans, sweep_runs


def _headspec(stage: Stage, python: str = "python") -> list[str]:
  if stage.args[0] == "@summarize":
    return [python, "-m", "headspec.sweeps", "summarize", stage.args[1]]
  if stage.args[0] == "@stage":
    return [python, "-m", "headspec.stage", *stage.args[1:]]
  return [python, "-m", "headspec", *stage.args]


def _train_extra(stage: Stage, extra: list[str]) -> list[str]:
  """`extra` flags for training stages, unless the user already set them."""
  if stage.args[0] != "train":
    return []
  return [f for f in extra if not any(a.startswith(f.split("=")[0] + "=") for a in stage.args)]


# -- local and one multi-GPU host -------------------------------------------------------------------


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
      extra = _train_extra(stage, ["--config.model.dtype=bfloat16"]) if gpu else []
      argv = [*_headspec(stage, sys.executable), *extra]
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
        steps.append(Step(f"local process {i} of {n}", (*argv, "--config.multihost=True"), proc_env))
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


# -- SLURM ----------------------------------------------------------------------------------------------


def _sbatch_value(flag: str, value: str) -> str:
  """`value` for an `#SBATCH` line: sbatch reads one word there, and a newline would start a script line."""
  if not value or any(c.isspace() or not c.isprintable() or c in "'\"#$`\\" for c in value):
    raise UserError(f"--{flag}={value!r}: one word without spaces, quotes, #, $ or backslashes for #SBATCH")
  return value


def slurm_script(opts, plans) -> str:
  """An sbatch script: training as `srun` over every node (one task per node; jax.distributed reads
  SLURM's variables), analyses as one task; SIGUSR1 two minutes before the limit goes to the batch shell,
  which passes SIGTERM to the step (headspec saves and exits) and requeues the job, which then resumes.
  Every value from the command line is quoted (shell lines) or checked to be one word (#SBATCH lines)."""
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
  if len(plans) > 1:
    lines.append(f"#SBATCH --array=0-{len(plans) - 1}")
  lines += [
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
  gpu_extra = ["--config.model.dtype=bfloat16"] if opts.gpus_per_node else []

  def body(stages) -> list[str]:
    out = []
    for stage in stages:
      argv = _headspec(stage)
      if stage.distributed:
        extra = _train_extra(stage, [*gpu_extra, "--config.multihost=True"])
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


# -- Cloud TPU --------------------------------------------------------------------------------------------


def tpu_steps(opts, plans) -> list[Step]:
  missing = [
    f"--{n} (or {e})" for n, e, v in (("tpu-name", "TPU_NAME", opts.tpu_name), ("zone", "ZONE", opts.zone)) if not v
  ]
  if opts.create:
    missing += [
      f"--{n} (or {e})"
      for n, e, v in (
        ("accelerator-type", "ACCELERATOR_TYPE", opts.accelerator_type),
        ("runtime-version", "RUNTIME_VERSION", opts.runtime_version),
      )
      if not v
    ]
  if missing:
    raise UserError(f"tpu launcher needs {', '.join(missing)}")
  if not opts.data:
    raise UserError("tpu launcher needs --data (a gs:// bucket folder or a local folder), or HEADSPEC_DATA_DIR")
  remote.check_url(opts.data, "--data")
  where = ["--zone", opts.zone] + (["--project", opts.project] if opts.project else [])
  tpu = ["gcloud", "compute", "tpus", "tpu-vm"]
  steps = []
  if opts.create:
    create = [*tpu, "create", opts.tpu_name, *where, f"--accelerator-type={opts.accelerator_type}"]
    create += [f"--version={opts.runtime_version}"] + (["--spot"] if opts.spot else [])
    steps.append(Step("local", tuple(create)))
  steps.append(Step("local", (sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", "dist", ".")))

  def ssh(command: str, worker: str = "all") -> Step:
    return Step(
      "every TPU worker" if worker == "all" else f"TPU worker {worker}",
      (*tpu, "ssh", opts.tpu_name, *where, f"--worker={worker}", f"--command={command}"),
    )

  steps.append(ssh(f"mkdir -p {REMOTE_HOME}"))
  steps.append(
    Step(
      "local",
      (*tpu, "scp", "--recurse", f"dist/{WHEEL}", f"{opts.tpu_name}:{REMOTE_HOME}/", *where, "--worker=all"),
    )
  )
  steps.append(ssh(f"pip install -q -U 'jax[tpu]' {REMOTE_HOME}/{WHEEL}"))
  if remote.is_remote(opts.data):  # staged on every worker's disk (TFDS and treebank readers want local files)
    data = shlex.quote(opts.data)  # the remote shell reads this line: a value is one word, never a command
    steps.append(ssh(f"mkdir -p {REMOTE_HOME}/data && gcloud storage rsync --recursive {data} {REMOTE_HOME}/data"))
  else:
    steps.append(
      Step(
        "local",
        (
          *tpu,
          "scp",
          "--recurse",
          opts.data.rstrip("/"),
          f"{opts.tpu_name}:{REMOTE_HOME}/data",
          *where,
          "--worker=all",
        ),
      )
    )
  for stages in plans:
    for stage in stages:
      argv = _headspec(stage, "python3") + _train_extra(
        stage, ["--config.model.dtype=bfloat16", "--config.multihost=True"]
      )
      command = f"cd {REMOTE_HOME} && HEADSPEC_DATA_DIR={REMOTE_HOME}/data {shlex.join(argv)}"
      steps.append(ssh(command, "all" if stage.distributed else "0"))
  return steps


# -- entry point -------------------------------------------------------------------------------------------


def build(argv: list[str], prog: str = "python -m headspec.launch"):
  """(opts, steps or sbatch script text, sweep runs) for argv; raises UserError on bad input."""
  rest = []
  if "--" in argv:
    i = argv.index("--")
    argv, rest = argv[:i], argv[i + 1 :]
  opts = _parser(prog).parse_args(argv)
  plans, sweep_runs = plan_runs(opts, rest)
  if opts.target in ("local", "multi-gpu"):
    return opts, local_steps(opts, plans), sweep_runs
  if opts.target == "slurm":
    if opts.nodes < 1:
      raise UserError(f"--nodes={opts.nodes}: must be at least 1")
    return opts, slurm_script(opts, plans), sweep_runs
  return opts, tpu_steps(opts, plans), sweep_runs


def _write_plans(opts, sweep_runs) -> None:
  """ROOT/sweep.csv or ROOT/experiment.json, before anything starts."""
  if sweep_runs:
    print(sweeps.write_plan(opts.workdir, sweep_runs))
  if opts.experiment:
    print(experiments.write_plan(opts.workdir, load_experiment(opts.experiment), opts.experiment))


def main(argv: list[str], prog: str = "python -m headspec.launch") -> int:
  """The launcher's command line (`python -m headspec.launch ARGS`, `headspec launch ARGS`): argv without
  the program name; `prog` names it in --help."""
  try:
    opts, work, sweep_runs = build(argv, prog)
  except UserError as e:
    print(f"headspec launch: error: {e}", file=sys.stderr)
    return 2
  except SystemExit as e:  # --help
    return e.code or 0
  if opts.target == "slurm":
    script = opts.script or f"slurm/{opts.job_name}.sbatch"
    if opts.dry_run:
      print(f"# host: local (writes {script}, then:)\nsbatch {script}\n# {script}:\n{work}", end="")
      return 0
    os.makedirs(os.path.dirname(script) or ".", exist_ok=True)
    with open(script, "w") as f:  # a local file: the script sbatch reads, not a run directory
      f.write(work)
    _write_plans(opts, sweep_runs)
    return subprocess.call(["sbatch", script])
  if opts.dry_run:
    for step in work:
      print(f"# host: {step.host}\n{step.text()}")
    return 0
  _write_plans(opts, sweep_runs)
  if opts.target == "tpu":
    for step in work:
      code = subprocess.call(list(step.argv), env={**os.environ, **dict(step.env)})
      if code:
        return code
    return 0
  return run_local(work)


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
