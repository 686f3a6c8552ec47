"""Bootstrap CIs over sentences: match a float64 reference loop; majority baseline."""

import numpy as np
import pytest

from headspec.errors import UserError
from headspec.probing import stats
from headspec.words import resampling


def _reference(correct_NG, sentence_N, num_resamples, seed):
  sentences = np.unique(sentence_N)
  idx_RS = np.random.default_rng(seed).integers(0, len(sentences), size=(num_resamples, len(sentences)))
  accs = []
  for r in range(num_resamples):
    rows = np.concatenate([np.flatnonzero(sentence_N == sentences[s]) for s in idx_RS[r]])
    accs.append(correct_NG[rows].astype(np.float64).mean(0))
  return np.percentile(np.array(accs), [2.5, 97.5], axis=0)


def test_matches_reference_loop_and_contains_estimate():
  rng = np.random.default_rng(0)
  lengths = rng.integers(1, 15, 60)
  sentence_N = np.repeat(rng.permutation(1000)[:60], lengths)  # arbitrary sentence ids
  p_G = np.array([0.2, 0.5, 0.9])
  correct_NG = rng.random((len(sentence_N), 3)) < p_G
  acc, low, high = resampling.bootstrap_ci(correct_NG, sentence_N, num_resamples=300, seed=5)
  ref_low, ref_high = _reference(correct_NG, np.unique(sentence_N, return_inverse=True)[1], 300, 5)
  np.testing.assert_allclose(low, ref_low, rtol=0, atol=1e-12)
  np.testing.assert_allclose(high, ref_high, rtol=0, atol=1e-12)
  np.testing.assert_allclose(acc, correct_NG.mean(0))
  assert np.all(low <= acc) and np.all(acc <= high) and np.all(low < high)
  again = resampling.bootstrap_ci(correct_NG, sentence_N, num_resamples=300, seed=5)
  np.testing.assert_array_equal(again[1], low)


def test_width_shrinks_with_more_sentences():
  rng = np.random.default_rng(1)
  widths = []
  for s in (50, 2000):
    sentence_N = np.repeat(np.arange(s), 10)
    _, low, high = resampling.bootstrap_ci(rng.random((s * 10, 1)) < 0.7, sentence_N, num_resamples=200)
    widths.append(float(high[0] - low[0]))
  assert widths[1] < widths[0] / 4


def test_majority_baseline_and_errors():
  assert stats.majority_baseline([0, 1, 1, -1, 2], [1, 1, 0, -1]) == pytest.approx(2 / 3)
  with pytest.raises(UserError):
    resampling.bootstrap_ci(np.ones((3, 2)), np.arange(4))


def test_selectivity_interval_is_paired():
  """Task and control on the same resampled sentences: when both err on the same hard sentences the paired
  interval of the difference is narrower than the two accuracy intervals would suggest."""
  rng = np.random.default_rng(0)
  sentence = np.repeat(np.arange(300), 10)
  hard = rng.random(300)[sentence]  # per-sentence difficulty shared by task and control
  task = rng.random(3000) > hard * 0.8
  control = task & (rng.random(3000) > 0.1)
  sel, low, high = resampling.bootstrap_selectivity(task, control, sentence, num_resamples=500)
  _, a_low, a_high = resampling.bootstrap_ci(task, sentence, num_resamples=500)
  assert low[0] <= sel[0] <= high[0]
  assert sel[0] == pytest.approx(task.mean() - control.mean())
  assert high[0] - low[0] < 0.5 * (a_high[0] - a_low[0])


def test_paired_difference_interval_covers_the_true_difference():
  """Coverage: two FIXED predictors on a large synthetic pool of sentences with a known population accuracy
  difference; over many evaluation samples drawn from the pool, about 95% of the paired 95% intervals
  contain the true difference."""
  rng = np.random.default_rng(1)
  pool_u = 20000
  lengths = rng.integers(3, 30, pool_u)
  difficulty = rng.beta(2, 2, pool_u)
  sentence = np.repeat(np.arange(pool_u), lengths)
  d = difficulty[sentence]
  a = rng.random(len(sentence)) > 0.7 * d  # predictor a and b share the sentence difficulty
  b = a & (rng.random(len(sentence)) > 0.08) | (~a & (rng.random(len(sentence)) < 0.03))
  truth = a.mean() - b.mean()  # the population (word-weighted) difference
  starts = np.concatenate([[0], np.cumsum(lengths)])
  covered, trials = 0, 200
  for t in range(trials):
    chosen = rng.choice(pool_u, 150, replace=False)
    words = np.concatenate([np.arange(starts[u], starts[u + 1]) for u in chosen])
    _, low, high = resampling.paired_difference_ci(a[words], b[words], sentence[words], num_resamples=400, seed=t)
    covered += low[0] <= truth <= high[0]
  assert 0.9 <= covered / trials <= 0.99, covered / trials


def test_weights_leave_ignored_words_out():
  sentence = np.array([0, 0, 1, 1])
  acc, low, high = resampling.bootstrap_ci(np.array([1, 0, 1, 1]), sentence, weight_N=np.array([1, 0, 1, 1]))
  assert acc[0] == 1.0 and low[0] == high[0] == 1.0


def test_train_sample_seed_defaults_to_seed():
  """probe.train_sample_seed draws the training subsample apart from `seed` (control labels, fit)."""
  from headspec.probing.config import probe_config

  c = probe_config()
  c.seed = 3
  assert stats.train_sample_seed(c) == 3
  lengths = np.full(500, 10)
  same = stats.subsample(lengths, 1000, stats.train_sample_seed(c))
  c.probe.train_sample_seed = 7
  assert stats.train_sample_seed(c) == 7
  assert not np.array_equal(stats.subsample(lengths, 1000, stats.train_sample_seed(c)), same)
