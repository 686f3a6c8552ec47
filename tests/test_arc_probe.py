"""Arc probe: recovers a planted bilinear head choice, is at chance on noise, is deterministic, and the
packed layout scores each word against exactly its own sentence."""

import numpy as np
import pytest

from headspec.errors import UserError
from headspec.probing import arc
from headspec.words import packing


def _planted(num_sentences, seed, noise_heads=False, n_max=10, g=2, k=8):
  """(x_NGK, heads per sentence): group 0's heads are argmax of a planted bilinear score, group 1 is noise."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, n_max + 1, num_sentences)
  x = rng.standard_normal((lengths.sum(), g, k)).astype(np.float32)
  a, b, u = rng.standard_normal((k, k)), rng.standard_normal((k, k)), rng.standard_normal(k)
  heads, start = [], 0
  for n in lengths:
    xg = x[start : start + n, 0].astype(np.float64)
    s_all = np.concatenate([((xg @ a.T) @ u)[:, None], (xg @ a.T) @ (xg @ b.T).T], -1)
    heads.append(s_all.argmax(-1) if not noise_heads else (rng.random(n) * (n + 1)).astype(np.int64))
    start += n
  return x, heads, lengths


def _split(x, heads, lengths, s):
  w = lengths[:s].sum()
  return x[:w], heads[:s], x[w:], heads[s:]


def test_recovers_planted_bilinear_structure_and_noise_group_is_low():
  x_all, h_all, lengths = _planted(1000, 0)
  x_tr, h_tr, x_dev, h_dev = _split(x_all, h_all, lengths, 800)
  fitted = arc.fit_arc_probes(
    x_tr, h_tr, x_dev, h_dev, epochs=20, learning_rate=3e-2, l2_grid=(1e-4, 1e-3), batch_words=256
  )
  assert fitted.dev_uas_G[0] > 0.95
  # Group 1 is independent noise: close to the accuracy of always predicting one candidate.
  assert fitted.dev_uas_G[1] < 0.35
  pred = arc.predict_heads(fitted, x_dev, lengths[800:])
  np.testing.assert_allclose(arc.uas(pred, np.concatenate(h_dev)), fitted.dev_uas_G, atol=1e-9)
  for start, n in zip(np.cumsum(np.r_[0, lengths[800:-1]]), lengths[800:]):
    assert pred[start : start + n].min() >= 0 and pred[start : start + n].max() <= n  # a head of its own sentence


def test_random_heads_are_at_chance():
  x, h, lengths = _planted(800, 2, noise_heads=True)
  x_tr, h_tr, x_dev, h_dev = _split(x, h, lengths, 600)
  fitted = arc.fit_arc_probes(x_tr, h_tr, x_dev, h_dev, epochs=10, l2_grid=(1e-3,), batch_words=256)
  chance = (lengths[600:] / (lengths[600:] + 1)).sum() / lengths[600:].sum()  # E[1/(n+1)] per word
  assert np.all(fitted.dev_uas_G < chance + 0.06)


def test_deterministic_given_seed():
  x, h, lengths = _planted(200, 3)
  x_tr, h_tr, x_dev, h_dev = _split(x, h, lengths, 150)
  f1 = arc.fit_arc_probes(x_tr, h_tr, x_dev, h_dev, epochs=3, seed=7)
  f2 = arc.fit_arc_probes(x_tr, h_tr, x_dev, h_dev, epochs=3, seed=7)
  np.testing.assert_array_equal(f1.a_GKI, f2.a_GKI)
  np.testing.assert_array_equal(f1.dev_uas_GP, f2.dev_uas_GP)


def test_packing_places_every_word_once_within_its_row():
  lengths = np.random.default_rng(0).integers(1, 65, 300)
  p = packing.first_fit(lengths, 64)
  cells = p.row_N * p.width + p.col_N
  assert len(np.unique(cells)) == lengths.sum()  # no two words share a cell
  assert (p.col_N < 64).all() and (p.col_N >= p.start_N).all()
  assert p.num_rows <= lengths.sum() // 64 + 1 + lengths.sum() // 640  # first-fit decreasing: near-tight


def test_packed_prediction_matches_per_sentence_scoring():
  """Long (own-row) and short (packed) sentences alike: argmax over ROOT + own sentence, in NumPy."""
  rng = np.random.default_rng(5)
  lengths = np.array([3, 70, 12, 1, 64, 40, 130, 9])
  g, k = 2, 6
  x = rng.standard_normal((lengths.sum(), g, k)).astype(np.float32)
  fitted = arc.FittedArcProbes(
    np.zeros((g, k), np.float32),
    np.ones((g, k), np.float32),
    rng.standard_normal((g, k, k)).astype(np.float32),
    rng.standard_normal((g, k, k)).astype(np.float32),
    rng.standard_normal((g, k)).astype(np.float32),
    np.zeros(g),
    np.zeros((g, 1)),
    np.zeros(g),
    (0.0,),
  )
  pred = arc.predict_heads(fitted, x, lengths, chunk_words=128)
  start = 0
  for n in lengths:
    for gi in range(g):
      q = x[start : start + n, gi] @ fitted.a_GKI[gi]
      s = np.concatenate([(q @ fitted.root_GI[gi])[:, None], q @ (x[start : start + n, gi] @ fitted.b_GKI[gi]).T], 1)
      np.testing.assert_array_equal(pred[start : start + n, gi], s.argmax(1))
    start += n


@pytest.mark.parametrize("rank", [6, 3])
def test_scores_and_gradients_match_the_factored_form(rank):
  """Full rank (r = K) scores through the merged K × K map M = A Bᵀ, lower rank through the factors; both
  give the factored form's scores and loss gradients (written here with jnp, float32 tolerance)."""
  import jax
  import jax.numpy as jnp

  rng = np.random.default_rng(3)
  p, g, b, w, k = 2, 3, 2, 8, 6
  x = jnp.asarray(rng.standard_normal((b, w, g, k)), jnp.float32)
  sentence = jnp.asarray([[0, 0, 0, 3, 3, 3, 3, -1], [0, 0, 0, 0, 0, 5, 5, 5]], jnp.int32)
  gold = jnp.asarray([[0, 2, 1, 0, 5, 4, 6, -1], [3, 0, 1, 1, 2, 0, 7, 8]], jnp.int32)
  params = tuple(
    jnp.asarray(rng.standard_normal(shape), jnp.float32) for shape in ((p, g, k, rank), (p, g, k, rank), (p, g, rank))
  )

  def factored(params):
    a, bb, u = params
    q, kk = jnp.einsum("bwgk,pgkr->pgbwr", x, a), jnp.einsum("bwgk,pgkr->pgbwr", x, bb)
    s = jnp.concatenate([jnp.einsum("pgbwr,pgr->pgbw", q, u)[..., None], jnp.einsum("pgbir,pgbjr->pgbij", q, kk)], -1)
    same = (sentence[:, :, None] == sentence[:, None, :]) & (sentence[:, None, :] >= 0)
    return jnp.where(jnp.concatenate([jnp.ones_like(same[..., :1]), same], -1), s, -jnp.inf)

  np.testing.assert_allclose(arc._scores(params, x, sentence), factored(params), rtol=1e-5, atol=1e-4)
  l2 = jnp.asarray([1e-3, 1e-2], jnp.float32)
  grad = jax.grad(lambda q: arc._loss_PG(q, x, sentence, gold, l2, 0.1).sum())(params)

  def loss_factored(q):
    logp = jax.nn.log_softmax(factored(q), -1)
    nll = -jnp.where(jax.nn.one_hot(gold, logp.shape[-1], dtype=bool), logp, 0.0).sum((-3, -2, -1)) * 0.1
    return (nll + 0.5 * l2[:, None] * sum(jnp.sum(jnp.square(t), axis=tuple(range(2, t.ndim))) for t in q)).sum()

  for got, want in zip(grad, jax.grad(loss_factored)(params)):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_rejects_heads_beyond_sentence_and_mismatched_features():
  x, h, _ = _planted(10, 4)
  bad = [hh.copy() for hh in h]
  bad[0][0] = 99
  with pytest.raises(UserError, match="outside its sentence"):
    arc.fit_arc_probes(x, bad, x, h, epochs=1)
  with pytest.raises(UserError, match="one row per word"):
    arc.fit_arc_probes(x[:-1], h, x, h, epochs=1)


def test_fixed_rank_early_stopping_train_uas_and_ignored_words():
  """Rank is fixed (capped at K) for every group; the dev-loss early stopping keeps an epoch and reports
  train UAS beside dev; heads of -1 are neither trained on nor scored."""
  rng = np.random.default_rng(5)
  lengths = rng.integers(3, 12, 120)
  heads = [np.where(rng.random(n) < 0.2, -1, rng.integers(0, n + 1, n)) for n in lengths]
  x = rng.standard_normal((int(lengths.sum()), 2, 40)).astype(np.float32)
  split = int(lengths[:100].sum())
  fitted = arc.fit_arc_probes(x[:split], heads[:100], x[split:], heads[100:], epochs=3, l2_grid=(1e-3,))
  assert fitted.rank == 32 and fitted.a_GKI.shape == (2, 40, 32)
  assert fitted.train_uas_G.shape == (2,) and np.isfinite(fitted.train_uas_G).all()
  assert 1 <= fitted.best_epoch_G.min() and fitted.best_epoch_G.max() <= fitted.epochs_run <= 3
  gold = np.concatenate(heads[100:])
  pred = arc.predict_heads(fitted, x[split:], lengths[100:])
  np.testing.assert_allclose(arc.uas(pred, gold), (pred[gold >= 0] == gold[gold >= 0][:, None]).mean(0))
