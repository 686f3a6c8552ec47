"""`headspec.probe`: the probing suite's job for one model step (what `headspec probe` runs), its rows as a table.

Part of the notebook API (docs/api.md); `import headspec` reaches it lazily (headspec/__init__.py).
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import os
import pathlib
import shutil
import tempfile
import uuid
from collections.abc import Sequence

import pandas as pd

from headspec import arguments as check
from headspec.api.load import Head, Loaded, as_loaded, check_heads, set_option
from headspec.errors import UserError
from headspec.io import tables
from headspec.probing import labels, plan, suite
from headspec.probing.config import probe_config
from headspec.runs import targets


def _probe_config(loaded: Loaded, task: str, config, options: dict):

  c = probe_config() if config is None else config.copy_and_resolve_references()
  if task in ("distance", "depth"):  # their rows are tree metrics (probes/structural.csv), not accuracies
    raise UserError(
      f"probe: {task!r} is a structural probe; fit it with `headspec probe --config=... "
      f"--config.probe.tasks={task}` (probes/structural.csv) or headspec.probing.structural"
    )
  c.probe.tasks = (task,)
  for key, value in options.items():
    if value is None:
      continue
    if key in ("seed", "data_dir"):
      c[key] = os.fspath(value) if key == "data_dir" else value
    elif key in c.probe:
      set_option(c.probe, key, tuple(value) if isinstance(value, list) else value, "probe")
    else:
      raise UserError(f"probe: unknown option {key!r}; options are the probe.* keys of probing/config.py")
  plan.check_config(c)
  return c


def _cache_dir(loaded: Loaded, cache_dir) -> pathlib.Path:
  """The feature cache: `cache_dir`, else a run's own RUN/probes/cache (shared with `headspec probe`),
  else a temporary folder of this process."""
  if cache_dir is not None:
    return pathlib.Path(cache_dir)
  if loaded.target is not None and "run" in loaded.target.identity:
    from headspec.probing.features import run_cache_dir

    return run_cache_dir(loaded.target.identity["run"])  # local scratch for a gs:// run
  return _temporary_cache()


@functools.cache
def _temporary_cache() -> pathlib.Path:
  """One feature cache per process (a pretrained model's features of a treebank are ~250 MB), removed
  when the process exits."""
  path = pathlib.Path(tempfile.mkdtemp(prefix="headspec-features-"))
  atexit.register(shutil.rmtree, path, ignore_errors=True)
  return path


@check.arguments(
  model=as_loaded,
  task=check.text,
  heads=check.optional(check.pairs),
  layer=check.optional(check.integer(-1)),
  treebank=check.optional(check.text),
  eval_splits=check.optional(check.texts),
  max_train_words=check.optional(check.integer(0)),
  data_dir=check.optional(check.path),
  seed=check.optional(check.seed),
  config=check.optional(check.config),
  cache_dir=check.optional(check.path),
)
def probe(
  model,
  task: str,
  heads: Sequence[Head] | None = None,
  *,
  layer: int | None = None,
  treebank: str | None = None,
  eval_splits: Sequence[str] | None = None,
  max_train_words: int | None = None,
  data_dir: str | os.PathLike | None = None,
  seed: int | None = None,
  config=None,
  cache_dir: str | os.PathLike | None = None,
  **options,
):
  """Fits and scores one task's probes on chosen heads and/or one layer's residual stream, with the
  Hewitt & Liang control task and 95% bootstrap CIs: a pandas DataFrame with probes/results.csv's
  columns and dtypes, one row per (head or residual stream, evaluation split).

  It runs the command's own job (labels.load_data, then probing/suite.probe_job: feature extraction and
  cache, every layer's fit and score, bootstrap CIs) and keeps the rows asked for, so a head's row
  EQUALS its row of probes/results.csv written with the same config. Only the layers asked for are
  fitted (a head with its layer's other heads, as the command fits it); subsample train
  (max_train_words) for quick looks. model: `load(...)`'s result or a (model, tokenizer) pair. task: 'upos', 'xpos',
  'deprel' or 'arc'. heads: (layer, head) pairs; layer: a residual stream (-1: the embeddings); at least
  one of the two. config: a probe config (probing/config.py, configs/probe_*.py) to start from;
  treebank, eval_splits, max_train_words (a seeded subsample of whole train sentences of about that
  many words: faster, and says so in no other way, so report it), data_dir, seed and any probe.* key
  given as a keyword (l2_grid=..., refine_samples=..., pooling=..., bootstrap_resamples=...) override it.
  cache_dir: the feature cache (default: a run's RUN/probes/cache, else a temporary folder removed when
  the process exits).
  A progress bar (tqdm, on stderr) counts the feature groups fitted; the stages' lines are absl INFO logs.
  """

  loaded = as_loaded(model)
  cfg = loaded.model.cfg
  if not heads and layer is None:  # heads=[] too: nothing would be fitted
    raise UserError("probe: give heads=[(layer, head), ...] and/or layer=L (a residual stream; -1: embeddings)")
  chosen = check_heads(cfg, heads or [])
  if layer is not None and not -1 <= layer < cfg.num_layers:
    raise UserError(
      f"probe: layer {layer!r} is out of range; the model has layers -1 (embeddings)..{cfg.num_layers - 1}"
    )
  options.update(
    treebank=treebank, eval_splits=eval_splits, max_train_words=max_train_words, data_dir=data_dir, seed=seed
  )
  c = _probe_config(loaded, task, config, options)
  data = labels.load_data(c)
  if loaded.target is not None:  # the already loaded model, under the target's name and cache identity
    job = dataclasses.replace(loaded.target, load=lambda: (loaded.model, loaded.tokenizer))
    cache = _cache_dir(loaded, cache_dir)
  else:
    identity = {"unsaved_model": uuid.uuid4().hex}
    job = targets.Target("model", 0, identity, lambda: (loaded.model, loaded.tokenizer), kind=cfg.kind)
    cache = pathlib.Path(cache_dir) if cache_dir is not None else _temporary_cache()
  cache.mkdir(parents=True, exist_ok=True)
  head_layers = {l for l, _ in chosen}

  def keep(l, heads):  # the layers asked for; each fitted exactly as in a full run (a head with its layer's heads)
    return l in head_layers if heads[0] >= 0 else l == layer

  parts = suite.probe_job(job, data, c, cache, want=(tables.PROBES,), keep_source=keep)  # the command's job
  rows = parts[tables.PROBES]
  wanted = set(chosen) | ({(int(layer), -1)} if layer is not None else set())
  rows = [r for r in rows if (r["layer"], r["head"]) in wanted]
  table = tables.PROBES
  frame = pd.DataFrame(rows, columns=list(table.columns))
  frame = frame.astype({col: "int64" for col in table.int_columns} | {col: "float64" for col in table.float_columns})
  for column in set(table.columns) - set(table.int_columns) - set(table.float_columns):
    frame[column] = frame[column].astype("string")
  frame.attrs["baselines"] = [b for b in data.baselines if b["task"] == c.probe.tasks[0]]
  frame.attrs["train_words"] = int(data.train.num_words)
  return frame
