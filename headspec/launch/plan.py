"""What a submission runs: plans (each a list of Stages, run in order) for a command, a pipeline, a sweep or an
experiment, and the `python -m headspec ...` line of a stage."""

from __future__ import annotations

import dataclasses
import shlex

from headspec import configs
from headspec.cli.commands import COMMANDS
from headspec.errors import UserError
from headspec.io import remote
from headspec.launch import args, experiments, sweeps


@dataclasses.dataclass(frozen=True)
class Stage:
  """One headspec invocation; `distributed`: runs as one process per node/worker/--processes (training and
  the analyses: `Command.multihost`, headspec/cli/commands.py)."""

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


def load_config(spec: str):
  return configs.load_config(spec, "--config")  # any error of the user's file: one line


# The analyses whose config `seed` draws what their intervals are said to cover over seeds (docs/study.md
# "Statistics"): the control task's labels, the probe's training subsample and minibatches, bootstrap resamples
# (probe); the MLM mask, random heads and resamples (ablate); the SAE's initialisation and batches (sae). Each
# run's stages of these get `--config.seed=<the run's seed>`, so condition differences stay paired on the seed.
SEEDED_ANALYSES = ("probe", "ablate", "sae")
# An experiment spec's key (configs/experiments/NAME.py:...,fixed_analysis_seed) keeping every run's analyses at
# their config's seed (0), as before runs' seeds reached their analyses: for designs that pair the analysis draws
# across runs.
FIXED_ANALYSIS_SEED = "fixed_analysis_seed"


def seed_flags(command: str, seed: int | None) -> tuple[str, ...]:
  """`--config.seed=SEED` for a seeded analysis (SEEDED_ANALYSES) of a run with `seed`; () otherwise or with
  seed None (the analysis keeps its config's seed)."""
  return (f"--config.seed={seed}",) if seed is not None and command in SEEDED_ANALYSES else ()


def load_experiment(spec: str) -> experiments.Experiment:
  """The Experiment of `spec` (configs/experiments/NAME.py[:ARG]), its config specs checked to load; the key
  FIXED_ANALYSIS_SEED among ARG's arguments sets `fixed_analysis_seed` (the file never sees it)."""
  module, arg = configs.load_module(spec, "--experiment")  # any error of the user's file: one line
  if not hasattr(module, "experiment"):
    raise UserError(f"--experiment={spec}: the file defines no experiment(arg) (configs/experiments/)")
  given = [a.strip() for a in (arg or "").split(",") if a.strip()]
  fixed = FIXED_ANALYSIS_SEED in given
  if fixed:
    arg = ",".join(a for a in given if a != FIXED_ANALYSIS_SEED) or None
  exp = configs.call(module, "experiment", arg, spec, "--experiment", always=True)
  if fixed:
    exp = dataclasses.replace(exp, fixed_analysis_seed=True)
  try:
    for config in [r.config for r in exp.runs] + [c for _, c in exp.analyses] + [c for _, _, c in exp.references]:
      if config:  # '' for a command without a config (atlas)
        load_config(config)
  except (AttributeError, KeyError, TypeError, ValueError) as e:
    raise UserError(f"--experiment={spec}: {e}") from None
  experiments.check(exp, f"--experiment={spec}")
  return exp


_NOT_FOR_EXPERIMENTS = ("pipeline", "study", "grid", "seeds", "config", "analyses", "fixed_analysis_seed")


def _check_experiment_options(opts, rest: list[str]) -> None:
  """An experiment takes its runs and analyses from its file: refuse the options it would ignore."""
  if not opts.workdir:
    raise UserError("an experiment needs --workdir=ROOT (every run goes to ROOT/<run>)")
  defaults = args.parser().parse_args([opts.target])
  given = [
    f"--{name.replace('_', '-')}"
    for name in (*_NOT_FOR_EXPERIMENTS, *(f"{a}_config" for a in args.ANALYSES))
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


def experiment_plans(opts, rest: list[str]) -> list[list[Stage]]:
  """One plan (a single job, in order): every run's training then its analyses, the references, the report."""
  _check_experiment_options(opts, rest)
  exp = load_experiment(opts.experiment)
  root = opts.workdir.rstrip("/")
  experiments.plan_to_merge(root, opts.experiment)  # a damaged ROOT/experiment.json: one line, before any stage
  data = str(remote.run_path(root) / "data") if exp.data else ""  # absolute: runs' configs keep it
  on_data = (f"--config.data_dir={data}",) if data else ()  # every stage with a config reads ROOT/data

  def resumable(name: str, command: str, config: str, seed: int | None = None) -> Stage:  # with its marker
    options = [f"--config={config}", *on_data, *seed_flags(command, seed)] if config else []
    argv = (command, *options, f"--workdir={root}/{name}")
    return Stage(("@stage", *experiments.stage_argv(root, f"{name}-{command}", argv)))

  stages = []
  if data:  # the experiment's own data first (a --config.data_dir given after -- still wins for training)
    stages.append(Stage(("@stage", *experiments.stage_argv(root, "data", ("data", *exp.data, f"--out={data}")))))
    rest = [*on_data, *rest]
  for run in exp.runs:
    if run.config:  # '': a published model (its analyses' configs name it), nothing to train
      stages.append(Stage(("train", f"--config={run.config}", f"--workdir={root}/{run.name}", *rest), distributed=True))
    seed = None if exp.fixed_analysis_seed else run.seed  # the run's seed: seeds vary the analyses' draws too
    stages += [resumable(run.name, command, config, seed) for command, config in exp.analyses]
  stages += [resumable(name, command, config) for name, command, config in exp.references]
  stages.append(Stage(("study", f"--workdir={root}")))
  return [stages]  # one job: the report needs every run


def _flag(argv, name: str) -> str | None:
  for i, a in enumerate(argv):
    if a.startswith(f"--{name}="):
      return a.split("=", 1)[1]
    if a == f"--{name}" and i + 1 < len(argv):
      return argv[i + 1]
  return None


def _command_plan(rest: list[str]) -> list[list[Stage]]:
  """Any headspec command, as given after `--`."""
  if not rest:
    raise UserError("nothing to run: give a headspec command after --, or --pipeline, or --grid")
  workdir = _flag(rest, "workdir")
  if workdir:
    remote.check_url(workdir)
  command = COMMANDS.get(rest[0])
  return [[Stage(tuple(rest), distributed=command is not None and command.multihost)]]


def plan_runs(opts, rest: list[str]) -> tuple[list[list[Stage]], list[sweeps.Run]]:
  """The runs of a submission (each a list of stages, run in order) and, for a sweep, its Runs."""
  if opts.experiment:
    return experiment_plans(opts, rest), []
  pipeline = opts.pipeline or opts.study  # --study: the deprecated name of --pipeline
  if not (pipeline or opts.grid or opts.seeds):
    return _command_plan(rest), []
  if not opts.config or not opts.workdir:
    raise UserError("a pipeline or sweep needs --config=TRAIN_CONFIG and --workdir=DIR")
  remote.check_url(opts.workdir)
  analyses = [a for a in opts.analyses.split(",") if a] if pipeline else []
  unknown = [a for a in analyses if a not in args.ANALYSES]
  if unknown:
    raise UserError(f"--analyses: unknown {', '.join(unknown)} (choose from {', '.join(args.ANALYSES)})")
  config = load_config(opts.config)
  for a in rest:
    if not a.startswith("--config."):
      raise UserError(f"a pipeline or sweep takes only --config.KEY=VALUE train overrides after --, got {a}")
  sweep_runs = []
  if opts.grid or opts.seeds:
    sweep_runs = sweeps.expand(config, sweeps.parse_grid(opts.grid, opts.seeds), opts.workdir)
    targets = [(r.workdir, r.flags) for r in sweep_runs]
  else:
    targets = [(opts.workdir.rstrip("/"), [])]
  plans = []
  for workdir, flags in targets:
    stages = [Stage(("train", f"--config={opts.config}", f"--workdir={workdir}", *flags, *rest), distributed=True)]
    seed = None if opts.fixed_analysis_seed else _run_seed(config, [*flags, *rest])
    for a in analyses:
      seeded = seed_flags(a, seed)
      analysis = (a, f"--config={getattr(opts, a + '_config')}", *seeded, f"--workdir={workdir}", args.ANALYSES[a][1])
      stages.append(Stage(analysis, distributed=True))
    if sweep_runs:
      stages.append(Stage(("@summarize", opts.workdir)))
    plans.append(stages)
  return plans, sweep_runs


def _run_seed(config, train_flags: list[str]) -> int | None:
  """The seed a pipeline's or sweep run's training uses: its last `--config.seed=` flag, else the config's."""
  given = [f.split("=", 1)[1] for f in train_flags if f.startswith("--config.seed=")]
  try:
    return int(given[-1]) if given else int(config.seed)
  except (AttributeError, KeyError, TypeError, ValueError):
    return None  # no integer seed to pass on: the analyses keep their configs' seeds


def headspec_argv(stage: Stage, python: str = "python") -> list[str]:
  """The command line of `stage`: `python -m headspec ...`, or the sweep summary's or a resumable stage's."""
  if stage.args[0] == "@summarize":
    return [python, "-m", "headspec.launch.sweeps", "summarize", stage.args[1]]
  if stage.args[0] == "@stage":
    return [python, "-m", "headspec.cli.stage", *stage.args[1:]]
  return [python, "-m", "headspec", *stage.args]


def train_extra(stage: Stage, extra: list[str]) -> list[str]:
  """`extra` flags for training stages, unless the user already set them."""
  if stage.args[0] != "train":
    return []
  return _unless_given(stage, extra)


def multihost_extra(stage: Stage) -> list[str]:
  """`--config.multihost=True` for a stage that runs on every node, worker or process (`distributed`), unless
  the user already set it."""
  return _unless_given(stage, ["--config.multihost=True"]) if stage.distributed else []


def _unless_given(stage: Stage, extra: list[str]) -> list[str]:
  return [f for f in extra if not any(a.startswith(f.split("=")[0] + "=") for a in stage.args)]
