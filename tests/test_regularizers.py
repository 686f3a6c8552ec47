"""headspec.train.regularizers: NumPy references (loops), known answers, descent directions, DropHead."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from headspec.errors import UserError
from headspec.train import regularizers

L, B, T, H, K, D = 2, 2, 4, 3, 2, 8
# The values checked through jitted copies: one program per call signature, not one per operation (eager
# dispatch compiles each); the errors are checked on the functions themselves.
cosine_agreement = jax.jit(regularizers.cosine_agreement, static_argnames="off_diagonal")
position_agreement = jax.jit(regularizers.position_agreement, static_argnames="off_diagonal")
orthogonality_penalty = jax.jit(regularizers.orthogonality_penalty, static_argnames="mode")


def cos_agreement_ref(x, valid, off_diagonal):
  x = np.asarray(x, np.float64)
  vals = []
  for l, b, t in itertools.product(range(x.shape[0]), range(x.shape[1]), range(x.shape[2])):
    if not valid[b, t]:
      continue
    pairs = [(i, j) for i in range(H) for j in range(H) if not (off_diagonal and i == j)]
    cos = [
      x[l, b, t, i] @ x[l, b, t, j] / (np.linalg.norm(x[l, b, t, i]) * np.linalg.norm(x[l, b, t, j])) for i, j in pairs
    ]
    vals.append(np.mean(cos))
  return np.mean(vals)


def position_agreement_ref(p, valid, off_diagonal):
  p = np.asarray(p, np.float64)
  vals = []
  for l, b, t in itertools.product(range(p.shape[0]), range(p.shape[1]), range(p.shape[3])):
    if valid[b, t]:
      pairs = [(i, j) for i in range(H) for j in range(H) if not (off_diagonal and i == j)]
      vals.append(np.mean([sum(p[l, b, i, t, s] * p[l, b, j, t, s] for s in range(p.shape[4])) for i, j in pairs]))
  return np.mean(vals)


@pytest.fixture
def batch():
  rng = np.random.default_rng(0)
  valid = np.array([[True] * T, [True, True, False, False]])
  logits = rng.normal(size=(L, B, H, T, T))
  return dict(
    v=rng.normal(size=(L, B, T, H, K)),
    logits=logits,
    probs=np.asarray(jax.nn.softmax(logits, -1)),
    out=rng.normal(size=(L, B, T, H, D)),
    valid=valid,
  )


@pytest.mark.parametrize("off_diagonal", [False, True])
def test_agreements_match_numpy(batch, off_diagonal):
  valid = jnp.asarray(batch["valid"])
  for x in (batch["v"], batch["out"]):
    got = cosine_agreement(jnp.asarray(x, jnp.float32), valid, off_diagonal=off_diagonal)
    np.testing.assert_allclose(got, cos_agreement_ref(x, batch["valid"], off_diagonal), rtol=1e-5, atol=1e-6)
  got = position_agreement(jnp.asarray(batch["probs"], jnp.float32), valid, off_diagonal=off_diagonal)
  np.testing.assert_allclose(got, position_agreement_ref(batch["probs"], batch["valid"], off_diagonal), rtol=1e-5)


def test_known_answers_identical_and_orthogonal_heads():
  valid = jnp.ones((B, T), bool)
  same = jnp.broadcast_to(jnp.arange(1.0, K + 1), (L, B, T, H, K))
  assert float(cosine_agreement(same, valid)) == pytest.approx(1.0, rel=1e-6)
  ortho = jnp.broadcast_to(jnp.eye(H, D), (L, B, T, H, D))  # head h writes only to coordinate h
  assert float(cosine_agreement(ortho, valid)) == pytest.approx(1.0 / H, rel=1e-6)  # diagonal only
  assert float(cosine_agreement(ortho, valid, off_diagonal=True)) == pytest.approx(0.0, abs=1e-7)
  one_hot = jnp.broadcast_to(jax.nn.one_hot(jnp.arange(H), T)[None, None, :, None], (L, B, H, T, T))
  assert float(position_agreement(one_hot, valid, off_diagonal=True)) == pytest.approx(0.0, abs=1e-7)
  assert float(position_agreement(jnp.full((L, B, H, T, T), 1.0 / T), valid)) == pytest.approx(1.0 / T, rel=1e-6)


def test_disagreement_terms_weights_and_fields(batch):
  valid = jnp.asarray(batch["valid"])
  inter = dict(
    v_LBTHK=jnp.asarray(batch["v"]),
    pattern_LBHTS=jnp.asarray(batch["probs"]),
    z_LBTHK=jnp.asarray(batch["v"]),
    head_out_LBTHD=jnp.asarray(batch["out"]),
  )
  terms = regularizers.disagreement_terms(inter, valid, w_subspace=0.5, w_position=2.0, w_output=1.0, output="head_out")
  assert set(terms) == {"disagreement/subspace", "disagreement/position", "disagreement/output"}
  np.testing.assert_allclose(
    terms["disagreement/subspace"], 0.5 * cos_agreement_ref(batch["v"], batch["valid"], False), rtol=1e-5
  )
  np.testing.assert_allclose(
    terms["disagreement/output"], cos_agreement_ref(batch["out"], batch["valid"], False), rtol=1e-5
  )
  assert regularizers.disagreement_terms(inter, valid) == {}
  with pytest.raises(UserError):
    regularizers.disagreement_terms({"v_LBTHK": None}, valid, w_subspace=1.0)
  with pytest.raises(UserError):
    regularizers.disagreement_terms(inter, valid, w_output=1.0, output="residual")


def _descends(f, x, lr=1e-2):
  f = jax.jit(f)
  value, grad = jax.jit(jax.value_and_grad(f))(x)
  assert np.all(np.isfinite(np.asarray(grad))), "gradient not finite"
  assert float(jnp.abs(grad).max()) > 0, "gradient is zero"
  assert float(f(x - lr * grad)) < float(value)


def test_regularizer_gradients_are_finite_and_descend(batch):
  valid = jnp.asarray(batch["valid"])
  v = jnp.asarray(batch["v"], jnp.float32).at[:, :, :, 0].set(0.0)  # a zeroed (masked) head: grads must stay finite
  _descends(lambda x: cosine_agreement(x, valid), v)
  _descends(lambda x: cosine_agreement(x, valid, off_diagonal=True), jnp.asarray(batch["out"], jnp.float32))
  logits = jnp.asarray(batch["logits"], jnp.float32)
  _descends(lambda x: position_agreement(jax.nn.softmax(x, -1), valid), logits, lr=1e-1)
  w_q = jnp.asarray(np.random.default_rng(1).normal(size=(L, D, H, K)), jnp.float32)
  _descends(lambda w: orthogonality_penalty(w, mode="inter"), w_q)
  _descends(lambda w: orthogonality_penalty(w, mode="full"), w_q)


def test_orthogonality_penalty_known_answers_and_reference():
  eye = jnp.eye(D)[:, : H * K].reshape(D, H, K)  # heads read disjoint orthonormal directions
  assert float(orthogonality_penalty(eye, mode="inter")) == pytest.approx(0.0, abs=1e-10)
  assert float(orthogonality_penalty(eye, mode="full")) == pytest.approx(0.0, abs=1e-10)
  same = jnp.broadcast_to(jnp.eye(D)[:, :K][:, None, :], (D, H, K))  # every head the same orthonormal W
  # W̃ = W/√K, W̃ᵀW̃ = I/K, ||·||_F² = 1/K per ordered pair i ≠ j
  assert float(orthogonality_penalty(same, mode="inter")) == pytest.approx(H * (H - 1) / K, rel=1e-6)
  w = np.random.default_rng(2).normal(size=(L, D, H, K))
  want_inter, want_full = 0.0, 0.0
  for l in range(L):
    blocks = [w[l, :, h] / np.linalg.norm(w[l, :, h]) for h in range(H)]
    want_inter += sum(np.linalg.norm(blocks[i].T @ blocks[j]) ** 2 for i in range(H) for j in range(H) if i != j)
    cols = w[l].reshape(D, H * K)
    cols = cols / np.linalg.norm(cols, axis=0)
    want_full += np.linalg.norm(cols.T @ cols - np.eye(H * K)) ** 2
  np.testing.assert_allclose(orthogonality_penalty(jnp.asarray(w, jnp.float32)), want_inter, rtol=1e-5)
  np.testing.assert_allclose(orthogonality_penalty(jnp.asarray(w, jnp.float32), mode="full"), want_full, rtol=1e-5)
  with pytest.raises(UserError):
    regularizers.orthogonality_penalty(w, mode="diag")


def test_drophead_mask_rate_and_expectation():
  p, n, heads = 0.3, 20000, 4
  mask = np.asarray(jax.jit(regularizers.drophead_mask, static_argnums=(2, 3, 4))(jax.random.key(0), p, n, 3, heads))
  assert mask.shape == (n, 3, heads)
  np.testing.assert_allclose(mask.sum(-1), heads, rtol=1e-6)  # kept heads rescaled by H / kept
  expected_drop = p - p**heads  # all-dropped rows are kept whole
  assert abs((mask == 0).mean() - expected_drop) < 4 * math.sqrt(expected_drop / (n * 3 * heads))
  assert abs(mask.mean() - 1.0) < 1e-6  # E[mask] = 1 exactly (each row sums to H)
  assert np.all(np.abs(mask.mean(axis=(0, 1)) - 1.0) < 0.02)  # per head too, up to sampling noise
  kept = (mask > 0).sum(-1, keepdims=True)
  np.testing.assert_allclose(mask[mask > 0], np.broadcast_to(heads / kept, mask.shape)[mask > 0], rtol=1e-6)
  assert np.all(np.asarray(regularizers.drophead_mask(jax.random.key(1), 0.0, 5, 2, heads)) == 1.0)


def test_drophead_rate_schedules():
  rate = jax.jit(regularizers.drophead_rate, static_argnums=(1, 2, 3))
  assert float(rate(123, 1000, 0.2, "constant")) == pytest.approx(0.2)
  v = [float(rate(s, 1000, 0.2, "v")) for s in (0, 250, 500, 750, 1000)]
  np.testing.assert_allclose(v, [0.2, 0.1, 0.0, 0.1, 0.2], atol=1e-7)
  assert float(regularizers.drophead_rate(100, 1000, 0.2, "v", turn=0.2)) == pytest.approx(0.1)
  with pytest.raises(UserError):
    regularizers.drophead_rate(0, 10, 0.1, "cosine")
  with pytest.raises(UserError, match="drophead_turn must be in"):
    regularizers.drophead_rate(0, 10, 0.1, "v", turn=1.0)


def test_drophead_turn_is_a_config_key():
  from types import SimpleNamespace

  from headspec.train import config as defaults
  from headspec.train import loop as train

  config = defaults.train_config()
  config.train.steps, config.train.regularizers.drophead = 1000, 0.2
  config.train.regularizers.drophead_schedule, config.train.regularizers.drophead_turn = "v", 0.2
  obj = train.objective(config, SimpleNamespace(vocab_size=50, mask_id=4, unk_id=1))
  assert obj.drophead_turn == 0.2
  rate = regularizers.drophead_rate(100, obj.total_steps, obj.drophead, obj.drophead_schedule, turn=obj.drophead_turn)
  assert float(rate) == pytest.approx(0.1)  # halfway down to the turn at step 200
