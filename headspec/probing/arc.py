"""Dependency-arc probe: which word is each word's syntactic head, from one feature group at a time.

For word i of a sentence with words 1..n and candidate heads j ∈ {ROOT, 1..n} (j = i included, so
control tasks that attach a word to itself are expressible):

  s_ij = (A x̂_i) · (B x̂_j),   s_i,ROOT = (A x̂_i) · u,    p(head_i = j) = softmax_j s_ij

with A, B ∈ R^{r×K} (a rank-r bilinear form x̂_iᵀ Aᵀ B x̂_j) and a learned root vector u. x̂ is the
standardised feature (train mean/std). This is a bilinear HEAD-SELECTION probe: Dozat & Manning
2017's biaffine arc scorer without its MLPs and bias terms, as used for the dependency-edge probe of
Hewitt & Liang 2019 (§3.2). It is NOT Hewitt & Manning 2019's structural probe (which fits squared
distances ‖B(h_i − h_j)‖² to tree distances and decodes a minimum spanning tree). The rank r is the
same for every group (DEFAULT_ARC_RANK = 32: the head width of MiniLM; a full-rank form on a 384-wide
residual stream has 2·384² parameters and memorises training sentences). No relative-position
features are given: the probe sees only the two words' vectors.
Trained with cross-entropy on the gold head + (λ/2)(‖A‖² + ‖B‖² + ‖u‖²), minibatch Adam with early
stopping on dev loss; λ picked per group on dev UAS from a grid (all grid values and all groups are
trained together, batched over both).
Metric: UAS = fraction of words whose gold head gets the highest score (Clark et al. 2019 probe heads
the same way, with attention weights instead of a learned score).

Layout: inputs are word-level (x_NGK and one head array per sentence). Sentences are packed side by
side into rows of `width` words (first-fit decreasing, headspec/words/packing.py) and a word's candidates are masked
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
from headspec.model import draws
from headspec.words import packing as packing_lib

DEFAULT_ARC_L2_GRID = (1e-4, 1e-3, 1e-2)
# Adam's step: at 1e-2 dev loss bottomed out after 1-2 epochs and dev UAS stayed low (all-MiniLM-L6-v2
# layer 3, 40k EWT words: 0.476 at 1e-2, 0.626 at 1e-3; docs/probing.md "Why the arc probe read attachment poorly").
DEFAULT_ARC_LEARNING_RATE = 1e-3
DEFAULT_ARC_RANK = 32  # the rank of A, B for every group (heads and residual streams alike), capped at K
PACK_WIDTH = 64  # words per packed row; longer sentences get a row of their own (next power of two)
# Words per chunk when scoring (dev loss every epoch, predictions): the (l2, group, row, word, candidate)
# scores of a chunk stay small enough for the CPU's caches (timings: docs/probing_core.md, "Measurements
# behind the constants").
CHUNK_WORDS = 512


@dataclasses.dataclass(frozen=True)
class FittedArcProbes:
  """Per group: a_GKI, b_GKI, root_GI (chosen l2), standardisation, l2 and dev UAS per grid value."""

  mean_GK: np.ndarray
  std_GK: np.ndarray
  a_GKI: np.ndarray
  b_GKI: np.ndarray
  root_GI: np.ndarray
  l2_G: np.ndarray
  dev_uas_GP: np.ndarray
  dev_uas_G: np.ndarray
  l2_grid: tuple
  train_uas_G: np.ndarray | None = None  # UAS of the chosen probe on its own training words (memorisation check)
  dev_loss_G: np.ndarray | None = None  # its dev cross-entropy (nats per scored word) at the kept epoch
  best_epoch_G: np.ndarray | None = None  # the epoch whose parameters were kept (lowest dev loss)
  epochs_run: int = 0
  rank: int = 0


def _lengths_and_heads(heads: Sequence[np.ndarray], x_NGK, what: str) -> tuple[np.ndarray, np.ndarray]:
  """(lengths_U, heads_N) of per-sentence gold heads (1-based, 0 = ROOT), checked against x_NGK."""
  lengths_U = np.array([len(h) for h in heads], np.int64)
  heads_N = np.concatenate([np.asarray(h, np.int64) for h in heads]) if len(heads) else np.zeros(0, np.int64)
  if x_NGK.ndim != 3 or x_NGK.shape[0] != len(heads_N) or not len(heads_N) or (lengths_U < 1).any():
    raise UserError(
      f"arc probe {what}: need x_NGK with one row per word of the non-empty sentences; got "
      f"{x_NGK.shape} for {len(heads)} sentences of {len(heads_N)} words"
    )
  if (heads_N < -1).any() or (heads_N > np.repeat(lengths_U, lengths_U)).any():
    raise UserError(
      f"arc probe {what}: a head index is outside its sentence (heads are 1-based, 0 = ROOT, -1 = ignored)"
    )
  return lengths_U, heads_N


def _candidates_N(packing: packing_lib.Packing, heads_N) -> np.ndarray:
  """Gold candidate index in a packed row: 0 = ROOT, 1 + column of the head word otherwise."""
  return np.where(heads_N == 0, 0, packing.start_N + heads_N)


def _scores(params, xs_BWGK, sentence_BW):
  """s_...GBWJ over candidates j = 0 (ROOT), 1..W (the row's words) for every group (and any leading axes
  of the params, e.g. the l2 grid); a word's candidates are ROOT and the words of its own sentence
  (sentence_BW: first column of each word's sentence, -1 = empty). Written as einsums over all groups at
  once rather than vmapped per group: XLA's CPU backend runs the batched form about 1.5x faster.

  Where the rank is not below K (every head group: K ≤ 32), the form is merged into one K × K map first,
  M = a_GKI b_GKIᵀ (AᵀB in the module's notation): s_ij = (x̂_i M) · x̂_j and s_i,ROOT = x̂_i · (Aᵀu). The
  same model and gradients (A, B, u stay the parameters), one K × K map per word instead of two K × r,
  and the second factor is the features themselves, shared by every λ. An arc training step of 12 heads
  × 3 λ (K = r = 32, 512 words) took 5.6 ms against 9.9 for the factored form (docs/probing_core.md)."""
  a_GKI, b_GKI, root_GI = params
  if a_GKI.shape[-1] >= a_GKI.shape[-2]:
    m_GKK = jnp.einsum("...gkr,...gjr->...gkj", a_GKI, b_GKI)
    q_GBWK = jnp.einsum("bwgk,...gkj->...gbwj", xs_BWGK, m_GKK)
    s_GBWW = jnp.einsum("...gbik,bjgk->...gbij", q_GBWK, xs_BWGK)
    s_root_GBW = jnp.einsum("bwgk,...gk->...gbw", xs_BWGK, jnp.einsum("...gkr,...gr->...gk", a_GKI, root_GI))
  else:
    q_GBWI = jnp.einsum("bwgk,...gkr->...gbwr", xs_BWGK, a_GKI)
    k_GBWI = jnp.einsum("bwgk,...gkr->...gbwr", xs_BWGK, b_GKI)
    s_GBWW = jnp.einsum("...bir,...bjr->...bij", q_GBWI, k_GBWI)
    s_root_GBW = jnp.einsum("...gbwr,...gr->...gbw", q_GBWI, root_GI)
  s_GBWJ = jnp.concatenate([s_root_GBW[..., None], s_GBWW], axis=-1)
  same_BWW = (sentence_BW[:, :, None] == sentence_BW[:, None, :]) & (sentence_BW[:, None, :] >= 0)
  cand_BWJ = jnp.concatenate([jnp.ones_like(same_BWW[..., :1]), same_BWW], axis=-1)
  return jnp.where(cand_BWJ, s_GBWJ, -jnp.inf)


def _loss_PG(params_PG, xs_BWGK, sentence_BW, gold_BW, l2_P, scale):
  """Penalised cross-entropy per (l2 value, group): scale · Σ_words −log p(gold) + (λ_l/2)‖params‖²."""
  logp_PGBWJ = jax.nn.log_softmax(_scores(params_PG, xs_BWGK, sentence_BW), axis=-1)
  gold_BWJ = jax.nn.one_hot(gold_BW, logp_PGBWJ.shape[-1], dtype=bool)  # all False for padding (gold -1)
  # A one-hot select, not take_along_axis: the latter's gradient is a scatter, slow on XLA's CPU backend.
  nll_PG = -jnp.where(gold_BWJ, logp_PGBWJ, 0.0).sum((-3, -2, -1)) * scale
  squares_PG = sum(jnp.sum(jnp.square(p), axis=tuple(range(2, p.ndim))) for p in params_PG)
  return nll_PG + 0.5 * l2_P[:, None] * squares_PG


def _standardise(x_BWGK, mean_GK, std_GK):
  return (x_BWGK - mean_GK) / std_GK


@functools.partial(jax.jit, static_argnames=("batch_rows", "learning_rate"))
def _epoch(params, opt_state, x_BWGK, sentence_BW, gold_BW, mean_GK, std_GK, l2_P, key, *, batch_rows, learning_rate):
  """One pass of minibatch Adam over the packed rows of one width (shuffled), all l2 values and groups."""
  opt = optax.adam(learning_rate)
  num_b = x_BWGK.shape[0]
  steps = max(num_b // batch_rows, 1)
  words_per_batch = jnp.maximum((gold_BW >= 0).sum() * batch_rows / num_b, 1.0)

  def total_loss(p, xs, sentence, gold):
    return _loss_PG(p, xs, sentence, gold, l2_P, 1.0 / words_per_batch).sum()

  grad_fn = jax.grad(total_loss)

  def step(carry, idx):
    p, s = carry
    xs = _standardise(x_BWGK[idx], mean_GK, std_GK)
    updates, s = opt.update(grad_fn(p, xs, sentence_BW[idx], gold_BW[idx]), s, p)
    return (optax.apply_updates(p, updates), s), None

  order = jax.random.permutation(key, num_b)[: steps * batch_rows].reshape(steps, batch_rows)
  return jax.lax.scan(step, (params, opt_state), order)[0]


@jax.jit
def _nll_PG(params_PG, x_BWGK, sentence_BW, gold_BW, mean_GK, std_GK):
  """Σ −log p(gold head) over the scored words of some packed rows, per (l2 value, group)."""
  logp = jax.nn.log_softmax(_scores(params_PG, _standardise(x_BWGK, mean_GK, std_GK), sentence_BW), axis=-1)
  gold_BWJ = jax.nn.one_hot(gold_BW, logp.shape[-1], dtype=bool)
  return -jnp.where(gold_BWJ, logp, 0.0).sum((-3, -2, -1))


def _buckets(lengths_U, heads_N):
  """Sentences grouped by packed-row width (64, 128, ...): [(sentence ids, word ids, packing, gold grid)]."""
  out = []
  for which_U, words_N, packing in packing_lib.by_width(lengths_U, PACK_WIDTH):
    gold = packing.grid(np.where(heads_N[words_N] < 0, -1, _candidates_N(packing, heads_N[words_N])), -1, np.int32)
    out.append((which_U, words_N, packing, gold))
  return out


def _in_chunks(a, rows, fill):
  """a (R, ...) as (chunks, rows, ...), the last chunk padded with `fill`."""
  pad = -a.shape[0] % rows
  return np.concatenate([a, np.full((pad,) + a.shape[1:], fill, a.dtype)]).reshape(-1, rows, *a.shape[1:])


def _dev_chunks(buckets, x_NGK, chunk_words):
  """A split's packed rows per bucket, cut into chunks of about chunk_words words (the last padded with
  empty rows), put on the device once: [(x_CBWGK, sentence_CBW, gold_CBW)], and the scored words."""
  out, words = [], 0
  for _, words_N, packing, gold in buckets:
    rows = max(1, chunk_words // packing.width)
    x = _in_chunks(packing.grid(x_NGK[words_N], 0.0, np.float32), rows, 0.0)
    sentence = _in_chunks(packing.grid(packing.start_N, -1, np.int32), rows, -1)
    out.append(jax.device_put((x, sentence, _in_chunks(gold, rows, -1))))
    words += int((gold >= 0).sum())
  return out, words


@jax.jit
def _nll_sum_PG(params_PG, x_CBWGK, sentence_CBW, gold_CBW, mean_GK, std_GK):
  """Σ −log p(gold head) per (l2 value, group) over chunks of packed rows, one compiled loop."""

  def add(total, chunk):
    return total + _nll_PG(params_PG, *chunk, mean_GK, std_GK), None

  zero = jnp.zeros(params_PG[2].shape[:2], jnp.float32)
  return jax.lax.scan(add, zero, (x_CBWGK, sentence_CBW, gold_CBW))[0]


def _dev_nll(params, chunks, words, mean_GK, std_GK):
  """Mean −log p(gold head) per (l2 value, group) over the scored words of a split: one read."""
  total = sum(_nll_sum_PG(params, *c, mean_GK, std_GK) for c in chunks)
  return np.asarray(total, np.float64) / max(words, 1)


@jax.jit
def _argmax_BWG(params_G, x_BWGK, sentence_BW, mean_GK, std_GK):
  """Best candidate index (0 = ROOT, 1 + column) per word and group."""
  s_GBWJ = _scores(params_G, _standardise(x_BWGK, mean_GK, std_GK), sentence_BW)
  return jnp.transpose(jnp.argmax(s_GBWJ, -1), (1, 2, 0)).astype(jnp.int32)


def _predict(params_list, x_NGK, lengths_U, mean_GK, std_GK, chunk_words: int) -> list[np.ndarray]:
  """pred_NG (0 = ROOT, 1-based) for each parameter set in params_list (each (a_GKI, b_GKI, root_GI)).

  Sentences up to PACK_WIDTH words are packed into rows of that width, longer ones into rows of the next
  power of two; rows are scored in chunks of a fixed shape (padded with empty rows) per width.
  """
  x_NGK = np.asarray(x_NGK)
  preds = [np.zeros(x_NGK.shape[:2], np.int32) for _ in params_list]
  for _, words_N, packing in packing_lib.by_width(lengths_U, PACK_WIDTH):
    width = packing.width
    x_BWGK = packing.grid(x_NGK[words_N], 0.0, np.float32)
    sentence_BW = packing.grid(packing.start_N, -1, np.int32)
    rows = max(1, chunk_words // int(width))
    out = [np.zeros((packing.num_rows, int(width), x_NGK.shape[1]), np.int32) for _ in params_list]
    for r0 in range(0, packing.num_rows, rows):
      x = np.zeros((rows,) + x_BWGK.shape[1:], np.float32)
      sentence = np.full((rows, int(width)), -1, np.int32)
      n = min(rows, packing.num_rows - r0)
      x[:n], sentence[:n] = x_BWGK[r0 : r0 + n], sentence_BW[r0 : r0 + n]
      for o, params in zip(out, params_list):
        o[r0 : r0 + n] = np.asarray(_argmax_BWG(params, x, sentence, mean_GK, std_GK))[:n]
    for pred, o in zip(preds, out):
      j_NG = o[packing.row_N, packing.col_N]
      pred[words_N] = np.where(j_NG == 0, 0, j_NG - packing.start_N[:, None])
  return preds


def uas(pred_NG, heads_N) -> np.ndarray:
  """Unlabelled attachment score per group: Σ[pred = gold] / #scored words (gold −1 = not scored)."""
  heads_N = np.asarray(heads_N)
  scored = heads_N >= 0
  return (np.asarray(pred_NG)[scored] == heads_N[scored][:, None]).mean(0)


def _train_rows(x_NGK, lengths_U, heads_N):
  """The training split's packed rows per width, on the device once (every epoch reads them):
  [(x_BWGK, sentence_BW, gold_BW, packing)]."""
  return [
    jax.device_put((packing.grid(x_NGK[words_N], 0.0, np.float32), packing.grid(packing.start_N, -1, np.int32), gold))
    + (packing,)
    for _, words_N, packing, gold in _buckets(lengths_U, heads_N)
  ]


def _train_with_early_stopping(params, train_rows, dev, stats, key, *, epochs, patience, batch_words, learning_rate):
  """Minibatch Adam, one compiled epoch per row width, with Hewitt & Liang's early stopping: after every
  epoch the dev loss of every (l2, group) probe (one read), its parameters with the lowest loss kept;
  stop after `patience` epochs with no improvement. Returns (best params, their dev loss, their epoch,
  epochs run)."""
  mean_j, std_j, l2_j = stats
  opt_state = optax.adam(learning_rate).init(params)
  num_l, num_g = params[2].shape[:2]
  best = jax.device_get(params)
  best_loss = np.full((num_l, num_g), np.inf)
  best_epoch = np.zeros((num_l, num_g), np.int32)
  since, epoch = 0, 0
  for epoch, epoch_key in enumerate(jax.random.split(key, max(epochs, 1)), start=1):
    for b, (x_BWGK, sentence_BW, gold_BW, packing) in enumerate(train_rows):
      batch_rows = min(max(1, batch_words // packing.width), packing.num_rows)
      params, opt_state = _epoch(
        params,
        opt_state,
        x_BWGK,
        sentence_BW,
        gold_BW,
        mean_j,
        std_j,
        l2_j,
        jax.random.fold_in(epoch_key, b),
        batch_rows=batch_rows,
        learning_rate=learning_rate,
      )
    loss = _dev_nll(params, *dev, mean_j, std_j)
    better = loss < best_loss - 1e-4
    if better.any():
      host = jax.device_get(params)
      best = tuple(np.where(better.reshape(better.shape + (1,) * (h.ndim - 2)), h, o) for h, o in zip(host, best))
      best_loss = np.where(better, loss, best_loss)
      best_epoch = np.where(better, epoch, best_epoch)
      since = 0
    else:
      since += 1
      if since >= patience:
        break
  return best, best_loss, best_epoch, epoch


def fit_arc_probes(
  x_train_NGK,
  heads_train: Sequence[np.ndarray],
  x_dev_NGK,
  heads_dev: Sequence[np.ndarray],
  *,
  rank: int | None = DEFAULT_ARC_RANK,
  l2_grid: Sequence[float] = DEFAULT_ARC_L2_GRID,
  seed: int = 0,
  epochs: int = 10,
  batch_words: int = 512,
  learning_rate: float = DEFAULT_ARC_LEARNING_RATE,
  chunk_words: int = CHUNK_WORDS,
  patience: int = 2,
  train_uas: bool = True,
  l2_G=None,
) -> FittedArcProbes:
  """Fits the bilinear arc probe for every group and l2 value; keeps the best l2 per group on dev.

  x_*_NGK: word features (sentences in order); heads_*: one array per sentence of gold heads (0 = ROOT,
  1-based; -1 = a word neither trained on nor scored, e.g. punctuation). Every training sentence is
  used (rows of 64 words, longer sentences in rows of the next power of two). rank: the rank r of
  A, B (the same for every group, capped at K; None = K, the full bilinear form). Early stopping as in
  Hewitt & Liang's control-tasks code: after every epoch the dev loss of every (l2, group) probe is
  measured and its parameters with the lowest dev loss are kept; training stops after `patience`
  epochs in which no probe improved, or after `epochs`. Then the l2 with the best dev UAS is kept per
  group (or, with l2_G, each group's given λ of the grid: Hewitt & Liang 2019's control fitted at its task's
  λ). Minibatches are `batch_words // width` packed rows. Deterministic given seed.
  """
  x_train_NGK, x_dev_NGK = np.asarray(x_train_NGK, np.float32), np.asarray(x_dev_NGK, np.float32)
  lengths_U, heads_N = _lengths_and_heads(heads_train, x_train_NGK, "train")
  lengths_dev_U, heads_dev_N = _lengths_and_heads(heads_dev, x_dev_NGK, "dev")
  if x_dev_NGK.shape[1:] != x_train_NGK.shape[1:]:
    raise UserError(f"arc probe: train and dev features differ in G, K: {x_train_NGK.shape}, {x_dev_NGK.shape}")
  _, num_g, k = x_train_NGK.shape
  rank = k if rank is None else min(int(rank), k)
  from headspec.probing.probe_start import floored_std  # the one standardisation of every probe

  words = np.asarray(x_train_NGK, np.float64)
  mean = words.mean(0)
  std = floored_std(mean, words.std(0))
  words = None
  l2_P = np.asarray(sorted(l2_grid), np.float32)
  num_l = len(l2_P)
  if l2_G is not None and (np.shape(l2_G) != (num_g,) or not np.isin(np.float32(l2_G), l2_P).all()):
    raise UserError(f"arc probe: l2_G {np.asarray(l2_G).tolist()} must give each of {num_g} groups a λ of {l2_P}")
  k_a, k_b, _, k_train = jax.random.split(jax.random.PRNGKey(seed), 4)
  init = lambda key, shape: draws.normal(key, shape) / np.sqrt(shape[-2])  # one program per size bucket
  params = (
    jnp.broadcast_to(init(k_a, (num_g, k, rank)), (num_l, num_g, k, rank)),
    jnp.broadcast_to(init(k_b, (num_g, k, rank)), (num_l, num_g, k, rank)),
    jnp.zeros((num_l, num_g, rank)),
  )
  mean_j, std_j, l2_j = jax.device_put((mean.astype(np.float32), std.astype(np.float32), l2_P))
  train_rows = _train_rows(x_train_NGK, lengths_U, heads_N)
  dev_chunks, dev_words = _dev_chunks(_buckets(lengths_dev_U, heads_dev_N), x_dev_NGK, chunk_words)
  best, best_loss, best_epoch, epoch = _train_with_early_stopping(
    params,
    train_rows,
    (dev_chunks, dev_words),
    (mean_j, std_j, l2_j),
    k_train,
    epochs=epochs,
    patience=patience,
    batch_words=batch_words,
    learning_rate=learning_rate,
  )
  preds_P = _predict(
    [tuple(jnp.asarray(p[l]) for p in best) for l in range(num_l)], x_dev_NGK, lengths_dev_U, mean_j, std_j, chunk_words
  )
  dev_uas_GP = np.stack([uas(p, heads_dev_N) for p in preds_P], axis=1)
  best_G = num_l - 1 - np.argmax(dev_uas_GP[:, ::-1], axis=1)
  if l2_G is not None:
    best_G = np.searchsorted(l2_P, np.float32(l2_G))
  pick = lambda p: np.asarray(p)[best_G, np.arange(num_g)]
  chosen = tuple(pick(p) for p in best)
  train_uas_G = np.full(num_g, np.nan)
  if train_uas:
    pred = _predict([tuple(jnp.asarray(p) for p in chosen)], x_train_NGK, lengths_U, mean_j, std_j, chunk_words)[0]
    train_uas_G = uas(pred, heads_N)
  return FittedArcProbes(
    mean.astype(np.float32),
    std.astype(np.float32),
    chosen[0],
    chosen[1],
    chosen[2],
    l2_P[best_G],
    dev_uas_GP,
    dev_uas_GP[np.arange(num_g), best_G],
    tuple(float(v) for v in l2_P),
    train_uas_G,
    best_loss[best_G, np.arange(num_g)],
    best_epoch[best_G, np.arange(num_g)],
    epoch,
    rank,
  )


def predict_heads(fitted: FittedArcProbes, x_NGK, lengths_U, *, chunk_words: int = CHUNK_WORDS) -> np.ndarray:
  """Predicted head pred_NG (0 = ROOT, 1-based within its sentence) per word and group."""
  lengths_U = np.asarray(lengths_U, np.int64)
  if np.asarray(x_NGK).shape[0] != lengths_U.sum():
    raise UserError(f"arc probe: {np.asarray(x_NGK).shape[0]} word features for sentences of {lengths_U.sum()} words")
  params = (jnp.asarray(fitted.a_GKI), jnp.asarray(fitted.b_GKI), jnp.asarray(fitted.root_GI))
  return _predict([params], x_NGK, lengths_U, jnp.asarray(fitted.mean_GK), jnp.asarray(fitted.std_GK), chunk_words)[0]
