"""Hewitt & Manning's structural probes: tree distance and tree depth as squared lengths under a linear map.

Hewitt & Manning 2019 ("A Structural Probe for Finding Syntax in Word Representations"; reference code
john-hewitt/structural-probes). For the words h_1..h_n of a sentence and a rank-r map B ∈ R^{r×K}:

  distance probe  d̂(i, j) = ‖B(x̂_i − x̂_j)‖²  fitted to the tree distance d(i, j) (edges on the path)
  depth probe     ‖ŵ_i‖ = ‖B x̂_i‖²           fitted to the depth of word i (edges from the root word)

x̂ = x, the raw feature, as H&M's probe reads it (`scale='std'` divides it by its train standard deviation:
B absorbs that, so the family is the same, but Adam's path is not; docs/probing.md gives the measured
difference). It is not centred: ‖B(x − μ)‖² is a different family from ‖Bx‖² for depths.

Training as the reference code's regimen.py (john-hewitt/structural-probes; each difference named):
  - L1 loss, per sentence normalised by n² (distance) or n (depth), averaged over the sentences of a batch;
  - Adam (lr 1e-3), B initialised uniform in ±0.05;
  - every epoch the train sentences in a new order (a permutation from the seed, folded with the epoch:
    DataLoader(shuffle=True)), cut into batches of consecutive sentences, at most `batch_sentences` (20,
    H&M's batch_size); here a batch's sentences lie side by side in rows of 64 words (headspec/words/packing.py's
    widths: a longer sentence joins the open batch of its wider rows), at most `batch_words` slots, so a
    batch of long sentences closes with fewer than 20;
  - after each epoch the dev loss; torch's ReduceLROnPlateau(mode 'min', factor 0.1, patience 0, threshold
    1e-4 relative, eps 1e-8) stepped on the SUMMED dev loss (Σ over sentences, regimen.py's epoch_dev_loss);
    the parameters kept when the MEAN dev loss improves by 1e-4 (absolute), and training stopped after
    `patience` (5) epochs without such an improvement, at most `epochs` (40).
Every feature group (each head's Z_h, each layer's residual stream) is fitted at once, each with its own map,
learning-rate schedule and stopping point: a group that has stopped is frozen (its steps scaled by 0) while
the others train on, as if each were trained alone.

Metrics (the reference code's reporter.py), each per group:
  UUAS      the minimum spanning tree of the predicted distances against the gold tree, both over the
            non-punctuation words, undirected edges: Σ shared edges / Σ gold edges. Punctuation
            (`punctuation`, probe.structural_punctuation): 'upos', UD's UPOS PUNCT (the default), or 'ptb',
            H&M's seven PTB XPOS tags '' , . : `` -LRB- -RRB- (reporter.py, prims_matrix_to_edges and
            get_nopunct_argmin), which keep e.g. EWT's HYPH, NFP and $ that UPOS calls PUNCT or SYM
  DSpr.     Spearman ρ between word i's predicted and gold distances to every word of its sentence,
            averaged over the words of each sentence length, then over the lengths 5–50
  root acc  the least deep non-punctuation word is the gold root: fraction of sentences
  NSpr.     Spearman ρ between predicted and gold depths of a sentence's words, averaged within lengths
            5–50, then over lengths
Linear-structure baseline (H&M §4.1 "LINEAR"): distances |i − j| and depths i (the first word as root).

Layout: sentences packed side by side into rows of `width` words (headspec/words/packing.py) as the arc probe
(arc.py) does; a word's pairs are masked to its own sentence.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import scipy.stats

from headspec.errors import UserError
from headspec.model import draws
from headspec.words import packing as packing_lib
from headspec.words import resampling

KINDS = ("distance", "depth")
DEFAULT_RANK = 64  # H&M find UUAS flat above rank ~64 on BERT-base; capped at K (a head's Z_h is d_head wide)
PACK_WIDTH = 64
SPEARMAN_LENGTHS = (5, 50)  # DSpr. and NSpr. average sentences of these lengths (inclusive), as H&M
# Hewitt & Manning's punctuation, the XPOS (PTB) tags their reporter.py leaves out of UUAS and root accuracy
PTB_PUNCTUATION_TAGS = ("''", ",", ".", ":", "``", "-LRB-", "-RRB-")
PUNCTUATION = ("upos", "ptb")  # probe.structural_punctuation: UPOS PUNCT | PTB_PUNCTUATION_TAGS on XPOS


def punctuation(upos: Sequence[str], xpos: Sequence[str], rule: str = "upos") -> np.ndarray:
  """The punctuation flags of a sentence's words (left out of UUAS and root accuracy; DSpr. and NSpr. keep
  every word, as H&M's reporter.py): 'upos', UPOS PUNCT; 'ptb', XPOS in PTB_PUNCTUATION_TAGS (H&M)."""
  if rule == "upos":
    return np.asarray([u == "PUNCT" for u in upos], bool)
  if rule == "ptb":
    return np.asarray([x in PTB_PUNCTUATION_TAGS for x in xpos], bool)
  raise UserError(f"structural probe: punctuation must be one of {PUNCTUATION}, got {rule!r}")


@dataclasses.dataclass(frozen=True)
class Tree:
  """One sentence's gold tree: heads_n (1-based, 0 = ROOT) and punct_n (`punctuation`'s flags, left out of
  UUAS and root accuracy)."""

  heads: np.ndarray
  punct: np.ndarray

  def __post_init__(self):
    heads = np.asarray(self.heads)
    n = len(heads)
    if n < 1 or (heads < 0).any() or (heads > n).any() or (heads == np.arange(1, n + 1)).any():
      raise UserError(f"structural probe: heads {heads.tolist()} are not a tree (1-based, 0 = ROOT)")
    if (heads == 0).sum() != 1:
      raise UserError(f"structural probe: heads {heads.tolist()} need exactly one root (head 0)")
    if len(self.punct) != n:
      raise UserError(f"structural probe: {len(self.punct)} punctuation flags for {n} words")

  def distances(self) -> np.ndarray:
    """d_NN: edges on the path between every two words, computed once per tree: a split's trees are fitted
    and scored against for every feature source of every model."""
    return self._distances

  def depths(self) -> np.ndarray:
    """depth_N: edges from the root word."""
    return self._distances[int(np.flatnonzero(np.asarray(self.heads) == 0)[0])]

  @functools.cached_property
  def _distances(self) -> np.ndarray:
    """d(i, j) = depth(i) + depth(j) − 2·depth(lca(i, j)), from the matrix of each word's ancestors.

    By hand: scipy.sparse.csgraph.shortest_path gives the same matrix, but building its sparse graph costs
    ~0.5 ms a sentence, 10 s of a quickstart probe command; in a tree the path runs through the lowest
    common ancestor, and the shared ancestors of two words are one matrix product."""
    parent = np.asarray(self.heads, np.int64) - 1  # the root's is −1
    n = len(parent)
    ancestor_NN = np.zeros((n, n), np.int32)  # [i, j] = 1: word j is on the path from word i to the root
    word, rows = np.arange(n), np.arange(n)
    for _ in range(n):
      ancestor_NN[rows, word] = 1
      up = parent[word]
      rows, word = rows[up >= 0], up[up >= 0]
      if not len(rows):
        break
    if len(rows):  # a cycle: some word never reaches the root
      raise UserError(f"structural probe: heads {np.asarray(self.heads).tolist()} do not connect every word")
    depth_N = ancestor_NN.sum(1) - 1
    shared_NN = ancestor_NN @ ancestor_NN.T  # = depth(lca) + 1
    d = (depth_N[:, None] + depth_N[None, :] - 2 * (shared_NN - 1)).astype(np.float32)
    d.flags.writeable = False  # shared by every caller
    return d


@dataclasses.dataclass(frozen=True)
class FittedStructural:
  """Per group: b_GKR (the kept map), the scaling (mean_GK is zero: features are not centred; std_GK is 1 for
  raw features), dev loss at the kept epoch and that epoch, whether the group stopped (`patience` epochs
  without a better dev loss) before the epochs ran out, the epoch it stopped at (or the last), the mean dev
  loss of every epoch (dev_loss_EG, nan once the group has stopped) and its final learning rate."""

  kind: str
  mean_GK: np.ndarray
  std_GK: np.ndarray
  b_GKR: np.ndarray
  dev_loss_G: np.ndarray
  best_epoch_G: np.ndarray
  converged_G: np.ndarray
  epochs_run: int
  rank: int
  stopped_epoch_G: np.ndarray | None = None
  dev_loss_EG: np.ndarray | None = None
  lr_G: np.ndarray | None = None
  scale: str = "raw"


def _predict_GBW(b_GKR, x_BWGK, kind: str):
  """Predicted squared distances s_GBWW (distance) or squared norms s_GBW (depth)."""
  t_GBWR = jnp.einsum("bwgk,gkr->gbwr", x_BWGK, b_GKR)
  if kind == "depth":
    return jnp.sum(jnp.square(t_GBWR), -1)
  sq_GBW = jnp.sum(jnp.square(t_GBWR), -1)
  gram_GBWW = jnp.einsum("gbir,gbjr->gbij", t_GBWR, t_GBWR)
  return jnp.maximum(sq_GBW[..., :, None] + sq_GBW[..., None, :] - 2.0 * gram_GBWW, 0.0)


def _l1_G(b_GKR, x_BWGK, gold, weight, kind: str):
  """Σ weight · |prediction − gold| per group (weight: 1/n² per pair or 1/n per word, 0 off-sentence)."""
  return jnp.sum(weight * jnp.abs(_predict_GBW(b_GKR, x_BWGK, kind) - gold), axis=tuple(range(1, gold.ndim + 1)))


@dataclasses.dataclass(frozen=True)
class _TrainWords:
  """The train split as flat per-word tables, so an epoch's batches are gathered on the device from word
  ids alone (the order of sentences changes every epoch): sentence_N, position_N (within its sentence),
  length_N (its sentence's), and the gold: for distance each sentence's d_nn flattened into gold_P with
  row_offset_N[i] = its sentence's offset + position_i · n (so d(i, j) = gold_P[row_offset_N[i] +
  position_N[j]]), for depth gold_P = depth_N (row_offset_N = the word's own index)."""

  sentence_N: np.ndarray
  position_N: np.ndarray
  length_N: np.ndarray
  row_offset_N: np.ndarray
  gold_P: np.ndarray

  @classmethod
  def make(cls, trees: Sequence[Tree], kind: str) -> _TrainWords:
    lengths_U = np.array([len(t.heads) for t in trees], np.int64)
    sentence_N = np.repeat(np.arange(len(trees)), lengths_U)
    first_U = np.concatenate([[0], np.cumsum(lengths_U)[:-1]])
    position_N = np.arange(len(sentence_N)) - first_U[sentence_N]
    length_N = lengths_U[sentence_N]
    if kind == "distance":
      gold_P = np.concatenate([t.distances().ravel() for t in trees]).astype(np.float32)
      square_U = np.concatenate([[0], np.cumsum(lengths_U**2)[:-1]])
      row_offset_N = square_U[sentence_N] + position_N * length_N
    else:
      gold_P = np.concatenate([t.depths() for t in trees]).astype(np.float32)
      row_offset_N = np.arange(len(sentence_N))
    i32 = lambda a: np.asarray(a, np.int32)
    return cls(i32(sentence_N), i32(position_N), i32(length_N), i32(row_offset_N), gold_P)


def epoch_order(key, epoch: int, num_sentences: int) -> np.ndarray:
  """order_U: the train sentences in the order epoch `epoch` (1-based) visits them, a permutation drawn
  from `key` folded with the epoch, as H&M's DataLoader(shuffle=True) draws one per epoch."""
  return np.asarray(jax.random.permutation(jax.random.fold_in(key, epoch), num_sentences))


def _row_width(n: int, width: int = PACK_WIDTH) -> int:
  return max(width, 1 << max(0, int(n) - 1).bit_length())  # as packing.by_width


def epoch_batches(lengths_U, order_U, *, batch_sentences: int, batch_words: int, width: int = PACK_WIDTH):
  """One epoch's minibatches: consecutive sentences of order_U, at most `batch_sentences` a batch (H&M's
  DataLoader batches), laid side by side into the rows of a [batch_words // W, W] grid (W = `width`, or
  the next power of two for a longer sentence, which joins the open batch of its width); a sentence that
  fits no row of its open batch closes it. Yields (idx_BW, number of sentences) in the order the batches
  close: idx_BW holds each slot's word id (words numbered in sentence order), −1 where empty."""
  lengths_U = np.asarray(lengths_U, np.int64)
  first_U = np.concatenate([[0], np.cumsum(lengths_U)[:-1]])
  open_batches: dict = {}  # width -> [idx_BW, free_B, sentences]

  def new(w):
    rows = max(1, batch_words // w)
    return [np.full((rows, w), -1, np.int32), np.full(rows, w, np.int64), 0]

  for s in order_U:
    n = int(lengths_U[s])
    w = _row_width(n, width)
    batch = open_batches.setdefault(w, new(w))
    fits = np.flatnonzero(batch[1] >= n)
    if not len(fits):  # closes the open batch; the sentence starts the next
      yield batch[0], batch[2]
      batch = open_batches[w] = new(w)
      fits = np.flatnonzero(batch[1] >= n)
    r = int(fits[0])
    col = w - int(batch[1][r])
    batch[0][r, col : col + n] = np.arange(first_U[s], first_U[s] + n)
    batch[1][r] -= n
    batch[2] += 1
    if batch[2] == batch_sentences:
      yield batch[0], batch[2]
      del open_batches[w]
  for batch in open_batches.values():
    yield batch[0], batch[2]


def reduce_on_plateau(lr_G, best_G, bad_G, loss_G, *, factor=0.1, patience=0, threshold=1e-4, eps=1e-8):
  """One step of torch.optim.lr_scheduler.ReduceLROnPlateau (mode 'min', threshold_mode 'rel', cooldown 0,
  min_lr 0) per group, as H&M's regimen.py steps it once an epoch on the summed dev loss (factor 0.1,
  patience 0, torch's default threshold 1e-4 and eps 1e-8): a loss below best·(1 − threshold) is the new
  best; after more than `patience` epochs without one the rate is multiplied by `factor` (unless that
  changes it by no more than eps) and the count starts again. Returns (lr_G, best_G, bad_G)."""
  better = loss_G < best_G * (1.0 - threshold)
  best_G = np.where(better, loss_G, best_G)
  bad_G = np.where(better, 0, bad_G + 1)
  reduce = bad_G > patience
  new_lr = lr_G * factor
  lr_G = np.where(reduce & (lr_G - new_lr > eps), new_lr, lr_G)
  return lr_G.astype(np.float32), best_G, np.where(reduce, 0, bad_G)


@functools.partial(jax.jit, static_argnames="kind")
def _step(b_GKR, opt_state, lr_G, x_NGK, words, std_GK, idx_BW, *, kind):
  """One Adam step on one batch (its slots' word ids idx_BW, −1 empty), gathered from the flat train
  words: the mean over the batch's sentences of each sentence's normalised L1 loss, each group's step
  scaled by its lr (0 for a group that has stopped)."""
  sentence_N, position_N, length_N, row_offset_N, gold_P = words
  valid = idx_BW >= 0
  i = jnp.where(valid, idx_BW, 0)
  x = jnp.where(valid[..., None, None], x_NGK[i], 0.0) / std_GK
  n = length_N[i].astype(jnp.float32)
  if kind == "distance":
    same = valid[:, :, None] & valid[:, None, :] & (sentence_N[i][:, :, None] == sentence_N[i][:, None, :])
    gold = jnp.where(same, gold_P[jnp.where(same, row_offset_N[i][:, :, None] + position_N[i][:, None, :], 0)], 0.0)
    weight = jnp.where(same, 1.0 / jnp.square(n)[:, :, None], 0.0)
  else:
    gold, weight = jnp.where(valid, gold_P[row_offset_N[i]], 0.0), jnp.where(valid, 1.0 / n, 0.0)
  num_sentences = jnp.maximum(jnp.sum(valid & (position_N[i] == 0)), 1)
  loss = lambda b: _l1_G(b, x, gold, weight, kind).sum() / num_sentences
  updates, opt_state = optax.scale_by_adam().update(jax.grad(loss)(b_GKR), opt_state)
  return b_GKR - lr_G[:, None, None] * updates, opt_state


@functools.partial(jax.jit, static_argnames="kind")
def _loss_sum_G(b_GKR, x_BWGK, gold, weight, mean_GK, std_GK, *, kind):
  return _l1_G(b_GKR, (x_BWGK - mean_GK) / std_GK, gold, weight, kind)


@functools.partial(jax.jit, static_argnames="kind")
def _predict_chunk(b_GKR, x_BWGK, mean_GK, std_GK, *, kind):
  return _predict_GBW(b_GKR, (x_BWGK - mean_GK) / std_GK, kind)


@dataclasses.dataclass(frozen=True)
class _Bucket:
  """Sentences of one packed-row width: their ids, word ids, packing and per-row gold and weights."""

  sentences_U: np.ndarray
  words_N: np.ndarray
  packing: packing_lib.Packing
  gold: np.ndarray  # d_BWW or depth_BW
  weight: np.ndarray  # the same shape: 1/n² per in-sentence pair or 1/n per word, 0 elsewhere
  first_BW: np.ndarray  # 1 at each sentence's first word (sentences per batch)


def _buckets(trees: Sequence[Tree], kind: str) -> list[_Bucket]:
  lengths_U = np.array([len(t.heads) for t in trees], np.int64)
  out = []
  for which_U, words_N, packing in packing_lib.by_width(lengths_U, PACK_WIDTH):
    width = packing.width
    shape = (packing.num_rows, int(width)) + ((int(width),) if kind == "distance" else ())
    gold, weight = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    n0 = 0
    for s in which_U:
      n = int(lengths_U[s])
      row, col = int(packing.row_N[n0]), int(packing.col_N[n0])
      if kind == "distance":
        gold[row, col : col + n, col : col + n] = trees[s].distances()
        weight[row, col : col + n, col : col + n] = 1.0 / n**2
      else:
        gold[row, col : col + n] = trees[s].depths()
        weight[row, col : col + n] = 1.0 / n
      n0 += n
    first = packing.grid(packing.col_N == packing.start_N, 0, np.int32)
    out.append(_Bucket(which_U, words_N, packing, gold, weight, first))
  return out


def _check(x_NGK, trees, what) -> None:
  if np.ndim(x_NGK) != 3 or np.shape(x_NGK)[0] != sum(len(t.heads) for t in trees) or not len(trees):
    raise UserError(
      f"structural probe {what}: need x_NGK with one row per word of {len(trees)} sentences "
      f"({sum(len(t.heads) for t in trees)} words), got {np.shape(x_NGK)}"
    )


def _on_device(buckets: list[_Bucket], x_NGK) -> list[tuple]:
  """Per bucket (x_BWGK, gold, weight, first_BW): a split's packed rows on the device once, since every
  epoch reads them (packing the dev split again each epoch took a tenth of a small fit's time)."""
  return [
    jax.device_put((bk.packing.grid(x_NGK[bk.words_N], 0.0, np.float32), bk.gold, bk.weight, bk.first_BW))
    for bk in buckets
  ]


def _dev_loss_G(b, rows, num_sentences: int, mean, std, kind) -> np.ndarray:
  """Mean per-sentence normalised L1 loss of each group on a split (its `_on_device` rows)."""
  total = sum(
    np.asarray(_loss_sum_G(b, x, gold, weight, mean, std, kind=kind), np.float64) for x, gold, weight, _ in rows
  )
  return total / num_sentences


SCALES = ("raw", "std")


def fit_structural_probes(
  x_train_NGK,
  trees_train: Sequence[Tree],
  x_dev_NGK,
  trees_dev: Sequence[Tree],
  *,
  kind: str,
  rank: int | None = DEFAULT_RANK,
  epochs: int = 40,
  patience: int = 5,
  learning_rate: float = 1e-3,
  batch_sentences: int = 20,
  batch_words: int = 512,
  scale: str = "raw",
  seed: int = 0,
) -> FittedStructural:
  """Fits the distance or depth probe of every group as H&M's regimen.py trains one (module docstring);
  scale='std' divides the features by their train std first (the family is the same, B absorbs it; the
  optimisation is not). Deterministic given seed."""
  if kind not in KINDS:
    raise UserError(f"structural probe: kind must be one of {KINDS}, got {kind!r}")
  if scale not in SCALES:
    raise UserError(f"structural probe: scale must be one of {SCALES}, got {scale!r}")
  if batch_sentences < 1 or batch_words < 1 or patience < 1:
    raise UserError(
      f"structural probe: batch_sentences ({batch_sentences}), batch_words ({batch_words}) and patience "
      f"({patience}) must be at least 1"
    )
  _check(x_train_NGK, trees_train, "train")
  _check(x_dev_NGK, trees_dev, "dev")
  from headspec.probing.probe_start import floored_std  # the one standardisation of every probe

  x_train_NGK, x_dev_NGK = np.asarray(x_train_NGK, np.float32), np.asarray(x_dev_NGK, np.float32)
  _, num_g, k = x_train_NGK.shape
  rank = k if rank is None else min(int(rank), k)
  mean = np.zeros((num_g, k))  # scaled at most, never centred (module docstring)
  if scale == "std":
    std = floored_std(x_train_NGK.mean(0, dtype=np.float64), x_train_NGK.std(0, dtype=np.float64))
  else:
    std = np.ones((num_g, k))
  mean_j, std_j = jnp.asarray(mean, jnp.float32), jnp.asarray(std, jnp.float32)
  k_init, k_train = jax.random.split(jax.random.PRNGKey(seed))
  b = draws.uniform(k_init, (num_g, k, rank), -0.05, 0.05)  # H&M's initialisation; draws.py: bucketed
  opt_state = optax.scale_by_adam().init(b)
  lengths_U = np.array([len(t.heads) for t in trees_train], np.int64)
  words = jax.device_put(dataclasses.astuple(_TrainWords.make(trees_train, kind)))
  x_train_j = jax.device_put(x_train_NGK)
  dev_buckets = _buckets(trees_dev, kind)
  dev, num_dev = _on_device(dev_buckets, x_dev_NGK), sum(len(bk.sentences_U) for bk in dev_buckets)
  lr_G = np.full(num_g, learning_rate, np.float32)
  plateau_best, plateau_bad = np.full(num_g, np.inf), np.zeros(num_g, np.int64)
  active = np.ones(num_g, bool)
  best, best_loss = np.asarray(b), np.full(num_g, np.inf)
  best_epoch, stopped_epoch = np.zeros(num_g, np.int32), np.zeros(num_g, np.int32)
  history = []
  epoch = 0
  for epoch in range(1, max(epochs, 1) + 1):
    step_lr = jnp.asarray(np.where(active, lr_G, 0.0).astype(np.float32))  # a stopped group is frozen
    order = epoch_order(k_train, epoch, len(lengths_U))
    for idx_BW, _ in epoch_batches(lengths_U, order, batch_sentences=batch_sentences, batch_words=batch_words):
      b, opt_state = _step(b, opt_state, step_lr, x_train_j, words, std_j, idx_BW, kind=kind)
    summed = _dev_loss_G(b, dev, 1, mean_j, std_j, kind)  # Σ over dev sentences, as regimen.py's epoch_dev_loss
    loss = summed / num_dev
    history.append(np.where(active, loss, np.nan))
    lr_new, best_new, bad_new = reduce_on_plateau(lr_G, plateau_best, plateau_bad, summed)
    lr_G, plateau_best, plateau_bad = (np.where(active, n, o) for n, o in ((lr_new, lr_G), (best_new, plateau_best),
                                                                           (bad_new, plateau_bad)))  # fmt: skip
    better = active & (loss < best_loss - 1e-4)  # regimen.py: saved when the mean dev loss improves by 1e-4
    best = np.where(better[:, None, None], np.asarray(b), best)
    best_epoch = np.where(better, epoch, best_epoch)
    best_loss = np.where(better, loss, best_loss)
    stop = active & ~better & (epoch - best_epoch >= patience)  # regimen.py: `patience` epochs without one
    stopped_epoch = np.where(stop, epoch, stopped_epoch)
    active &= ~stop
    if not active.any():
      break
  stopped_epoch = np.where(active, epoch, stopped_epoch)
  return FittedStructural(
    kind, mean.astype(np.float32), std.astype(np.float32), best, best_loss, best_epoch, ~active, epoch, rank,
    stopped_epoch, np.stack(history), lr_G, scale,
  )  # fmt: skip


def predictions(fitted: FittedStructural, x_NGK, trees: Sequence[Tree], *, chunk_words: int = 8192) -> list[np.ndarray]:
  """Per sentence: predicted squared distances p_GNN (distance) or depths p_GN (depth), in sentence order."""
  _check(x_NGK, trees, "predict")
  x_NGK = np.asarray(x_NGK, np.float32)
  b = jnp.asarray(fitted.b_GKR)
  mean, std = jnp.asarray(fitted.mean_GK), jnp.asarray(fitted.std_GK)
  lengths_U = np.array([len(t.heads) for t in trees], np.int64)
  out: list = [None] * len(trees)
  for which_U, words_N, packing in packing_lib.by_width(lengths_U, PACK_WIDTH):
    x_BWGK = packing.grid(x_NGK[words_N], 0.0, np.float32)
    first_U = np.concatenate([[0], np.cumsum(lengths_U[which_U])[:-1]])  # each sentence's first word in words_N
    row_U, col_U = packing.row_N[first_U], packing.col_N[first_U]
    rows = max(1, chunk_words // packing.width)
    for r0 in range(0, packing.num_rows, rows):
      x = np.zeros((rows,) + x_BWGK.shape[1:], np.float32)
      n = min(rows, packing.num_rows - r0)
      x[:n] = x_BWGK[r0 : r0 + n]
      p = np.asarray(_predict_chunk(b, x, mean, std, kind=fitted.kind))
      for i in np.flatnonzero((row_U >= r0) & (row_U < r0 + n)):
        cols = slice(int(col_U[i]), int(col_U[i]) + int(lengths_U[which_U[i]]))
        row = int(row_U[i]) - r0
        out[which_U[i]] = p[:, row, cols, cols] if fitted.kind == "distance" else p[:, row, cols]
  return out


def linear_predictions(trees: Sequence[Tree], kind: str) -> list[np.ndarray]:
  """H&M's linear-structure baseline, one group: distances |i − j|, depths i (the first word as root)."""
  out = []
  for t in trees:
    i = np.arange(len(t.heads), dtype=np.float32)
    out.append((np.abs(i[:, None] - i[None, :]) if kind == "distance" else i)[None])
  return out


def mst_parents(d_GNN: np.ndarray) -> np.ndarray:
  """parent_GN of Prim's minimum spanning tree of each group's symmetric distance matrix, grown from
  node 0 (parent −1); edges are (v, parent_v) for v ≥ 1.

  By hand: networkx and scipy build one tree per call (and scipy drops zero-weight edges); this grows
  the trees of every probe of every sentence of one size at once (score_sentences stacks them along the
  leading axis), N − 1 array steps per stack."""
  d_GNN = np.asarray(d_GNN, np.float64)
  num_g, n, _ = d_GNN.shape
  parent = np.full((num_g, n), -1, np.int64)
  if n < 2:
    return parent
  g = np.arange(num_g)
  in_tree = np.zeros((num_g, n), bool)
  in_tree[:, 0] = True
  best = d_GNN[:, 0, :].copy()
  parent[:, 1:] = 0
  for _ in range(n - 1):
    j = np.argmin(np.where(in_tree, np.inf, best), axis=1)
    in_tree[g, j] = True
    closer = (d_GNN[g, j, :] < best) & ~in_tree
    best = np.where(closer, d_GNN[g, j, :], best)
    parent = np.where(closer, j[:, None], parent)
  return parent


def _edges(parent_N) -> set:
  return {tuple(sorted((v, int(p)))) for v, p in enumerate(parent_N) if p >= 0}


def _row_spearman(pred, gold) -> np.ndarray:
  """Spearman ρ between each row (last axis) of pred and the matching row of gold (broadcast against pred):
  ρ with pred's shape less its last axis (nan for a constant row). Ties get their average rank."""
  rp = scipy.stats.rankdata(pred, axis=-1)
  rg = scipy.stats.rankdata(gold, axis=-1)
  rp, rg = rp - rp.mean(-1, keepdims=True), rg - rg.mean(-1, keepdims=True)
  with np.errstate(invalid="ignore", divide="ignore"):
    return (rp * rg).sum(-1) / np.sqrt((rp**2).sum(-1) * (rg**2).sum(-1))


def _same_size(sizes_U) -> list[tuple[int, np.ndarray]]:
  """[(size, the sentences of that size)]: the scoring runs on stacks of equal-sized sentences at once."""
  sizes_U = np.asarray(sizes_U)
  return [(int(n), np.flatnonzero(sizes_U == n)) for n in np.unique(sizes_U)]


@dataclasses.dataclass(frozen=True)
class SentenceScores:
  """Per sentence u and group g, the sums the metrics are ratios of (so a bootstrap resamples sentences).

  distance: correct_UG / total_U are shared and gold MST edges; spearman_UG / count_U the sum and number
  of the words' DSpr. rows. depth: correct_UG is the root hit (total_U = 1 where a root is scorable);
  spearman_UG the sentence's NSpr. (count_U = 1).
  """

  kind: str
  length_U: np.ndarray
  correct_UG: np.ndarray
  total_U: np.ndarray
  spearman_UG: np.ndarray
  count_U: np.ndarray


def score_sentences(pred: Sequence[np.ndarray], trees: Sequence[Tree], kind: str) -> SentenceScores:
  """Scores per-sentence predictions (from `predictions` or `linear_predictions`) against gold trees;
  sentences of one length (for UUAS: of one count of non-punctuation words) are scored as one stack."""
  num_g = len(pred[0])
  length_U = np.array([len(t.heads) for t in trees])
  correct, total = np.zeros((len(trees), num_g)), np.zeros(len(trees))
  spearman, count = np.zeros((len(trees), num_g)), np.zeros(len(trees))
  for n, us in _same_size(length_U):
    p = np.stack([pred[u] for u in us])  # (V, G, n, n) or (V, G, n)
    if kind == "distance":  # DSpr.: word i's predicted against gold distances to every word
      gold = np.stack([trees[u].distances() for u in us])[:, None]
      spearman[us], count[us] = np.nansum(_row_spearman(p, gold), -1), n
      continue
    gold = np.stack([trees[u].depths() for u in us])[:, None]  # NSpr.: the sentence's depths
    spearman[us], count[us] = np.nan_to_num(_row_spearman(p, gold)), 1
    punct = np.stack([np.asarray(trees[u].punct, bool) for u in us])[:, None]  # root acc.: least deep word
    least = np.argmin(np.where(punct, np.inf, p), axis=-1)
    root = np.array([int(np.flatnonzero(np.asarray(trees[u].heads) == 0)[0]) for u in us])
    scorable = ~punct.all(-1)[:, 0]
    correct[us] = np.where(scorable[:, None], least == root[:, None], 0)
    total[us] = scorable
  if kind == "distance":  # UUAS: the MST of predicted against that of gold distances, punctuation left out
    keep_U = [np.flatnonzero(~np.asarray(t.punct, bool)) for t in trees]
    for m, us in _same_size([len(k) for k in keep_U]):
      if m < 2:
        continue
      sub = [np.ix_(keep_U[u], keep_U[u]) for u in us]
      p = np.stack([pred[u][(slice(None), *ix)] for u, ix in zip(us, sub)])  # (V, G, m, m)
      gold = np.stack([trees[u].distances()[ix] for u, ix in zip(us, sub)])  # (V, m, m)
      gold_parent = mst_parents(gold)
      gold_edge = np.zeros((len(us), m, m), bool)
      v = np.arange(len(us))[:, None]
      gold_edge[v, np.arange(1, m), gold_parent[:, 1:]] = gold_edge[v, gold_parent[:, 1:], np.arange(1, m)] = True
      parent = mst_parents(p.reshape(-1, m, m)).reshape(len(us), num_g, m)
      correct[us] = gold_edge[v[:, :, None], np.arange(1, m), parent[:, :, 1:]].sum(-1)
      total[us] = m - 1
  return SentenceScores(kind, length_U, correct, total, spearman, count)


def _length_mean(spearman_RUG, count_RU, length_U, lo: int, hi: int) -> np.ndarray:
  """Mean over the lengths lo..hi present of (Σ spearman / Σ count) within each length; for R resamples
  at once (spearman_RUG and count_RU already weighted by how often each sentence was drawn)."""
  lengths = [n for n in range(lo, hi + 1) if (length_U == n).any()]
  if not lengths:
    return np.full(spearman_RUG.shape[::2], np.nan)
  means = []
  for n in lengths:
    m = length_U == n
    num, den = spearman_RUG[:, m].sum(1), count_RU[:, m].sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
      means.append(np.where(den[:, None] > 0, num / den[:, None], np.nan))
  return np.nanmean(np.stack(means), axis=0)


def metrics(scores: SentenceScores, *, num_resamples: int = 1000, seed: int = 0, confidence: float = 0.95) -> dict:
  """{metric: (value_G, low_G, high_G)} with percentile bootstrap intervals over sentences (the same
  resamples as every headspec interval: resampling.bootstrap_resample_counts): 'uuas' and 'dspr' for the
  distance probe, 'root_acc' and 'nspr' for the depth probe."""
  names = ("uuas", "dspr") if scores.kind == "distance" else ("root_acc", "nspr")
  lo, hi = SPEARMAN_LENGTHS
  counts_RU = np.concatenate([np.ones((1, len(scores.length_U))), resampling.bootstrap_resample_counts(
    len(scores.length_U), num_resamples, seed)])  # fmt: skip
  with np.errstate(invalid="ignore", divide="ignore"):
    ratio_RG = (counts_RU @ scores.correct_UG) / (counts_RU @ scores.total_U)[:, None]
  spearman_RUG = counts_RU[:, :, None] * scores.spearman_UG[None]
  length_RG = _length_mean(spearman_RUG, counts_RU * scores.count_U[None], scores.length_U, lo, hi)
  alpha = 100 * (1.0 - confidence) / 2.0
  out = {}
  for name, est_RG in zip(names, (ratio_RG, length_RG)):
    low, high = np.nanpercentile(est_RG[1:], [alpha, 100 - alpha], axis=0)
    out[name] = (est_RG[0], low, high)
  return out
