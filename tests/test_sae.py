"""Sparse autoencoders on attention outputs (headspec/sae/, docs/sae.md, issue 66)."""

from __future__ import annotations

import numpy as np
import pytest

import headspec
from headspec.errors import UserError
from headspec.sae import metrics
from headspec.sae import train as sae_train

H, KH, PER_HEAD = 4, 8, 4  # planted features: 4 per head, each a unit direction inside one head's 8-wide slice


def planted(n: int = 8192, active: int = 3, seed: int = 0):
  """(x_NK, directions_PK, head_P): inputs that are sparse sums of planted unit directions, plus a little noise."""
  rng = np.random.default_rng(seed)
  K, P = H * KH, H * PER_HEAD
  directions_PK, head_P = np.zeros((P, K)), np.repeat(np.arange(H), PER_HEAD)
  for p, h in enumerate(head_P):
    u = rng.normal(size=KH)
    directions_PK[p, h * KH : (h + 1) * KH] = u / np.linalg.norm(u)
  coef_NP = np.zeros((n, P))
  for row in coef_NP:
    row[rng.choice(P, active, replace=False)] = rng.uniform(1, 2, active)
  return coef_NP @ directions_PK + 0.01 * rng.normal(size=(n, K)), directions_PK, head_P


@pytest.fixture(scope="module")
def planted_fit():
  x, directions, head = planted()
  sae = headspec.fit_sae(x, features=32, kind="topk", k=3, steps=1500, seed=0, batch_size=256, lr=3e-3, progress=False)
  return x, directions, head, sae


def test_topk_recovers_planted_features_and_their_heads(planted_fit):
  x, directions_PK, head_P, sae = planted_fit
  cos_PF = directions_PK @ np.asarray(sae.W_dec_FK).T
  assert cos_PF.max(1).mean() >= 0.9
  best_P = cos_PF.argmax(1)
  fractions_FH = headspec.sae_head_fractions(sae, heads=H)
  assert fractions_FH.shape == (32, H)
  np.testing.assert_allclose(fractions_FH.sum(1), 1.0, rtol=1e-6)
  np.testing.assert_array_equal(fractions_FH[best_P].argmax(1), head_P)
  assert fractions_FH[best_P].max(1).min() > 0.9
  f = np.asarray(sae.encode(x[:512]))
  assert ((f > 0).sum(1) <= 3).all() and metrics.l0(f) > 2
  assert metrics.fvu(x[:512], np.asarray(sae.decode(f))) < 0.1
  assert {"encode", "decode", "W_enc_KF", "W_dec_FK", "b_dec_K"} <= set(dir(sae))
  assert sae.W_enc_KF.shape == (32, 32) and sae.b_dec_K.shape == (32,)


def test_relu_l1_keeps_decoder_rows_at_unit_norm():
  x, _, _ = planted(n=2048)
  sae = headspec.fit_sae(x, features=24, kind="relu", l1=0.5, steps=200, batch_size=128, lr=3e-3, progress=False)
  np.testing.assert_allclose(np.linalg.norm(np.asarray(sae.W_dec_FK), axis=1), 1.0, atol=1e-5)
  f = np.asarray(sae.encode(x[:256]))
  assert (f >= 0).all() and metrics.l0(f) < 24  # the L1 penalty makes it sparse
  assert metrics.fvu(x[:256], np.asarray(sae.decode(f))) < 0.5


def test_finished_checkpoint_is_returned_and_other_options_refused(tmp_path):
  x, _, _ = planted(n=1024)
  kw = dict(features=16, k=3, batch_size=64, lr=3e-3, chunk=10, progress=False, checkpoint_dir=tmp_path / "c")
  first = headspec.fit_sae(x, steps=40, checkpoint_every=20, **kw)
  again = headspec.fit_sae(x, steps=40, checkpoint_every=20, **kw)
  assert (first.info["resumed_at"], again.info["resumed_at"]) == (0, 40)
  np.testing.assert_array_equal(np.asarray(again.W_dec_FK), np.asarray(first.W_dec_FK))
  with pytest.raises(UserError, match="holds an SAE trained with other options steps"):
    headspec.fit_sae(x, steps=30, checkpoint_every=20, **kw)
  with pytest.raises(UserError, match="holds an SAE trained with other inputs"):
    headspec.fit_sae(x[:-1], steps=40, checkpoint_every=20, **kw)


def test_resume_mid_run(tmp_path, monkeypatch):
  """A run killed after its first checkpoint continues from it to the uninterrupted run's weights."""
  x, _, _ = planted(n=1024)
  kw = dict(features=16, k=3, batch_size=64, lr=3e-3, chunk=10, steps=40, progress=False)
  whole = headspec.fit_sae(x, **kw)
  from headspec.sae import checkpoint as ckpt

  real_save, calls = ckpt.save, []

  def save_then_die(mngr, step, state, meta):
    real_save(mngr, step, state, meta)
    calls.append(step)
    if step == 20:
      mngr.wait_until_finished()
      raise KeyboardInterrupt

  monkeypatch.setattr(ckpt, "save", save_then_die)
  with pytest.raises(KeyboardInterrupt):
    headspec.fit_sae(x, checkpoint_dir=tmp_path / "c", checkpoint_every=20, **kw)
  monkeypatch.setattr(ckpt, "save", real_save)
  resumed = headspec.fit_sae(x, checkpoint_dir=tmp_path / "c", checkpoint_every=20, **kw)
  assert resumed.info["resumed_at"] == 20
  np.testing.assert_allclose(np.asarray(resumed.W_dec_FK), np.asarray(whole.W_dec_FK), atol=1e-5)


@pytest.mark.parametrize(
  "kwargs, message",
  [
    (dict(features=0), "features=0 must be a positive"),
    (dict(features=-3), "features=-3 must be a positive"),
    (dict(features=8, k=9), "k=9 must be between 1 and features=8"),
    (dict(features=8, kind="jump"), "kind='jump'"),
    (dict(features=8, k=2, steps=0), "steps=0"),
  ],
)
def test_bad_options_are_one_line(kwargs, message):
  x, _, _ = planted(n=64)
  with pytest.raises(UserError, match=message):
    headspec.fit_sae(x, progress=False, **kwargs)


def test_nan_activations_are_refused():
  x, _, _ = planted(n=64)
  x[5, 2] = np.nan
  with pytest.raises(UserError, match="NaN or inf in 1 row.*first row 5"):
    headspec.fit_sae(x, features=8, k=2, progress=False)


def test_metric_formulas_on_known_cases():
  x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
  assert metrics.fvu(x, x) == 0.0
  assert metrics.fvu(x, np.broadcast_to(x.mean(0), x.shape)) == pytest.approx(1.0)
  assert metrics.fvu(x, x + np.array([0.5, 0.0])) == pytest.approx(4 * 0.25 / 2.0)  # Σ‖e‖² = 1, Σ‖x − x̄‖² = 2
  f = np.array([[1.0, 0.0, 0.0], [2.0, 3.0, 0.0], [0.5, 0.0, 0.0], [1.0, 0.0, 0.0]])
  assert metrics.l0(f) == pytest.approx(5 / 4)
  rates = metrics.firing_rates(f)
  np.testing.assert_allclose(rates, [1.0, 0.25, 0.0])
  assert metrics.dead_fraction(rates) == pytest.approx(1 / 3)
  assert metrics.dense_fraction(rates, 0.5) == pytest.approx(1 / 3)
  assert metrics.loss_recovered(clean=2.0, splice=2.5, ablated=4.0) == pytest.approx(0.75)
  assert np.isnan(metrics.loss_recovered(2.0, 2.5, 2.0))
  a = np.array([[1.0, 0.0], [0.5, 0.5], [0.25, 0.75]])
  np.testing.assert_allclose(metrics.entropy_bits(a), [0.0, 1.0, -(0.25 * np.log2(0.25) + 0.75 * np.log2(0.75))])
  # S_h = Σ a² / Σ a over live features: head 0 (1 + .25 + .0625)/(1.75), head 1 (.25 + .5625)/1.25
  np.testing.assert_allclose(metrics.specialization(a, [1, 1, 1]), [1.3125 / 1.75, 0.8125 / 1.25])
  np.testing.assert_allclose(metrics.specialization(a, [1, 0, 0]), [1.0, np.nan])
  w = np.array([[3.0, 4.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0]])  # heads of width 2
  np.testing.assert_allclose(metrics.head_fractions(w, 2), [[1.0, 0.0], [0.5, 0.5]])
  with pytest.raises(UserError, match="heads=3 must be a positive divisor of the SAE width 4"):
    metrics.head_fractions(w, 3)


def test_geometric_median_is_robust_and_exact():
  x = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [100.0, 100.0]])
  m = sae_train.geometric_median(x, iterations=1000, tolerance=1e-12)
  distances = lambda c: np.linalg.norm(x - c, axis=1).sum()
  assert distances(m) <= distances(x.mean(0))
  for d in ([1e-3, 0], [0, 1e-3], [-1e-3, 0], [0, -1e-3]):
    assert distances(m) <= distances(m + np.array(d)) + 1e-9  # a minimum


def test_schedules():
  o = sae_train.Options(features=4, steps=100, lr=1.0, warmup_steps=10, decay_fraction=0.2)
  s = sae_train.schedule(o)
  assert float(s(0)) == pytest.approx(0.1) and float(s(10)) == pytest.approx(1.0)
  assert (
    float(s(80)) == pytest.approx(1.0) and float(s(90)) == pytest.approx(0.5) and float(s(100)) == pytest.approx(0.0)
  )
