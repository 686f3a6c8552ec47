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
  acc_G, acc_RG = bootstrap_accuracies(correct_NG, sentence_index_N, num_resamples=num_resamples, seed=seed)
  alpha = (1.0 - confidence) / 2.0
  low_G, high_G = np.percentile(acc_RG, [100 * alpha, 100 * (1 - alpha)], axis=0)
  return acc_G, low_G, high_G


def bootstrap_accuracies(correct_NG, sentence_index_N, *, num_resamples: int = 1000, seed: int = 0):
  """(accuracy_G, accuracy_RG): word accuracy of every group and its R bootstrap resamples over sentences, the
  same resampled sentences for every group (paired: differences between groups are resampled as pairs)."""
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
  return correct_UG.sum(0) / words_U.sum(), (counts_RU @ correct_UG) / (counts_RU @ words_U)[:, None]


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


# --- tests over seeds and their corrections (the study's statistics; docs/study.md "Statistics") ---


def holm(p_values) -> np.ndarray:
  """Holm's (1979) step-down adjustment of a family of p-values (NaN entries are left out and stay NaN)."""
  p = np.asarray(p_values, np.float64)
  out = np.full(p.shape, np.nan)
  idx = np.flatnonzero(~np.isnan(p))
  order = idx[np.argsort(p[idx], kind="stable")]
  m, running = len(order), 0.0
  for i, j in enumerate(order):
    running = max(running, min(1.0, (m - i) * p[j]))
    out[j] = running
  return out


def mde(ci_low, ci_high):
  """The minimum detectable effect at 80% power (two-sided α = 0.05) of an estimate with this 95% CI:
  (z_0.975 + z_0.80) × SE ≈ 2.8 × SE with SE = half-width / 1.96 (Bloom 1995, "Minimum detectable effects",
  Evaluation Review 19(5); the standard normal power calculation). A bootstrap CI may be asymmetric: the
  mean half-width, (ci_high − ci_low) / 2, is used."""
  return (1.96 + 0.8416) * (np.asarray(ci_high, float) - np.asarray(ci_low, float)) / 2 / 1.96


def _ranks(x) -> np.ndarray:
  import pandas as pd

  r = pd.Series(np.asarray(x, np.float64)).rank().to_numpy()
  return (r - r.mean()) / (r.std() or 1.0)


def spearman(x, y, *, permutations: int = 10000, seed: int = 0) -> tuple[float, float]:
  """Spearman's ρ (Pearson correlation of ranks, ties averaged) and its two-sided permutation p-value."""
  rx, ry = _ranks(x), _ranks(y)
  rho = float(np.mean(rx * ry))
  rng = np.random.default_rng(seed)
  shuffled = np.array([np.mean(rx * ry[rng.permutation(len(ry))]) for _ in range(permutations)])
  p = (1 + np.sum(np.abs(shuffled) >= abs(rho) - 1e-12)) / (permutations + 1)
  return rho, float(p)


def within_layer_spearman(x, y, layer, *, permutations: int = 10000, seed: int = 0) -> tuple[float, float]:
  """The mean over layers of Spearman's ρ between x and y among one layer's heads, and its two-sided
  permutation p-value with y shuffled only within each layer (the layers' levels are kept under the null)."""
  layer = np.asarray(layer)
  groups = [np.flatnonzero(layer == l) for l in np.unique(layer)]
  groups = [g for g in groups if len(g) >= 3]
  if not groups:
    return float("nan"), float("nan")
  rx = [_ranks(np.asarray(x)[g]) for g in groups]
  ry = [_ranks(np.asarray(y)[g]) for g in groups]
  rho = float(np.mean([np.mean(a * b) for a, b in zip(rx, ry)]))
  rng = np.random.default_rng(seed)
  shuffled = np.array(
    [np.mean([np.mean(a * b[rng.permutation(len(b))]) for a, b in zip(rx, ry)]) for _ in range(permutations)]
  )
  return rho, float((1 + np.sum(np.abs(shuffled) >= abs(rho) - 1e-12)) / (permutations + 1))


def _finite(values) -> np.ndarray:
  v = np.asarray(values, np.float64)
  return v[~np.isnan(v)]


def one_sample_t(values, *, confidence: float = 0.95) -> dict:
  """The one-sample t test of mean 0 over seeds: {mean, low, high (mean ± t·sd/√n), n, p (two-sided)};
  NaN bounds and p with fewer than 2 values (or no spread: p is then 0 or 1 by the mean's sign)."""
  from scipy import stats

  v = _finite(values)
  n = len(v)
  mean = float(v.mean()) if n else np.nan
  if n < 2:
    return dict(mean=mean, low=np.nan, high=np.nan, n=n, p=np.nan)
  se = v.std(ddof=1) / np.sqrt(n)
  half = float(stats.t.ppf(0.5 + confidence / 2, n - 1) * se)
  p = float(2 * stats.t.sf(abs(mean) / se, n - 1)) if se > 0 else float(mean == 0)
  return dict(mean=mean, low=mean - half, high=mean + half, n=n, p=p)


def welch_t(a, b, *, confidence: float = 0.95) -> dict:
  """Welch's unequal-variance t test of mean(a) − mean(b) (Welch 1947): {mean, low, high, n (len a),
  n_b, df, p}; NaN bounds and p unless both have 2 or more values."""
  from scipy import stats

  a, b = _finite(a), _finite(b)
  mean = float(a.mean() - b.mean()) if len(a) and len(b) else np.nan
  if len(a) < 2 or len(b) < 2:
    return dict(mean=mean, low=np.nan, high=np.nan, n=len(a), n_b=len(b), df=np.nan, p=np.nan)
  va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
  se = np.sqrt(va + vb)
  if se == 0:
    return dict(mean=mean, low=mean, high=mean, n=len(a), n_b=len(b), df=np.nan, p=float(mean == 0))
  df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
  half = float(stats.t.ppf(0.5 + confidence / 2, df) * se)
  p = float(2 * stats.t.sf(abs(mean) / se, df))
  return dict(mean=mean, low=mean - half, high=mean + half, n=len(a), n_b=len(b), df=float(df), p=p)


def tost(values, margin: float) -> float:
  """Schuirmann's (1987) two one-sided t tests of equivalence over seeds: the p-value for "the mean lies
  inside (−margin, +margin)", max of the one-sided p of mean > −margin and of mean < +margin. Small (say
  < 0.05): the mean is shown to be within the margin; an interval that merely includes 0 shows nothing of
  the kind. NaN with fewer than 2 values or a margin that is not positive."""
  from scipy import stats

  v = _finite(values)
  n = len(v)
  if n < 2 or not margin > 0:
    return float("nan")
  se = v.std(ddof=1) / np.sqrt(n)
  if se == 0:
    return float(0.0 if abs(v.mean()) < margin else 1.0)
  p_low = stats.t.sf((v.mean() + margin) / se, n - 1)  # H0: mean <= −margin
  p_high = stats.t.cdf((v.mean() - margin) / se, n - 1)  # H0: mean >= +margin
  return float(max(p_low, p_high))


def mean_over_draws_R(boot_RD, *, resample_draws: bool, seed: int) -> np.ndarray:
  """[R] the mean over D random draws (head sets) in each of R bootstrap resamples `boot_RD` (the draws'
  values on the same sentence resamples). resample_draws: the draws are a sample of the possible ones, so
  each resample also draws the D draws with replacement (a two-stage bootstrap over sentences and draws,
  Davison & Hinkley 1997 §3.8); False when the draws enumerate every possible one (their mean is then exact
  and only the sentences vary)."""
  boot_RD = np.asarray(boot_RD, np.float64)
  R, D = boot_RD.shape
  if not resample_draws or D < 2:
    return boot_RD.mean(1)
  pick_RD = np.random.default_rng(seed).integers(0, D, size=(R, D))
  return np.take_along_axis(boot_RD, pick_RD, axis=1).mean(1)
