"""Experiments: many runs, the same analyses on each, reference models, then one report; resumable.

An experiment config (configs/experiments/NAME.py) defines `experiment(arg) -> Experiment` beside its
`get_config(arg)`. `headspec launch TARGET --experiment=configs/experiments/NAME.py[:ARG] --workdir=ROOT`
turns it into stages, in order:

  data ROOT/data                                          the experiment's own data, when it writes it
  train ROOT/<run>, then every analysis of ROOT/<run>     run by run (training resumes from its last
                                                          checkpoint when the command is run again)
  <analysis> ROOT/<reference>                             pretrained reference models (e.g. MiniLM)
  study ROOT                                              headspec/study/: tables and figures across runs

ROOT/experiment.json lists the runs (name, condition, seed, config) for the report. Every stage but
training goes through `python -m headspec.cli.stage MARKER -- COMMAND ARGS` (headspec/cli/stage.py), which skips the stage
when ROOT/stages/MARKER.done holds the same command line and writes it when the stage succeeds, so
running the same command again after an interruption picks up at the first unfinished stage (training
picks up at its last checkpoint: it has its own resume). A marker of another command line (a changed
config) does not count: that stage runs again.
"""

from __future__ import annotations

import dataclasses
import json
import os

from etils import epath

from headspec import configs
from headspec.errors import UserError
from headspec.io import remote, tables

PLAN = "experiment.json"
STAGES = "stages"


@dataclasses.dataclass(frozen=True)
class Run:
  """One training run of an experiment: ROOT/<name>, trained with `config` (configs/...py:ARGS); `config` ''
  is a published series that is not trained (its analyses' configs name it: experiments/pythia_revisions.py)."""

  name: str
  config: str
  condition: str
  seed: int


@dataclasses.dataclass(frozen=True)
class Experiment:
  """`analyses`: (command, config spec) run on every run's directory in order ('' for a command that takes
  no config, such as atlas); `references`: (name, command, config spec) run once on ROOT/<name>
  (pretrained models, compared with the runs); `data`: the arguments of a `headspec data` command that
  writes the experiment's own data, run first with --out=ROOT/data (then every stage with a config, training
  and analyses, gets --config.data_dir=ROOT/data); `fixed_analysis_seed`: every run's seeded analyses keep
  their config's seed (0) instead of the run's (headspec/launch/plan.py SEEDED_ANALYSES; a paired design)."""

  runs: tuple[Run, ...]
  analyses: tuple[tuple[str, str], ...]
  references: tuple[tuple[str, str, str], ...] = ()
  data: tuple[str, ...] = ()
  fixed_analysis_seed: bool = False


def check(experiment: Experiment, where: str) -> None:
  names = [r.name for r in experiment.runs]
  if not names:
    raise UserError(f"{where}: experiment() lists no runs")
  if len(set(names)) != len(names) or {name for name, _, _ in experiment.references} & set(names):
    raise UserError(f"{where}: two runs (or a run and a reference) share a name, so they would share a folder")
  stages = [c for c, _ in experiment.analyses] + [f"{n}-{c}" for n, c, _ in experiment.references]
  if len(set(stages)) != len(stages):
    raise UserError(f"{where}: a command is listed twice for the same runs, so their stage markers would collide")


def stage_argv(root: str, marker: str, args: tuple[str, ...]) -> tuple[str, ...]:
  """The arguments of `python -m headspec.cli.stage ...` for one resumable stage."""
  return (f"{root}/{STAGES}/{marker}.done", "--", *args)


PART_KEYS = ("condition", "seed", "layers")  # an experiment argument with one of these keys picks a part


def _setting(spec: str) -> tuple[str, tuple[str, ...], bool]:
  """(experiment file, its arguments other than the part keys, whether the spec names a part). The file is
  resolved as the launcher resolves it (a packaged config by name, `configs/...` path or absolute path; any
  other file by its real path), so every spelling of one setting is the same setting."""
  path, _, arg = configs.resolve(spec).partition(":")
  args = [a.strip() for a in arg.split(",") if a.strip()]
  part = [a for a in args if a.partition("=")[0] in PART_KEYS]
  return os.path.realpath(path), tuple(sorted(set(args) - set(part))), bool(part)


def plan_to_merge(root, spec: str) -> dict | None:
  """The ROOT/experiment.json that write_plan merges a part's runs into (checked: a damaged one is one
  UserError line, which the launcher raises while planning, before any stage), or None (no plan there, or
  `spec` names no part)."""
  path = remote.run_path(root) / PLAN
  if not _setting(spec)[2] or not path.exists():
    return None
  return read_plan(root)


def write_plan(root, experiment: Experiment, spec: str) -> epath.Path:
  """ROOT/experiment.json: the experiment's config spec and its runs and references. A part of a setting
  (its spec names condition=, seed= or layers=) adds its runs to a plan of the same setting already there
  (the same file and other arguments; a run of the same name is replaced), so parts run one after another
  or side by side each report every run done so far; a spec naming no part (the whole setting) or another
  setting writes its own runs only. Read, merge and write hold the plan's lock (tables.locked)."""
  path = remote.run_path(root) / PLAN
  path.parent.mkdir(parents=True, exist_ok=True)
  runs = [dataclasses.asdict(r) for r in experiment.runs]
  references = {name for name, _, _ in experiment.references}
  file, args, _ = _setting(spec)
  with tables.locked(path) as check:
    old = plan_to_merge(root, spec)
    if old is not None:
      old_file, old_args, _ = _setting(old.get("experiment") or "")
      if (old_file, old_args) == (file, args):
        mine = {r["name"] for r in runs}
        runs = [r for r in old.get("runs", []) if r["name"] not in mine] + runs
        references |= set(old.get("references", []))
    text = json.dumps(dict(experiment=spec, runs=runs, references=sorted(references)), indent=1)
    check()
    remote.write_bytes_atomic(path, text.encode())
  return path


def read_plan(root) -> dict:
  """ROOT/experiment.json, checked (`check_plan`): one line naming the file when it is missing or damaged."""
  path = remote.run_path(root) / PLAN
  if not path.exists():
    raise UserError(f"{path}: not an experiment folder (the launcher writes experiment.json when it starts one)")
  return check_plan(path, remote.read_json(path))


# What write_plan writes per run: key -> (type, what it must be).
_RUN_KEYS = {"name": (str, "a string"), "condition": (str, "a string"), "seed": (int, "an integer")}


def _folder_name(value) -> bool:
  return isinstance(value, str) and value not in ("", ".", "..") and "/" not in value and "\\" not in value


def check_plan(path, plan) -> dict:
  """`plan` (the JSON of experiment.json at `path`) if it has the shape write_plan writes: an object whose
  `runs` is a list of objects each with a `name` (a folder name under ROOT), a `condition` (a string) and a
  `seed` (an integer), `references` a list of folder names, `experiment` a string; else one UserError
  line naming the file and the first thing wrong, before the study or a launch does any work."""
  rewrite = "the file is damaged (launch the experiment again to rewrite it)"
  if not isinstance(plan, dict):
    raise UserError(f"{path}: a JSON {type(plan).__name__} at the top, not an object with 'runs'; {rewrite}")
  if "runs" not in plan:
    raise UserError(f"{path}: no 'runs' list; {rewrite}")
  if not isinstance(plan["runs"], list):
    raise UserError(f"{path}: 'runs' is a {type(plan['runs']).__name__}, not a list; {rewrite}")
  for i, run in enumerate(plan["runs"]):
    if not isinstance(run, dict):
      raise UserError(f"{path}: runs[{i}] is a {type(run).__name__}, not an object; {rewrite}")
    for key, (kind, what) in _RUN_KEYS.items():
      if key not in run:
        raise UserError(f"{path}: runs[{i}] has no {key!r}; {rewrite}")
      value = run[key]
      if not isinstance(value, kind) or isinstance(value, bool):
        raise UserError(f"{path}: runs[{i}].{key} is {value!r}, not {what}; {rewrite}")
    if not _folder_name(run["name"]):
      raise UserError(f"{path}: runs[{i}].name {run['name']!r} is not a folder name under the root; {rewrite}")
    if not isinstance(run.get("config", ""), str):
      raise UserError(f"{path}: runs[{i}].config is {run['config']!r}, not a string; {rewrite}")
  references = plan.get("references", [])
  if not isinstance(references, list) or not all(_folder_name(r) for r in references):
    raise UserError(f"{path}: 'references' is {references!r}, not a list of folder names; {rewrite}")
  if not isinstance(plan.get("experiment", ""), str):
    raise UserError(f"{path}: 'experiment' is {plan['experiment']!r}, not a config spec string; {rewrite}")
  return plan
