"""Softmax probes: agree with scikit-learn's LogisticRegression, pick l2 on dev, are deterministic."""

import numpy as np
import pytest
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from headspec.errors import UserError
from headspec.probing import probe

N_TRAIN, N_DEV, G, K = 20000, 6000, 3, 12


def _features(seed=0):
  """Two correlated label sets, projected per group with different strengths, squashed by tanh."""
  rng = np.random.default_rng(seed)
  n = N_TRAIN + N_DEV
  y_a = rng.choice(8, n, p=rng.dirichlet(np.ones(8)))
  y_b = (3 * y_a + rng.choice(3, n) + (rng.random(n) < 0.2) * rng.integers(0, 20, n)) % 20
  x = np.empty((n, G, K), np.float32)
  for g, (sa, sb) in enumerate([(1.2, 0.6), (0.5, 1.0), (0.0, 0.0)]):
    h = sa * rng.standard_normal((8, K))[y_a] + sb * rng.standard_normal((20, K))[y_b] + rng.standard_normal((n, K))
    x[:, g] = 3.0 + 2.0 * np.tanh(h) @ (np.eye(K) + rng.standard_normal((K, K)) / 4)
  y_b[rng.random(n) < 0.05] = -1  # some words carry no label for task b
  return x, y_a.astype(np.int32), y_b.astype(np.int32)


@pytest.fixture(scope="module")
def fitted_and_data():
  x, y_a, y_b = _features()
  specs = [
    probe.ProbeSpec("a", 8, y_a[:N_TRAIN], y_a[N_TRAIN:]),
    probe.ProbeSpec("b", 20, y_b[:N_TRAIN], y_b[N_TRAIN:]),
  ]
  fitted = probe.fit_softmax_probes(
    x[:N_TRAIN], x[N_TRAIN:], specs, l2_grid=(1e-5, 1e-4, 1e-2), refine_samples=8 * N_TRAIN, batch_size=512
  )
  return fitted, x, y_a, y_b


@pytest.mark.slow
def test_matches_sklearn_logistic_regression(fitted_and_data):
  fitted, x, y_a, y_b = fitted_and_data
  for name, y in (("a", y_a), ("b", y_b)):
    pred_NG = probe.predict(fitted, x[N_TRAIN:], name)
    keep_tr, keep_dev = y[:N_TRAIN] >= 0, y[N_TRAIN:] >= 0
    for g in range(G):
      scaler = StandardScaler().fit(x[:N_TRAIN, g])
      l2 = float(fitted.l2[name][g])
      ref = LogisticRegression(C=1.0 / (l2 * keep_tr.sum()), max_iter=500).fit(
        scaler.transform(x[:N_TRAIN, g][keep_tr]), y[:N_TRAIN][keep_tr]
      )
      ref_acc = ref.score(scaler.transform(x[N_TRAIN:, g][keep_dev]), y[N_TRAIN:][keep_dev])
      ours = (pred_NG[keep_dev, g] == y[N_TRAIN:][keep_dev]).mean()
      assert abs(ours - ref_acc) < 0.005, (name, g, ours, ref_acc)
      assert ours == pytest.approx(fitted.dev_accuracy_best[name][g])


def test_l2_selection_and_signal(fitted_and_data):
  fitted, *_ = fitted_and_data
  for name in ("a", "b"):
    acc = fitted.dev_accuracy[name]
    assert acc.shape == (G, 3)
    np.testing.assert_array_equal(fitted.dev_accuracy_best[name], acc.max(1))
    assert fitted.dev_accuracy_best[name][0] > fitted.dev_accuracy_best[name][2] + 0.2  # group 2 is noise
  # the strong penalty (1e-2) hurts a well-determined probe, so it is not chosen for group 0
  assert fitted.l2["a"][0] < 1e-2


def test_deterministic_given_seed():
  x, y_a, _ = _features(1)
  x, y_a = x[:6000], y_a[:6000]
  specs = [probe.ProbeSpec("a", 8, y_a[:5000], y_a[5000:])]
  f1 = probe.fit_softmax_probes(x[:5000], x[5000:], specs, refine_samples=8192, seed=3)
  f2 = probe.fit_softmax_probes(x[:5000], x[5000:], specs, refine_samples=8192, seed=3)
  np.testing.assert_array_equal(f1.weights["a"], f2.weights["a"])
  np.testing.assert_array_equal(f1.dev_accuracy["a"], f2.dev_accuracy["a"])


def test_user_errors():
  x = np.zeros((10, 2, 4), np.float32)
  y = np.zeros(10, np.int32)
  with pytest.raises(UserError):
    probe.fit_softmax_probes(x, x, [probe.ProbeSpec("a", 2, np.full(10, 5), y)])
  with pytest.raises(UserError):
    probe.fit_softmax_probes(x, x[:, :1], [probe.ProbeSpec("a", 2, y, y)])
