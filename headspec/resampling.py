"""Bootstrap resamples over sentences and the confidence intervals built on them, for every analysis.

Bootstrap over sentences (Efron & Tibshirani 1993; resampling units are sentences because words in a
sentence are not independent, as in Koehn 2004 for MT): draw the U sentences with replacement R times,
accuracy*_r = Σ correct words / Σ words over the drawn sentences, and report the 2.5 and 97.5
percentiles. All groups share the same resamples, computed at once as counts_RU @ correct_UG, in
float64 NumPy (a few milliseconds; no JAX needed). Probes, attention roles, ablation effects and the
causal test draw their resamples here (`bootstrap_resample_counts`), so the same seed gives the same
sentences everywhere.
"""

from __future__ import annotations

import numpy as np

from headspec.errors import UserError


def bootstrap_resample_counts(num_sentences: int, num_resamples: int, seed: int) -> np.ndarray:
  """counts_RU: how often each sentence is drawn in each resample (rows of a multinomial draw).

  Drawn as rng.integers(0, U, size=(R, U)) with np.random.default_rng(seed) and counted, so a
  reference loop can reproduce the same resamples.
  """
  idx_RU = np.random.default_rng(seed).integers(0, num_sentences, size=(num_resamples, num_sentences))
  # one bincount over (resample, sentence) cells: the counts np.add.at gives, ~7x faster
  cell_RU = idx_RU + num_sentences * np.arange(num_resamples)[:, None]
  counts = np.bincount(cell_RU.ravel(), minlength=num_resamples * num_sentences)
  return counts.reshape(num_resamples, num_sentences).astype(np.float64)


def bootstrap_ci(
  correct_NG, sentence_index_N, *, num_resamples: int = 1000, seed: int = 0, confidence: float = 0.95, weight_N=None
):
  """(accuracy_G, low_G, high_G): word accuracy and its percentile bootstrap CI over sentences.

  correct_NG: bool/0-1 per word and group; sentence_index_N: the sentence of each word (any ints);
  weight_N: 1 for scored words, 0 for ignored ones (default: every word is scored).
  """
  if weight_N is not None:
    correct_NG = np.asarray(correct_NG, np.float64)
    return _paired_ci(correct_NG, sentence_index_N, num_resamples, seed, confidence, weight_N, "bootstrap_ci")
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
  correct_UG = np.zeros((num_s, correct_NG.shape[1]))
  np.add.at(correct_UG, sent_N, correct_NG)
  words_U = np.bincount(sent_N, minlength=num_s).astype(np.float64)
  counts_RU = bootstrap_resample_counts(num_s, num_resamples, seed)
  acc_RG = (counts_RU @ correct_UG) / (counts_RU @ words_U)[:, None]
  alpha = (1.0 - confidence) / 2.0
  low_G, high_G = np.percentile(acc_RG, [100 * alpha, 100 * (1 - alpha)], axis=0)
  return correct_UG.sum(0) / words_U.sum(), low_G, high_G


def _sentence_sums(values_NG, sentence_index_N, what):
  values_NG = np.asarray(values_NG, np.float64)
  if values_NG.ndim == 1:
    values_NG = values_NG[:, None]
  sentence_index_N = np.asarray(sentence_index_N)
  if values_NG.shape[0] != sentence_index_N.shape[0] or values_NG.shape[0] == 0:
    raise UserError(
      f"{what}: per-word values {values_NG.shape} and sentence_index_N {sentence_index_N.shape} must be "
      "non-empty with the same N"
    )
  _, sent_N = np.unique(sentence_index_N, return_inverse=True)
  num_s = sent_N.max() + 1
  sums_UG = np.zeros((num_s, values_NG.shape[1]))
  np.add.at(sums_UG, sent_N, values_NG)
  return sums_UG, sent_N, num_s


def bootstrap_selectivity(
  correct_NG, control_correct_NG, sentence_index_N, *, num_resamples=1000, seed=0, confidence=0.95, weight_N=None
):
  """(selectivity_G, low_G, high_G): accuracy − control accuracy and its paired percentile bootstrap CI.

  The task and the control probe are scored on the SAME resampled sentences in every resample
  (counts_RU from `bootstrap_resample_counts(U, R, seed)`, as `bootstrap_ci` draws them), so the
  interval is for the difference, not two independent intervals. weight_N: 1 for scored words, 0 for
  ignored ones (e.g. punctuation for arcs); default all 1. This interval covers the sampling of
  EVALUATION sentences only: the variance of the probe fit and of the control task's random label
  draw is measured by repeating the study over seeds and training subsamples (docs/probing_core.md).
  """
  diff_NG = np.asarray(correct_NG, np.float64) - np.asarray(control_correct_NG, np.float64)
  return _paired_ci(diff_NG, sentence_index_N, num_resamples, seed, confidence, weight_N, "bootstrap_selectivity")


def paired_difference_ci(a_NG, b_NG, sentence_index_N, *, num_resamples=1000, seed=0, confidence=0.95, weight_N=None):
  """(diff_G, low_G, high_G): mean_words(a − b) with a paired percentile bootstrap CI over sentences.

  a, b: per-word scores (0/1 correct, or correct − control-correct for selectivity) of two predictors
  on the same words, e.g. the two most selective heads; both are resampled with the same sentences.
  """
  diff_NG = np.asarray(a_NG, np.float64) - np.asarray(b_NG, np.float64)
  return _paired_ci(diff_NG, sentence_index_N, num_resamples, seed, confidence, weight_N, "paired_difference_ci")


def _paired_ci(diff_NG, sentence_index_N, num_resamples, seed, confidence, weight_N, what):
  if diff_NG.ndim == 1:
    diff_NG = diff_NG[:, None]
  weight_N = np.ones(diff_NG.shape[0]) if weight_N is None else np.asarray(weight_N, np.float64)
  sums_UG, sent_N, num_s = _sentence_sums(diff_NG * weight_N[:, None], sentence_index_N, what)
  words_U = np.bincount(sent_N, weights=weight_N, minlength=num_s)
  if words_U.sum() <= 0:
    raise UserError(f"{what}: no scored word")
  counts_RU = bootstrap_resample_counts(num_s, num_resamples, seed)
  est_RG = (counts_RU @ sums_UG) / np.maximum(counts_RU @ words_U, 1e-300)[:, None]
  alpha = (1.0 - confidence) / 2.0
  low_G, high_G = np.percentile(est_RG, [100 * alpha, 100 * (1 - alpha)], axis=0)
  return sums_UG.sum(0) / words_U.sum(), low_G, high_G
