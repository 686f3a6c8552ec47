"""Arc probe: recovers a planted bilinear head choice, is at chance on noise, is deterministic."""
import numpy as np
import pytest

from headspec.errors import UserError
from headspec.probing import arc


def _planted(num_sentences, seed, noise_heads=False, n_max=10, g=2, k=8):
  rng = np.random.default_rng(seed)
  x = rng.standard_normal((num_sentences, n_max, g, k)).astype(np.float32)
  lengths = rng.integers(3, n_max + 1, num_sentences)
  valid = np.arange(n_max)[None, :] < lengths[:, None]
  a, b, u = rng.standard_normal((k, k)), rng.standard_normal((k, k)), rng.standard_normal(k)
  xg = x[:, :, 0].astype(np.float64)  # group 0 carries the structure, group 1 is noise
  s = np.einsum("bik,kl,bjl->bij", xg @ a.T, np.eye(k), xg @ b.T)
  s_root = (xg @ a.T) @ u
  s_all = np.concatenate([s_root[..., None], s], -1)
  s_all[:, :, 1:][~np.broadcast_to(valid[:, None, :], s.shape)] = -np.inf
  heads = np.where(valid, s_all.argmax(-1), -1).astype(np.int32)
  if noise_heads:
    heads = np.where(valid, (rng.random(valid.shape) * (lengths[:, None] + 1)).astype(np.int32), -1)
  return x, heads


def test_recovers_planted_bilinear_structure_and_noise_group_is_low():
  x_all, h_all = _planted(1000, 0)
  fitted = arc.fit_arc_probes(x_all[:800], h_all[:800], x_all[800:], h_all[800:], epochs=20,
                              learning_rate=3e-2, l2_grid=(1e-4, 1e-3))
  assert fitted.dev_uas_G[0] > 0.95
  # Group 1 is independent noise: close to the accuracy of always predicting one candidate.
  assert fitted.dev_uas_G[1] < 0.35
  pred = arc.predict_heads(fitted, x_all[800:], h_all[800:])
  np.testing.assert_allclose(arc.uas(pred, h_all[800:]), fitted.dev_uas_G, atol=1e-9)
  assert set(np.unique(pred[h_all[800:] >= 0])) <= set(range(0, 11))


def test_random_heads_are_at_chance():
  x, h = _planted(800, 2, noise_heads=True)
  fitted = arc.fit_arc_probes(x[:600], h[:600], x[600:], h[600:], epochs=10, l2_grid=(1e-3,))
  lengths = (h[600:] >= 0).sum(1)
  chance = (lengths / (lengths + 1)).sum() / lengths.sum()  # E[1/(n+1)] per word
  assert np.all(fitted.dev_uas_G < chance + 0.06)


def test_deterministic_given_seed():
  x, h = _planted(200, 3)
  f1 = arc.fit_arc_probes(x[:150], h[:150], x[150:], h[150:], epochs=3, seed=7)
  f2 = arc.fit_arc_probes(x[:150], h[:150], x[150:], h[150:], epochs=3, seed=7)
  np.testing.assert_array_equal(f1.a_GKR, f2.a_GKR)
  np.testing.assert_array_equal(f1.dev_uas_GL, f2.dev_uas_GL)


def test_rejects_heads_beyond_sentence():
  x, h = _planted(10, 4)
  h = h.copy()
  h[0, 0] = 99
  with pytest.raises(UserError):
    arc.fit_arc_probes(x, h, x, h, epochs=1)
