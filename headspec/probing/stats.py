"""Majority baselines and seeded training subsamples of sentences for probes.

Confidence intervals and bootstrap resamples are in headspec/words/resampling.py (shared by every analysis).
"""

from __future__ import annotations

import numpy as np

from headspec.errors import UserError


def majority_baseline(y_train_N, y_eval_N) -> float:
  """Accuracy of always predicting the most frequent training label (ignoring -1 labels)."""
  y_train_N, y_eval_N = np.asarray(y_train_N), np.asarray(y_eval_N)
  train, evaluated = y_train_N[y_train_N >= 0], y_eval_N[y_eval_N >= 0]
  if train.size == 0 or evaluated.size == 0:
    raise UserError("majority_baseline: no labelled word in train or eval")
  return float((evaluated == np.bincount(train).argmax()).mean())


def train_sample_seed(config) -> int:
  """The seed of the training subsamples (`probe.max_train_words`, `probe.arc_max_train_words`):
  `probe.train_sample_seed`, or `seed` when that is -1 (the default). Setting it apart from `seed`
  varies the training sample and the fit (control labels, minibatch order) separately."""
  seed = config.probe.get("train_sample_seed", -1)
  return config.seed if seed < 0 else seed


def subsample(lengths_U, max_words: int, seed: int, *, max_length: int | None = None) -> np.ndarray:
  """Sorted indices of a seeded random subset of whole sentences with about `max_words` words in all.

  Sentences are taken in the order of one permutation (np.random.default_rng(seed)) until the next
  would pass `max_words` (at least one is taken). With `max_length`, only sentences of at most that
  many words are candidates (all of them, in a second permutation, if none is that short).
  """
  lengths_U = np.asarray(lengths_U, np.int64)
  rng = np.random.default_rng(seed)
  order_U = rng.permutation(len(lengths_U))
  if max_length is not None:
    fitting_U = order_U[lengths_U[order_U] <= max_length]
    order_U = fitting_U if len(fitting_U) else rng.permutation(len(lengths_U))
  cumulative_U = np.cumsum(lengths_U[order_U])
  return np.sort(order_U[: max(1, int(np.searchsorted(cumulative_U, max_words, side="right")))])
