"""Dependency-arc probe: which word is each word's syntactic head, from one feature group at a time.

For word i of a sentence with words 1..n and candidate heads j ∈ {ROOT, 1..n} (j = i included, so
control tasks that attach a word to itself are expressible):

  s_ij = (A x̂_i) · (B x̂_j),   s_i,ROOT = (A x̂_i) · u,    p(head_i = j) = softmax_j s_ij

with A, B ∈ R^{r×K} (low-rank bilinear form x̂_iᵀ Aᵀ B x̂_j; r = K gives the full bilinear probe of
Hewitt & Manning 2019's "structural probe" family / Dozat & Manning 2017's biaffine scorer without
its MLPs) and a learned root vector u. x̂ is the standardised feature (train mean/std).
Trained with cross-entropy on the gold head + (λ/2)(‖A‖² + ‖B‖² + ‖u‖²), minibatch Adam; λ picked per
group on dev from a grid (all grid values and all groups are trained together: vmap over both).
Metric: UAS = fraction of words whose gold head gets the highest score (Clark et al. 2019 probe heads
the same way, with attention weights instead of a learned score).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from headspec.errors import UserError

DEFAULT_ARC_L2_GRID = (1e-4, 1e-3, 1e-2)


@dataclasses.dataclass(frozen=True)
class FittedArcProbes:
  """Per group: a_GKR, b_GKR, root_GR (chosen l2), standardisation, l2 and dev UAS per grid value."""
  mean_GK: np.ndarray
  std_GK: np.ndarray
  a_GKR: np.ndarray
  b_GKR: np.ndarray
  root_GR: np.ndarray
  l2_G: np.ndarray
  dev_uas_GL: np.ndarray
  dev_uas_G: np.ndarray
  l2_grid: tuple


def _check(x_BNGK, heads_BN, what):
  if x_BNGK.ndim != 4 or heads_BN.shape != x_BNGK.shape[:2]:
    raise UserError(f"arc probe {what}: need x_BNGK and heads_BN with the same B, N; got {x_BNGK.shape}, {heads_BN.shape}")
  valid = heads_BN >= 0
  lengths = valid.sum(1)
  if (heads_BN > lengths[:, None]).any():
    raise UserError(f"arc probe {what}: a head index exceeds its sentence length (heads are 1-based, 0 = ROOT)")
  if not (valid == (np.arange(heads_BN.shape[1])[None, :] < lengths[:, None])).all():
    raise UserError(f"arc probe {what}: padding (-1) must come after each sentence's words")


def _scores_BNJ(params, xs_BNK, valid_BN):
  """Scores over candidates j = 0 (ROOT), 1..N for one group; invalid candidates get -inf."""
  a_KR, b_KR, root_R = params
  q_BNR = xs_BNK @ a_KR
  k_BNR = xs_BNK @ b_KR
  s_BNN = jnp.einsum("bir,bjr->bij", q_BNR, k_BNR)
  s_root_BN = q_BNR @ root_R
  s_BNJ = jnp.concatenate([s_root_BN[..., None], s_BNN], axis=-1)
  cand_BJ = jnp.concatenate([jnp.ones_like(valid_BN[:, :1]), valid_BN], axis=-1)
  return jnp.where(cand_BJ[:, None, :], s_BNJ, -jnp.inf)


def _group_loss(params, xs_BNK, heads_BN, l2, scale):
  valid_BN = heads_BN >= 0
  s_BNJ = _scores_BNJ(params, xs_BNK, valid_BN)
  logp_BNJ = jax.nn.log_softmax(s_BNJ, axis=-1)
  picked_BN = jnp.take_along_axis(logp_BNJ, jnp.maximum(heads_BN, 0)[..., None], axis=-1)[..., 0]
  nll = -jnp.where(valid_BN, picked_BN, 0.0).sum() * scale
  return nll + 0.5 * l2 * sum(jnp.sum(jnp.square(p)) for p in params)


# vmap over groups (features axis 2 of x_BNGK), then over the l2 grid.
_loss_G = jax.vmap(_group_loss, in_axes=(0, 2, None, None, None))
_loss_LG = jax.vmap(_loss_G, in_axes=(0, None, None, 0, None))


def _standardise(x_BNGK, mean_GK, std_GK):
  return (x_BNGK - mean_GK) / std_GK


@functools.partial(jax.jit, static_argnames=("epochs", "batch_size", "learning_rate"))
def _train(params, x_BNGK, heads_BN, mean_GK, std_GK, l2_L, key, *, epochs, batch_size, learning_rate):
  num_b = x_BNGK.shape[0]
  steps = num_b // batch_size
  opt = optax.adam(optax.cosine_decay_schedule(learning_rate, epochs * steps))
  words_per_batch = jnp.maximum((heads_BN >= 0).sum() * batch_size / num_b, 1.0)

  def total_loss(p, xs, h):
    return _loss_LG(p, xs, h, l2_L, 1.0 / words_per_batch).sum()

  grad_fn = jax.grad(total_loss)

  def step(carry, idx):
    p, s = carry
    xs = _standardise(x_BNGK[idx], mean_GK, std_GK)
    updates, s = opt.update(grad_fn(p, xs, heads_BN[idx]), s, p)
    return (optax.apply_updates(p, updates), s), None

  def epoch(carry, k):
    order = jax.random.permutation(k, num_b)[: steps * batch_size].reshape(steps, batch_size)
    return jax.lax.scan(step, carry, order)[0], None

  (params, _), _ = jax.lax.scan(epoch, (params, opt.init(params)), jax.random.split(key, epochs))
  return params


@jax.jit
def _heads_BNG(params_G, xs_BNGK, valid_BN):
  """argmax candidate per word and group, as a CoNLL-U head (0 = ROOT, 1-based)."""
  s_GBNJ = jax.vmap(_scores_BNJ, in_axes=(0, 2, None))(params_G, xs_BNGK, valid_BN)
  return jnp.transpose(jnp.argmax(s_GBNJ, -1), (1, 2, 0)).astype(jnp.int32)


def _predict_all(params, x_BNGK, heads_BN, mean_GK, std_GK, chunk):
  """heads_{L,}BNG for params with a leading l2 axis or without, chunked over sentences."""
  outs = []
  for start in range(0, x_BNGK.shape[0], chunk):
    xs = _standardise(jnp.asarray(x_BNGK[start:start + chunk], jnp.float32), mean_GK, std_GK)
    valid = jnp.asarray(heads_BN[start:start + chunk] >= 0)
    if params[0].ndim == 4:
      outs.append(np.stack([np.asarray(_heads_BNG(tuple(p[l] for p in params), xs, valid))
                            for l in range(params[0].shape[0])]))
    else:
      outs.append(np.asarray(_heads_BNG(params, xs, valid)))
  return np.concatenate(outs, axis=-3)


def uas(pred_BNG, heads_BN) -> np.ndarray:
  """Unlabelled attachment score per group: Σ[pred = gold] / #words (padding excluded)."""
  valid = heads_BN >= 0
  return ((pred_BNG == heads_BN[..., None]) & valid[..., None]).sum((0, 1)) / max(valid.sum(), 1)


def fit_arc_probes(x_train_BNGK, heads_train_BN, x_dev_BNGK, heads_dev_BN, *, rank: int | None = None,
                   l2_grid: Sequence[float] = DEFAULT_ARC_L2_GRID, seed: int = 0, epochs: int = 10,
                   batch_size: int = 32, learning_rate: float = 1e-2, chunk: int = 256) -> FittedArcProbes:
  """Fits the bilinear arc probe for every group and l2 value; keeps the best l2 per group on dev.

  x_*_BNGK: sentence-padded features; heads_*_BN: gold heads (0 = ROOT, 1-based, -1 = padding).
  rank defaults to K (full bilinear form). Deterministic given seed.
  """
  heads_train_BN, heads_dev_BN = np.asarray(heads_train_BN), np.asarray(heads_dev_BN)
  _check(x_train_BNGK, heads_train_BN, "train")
  _check(x_dev_BNGK, heads_dev_BN, "dev")
  _, _, num_g, k = x_train_BNGK.shape
  rank = k if rank is None else rank
  batch_size = min(batch_size, x_train_BNGK.shape[0])
  valid = heads_train_BN >= 0
  words = np.asarray(x_train_BNGK, np.float64)[valid]  # (words, G, K)
  mean = words.mean(0)
  std = words.std(0)
  std = np.where(std > 1e-6 * max(std.max(), 1e-30), std, 1.0)
  l2_L = np.asarray(sorted(l2_grid), np.float32)
  num_l = len(l2_L)
  k_a, k_b, k_r, k_train = jax.random.split(jax.random.PRNGKey(seed), 4)
  init = lambda key, shape: jax.random.normal(key, shape) / np.sqrt(shape[-2] if len(shape) > 3 else shape[-1])
  params = (jnp.broadcast_to(init(k_a, (num_g, k, rank)), (num_l, num_g, k, rank)),
            jnp.broadcast_to(init(k_b, (num_g, k, rank)), (num_l, num_g, k, rank)),
            jnp.zeros((num_l, num_g, rank)))
  mean_j, std_j = jnp.asarray(mean, jnp.float32), jnp.asarray(std, jnp.float32)
  params = _train(params, jnp.asarray(x_train_BNGK, jnp.float32), jnp.asarray(heads_train_BN, jnp.int32),
                  mean_j, std_j, jnp.asarray(l2_L), k_train, epochs=epochs, batch_size=batch_size,
                  learning_rate=learning_rate)
  pred_LBNG = _predict_all(params, x_dev_BNGK, heads_dev_BN, mean_j, std_j, chunk)
  dev_uas_GL = np.stack([uas(p, heads_dev_BN) for p in pred_LBNG], axis=1)
  best_G = num_l - 1 - np.argmax(dev_uas_GL[:, ::-1], axis=1)
  pick = lambda p: np.asarray(p)[best_G, np.arange(num_g)]
  return FittedArcProbes(mean.astype(np.float32), std.astype(np.float32), pick(params[0]), pick(params[1]),
                         pick(params[2]), l2_L[best_G], dev_uas_GL, dev_uas_GL[np.arange(num_g), best_G],
                         tuple(float(v) for v in l2_L))


def predict_heads(fitted: FittedArcProbes, x_BNGK, heads_or_mask_BN, *, chunk: int = 256) -> np.ndarray:
  """Predicted head pred_BNG (0 = ROOT, 1-based) per word and group; heads_or_mask_BN ≥ 0 marks words."""
  params = (jnp.asarray(fitted.a_GKR), jnp.asarray(fitted.b_GKR), jnp.asarray(fitted.root_GR))
  return _predict_all(params, x_BNGK, np.asarray(heads_or_mask_BN), jnp.asarray(fitted.mean_GK),
                      jnp.asarray(fitted.std_GK), chunk)
