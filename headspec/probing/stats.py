"""Confidence intervals and baselines for probe accuracies.

Bootstrap over sentences (Efron & Tibshirani 1993; resampling units are sentences because words in a
sentence are not independent, as in Koehn 2004 for MT): draw S sentences with replacement R times,
accuracy*_r = Σ correct words / Σ words over the drawn sentences, and report the 2.5 and 97.5
percentiles. All groups share the same resamples, computed at once as counts_RS @ correct_SG, in
float64 NumPy (a few milliseconds; no JAX needed).
"""

from __future__ import annotations

import numpy as np

from headspec.errors import UserError


def bootstrap_resample_counts(num_sentences: int, num_resamples: int, seed: int) -> np.ndarray:
  """counts_RS: how often each sentence is drawn in each resample (rows of a multinomial draw).

  Drawn as rng.integers(0, S, size=(R, S)) with np.random.default_rng(seed) and counted, so a
  reference loop can reproduce the same resamples.
  """
  idx_RS = np.random.default_rng(seed).integers(0, num_sentences, size=(num_resamples, num_sentences))
  counts_RS = np.zeros((num_resamples, num_sentences), np.float64)
  np.add.at(counts_RS, (np.arange(num_resamples)[:, None], idx_RS), 1.0)
  return counts_RS


def bootstrap_ci(correct_NG, sentence_index_N, *, num_resamples: int = 1000, seed: int = 0, confidence: float = 0.95):
  """(accuracy_G, low_G, high_G): word accuracy and its percentile bootstrap CI over sentences.

  correct_NG: bool/0-1 per word and group; sentence_index_N: the sentence of each word (any ints).
  """
  correct_NG = np.asarray(correct_NG, np.float64)
  if correct_NG.ndim == 1:
    correct_NG = correct_NG[:, None]
  sentence_index_N = np.asarray(sentence_index_N)
  if correct_NG.shape[0] != sentence_index_N.shape[0] or correct_NG.shape[0] == 0:
    raise UserError(
      f"bootstrap_ci: correct_NG {correct_NG.shape} and sentence_index_N "
      f"{sentence_index_N.shape} must be non-empty with the same N"
    )
  _, sent_N = np.unique(sentence_index_N, return_inverse=True)
  num_s = sent_N.max() + 1
  correct_SG = np.zeros((num_s, correct_NG.shape[1]))
  np.add.at(correct_SG, sent_N, correct_NG)
  words_S = np.bincount(sent_N, minlength=num_s).astype(np.float64)
  counts_RS = bootstrap_resample_counts(num_s, num_resamples, seed)
  acc_RG = (counts_RS @ correct_SG) / (counts_RS @ words_S)[:, None]
  alpha = (1.0 - confidence) / 2.0
  low_G, high_G = np.percentile(acc_RG, [100 * alpha, 100 * (1 - alpha)], axis=0)
  return correct_SG.sum(0) / words_S.sum(), low_G, high_G


def majority_baseline(y_train_N, y_eval_N) -> float:
  """Accuracy of always predicting the most frequent training label (ignoring -1 labels)."""
  y_train_N, y_eval_N = np.asarray(y_train_N), np.asarray(y_eval_N)
  train, evaluated = y_train_N[y_train_N >= 0], y_eval_N[y_eval_N >= 0]
  if train.size == 0 or evaluated.size == 0:
    raise UserError("majority_baseline: no labelled word in train or eval")
  return float((evaluated == np.bincount(train).argmax()).mean())
