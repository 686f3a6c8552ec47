"""Hewitt & Manning's structural probes: tree distance and tree depth as squared lengths under a linear map.

Hewitt & Manning 2019 ("A Structural Probe for Finding Syntax in Word Representations"; reference code
john-hewitt/structural-probes). For the words h_1..h_n of a sentence and a rank-r map B ∈ R^{r×K}:

  distance probe  d̂(i, j) = ‖B(x̂_i − x̂_j)‖²  fitted to the tree distance d(i, j) (edges on the path)
  depth probe     ‖ŵ_i‖ = ‖B x̂_i‖²           fitted to the depth of word i (edges from the root word)

x̂ = x / σ is the feature scaled by its train standard deviation (for conditioning; B absorbs it, so the
probe family is H&M's). It is not centred: ‖B(x − μ)‖² is a different family from ‖Bx‖² for depths. Training as the reference code: L1 loss, per sentence normalised by n²
(distance) or n (depth) and averaged over the sentences of a batch; Adam (lr 1e-3, batches of ~20
sentences: `batch_words` 512), the learning rate divided by 10 after an epoch whose dev loss did not
improve (ReduceLROnPlateau, patience 0), parameters kept at the lowest dev loss, training stopped after
`patience` (5) epochs without an improvement of 1e-4. Every feature group (each head's Z_h, each
layer's residual stream) is fitted at once, each with its own map, learning rate and stopping point.

Metrics (the reference code's reporter.py), each per group:
  UUAS      the minimum spanning tree of the predicted distances against the gold tree, both over the
            non-punctuation words (UPOS PUNCT), undirected edges: Σ shared edges / Σ gold edges
  DSpr.     Spearman ρ between word i's predicted and gold distances to every word of its sentence,
            averaged over the words of each sentence length, then over the lengths 5–50
  root acc  the least deep non-punctuation word is the gold root: fraction of sentences
  NSpr.     Spearman ρ between predicted and gold depths of a sentence's words, averaged within lengths
            5–50, then over lengths
Linear-structure baseline (H&M §4.1 "LINEAR"): distances |i − j| and depths i (the first word as root).

Layout: sentences packed side by side into rows of `width` words (headspec/packing.py) as the arc probe
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

from headspec import draws, resampling
from headspec import packing as packing_lib
from headspec.errors import UserError

KINDS = ("distance", "depth")
DEFAULT_RANK = 64  # H&M find UUAS flat above rank ~64 on BERT-base; capped at K (a head's Z_h is d_head wide)
PACK_WIDTH = 64
SPEARMAN_LENGTHS = (5, 50)  # DSpr. and NSpr. average sentences of these lengths (inclusive), as H&M


@dataclasses.dataclass(frozen=True)
class Tree:
  """One sentence's gold tree: heads_n (1-based, 0 = ROOT) and punct_n (UPOS PUNCT, left out of UUAS and
  root accuracy)."""

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
  """Per group: b_GKR (the kept map), the scaling (mean_GK is zero: features are not centred), dev loss at the
  kept epoch and that epoch, and whether the group stopped improving (`patience` epochs without a better dev
  loss) before the epochs ran out."""

  kind: str
  mean_GK: np.ndarray
  std_GK: np.ndarray
  b_GKR: np.ndarray
  dev_loss_G: np.ndarray
  best_epoch_G: np.ndarray
  converged_G: np.ndarray
  epochs_run: int
  rank: int


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


@functools.partial(jax.jit, static_argnames=("batch_rows", "kind"))
def _epoch(b_GKR, opt_state, lr_G, x_BWGK, gold, weight, first_BW, mean_GK, std_GK, key, *, batch_rows, kind):
  """One pass of minibatch Adam over the packed rows (shuffled); each group's step scaled by its lr."""
  num_b = x_BWGK.shape[0]
  steps = max(num_b // batch_rows, 1)

  def loss(b, idx):
    x = (x_BWGK[idx] - mean_GK) / std_GK
    return _l1_G(b, x, gold[idx], weight[idx], kind).sum() / jnp.maximum(first_BW[idx].sum(), 1)

  def step(carry, idx):
    b, s = carry
    updates, s = optax.scale_by_adam().update(jax.grad(loss)(b, idx), s)
    return (b - lr_G[:, None, None] * updates, s), None

  order = jax.random.permutation(key, num_b)[: steps * batch_rows].reshape(steps, batch_rows)
  return jax.lax.scan(step, (b_GKR, opt_state), order)[0]


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
  batch_words: int = 512,
  seed: int = 0,
) -> FittedStructural:
  """Fits the distance or depth probe of every group (see the module docstring); deterministic given seed."""
  if kind not in KINDS:
    raise UserError(f"structural probe: kind must be one of {KINDS}, got {kind!r}")
  _check(x_train_NGK, trees_train, "train")
  _check(x_dev_NGK, trees_dev, "dev")
  from headspec.probing.probe import floored_std  # the one standardisation of every probe

  x_train_NGK, x_dev_NGK = np.asarray(x_train_NGK, np.float32), np.asarray(x_dev_NGK, np.float32)
  _, num_g, k = x_train_NGK.shape
  rank = k if rank is None else min(int(rank), k)
  mean = x_train_NGK.mean(0, dtype=np.float64)
  std = floored_std(mean, x_train_NGK.std(0, dtype=np.float64))
  mean = np.zeros_like(mean)  # scaled, not centred (module docstring)
  mean_j, std_j = jnp.asarray(mean, jnp.float32), jnp.asarray(std, jnp.float32)
  k_init, k_train = jax.random.split(jax.random.PRNGKey(seed))
  b = draws.uniform(k_init, (num_g, k, rank), -0.05, 0.05)  # H&M's initialisation; draws.py: bucketed
  opt_state = optax.scale_by_adam().init(b)
  lr_G = np.full(num_g, learning_rate, np.float32)
  train_buckets, dev_buckets = _buckets(trees_train, kind), _buckets(trees_dev, kind)
  train = list(zip(train_buckets, _on_device(train_buckets, x_train_NGK)))
  dev, num_dev = _on_device(dev_buckets, x_dev_NGK), sum(len(bk.sentences_U) for bk in dev_buckets)
  best, best_loss = np.asarray(b), np.full(num_g, np.inf)
  best_epoch = np.zeros(num_g, np.int32)
  epoch = 0
  for epoch, key in enumerate(jax.random.split(k_train, max(epochs, 1)), start=1):
    for i, (bk, rows) in enumerate(train):
      batch_rows = min(max(1, batch_words // bk.packing.width), bk.packing.num_rows)
      b, opt_state = _epoch(
        b, opt_state, jnp.asarray(lr_G), *rows, mean_j, std_j,
        jax.random.fold_in(key, i), batch_rows=batch_rows, kind=kind,
      )  # fmt: skip
    loss = _dev_loss_G(b, dev, num_dev, mean_j, std_j, kind)
    better = loss < best_loss - 1e-4
    lr_G = np.where(better, lr_G, lr_G * 0.1).astype(np.float32)  # ReduceLROnPlateau(factor 0.1, patience 0)
    best = np.where(better[:, None, None], np.asarray(b), best)
    best_epoch = np.where(better, epoch, best_epoch)
    best_loss = np.where(better, loss, best_loss)
    if (epoch - best_epoch >= patience).all():
      break
  converged = epoch - best_epoch >= patience
  return FittedStructural(
    kind, mean.astype(np.float32), std.astype(np.float32), best, best_loss, best_epoch, converged, epoch, rank
  )


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
