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

Layout: inputs are word-level (x_NGK and one head array per sentence). Sentences are packed side by
side into rows of `width` words (first-fit decreasing bin packing) and a word's candidates are masked
to its own sentence, so the O(width²) score matrix is spent on words, not padding: EWT sentences
average ~16 words, so padding each to the longest (64) would cost ~4x more.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from headspec.errors import UserError

DEFAULT_ARC_L2_GRID = (1e-4, 1e-3, 1e-2)
PACK_WIDTH = 64  # words per packed row; longer sentences get a row of their own (next power of two)


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


@dataclasses.dataclass(frozen=True)
class _Packing:
  """Word n sits at (row_N[n], col_N[n]) of a [num_rows, width] grid; start_N[n] is the column of its
  sentence's first word (which also names the sentence within its row)."""

  width: int
  num_rows: int
  row_N: np.ndarray
  col_N: np.ndarray
  start_N: np.ndarray

  def grid(self, values_N, fill, dtype) -> np.ndarray:
    """values_N (with trailing axes) laid out as [num_rows, width, ...]; `fill` elsewhere."""
    values_N = np.asarray(values_N)
    out = np.full((self.num_rows, self.width) + values_N.shape[1:], fill, dtype)
    out[self.row_N, self.col_N] = values_N
    return out


def _width(longest: int) -> int:
  return max(PACK_WIDTH, 1 << max(0, int(longest) - 1).bit_length())


def _pack(lengths_S: np.ndarray, width: int) -> _Packing:
  """First-fit decreasing: longest sentence first, each into the first row with room.

  By hand: grain's first-fit packing iterates a dataset example by example to emit training batches;
  here the same placement must be reused for features, gold heads and predictions, so only the
  (row, column) of each word is wanted."""
  lengths_S = np.asarray(lengths_S, np.int64)
  free_R = np.zeros(len(lengths_S), np.int64)  # at most one row per sentence
  row_S, start_S = np.zeros_like(lengths_S), np.zeros_like(lengths_S)
  num_rows = 0
  for s in np.argsort(-lengths_S, kind="stable"):
    fits = np.flatnonzero(free_R[:num_rows] >= lengths_S[s])
    r = int(fits[0]) if len(fits) else num_rows
    if r == num_rows:
      free_R[r], num_rows = width, num_rows + 1
    row_S[s], start_S[s] = r, width - free_R[r]
    free_R[r] -= lengths_S[s]
  sentence_N = np.repeat(np.arange(len(lengths_S)), lengths_S)
  first_N = np.concatenate([[0], np.cumsum(lengths_S)[:-1]])[sentence_N]
  start_N = start_S[sentence_N]
  return _Packing(width, num_rows, row_S[sentence_N], start_N + np.arange(len(sentence_N)) - first_N, start_N)


def _lengths_and_heads(heads: Sequence[np.ndarray], x_NGK, what: str) -> tuple[np.ndarray, np.ndarray]:
  """(lengths_S, heads_N) of per-sentence gold heads (1-based, 0 = ROOT), checked against x_NGK."""
  lengths_S = np.array([len(h) for h in heads], np.int64)
  heads_N = np.concatenate([np.asarray(h, np.int64) for h in heads]) if len(heads) else np.zeros(0, np.int64)
  if x_NGK.ndim != 3 or x_NGK.shape[0] != len(heads_N) or not len(heads_N) or (lengths_S < 1).any():
    raise UserError(
      f"arc probe {what}: need x_NGK with one row per word of the non-empty sentences; got "
      f"{x_NGK.shape} for {len(heads)} sentences of {len(heads_N)} words"
    )
  if (heads_N < 0).any() or (heads_N > np.repeat(lengths_S, lengths_S)).any():
    raise UserError(f"arc probe {what}: a head index is outside its sentence (heads are 1-based, 0 = ROOT)")
  return lengths_S, heads_N


def _candidates_N(packing: _Packing, heads_N) -> np.ndarray:
  """Gold candidate index in a packed row: 0 = ROOT, 1 + column of the head word otherwise."""
  return np.where(heads_N == 0, 0, packing.start_N + heads_N)


def _scores(params, xs_BWGK, sentence_BW):
  """s_...GBWJ over candidates j = 0 (ROOT), 1..W (the row's words) for every group (and any leading axes
  of the params, e.g. the l2 grid); a word's candidates are ROOT and the words of its own sentence
  (sentence_BW: first column of each word's sentence, -1 = empty). Written as einsums over all groups at
  once rather than vmapped per group: XLA's CPU backend runs the batched form about 1.5x faster."""
  a_GKR, b_GKR, root_GR = params
  q_GBWR = jnp.einsum("bwgk,...gkr->...gbwr", xs_BWGK, a_GKR)
  k_GBWR = jnp.einsum("bwgk,...gkr->...gbwr", xs_BWGK, b_GKR)
  s_GBWW = jnp.einsum("...bir,...bjr->...bij", q_GBWR, k_GBWR)
  s_root_GBW = jnp.einsum("...gbwr,...gr->...gbw", q_GBWR, root_GR)
  s_GBWJ = jnp.concatenate([s_root_GBW[..., None], s_GBWW], axis=-1)
  same_BWW = (sentence_BW[:, :, None] == sentence_BW[:, None, :]) & (sentence_BW[:, None, :] >= 0)
  cand_BWJ = jnp.concatenate([jnp.ones_like(same_BWW[..., :1]), same_BWW], axis=-1)
  return jnp.where(cand_BWJ, s_GBWJ, -jnp.inf)


def _loss_LG(params_LG, xs_BWGK, sentence_BW, gold_BW, l2_L, scale):
  """Penalised cross-entropy per (l2 value, group): scale · Σ_words −log p(gold) + (λ_l/2)‖params‖²."""
  logp_LGBWJ = jax.nn.log_softmax(_scores(params_LG, xs_BWGK, sentence_BW), axis=-1)
  gold_BWJ = jax.nn.one_hot(gold_BW, logp_LGBWJ.shape[-1], dtype=bool)  # all False for padding (gold -1)
  # A one-hot select, not take_along_axis: the latter's gradient is a scatter, slow on XLA's CPU backend.
  nll_LG = -jnp.where(gold_BWJ, logp_LGBWJ, 0.0).sum((-3, -2, -1)) * scale
  squares_LG = sum(jnp.sum(jnp.square(p), axis=tuple(range(2, p.ndim))) for p in params_LG)
  return nll_LG + 0.5 * l2_L[:, None] * squares_LG


def _standardise(x_BWGK, mean_GK, std_GK):
  return (x_BWGK - mean_GK) / std_GK


@functools.partial(jax.jit, static_argnames=("epochs", "batch_rows", "learning_rate"))
def _train(params, x_BWGK, sentence_BW, gold_BW, mean_GK, std_GK, l2_L, key, *, epochs, batch_rows, learning_rate):
  num_b = x_BWGK.shape[0]
  steps = num_b // batch_rows
  opt = optax.adam(optax.cosine_decay_schedule(learning_rate, epochs * steps))
  words_per_batch = jnp.maximum((gold_BW >= 0).sum() * batch_rows / num_b, 1.0)

  def total_loss(p, xs, sentence, gold):
    return _loss_LG(p, xs, sentence, gold, l2_L, 1.0 / words_per_batch).sum()

  grad_fn = jax.grad(total_loss)

  def step(carry, idx):
    p, s = carry
    xs = _standardise(x_BWGK[idx], mean_GK, std_GK)
    updates, s = opt.update(grad_fn(p, xs, sentence_BW[idx], gold_BW[idx]), s, p)
    return (optax.apply_updates(p, updates), s), None

  def epoch(carry, k):
    order = jax.random.permutation(k, num_b)[: steps * batch_rows].reshape(steps, batch_rows)
    return jax.lax.scan(step, carry, order)[0], None

  (params, _), _ = jax.lax.scan(epoch, (params, opt.init(params)), jax.random.split(key, epochs))
  return params


@jax.jit
def _argmax_BWG(params_G, x_BWGK, sentence_BW, mean_GK, std_GK):
  """Best candidate index (0 = ROOT, 1 + column) per word and group."""
  s_GBWJ = _scores(params_G, _standardise(x_BWGK, mean_GK, std_GK), sentence_BW)
  return jnp.transpose(jnp.argmax(s_GBWJ, -1), (1, 2, 0)).astype(jnp.int32)


def _predict(params_list, x_NGK, lengths_S, mean_GK, std_GK, chunk_words: int) -> list[np.ndarray]:
  """pred_NG (0 = ROOT, 1-based) for each parameter set in params_list (each (a_GKR, b_GKR, root_GR)).

  Sentences up to PACK_WIDTH words are packed into rows of that width, longer ones into rows of the next
  power of two; rows are scored in chunks of a fixed shape (padded with empty rows) per width.
  """
  x_NGK = np.asarray(x_NGK)
  offsets_S = np.concatenate([[0], np.cumsum(lengths_S)[:-1]])
  widths_S = np.array([_width(n) for n in lengths_S])
  preds = [np.zeros(x_NGK.shape[:2], np.int32) for _ in params_list]
  for width in np.unique(widths_S):
    which_S = np.flatnonzero(widths_S == width)
    words_N = np.concatenate([np.arange(offsets_S[s], offsets_S[s] + lengths_S[s]) for s in which_S])
    packing = _pack(lengths_S[which_S], int(width))
    x_RWGK = packing.grid(x_NGK[words_N], 0.0, np.float32)
    sentence_RW = packing.grid(packing.start_N, -1, np.int32)
    rows = max(1, chunk_words // int(width))
    out = [np.zeros((packing.num_rows, int(width), x_NGK.shape[1]), np.int32) for _ in params_list]
    for r0 in range(0, packing.num_rows, rows):
      x = np.zeros((rows,) + x_RWGK.shape[1:], np.float32)
      sentence = np.full((rows, int(width)), -1, np.int32)
      n = min(rows, packing.num_rows - r0)
      x[:n], sentence[:n] = x_RWGK[r0 : r0 + n], sentence_RW[r0 : r0 + n]
      for o, params in zip(out, params_list):
        o[r0 : r0 + n] = np.asarray(_argmax_BWG(params, x, sentence, mean_GK, std_GK))[:n]
    for pred, o in zip(preds, out):
      j_NG = o[packing.row_N, packing.col_N]
      pred[words_N] = np.where(j_NG == 0, 0, j_NG - packing.start_N[:, None])
  return preds


def uas(pred_NG, heads_N) -> np.ndarray:
  """Unlabelled attachment score per group: Σ[pred = gold] / #words."""
  return (np.asarray(pred_NG) == np.asarray(heads_N)[:, None]).mean(0)


def fit_arc_probes(
  x_train_NGK,
  heads_train: Sequence[np.ndarray],
  x_dev_NGK,
  heads_dev: Sequence[np.ndarray],
  *,
  rank: int | None = None,
  l2_grid: Sequence[float] = DEFAULT_ARC_L2_GRID,
  seed: int = 0,
  epochs: int = 10,
  batch_words: int = 512,
  learning_rate: float = 1e-2,
  chunk_words: int = 8192,
) -> FittedArcProbes:
  """Fits the bilinear arc probe for every group and l2 value; keeps the best l2 per group on dev.

  x_*_NGK: word features (sentences in order); heads_*: one array per sentence of gold heads (0 = ROOT,
  1-based). Minibatches are `batch_words // width` packed rows. rank defaults to K (full bilinear form).
  Deterministic given seed.
  """
  x_train_NGK, x_dev_NGK = np.asarray(x_train_NGK), np.asarray(x_dev_NGK)
  lengths_S, heads_N = _lengths_and_heads(heads_train, x_train_NGK, "train")
  lengths_dev_S, heads_dev_N = _lengths_and_heads(heads_dev, x_dev_NGK, "dev")
  if x_dev_NGK.shape[1:] != x_train_NGK.shape[1:]:
    raise UserError(f"arc probe: train and dev features differ in G, K: {x_train_NGK.shape}, {x_dev_NGK.shape}")
  _, num_g, k = x_train_NGK.shape
  rank = k if rank is None else rank
  words = np.asarray(x_train_NGK, np.float64)
  mean, std = words.mean(0), words.std(0)
  std = np.where(std > 1e-6 * max(std.max(), 1e-30), std, 1.0)
  packing = _pack(lengths_S, _width(int(lengths_S.max())))
  batch_rows = min(max(1, batch_words // packing.width), packing.num_rows)
  l2_L = np.asarray(sorted(l2_grid), np.float32)
  num_l = len(l2_L)
  k_a, k_b, _, k_train = jax.random.split(jax.random.PRNGKey(seed), 4)
  init = lambda key, shape: jax.random.normal(key, shape) / np.sqrt(shape[-2])
  params = (
    jnp.broadcast_to(init(k_a, (num_g, k, rank)), (num_l, num_g, k, rank)),
    jnp.broadcast_to(init(k_b, (num_g, k, rank)), (num_l, num_g, k, rank)),
    jnp.zeros((num_l, num_g, rank)),
  )
  mean_j, std_j = jnp.asarray(mean, jnp.float32), jnp.asarray(std, jnp.float32)
  params = _train(
    params,
    packing.grid(x_train_NGK, 0.0, np.float32),
    packing.grid(packing.start_N, -1, np.int32),
    packing.grid(_candidates_N(packing, heads_N), -1, np.int32),
    mean_j,
    std_j,
    jnp.asarray(l2_L),
    k_train,
    epochs=epochs,
    batch_rows=batch_rows,
    learning_rate=learning_rate,
  )
  preds_L = _predict(
    [tuple(p[l] for p in params) for l in range(num_l)], x_dev_NGK, lengths_dev_S, mean_j, std_j, chunk_words
  )
  dev_uas_GL = np.stack([uas(p, heads_dev_N) for p in preds_L], axis=1)
  best_G = num_l - 1 - np.argmax(dev_uas_GL[:, ::-1], axis=1)
  pick = lambda p: np.asarray(p)[best_G, np.arange(num_g)]
  return FittedArcProbes(
    mean.astype(np.float32),
    std.astype(np.float32),
    pick(params[0]),
    pick(params[1]),
    pick(params[2]),
    l2_L[best_G],
    dev_uas_GL,
    dev_uas_GL[np.arange(num_g), best_G],
    tuple(float(v) for v in l2_L),
  )


def predict_heads(fitted: FittedArcProbes, x_NGK, lengths_S, *, chunk_words: int = 8192) -> np.ndarray:
  """Predicted head pred_NG (0 = ROOT, 1-based within its sentence) per word and group."""
  lengths_S = np.asarray(lengths_S, np.int64)
  if np.asarray(x_NGK).shape[0] != lengths_S.sum():
    raise UserError(f"arc probe: {np.asarray(x_NGK).shape[0]} word features for sentences of {lengths_S.sum()} words")
  params = (jnp.asarray(fitted.a_GKR), jnp.asarray(fitted.b_GKR), jnp.asarray(fitted.root_GR))
  return _predict([params], x_NGK, lengths_S, jnp.asarray(fitted.mean_GK), jnp.asarray(fitted.std_GK), chunk_words)[0]
