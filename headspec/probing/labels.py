"""The treebank splits a probe study reads, labelled by its tasks (tasks.py), and their baselines.

`load_data(config)` reads the train split of `probe.treebank` (a seeded subsample of whole sentences
when `probe.max_train_words` is set), its dev split (to pick each probe's L2) and the evaluation
splits (`probe.eval_splits`, and the dev/test splits of `probe.extra_treebanks`), and labels each with
every task's gold and control labels. Every problem (no data directory, a missing treebank or split, a
split that gives a task nothing to fit, tune or score) is a UserError raised here, before any model is run.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from headspec.data import treebank as treebank_lib
from headspec.errors import UserError
from headspec.probing import stats
from headspec.probing import tasks as tasks_lib
from headspec.runs import targets


@dataclasses.dataclass
class Split:
  """One labelled treebank split (`key` is 'treebank/split').

  labels[task] / controls[task]: the task's gold and control labels, in the form its `score` reads.
  sentence_N: the sentence of each of the N words (bootstrap resamples sentences).
  """

  key: str
  words: list[tuple[str, ...]]
  labels: dict
  controls: dict
  sentence_N: np.ndarray

  @property
  def num_words(self) -> int:
    return len(self.sentence_N)


@dataclasses.dataclass
class Data:
  """train (probes fitted), tune (L2 picked: the dev split), evals (scored), each task's vocabulary
  (what it learned from train) and the baselines.csv rows."""

  train: Split
  tune: Split
  evals: list[Split]
  vocab: dict
  baselines: list[dict]


def label_split(key: str, sentences, tasks, vocab: dict, config) -> Split:
  """Gold and control labels of `sentences` for every task."""
  words = [s.words for s in sentences]
  return Split(
    key,
    words,
    {t.name: t.labels(sentences, vocab[t.name], config) for t in tasks},
    {t.name: t.control(sentences, vocab[t.name], config) for t in tasks},
    np.repeat(np.arange(len(sentences)), [len(w) for w in words]).astype(np.int32),
  )


def _splits_of(data_root, treebank: str, wanted) -> list[str]:
  present = treebank_lib.available_splits(data_root, treebank)
  for split in wanted:
    if split not in treebank_lib.SPLITS:
      raise UserError(f"probe.eval_splits: unknown split {split!r} (use {', '.join(treebank_lib.SPLITS)})")
  return [s for s in wanted if s in present]


def check_scorable(tasks, config, role: str, path, sentences, vocab: dict | None) -> None:
  """One UserError naming the split's file and the task when `sentences` give a task nothing to fit
  (role 'train'), to pick λ and the epoch on ('dev') or to score ('eval'), e.g. one one-word sentence or
  only punctuation for arcs (each task's `missing`, tasks.py): before any model is run, not a traceback or
  a NaN after fitting."""
  doing = {"train": "fit", "dev": "tune", "eval": "score"}[role]
  for task in tasks:
    missing = getattr(task, "missing", None)
    lack = missing(sentences, config, role, None if vocab is None else vocab[task.name]) if missing else ""
    if lack:
      raise UserError(f"{path}: task {task.name!r} has nothing to {doing} on this split: {lack}")


def load_data(config, keep=None) -> Data:
  """Reads and labels the train, dev and evaluation splits; every problem is a UserError before any work.
  keep(key, sentences) -> the sentences to use (the suite's: those the model can represent), applied to
  each split as it is read, before the train subsample."""
  keep = keep or (lambda key, sentences: sentences)
  tasks = tasks_lib.from_config(config)
  data_root = targets.data_dir(config, purpose="the treebank to probe on")
  p, tb = config.probe, config.probe.treebank
  present = treebank_lib.available_splits(data_root, tb)
  for needed in ("train", "dev"):
    if needed not in present:
      raise UserError(
        f"treebank {tb} has no {needed} split under {data_root}/ud/{tb} "
        f"(present: {', '.join(present) or 'none'}); probes are fitted on train and tuned on dev"
      )
  missing = [s for s in p.eval_splits if s not in _splits_of(data_root, tb, p.eval_splits)]
  if missing:
    raise UserError(f"probe.eval_splits: {tb} has no split(s) {', '.join(missing)} (present: {', '.join(present)})")
  train = keep(f"{tb}/train", treebank_lib.load_split(data_root, tb, "train"))
  if p.max_train_words:
    chosen_U = stats.subsample([len(s.words) for s in train], p.max_train_words, stats.train_sample_seed(config))
    train = [train[u] for u in chosen_U]
  path = lambda treebank, split: treebank_lib.split_path(data_root, treebank, split)
  check_scorable(tasks, config, "train", path(tb, "train"), train, None)
  vocab = {t.name: t.vocabulary(train, config) for t in tasks}
  make = lambda key, sentences: label_split(key, sentences, tasks, vocab, config)
  train_split = make(f"{tb}/train", train)

  def read(treebank, split, roles=("eval",)):
    sentences = keep(f"{treebank}/{split}", treebank_lib.load_split(data_root, treebank, split))
    for role in roles:
      check_scorable(tasks, config, role, path(treebank, split), sentences, vocab)
    return sentences

  loaded = {"dev": make(f"{tb}/dev", read(tb, "dev", ("dev", "eval")))}  # dev is always scored (the rankings)
  evals = []
  for split in p.eval_splits:
    if split not in loaded:
      loaded[split] = make(f"{tb}/{split}", read(tb, split))
    evals.append(loaded[split])
  for extra in p.extra_treebanks:
    extra_splits = _splits_of(data_root, extra, ("dev", "test"))
    if not extra_splits:
      raise UserError(f"probe.extra_treebanks: {extra} has no dev or test split under {data_root}/ud/{extra}")
    for split in extra_splits:
      evals.append(make(f"{extra}/{split}", read(extra, split)))
  if not evals:
    raise UserError("nothing to score: probe.eval_splits and probe.extra_treebanks are both empty")
  data = Data(train_split, loaded["dev"], evals, vocab, [])
  data.baselines = baselines(data, tasks)
  return data


def baselines(data: Data, tasks) -> list[dict]:
  """probes/baselines.csv rows: each task's baseline (tasks.py: majority label, most frequent head
  offset; a structural task's linear-structure baseline gives one row per metric) on every evaluation
  split."""
  rows = []
  for split in data.evals:
    for t in tasks:
      out = t.baseline(data.vocab[t.name], data.train.labels[t.name], split.labels[t.name])
      for name, accuracy in out if isinstance(out, list) else [out]:
        rows.append(dict(task=t.name, split=split.key, baseline=name, accuracy=accuracy, n=split.num_words))
  return rows
