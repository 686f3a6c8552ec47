"""Linear softmax probes for many feature groups (every head, every layer) and many label sets at once.

A probe for group g and task s is multinomial logistic regression on standardised features
(Clark et al. 2019, "What Does BERT Look At?", probe per attention head; Hewitt & Liang 2019 for
control tasks and selectivity):

  p(y = c | x) = softmax_c(x̂ᵀ W_c + b_c),  x̂ = (x − mean) / std   (mean, std from train)
  W, b = argmin  (1/n) Σ_n −log p(y_n | x_n) + (λ/2) ‖W‖²_F          (bias not penalised)

which is scikit-learn's LogisticRegression(C = 1/(λ n)) on StandardScaler'd features. λ is picked per
(group, task) from `l2_grid` by dev accuracy (ties go to the stronger penalty).

How: every pass over x_NGK costs N·G·K·C multiply-adds and N·G·C exps, and on a CPU that is the
whole bill, so every (group, task, λ) probe shares each pass, in three stages:
  1. one streaming pass for sufficient statistics shared by every task: per-group mean and std,
     per-task class sums (a sparse one-hot product, no factor C) and a K×K correlation from a strided
     subset. They give a closed-form Fisher-LDA start W₀ = Σ_w⁻¹ μ_c, b₀ = log π_c − ½ μ_cᵀ W₀,c (the
     Gaussian model whose posterior is exactly a softmax-linear probe; within-class eigenvalues
     clipped at zero), kept per probe only if its objective on a subset beats the class-prior start
     (headspec/probing/probe_start.py);
  2. minibatch Adam on the exact penalised cross-entropy from that start, over `refine_samples`
     shuffled training words, with ALL tasks × groups in the same matmuls (X_b @ W[K, Σ C]).
     Parameters live in whitened coordinates (W = R^(-1/2) V, R the feature correlation), which
     conditions the feature side of the Hessian (Böhning 1992 bounds it by ½(I − 11ᵀ/C) ⊗ R). The l2
     grid is a warm-started path: all grid values share the first (1 − fork_fraction) of the steps at
     the weakest l2, then each value continues with its own penalty;
  3. full-batch L-BFGS per probe (the batched engine headspec/probing/lbfgs.py, which knows nothing of
     probes, on `_ProbeProblem`) until its relative decrease and its quasi-Newton decrement
     are both below `tol` (or `max_iter`), every probe with its own direction, curvature pairs, step and
     stopping test, all sharing each pass. Its initial inverse Hessian is each class's exact Hessian
     block, inverted, refreshed every PRECONDITION_EVERY iterations (`_preconditioner`), where that
     pays: on word-level features the weak-λ probes are nearly separable, and this cut the Hessian's
     condition number 150-fold and the iterations about threefold. Groups too wide for a block per
     column (384-wide residual streams) get one block per probe, its classes' average, each column
     scaled by its own curvature (`_SharedBlocks`). One iteration, line search
     included, is one compiled call and one read; stopped probes are masked (fixed shapes), and the pass narrows to the groups and
     (task, λ) column blocks still running only when that pays for a compile. A probe that ends above
     min(its start's objective, the class-prior model's) is refitted from the class prior, and the fit
     fails loudly if that does not help either.
Groups are independent, so on accelerators they are split over the local JAX devices and fitted
concurrently, one thread per device taking turns (headspec/probing/fanout.py); on a CPU host they are
fitted on one device in the calling thread (fit threads crashed jaxlib 0.10.2's CPU backend).
No library provides batched multi-task logistic regression over a group axis in JAX, hence this file.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from headspec.errors import UserError
from headspec.probing import fanout, lbfgs, probe_start
from headspec.probing.probe_start import floored_std

__all__ = [
  "CHUNK_LOGITS",
  "DEFAULT_L2_GRID",
  "DEFAULT_MAX_ITER",
  "DEFAULT_TOL",
  "FittedProbes",
  "ProbeSpec",
  "fit_softmax_probes",
  "floored_std",
  "pass_chunk_words",
  "predict",
]

DEFAULT_L2_GRID = (1e-5, 1e-4, 1e-3)
DEFAULT_TOL = 1e-5  # L-BFGS stops a probe when its objective changes (and is predicted to change) by less, relatively
DEFAULT_MAX_ITER = 500  # L-BFGS iterations at most (each one pass over the training words; XPOS needs up to ~400)
# L-BFGS narrows its pass to the probes still running when the multiply-adds that saves (estimated) are
# worth more than compiling the step for the narrower shape (~1.4 s of a 2-core CPU). 2e11 measured best
# with preconditioning, whose probes need fewer iterations than the rule's "as many again" (issue 33)
NARROWING_COST = 2e11
# Preconditioned L-BFGS (see _preconditioner): the class blocks are recomputed every PRECONDITION_EVERY
# iterations from about PRECONDITION_WORDS training words, where it pays (_ProbeProblem._preconditioned): a
# pass of at least PRECONDITION_MIN_WORK multiply-adds (below, a fit is bound by compiling, and the
# preconditioner's programs cost more than it saves), a refresh of at most PRECONDITION_MAX_PASSES
# passes' multiply-adds ((K+1)·words/(2N): a 384-wide stream is too wide) and blocks of at most
# PRECONDITION_MAX_FLOATS floats (G·T·(K+1)²). Wider groups get one block per probe (G·Q·(K+1)² floats)
# where a pass is at least PRECONDITION_SHARED_WORK multiply-adds, refreshed every
# PRECONDITION_EVERY_SHARED iterations (the timings behind these numbers: docs/probing_core.md,
# "Measurements behind the constants").
PRECONDITION_EVERY = 20
PRECONDITION_WORDS = 12_288
PRECONDITION_MIN_WORK = 1e8
PRECONDITION_MAX_PASSES = 32
PRECONDITION_MAX_FLOATS = 1 << 25
PRECONDITION_SHARED_WORK = 4e9
PRECONDITION_EVERY_SHARED = 50
CHUNK_LOGITS = 1 << 21  # logits per chunk of a full-batch pass, at most (see pass_chunk_words)


@dataclasses.dataclass(frozen=True)
class ProbeSpec:
  """One label set over the words: int labels in [0, num_classes), -1 = ignore this word."""

  name: str
  num_classes: int
  y_train_N: np.ndarray
  y_dev_N: np.ndarray


@dataclasses.dataclass(frozen=True)
class FittedProbes:
  """Fitted probes: per task `weights[name]` W_GKC and `biases[name]` b_GC act on standardised x.

  `l2[name]` (G,) is the chosen penalty per group; `dev_accuracy[name]` (G, len(l2_grid)) the dev
  accuracy of every grid value, `dev_accuracy_best[name]` (G,) the chosen one. For the chosen probe:
  `train_objective[name]` (G,) its final penalised train objective (nats per word + penalty),
  `iterations[name]` (G,) its L-BFGS iterations, `converged[name]` (G,) whether it met the tolerance;
  `start[name]` (G,) 'lda' or 'prior' (the start that scored the lower objective on a subset).
  `profile`: where the fit's time went (start_s, adam_s, lbfgs_s, dev_s seconds; group_columns: Σ over
  the full-batch passes of groups × packed weight columns in the pass, the passes' arithmetic is
  about 4·N·K·group_columns; words N, groups G, width K and columns T of the full pass), for benchmarks.
  """

  mean_GK: np.ndarray
  std_GK: np.ndarray
  weights: dict
  biases: dict
  l2: dict
  dev_accuracy: dict
  dev_accuracy_best: dict
  l2_grid: tuple
  train_objective: dict = dataclasses.field(default_factory=dict)
  iterations: dict = dataclasses.field(default_factory=dict)
  converged: dict = dataclasses.field(default_factory=dict)
  start: dict = dataclasses.field(default_factory=dict)
  profile: dict = dataclasses.field(default_factory=dict)

  def lbfgs_arithmetic(self) -> dict:
    """The L-BFGS passes' matmul arithmetic, 4·N·K·group_columns (logits xs·W and gradient xsᵀ·Z, two
    multiply-adds per weight per word), their seconds (compilation included) and the full pass's shape:
    what a benchmark needs to set the fit beside a plain matmul of the same shapes."""
    p = self.profile
    return {
      "gflop": round(4.0 * p["words"] * p["width"] * p["group_columns"] / 1e9, 3),
      "seconds": round(p["lbfgs_s"], 2),
      **{key: p[key] for key in ("words", "groups", "width", "columns")},
    }


def _check(x_train_NGK, x_dev_NGK, specs):
  if x_train_NGK.ndim != 3 or x_dev_NGK.ndim != 3 or x_train_NGK.shape[1:] != x_dev_NGK.shape[1:]:
    raise UserError(
      f"probe features must be x_NGK with equal G, K for train and dev; got {x_train_NGK.shape} and {x_dev_NGK.shape}"
    )
  names = [s.name for s in specs]
  if not specs or len(set(names)) != len(names):
    raise UserError(f"probe specs need distinct names, got {names}")
  for s in specs:
    for split, y, x in (("train", s.y_train_N, x_train_NGK), ("dev", s.y_dev_N, x_dev_NGK)):
      y = np.asarray(y)
      if y.shape != (x.shape[0],):
        raise UserError(f"probe task {s.name}: {split} labels have shape {y.shape}, features have N={x.shape[0]}")
      if y.size and (y.min() < -1 or y.max() >= s.num_classes):
        raise UserError(f"probe task {s.name}: {split} labels outside [-1, {s.num_classes})")
    if not (np.asarray(s.y_train_N) >= 0).any():
      raise UserError(f"probe task {s.name}: no labelled training word")


def _chunks(x_NGK, ys, chunk):
  """Yields (x_cGK, weight_c, labels) chunks of equal size (≤ chunk, a multiple of 256 so few shapes
  compile), zero-padding the last one; weight 0 and label -1 mark the padding."""
  n = x_NGK.shape[0]
  # equal chunks of at most `chunk` words, each rounded up to a multiple of 256
  per_chunk = math.ceil(n / math.ceil(n / chunk)) if n else chunk
  size = min(chunk, math.ceil(per_chunk / 256) * 256)
  for start in range(0, n, size):
    stop = min(start + size, n)
    x, w = np.asarray(x_NGK[start:stop], np.float32), np.ones(stop - start, np.float32)
    y = [np.asarray(y_N[start:stop], np.int32) for y_N in ys]
    if stop - start < size:
      pad = size - (stop - start)
      x = np.concatenate([x, np.zeros((pad,) + x.shape[1:], np.float32)])
      w = np.concatenate([w, np.zeros(pad, np.float32)])
      y = [np.concatenate([v, np.full(pad, -1, np.int32)]) for v in y]
    yield x, w, y


def _columns(specs, num_l2):
  """Column layout of the packed weight matrix: task s, l2 index l occupy a block of C_s columns."""
  offsets, off = [], 0
  for s in specs:
    offsets.append(off)
    off += num_l2 * s.num_classes
  return offsets, off


def _optimizer(learning_rate, total_steps):
  return optax.adam(optax.cosine_decay_schedule(learning_rate, max(total_steps, 1)))


@functools.partial(jax.jit, static_argnames=("learning_rate", "total_steps"))
def _adam_init(params, *, learning_rate, total_steps):
  return _optimizer(learning_rate, total_steps).init(params)


def _minibatch_grad(params, xs_GKB, ys_AB, whiten_GKK, l2_T, label_scale_A, layout):
  """Gradient of Σ over probes of label_scale·Σ_batch CE + (λ/2)‖W‖² with respect to (v, b), written
  out as the full pass's (_softmax_ce)."""
  v_GKT, b_GT = params
  w_GKT = jnp.einsum("gkl,glc->gkc", whiten_GKK, v_GKT)
  _, (gw_GKT, gb_GT) = _softmax_ce(xs_GKB, w_GKT, b_GT, ys_AB, label_scale_A, layout, True)
  return jnp.einsum("gkl,gkc->glc", whiten_GKK, gw_GKT + l2_T * w_GKT), gb_GT


@functools.partial(jax.jit, static_argnames=("layout", "learning_rate", "total_steps"))
def _refine(
  params,
  opt_state,
  x_NGK,
  ys_AN,
  order_OB,
  mean_GK,
  std_GK,
  whiten_GKK,
  l2_T,
  label_scale_A,
  *,
  layout,
  learning_rate,
  total_steps,
):
  """Minibatch Adam over the words in order_OB (T steps of B words), cosine-decayed over total_steps
  (layout: per task (first column, classes, λ blocks); l2_T: each packed column's λ)."""
  opt = _optimizer(learning_rate, total_steps)

  def step(carry, idx_B):
    params, opt_state = carry
    xs_GKB = jnp.transpose((x_NGK[idx_B] - mean_GK) / std_GK, (1, 2, 0))
    ys_AB = tuple(y_N[idx_B] for y_N in ys_AN)
    grads = _minibatch_grad(params, xs_GKB, ys_AB, whiten_GKK, l2_T, label_scale_A, layout)
    updates, opt_state = opt.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), None

  return jax.lax.scan(step, (params, opt_state), order_OB)[0]


def _fork_columns(tree, layout_one, num_l2, total_one):
  """Copies every task's column block num_l2 times (arrays whose last axis is the packed columns)."""

  def fork(a):
    if getattr(a, "ndim", 0) == 0 or a.shape[-1] != total_one:
      return a
    return jnp.concatenate([jnp.concatenate([a[..., off : off + c]] * num_l2, axis=-1) for off, c in layout_one], -1)

  return jax.tree_util.tree_map(fork, tree)


@functools.partial(jax.jit, static_argnames=("layout", "num_l2"))
def _dev_correct(x_cGK, ys_Ac, mean_GK, std_GK, w_GKC, b_GC, layout, num_l2):
  """Per task: correct-prediction counts (G, P) and labelled-word counts for one chunk."""
  xs_GcK = jnp.transpose((x_cGK - mean_GK) / std_GK, (1, 0, 2))
  logits = jnp.einsum("gbk,gkc->gbc", xs_GcK, w_GKC) + b_GC[:, None, :]
  out = []
  for (off, c), y_c in zip(layout, ys_Ac):
    z = logits[:, :, off : off + num_l2 * c].reshape(*logits.shape[:2], num_l2, c)
    hit = (jnp.argmax(z, -1) == y_c[None, :, None]) & (y_c >= 0)[None, :, None]
    out.append(hit.sum(1))
  return out


def _block_map(layout, num_l2):
  """block_T: the probe (task, l2) index q = a·P + l of every packed column (layout: per-P blocks)."""
  block_T = []
  for a, (_, c) in enumerate(layout):
    for l in range(num_l2):
      block_T += [a * num_l2 + l] * c
  return np.asarray(block_T, np.int32)


class _Pass(NamedTuple):
  """The device arrays of a full-batch pass over the training words for some groups: xs_CGKc, the
  standardised features in chunks of c words (the last padded with label -1), group-major and words
  last, as each chunk's matmuls and softmax read them (_softmax_ce); whiten_GKK per group; the rest per
  column (l2_T), per label set (ys_ACc, inv_count_A) or mapping columns to probes (block_T, onehot_TQ)."""

  xs_CGKc: jax.Array
  whiten_GKK: jax.Array
  ys_ACc: tuple
  l2_T: jax.Array
  inv_count_A: jax.Array
  block_T: jax.Array
  onehot_TQ: jax.Array


def _softmax_ce(xs_GKB, w_GKT, b_GT, ys_AB, scale_A, layout, with_grad):
  """Σ_words scale·CE per probe (f_GQ) over B words and, with_grad, its gradient (gw_GKT, gb_GT) from
  the logits' gradient softmax − one-hot, written out rather than differentiated (no scatter from
  take_along_axis's transpose, one exp per logit). The logits are laid out (G, T, B), words last: each
  probe's max, exp-sum and softmax run over its C class rows as whole-vector operations along the
  words, which on the 2-core CPU takes about a sixth of the time of the same work along C-wide rows
  (docs/probing_core.md, "Measurements behind the constants")."""
  z_GTB = jnp.einsum("gkt,gkb->gtb", w_GKT, xs_GKB) + b_GT[:, :, None]
  num_g, num_b = z_GTB.shape[0], z_GTB.shape[2]
  f_parts, dz_parts = [], []
  for (off, c, num_p), y_B, scale in zip(layout, ys_AB, scale_A):
    z = z_GTB[:, off : off + num_p * c].reshape(num_g, num_p, c, num_b)
    weight_B = (y_B >= 0).astype(z.dtype) * scale  # label -1: neither trained on nor counted
    top = jax.lax.stop_gradient(z.max(2, keepdims=True))
    e = jnp.exp(z - top)
    total = e.sum(2, keepdims=True)
    z_label = jnp.take_along_axis(z, jnp.maximum(y_B, 0)[None, None, None, :], axis=2)[:, :, 0]
    f_parts.append(((top[:, :, 0] + jnp.log(total[:, :, 0]) - z_label) * weight_B).sum(-1))  # (G, P)
    if with_grad:
      label = jax.lax.broadcasted_iota(jnp.int32, (1, 1, c, 1), 2) == y_B[None, None, None, :]
      dz = e * (weight_B / total) - jnp.where(label, weight_B, 0.0)
      dz_parts.append(dz.reshape(num_g, num_p * c, num_b))
  f_GQ = jnp.concatenate(f_parts, axis=1)
  if not with_grad:
    return f_GQ, None
  dz_GTB = jnp.concatenate(dz_parts, axis=1)
  return f_GQ, (jnp.einsum("gkb,gtb->gkt", xs_GKB, dz_GTB), dz_GTB.sum(-1))


def _full_objective(params, data, *, layout, with_grad):
  """Exact penalised objective f_GQ of every probe (mean CE over its labelled train words + (λ/2)‖W‖²),
  and its gradient (None without), over all training words: one pass, chunk by chunk (value and
  gradient accumulated per chunk, so no chunk's logits outlive it): per chunk two matmuls (logits, and
  the gradient xsᵀ·dz) and one exp per logit (_softmax_ce). layout: per label set its (first
  column, classes C, probes P): P consecutive blocks of C columns. Traced inside the compiled L-BFGS
  calls below."""
  v_GKT, b_GT = params
  w_GKT = jnp.einsum("gkl,glc->gkc", data.whiten_GKK, v_GKT)

  def body(carry, chunk):
    xs_GKc, ys = chunk
    f_GQ, grad = _softmax_ce(xs_GKc, w_GKT, b_GT, ys, data.inv_count_A, layout, with_grad)
    if not with_grad:
      return (carry[0] + f_GQ, carry[1], carry[2]), None
    return (carry[0] + f_GQ, carry[1] + grad[0], carry[2] + grad[1]), None

  zero_f = jnp.zeros((b_GT.shape[0], data.onehot_TQ.shape[1]), jnp.float32)
  (f_GQ, gw_GKT, gb_GT), _ = jax.lax.scan(
    body, (zero_f, jnp.zeros_like(w_GKT), jnp.zeros_like(b_GT)), (data.xs_CGKc, data.ys_ACc)
  )
  f_GQ = f_GQ + lbfgs.per_problem(0.5 * data.l2_T * jnp.square(w_GKT).sum(1), data.onehot_TQ)
  if not with_grad:
    return f_GQ, None
  # w = A·v (A = whiten, symmetric): ∂/∂v = Aᵀ·∂/∂w, the penalty's ∂/∂w being λ·w
  gv_GKT = jnp.einsum("gkl,gkc->glc", data.whiten_GKK, gw_GKT + data.l2_T * w_GKT)
  return f_GQ, (gv_GKT, gb_GT)


def _curvature_blocks(params, data, *, layout, stride, shared=False):
  """Per packed column t its class block of the Hessian in whitened coordinates, (K+1)×(K+1) over
  (v_t, b_t): Σ_n a_nt x̃ₙx̃ₙᵀ with x̃ₙ = [A·x̂ₙ; 1] and a_nt = weight_n·p_nt(1 − p_nt), plus the
  penalty's λ_t·A² (A = whiten), from every `stride`-th chunk of words. shared: one block per probe
  instead, its classes' a_nt averaged (G, Q, K+1, K+1): C times smaller, for wide groups."""
  v_GKT, b_GT = params
  w_GKT = jnp.einsum("gkl,glc->gkc", data.whiten_GKK, v_GKT)
  num_g, k = w_GKT.shape[:2]

  def body(acc, chunk):
    xs_GKc, ys = chunk
    num_b = xs_GKc.shape[-1]
    z_GTB = jnp.einsum("gkt,gkb->gtb", w_GKT, xs_GKc) + b_GT[:, :, None]
    parts, col_parts = [], []
    for (off, c, num_p), y_B, scale in zip(layout, ys, data.inv_count_A):
      p = jax.nn.softmax(z_GTB[:, off : off + num_p * c].reshape(num_g, num_p, c, num_b), axis=2)
      a = p * (1.0 - p) * ((y_B >= 0) * scale)
      parts.append(a.mean(2) if shared else a.reshape(num_g, num_p * c, num_b))
      if shared:
        col_parts.append(a.sum(-1).reshape(num_g, num_p * c))
    a_GTB = jnp.concatenate(parts, axis=1)  # (G, Q, B) when shared
    acc, col_GT = acc
    xt_GJB = jnp.concatenate(
      [jnp.einsum("gkl,gkb->glb", data.whiten_GKK, xs_GKc), jnp.ones((num_g, 1, num_b), xs_GKc.dtype)], axis=1
    )
    if shared:  # Q blocks of a wide group: weight x̃ per probe first, a Q·J·B temporary (J² is large)
      weighted_GQJB = a_GTB[:, :, None, :] * xt_GJB[:, None]
      h = jnp.einsum("gqjb,glb->gqjl", weighted_GQJB, xt_GJB).reshape(acc.shape)
      return (acc + h, col_GT + jnp.concatenate(col_parts, axis=1)), None
    # Σ_b a_tb·(x̃_b x̃_bᵀ) as one matmul of a (T × B) with the words' outer products (B × J²): a
    # J²·B temporary instead of the J·T·B of weighting x̃ per column first (17 MB against 158 MB a chunk
    # at K = 64, 594 columns, 1,024 words)
    outer_GQB = (xt_GJB[:, :, None, :] * xt_GJB[:, None, :, :]).reshape(num_g, (k + 1) ** 2, num_b)
    return (acc + jnp.einsum("gtb,gqb->gtq", a_GTB, outer_GQB), col_GT), None

  blocks = data.onehot_TQ.shape[1] if shared else b_GT.shape[1]
  zero = jnp.zeros((num_g, blocks, (k + 1) ** 2), jnp.float32), jnp.zeros(b_GT.shape, jnp.float32)
  (h, col_GT), _ = jax.lax.scan(body, zero, (data.xs_CGKc[::stride], tuple(y[::stride] for y in data.ys_ACc)))
  h = h.reshape(num_g, -1, k + 1, k + 1) * stride
  a2_GKK = jnp.einsum("gkl,glm->gkm", data.whiten_GKK, data.whiten_GKK)
  l2 = data.l2_T @ data.onehot_TQ / data.onehot_TQ.sum(0) if shared else data.l2_T  # a probe's λ
  h = h.at[:, :, :k, :k].add(l2[None, :, None, None] * a2_GKK[:, None])
  if not shared:
    return h
  # each column's curvature against its probe's average (Σ_n a_nt, the λ added to both)
  mean_GQ = (col_GT @ data.onehot_TQ) / data.onehot_TQ.sum(0)
  return h, (mean_GQ[:, data.block_T] + data.l2_T) / (col_GT + data.l2_T)


class _SharedBlocks(NamedTuple):
  """A preconditioner with one block per probe (G, Q, K+1, K+1), shared by its classes' columns, each
  column's product scaled by its curvature against the probe's average (scale_GT)."""

  m_GQJJ: jax.Array
  scale_GT: jax.Array


@functools.partial(jax.jit, static_argnames=("layout", "stride", "shared"))
def _preconditioner(params, data, *, layout, stride=1, shared=False):
  """The inverse of each column's class block (_curvature_blocks), its eigenvalues floored at 1e-6 of
  the largest: the initial inverse Hessian H₀ = γ·M of preconditioned L-BFGS (Nocedal & Wright 2006,
  §7.2 on choosing H₀; M is a block-Jacobi preconditioner: the exact Hessian's per-class blocks). On the
  quickstart decoder's embeddings (UPOS, λ = 1e-5) it took the condition number of the Hessian in
  whitened coordinates from 3.2e6 to 2.1e4 (docs/probing_core.md). The cross-class coupling is left
  out: its full (K+1)C-wide Hessian would be 1,000-20,000 wide per probe. shared: one block per probe
  (the class blocks' average, `_SharedBlocks`), for groups too wide for a block per column: on
  all-MiniLM-L6-v2's 384-wide residual streams, where blocks per column would be 624 × 385² floats."""
  h = _curvature_blocks(params, data, layout=layout, stride=stride, shared=shared)
  h, scale_GT = h if shared else (h, None)
  evals, evecs = jnp.linalg.eigh(h)
  evals = jnp.maximum(evals, 1e-6 * evals[..., -1:] + 1e-30)
  m = jnp.einsum("gtij,gtj,gtlj->gtil", evecs, 1.0 / evals, evecs)
  return _SharedBlocks(m, scale_GT) if shared else m


def _precondition(m, p, layout):
  """M·p per column for a packed parameter pair p = (v_GKT, b_GT): m is a block per column (G, T, J, J)
  or `_SharedBlocks`, whose probe blocks apply to the columns of each probe in the pass's layout."""
  k = p[0].shape[1]
  p_GTJ = jnp.concatenate([jnp.swapaxes(p[0], 1, 2), p[1][..., None]], axis=-1)
  if isinstance(m, _SharedBlocks):
    parts, first = [], 0
    for off, c, num_p in layout:
      p_GPCJ = p_GTJ[:, off : off + num_p * c].reshape(p_GTJ.shape[0], num_p, c, k + 1)
      parts.append(
        jnp.einsum("gpij,gpcj->gpci", m.m_GQJJ[:, first : first + num_p], p_GPCJ).reshape(p_GPCJ.shape[0], -1, k + 1)
      )
      first += num_p
    out = jnp.concatenate(parts, axis=1) * m.scale_GT[..., None]
  else:
    out = jnp.einsum("gtij,gtj->gti", m, p_GTJ)
  return (jnp.swapaxes(out[..., :k], 1, 2), out[..., k])


def _probe_blocks(probes, cols):
  """The pass over the probes `probes` (sorted ids q = task·P + λ index): runs of consecutive λ blocks
  of one task as [task, first λ, count], the packed columns they occupy (ascending) and the pass layout
  (first column, classes, probes) of each run."""
  runs = []
  for q in probes:
    a, lam = divmod(int(q), cols.num_l2)
    if runs and runs[-1][0] == a and sum(runs[-1][1:]) == lam:
      runs[-1][2] += 1
    else:
      runs.append([a, lam, 1])
  widths = [n * cols.layout[a][1] for a, _, n in runs]
  col_T = np.concatenate(
    [cols.layout[a][0] + lam * cols.layout[a][1] + np.arange(w) for (a, lam, _), w in zip(runs, widths)]
  )
  starts = np.cumsum([0] + widths[:-1])
  layout = tuple((int(start), cols.layout[a][1], n) for start, (a, _, n) in zip(starts, runs))
  return runs, col_T, layout


@jax.jit
def _take_groups(xs_CGKc, whiten_GKK, idx):
  return xs_CGKc[:, idx], whiten_GKK[idx]


@dataclasses.dataclass(frozen=True)
class _SoftmaxLoss:
  """The L-BFGS engine's loss for a pass of `layout` (per label set its first column, classes, probes):
  the exact penalised objective and its gradient (`_full_objective`), and M·p (`_precondition`). Hashable,
  so the compiled step is reused for every pass of the same layout."""

  layout: tuple

  def __call__(self, params, data):
    return _full_objective(params, data, layout=self.layout, with_grad=True)

  def precondition(self, m, p):
    return _precondition(m, p, self.layout)


class _ProbeProblem(lbfgs.Problem):
  """The probes as the L-BFGS engine's problems (group g, task × l2 block q) over the pass `data`: the
  softmax loss, the class-block preconditioner where it pays (`_preconditioned`), recomputed every
  PRECONDITION_EVERY iterations (shared blocks: every PRECONDITION_EVERY_SHARED, until the first
  narrowing), and narrowing to the (task, λ) column blocks still running (`columns`, `restrict`). XPOS
  at the weakest λ, which often runs hundreds of iterations after everything else has stopped, then pays
  for its own columns only."""

  def __init__(self, data, cols, precondition):
    self.data, self.cols, self.loss = data, cols, _SoftmaxLoss(cols.pass_layout)
    self.mode = self._preconditioned(precondition)
    self.refresh_every = (
      0 if self.mode is None else (PRECONDITION_EVERY_SHARED if self.mode == "probe" else PRECONDITION_EVERY)
    )
    # The shared blocks are refreshed at the pass's first shape only: at a narrowed shape a refresh
    # compiles anew (~1 s each, 5 in a 384-wide stream's fit at 40k words) for no fewer iterations
    # (all-MiniLM-L6-v2's embeddings 96.6 -> 89.4 s, layer 2's stream 156.4 -> 145.9 s; objectives within
    # 2.2e-4 relative). Column blocks keep their refresh: without it the quickstart decoder's probes took
    # 2.5% more iterations.
    self.refresh_narrowed = self.mode == "column"
    # multiply-adds of a pass per group × column (the logits, the gradient and the softmax's few per word)
    self.pass_cost = 4.0 * data.xs_CGKc.shape[0] * data.xs_CGKc.shape[3] * (data.xs_CGKc.shape[2] + 5)

  def _preconditioned(self, precondition):
    """Which preconditioner this fit keeps: 'column' (a class block per packed column) where asked for
    and worth it (see PRECONDITION_MIN_WORK; its timings in docs/probing_core.md); 'probe'
    (one block per probe, `_SharedBlocks`) where blocks per column are too large or too costly to
    refresh but the pass is at least PRECONDITION_SHARED_WORK multiply-adds (a 384-wide stream of 40k
    words); None: plain L-BFGS."""
    num_chunks, num_g, k, words = self.data.xs_CGKc.shape
    n, num_t, num_q = num_chunks * words, len(self.cols.block_T), self.cols.onehot_TQ.shape[1]
    sample = -(-num_chunks // self._stride()) * words  # the words _curvature_blocks reads
    work = n * num_g * num_t * k
    if not precondition or work < PRECONDITION_MIN_WORK:
      return None
    if (k + 1) * sample <= 2 * PRECONDITION_MAX_PASSES * n and num_g * num_t * (k + 1) ** 2 <= PRECONDITION_MAX_FLOATS:
      return "column"
    if work >= PRECONDITION_SHARED_WORK and num_g * num_q * (k + 1) ** 2 <= PRECONDITION_MAX_FLOATS:
      return "probe"
    return None

  def _stride(self):
    """Every how many chunks of words the class blocks are estimated from (about PRECONDITION_WORDS)."""
    chunks, words = self.data.xs_CGKc.shape[0], self.data.xs_CGKc.shape[3]
    return max(1, chunks // -(-PRECONDITION_WORDS // words))

  def preconditioner(self, params, data, loss):
    return _preconditioner(params, data, layout=loss.layout, stride=self._stride(), shared=self.mode == "probe")

  def narrow_preconditioner(self, m, row_pos, col_pos, problem_pos, put):
    if isinstance(m, _SharedBlocks):
      return _SharedBlocks(put(m.m_GQJJ[row_pos][:, problem_pos]), put(m.scale_GT[row_pos][:, col_pos]))
    return put(m[row_pos][:, col_pos])

  def columns(self, problems):
    runs, col_T, layout = _probe_blocks(problems, self.cols)
    return col_T, (runs, layout)

  def restrict(self, rows, problems, col_T, key):
    """The pass over the groups `rows` and the probes `problems` (packed columns col_T, in runs)."""
    (runs, layout), base, cols = key, self.data, self.cols
    put = lambda a: jax.device_put(a, base.l2_T.device)
    xs, whiten = _take_groups(base.xs_CGKc, base.whiten_GKK, put(rows))
    data = _Pass(
      xs,
      whiten,
      tuple(base.ys_ACc[a] for a, _, _ in runs),
      put(cols.l2_T[col_T]),
      put(cols.inv_count_A[[a for a, _, _ in runs]]),
      put(np.searchsorted(problems, cols.block_T[col_T]).astype(np.int32)),
      put(cols.onehot_TQ[np.ix_(col_T, problems)]),
    )
    return data, _SoftmaxLoss(layout)


def _lbfgs(data, params, done_GQ, *, cols, tol, max_iter, precondition=True, fetch=jax.device_get) -> lbfgs.Result:
  """L-BFGS of every probe from `params` (probes marked done_GQ stay where they are): headspec/probing/lbfgs.py
  on `_ProbeProblem`, narrowing when the multiply-adds saved are worth NARROWING_COST."""
  problem = _ProbeProblem(data, cols, precondition)
  return lbfgs.minimize(
    problem, params, done_GQ, tol=tol, max_iter=max_iter, fetch=fetch, narrowing_cost=NARROWING_COST
  )


@dataclasses.dataclass(frozen=True)
class _Columns:
  """The packed weight matrix: one block of C_s columns per task (the shared Adam phase at the weakest
  λ: `layout_one`), later num_l2 blocks per task (`layout`); the probe q = task·P + λ index of each
  column (block_T), its λ (l2_T), and per probe the class-prior model's objective and bias."""

  specs: tuple
  l2_P: np.ndarray
  layout_one: tuple
  total_one: int
  layout: tuple
  block_T: np.ndarray
  l2_T: np.ndarray
  onehot_TQ: np.ndarray
  inv_count_A: np.ndarray
  prior_objective_Q: np.ndarray
  prior_b_T: np.ndarray

  @classmethod
  def make(cls, specs, l2_P, per_task):
    num_l2 = len(l2_P)
    offsets_one, total_one = _columns(specs, 1)
    offsets, _ = _columns(specs, num_l2)
    layout = tuple((off, s.num_classes) for off, s in zip(offsets, specs))
    block_T = _block_map(layout, num_l2)
    entropy = [-(pr[pr > 0] * np.log(pr[pr > 0])).sum() for _, pr in per_task]  # the prior model's objective
    return cls(
      specs,
      l2_P,
      tuple((off, s.num_classes) for off, s in zip(offsets_one, specs)),
      total_one,
      layout,
      block_T,
      l2_P[block_T % num_l2],
      np.eye(len(specs) * num_l2, dtype=np.float32)[block_T],
      np.asarray([1.0 / max((np.asarray(s.y_train_N) >= 0).sum(), 1) for s in specs], np.float32),
      np.asarray(entropy, np.float64).repeat(num_l2),
      np.concatenate([np.tile(probe_start.prior_bias(pr), num_l2) for _, pr in per_task]).astype(np.float32),
    )

  @property
  def num_l2(self):
    return len(self.l2_P)

  @property
  def pass_layout(self):
    """(first column, classes, probes) per task, as _full_objective reads it."""
    return tuple((off, c, self.num_l2) for off, c in self.layout)


@dataclasses.dataclass(frozen=True)
class _Fit:
  """Everything the per-device fits share: the features, statistics, starts and settings."""

  x_train_NGK: object
  cols: _Columns
  mean: np.ndarray
  std: np.ndarray
  whiten: np.ndarray
  v0: np.ndarray
  b0: np.ndarray
  order: np.ndarray | None  # (steps, batch) word indices of Adam's minibatches
  forked_steps: int
  learning_rate: float
  label_scale_A: np.ndarray
  tol: float
  max_iter: int
  pass_chunk: int
  precondition: bool


@functools.partial(jax.jit, static_argnames=("n", "count"))
def _shuffles(seed, *, n, count):
  keys = jax.random.split(jax.random.PRNGKey(seed), count)
  return jax.vmap(lambda key: jax.random.permutation(key, n))(keys)


def _adam_order(n, steps, batch_size, seed):
  """Consecutive shuffles of the training words (more than one pass only when steps·batch > N)."""
  if steps <= 0:
    return None
  order = np.asarray(_shuffles(seed, n=n, count=-(-steps * batch_size // n))).reshape(-1)[: steps * batch_size]
  return order.reshape(steps, batch_size)


@functools.partial(jax.jit, static_argnames=("layout_one", "num_l2", "total_one"))
def _fork(tree, *, layout_one, num_l2, total_one):
  return _fork_columns(tree, layout_one, num_l2, total_one)


def _adam(fit, g0, g1, put):
  """Minibatch Adam from the start for groups g0..g1-1: the shared phase at the weakest λ, then the
  fork into one column block per λ and the rest of the steps with each block's own λ."""
  cols = fit.cols
  fork = functools.partial(_fork, layout_one=cols.layout_one, num_l2=cols.num_l2, total_one=cols.total_one)
  params = (put(fit.v0[g0:g1]), put(fit.b0[g0:g1]))
  if fit.order is None:
    return fork(params)
  steps = len(fit.order)
  opt_state = _adam_init(params, learning_rate=fit.learning_rate, total_steps=steps)
  stats = tuple(put(np.asarray(a[g0:g1], np.float32)) for a in (fit.mean, fit.std, fit.whiten))
  x = put(np.asarray(fit.x_train_NGK[:, g0:g1], np.float32))
  ys = tuple(put(np.asarray(s.y_train_N, np.int32)) for s in cols.specs)
  common = dict(learning_rate=fit.learning_rate, total_steps=steps)
  shared = steps - fit.forked_steps
  label_scale = put(fit.label_scale_A)
  if shared > 0:
    params, opt_state = _refine(
      params,
      opt_state,
      x,
      ys,
      put(fit.order[:shared]),
      *stats,
      put(np.full(cols.total_one, cols.l2_P[0], np.float32)),
      label_scale,
      layout=tuple((off, c, 1) for off, c in cols.layout_one),
      **common,
    )
  params, opt_state = fork((params, opt_state))
  if fit.forked_steps > 0:
    params, opt_state = _refine(
      params,
      opt_state,
      x,
      ys,
      put(fit.order[shared:]),
      *stats,
      put(cols.l2_T),
      label_scale,
      layout=cols.pass_layout,
      **common,
    )
  return params


def pass_chunk_words(n: int, groups: int, columns: int, most: int = 2048) -> int:
  """Words per chunk of a full-batch pass (see _pass_data): the fewest chunks of at most L words, L the
  power of two at or below CHUNK_LOGITS / (groups·columns) kept within [256, most], each chunk a
  multiple of 64 words (the pass timings per chunk size: docs/probing_core.md, "Measurements behind the
  constants")."""
  fit = CHUNK_LOGITS // (groups * columns)
  largest = max(1, min(most, max(1 << (max(fit, 1).bit_length() - 1), 256), n))
  chunks = -(-n // largest)
  return min(largest, 64 * -(-n // (64 * chunks)))


def _pass_data(fit, g0, g1, put):
  """The device arrays of a full pass for groups g0..g1-1: standardised features in chunks (the last
  padded), group-major, words last. A chunk's logits, softmax and their gradient are a few G·T·c
  arrays, at most CHUNK_LOGITS floats so they stay in cache (pass_chunk_words), and the words are
  spread evenly over the chunks."""
  mean, std = (np.asarray(a[g0:g1], np.float32) for a in (fit.mean, fit.std))
  xs = (np.asarray(fit.x_train_NGK[:, g0:g1], np.float32) - mean) / std
  n = xs.shape[0]
  c = pass_chunk_words(n, g1 - g0, len(fit.cols.block_T), fit.pass_chunk)
  pad = -n % c
  xs = np.concatenate([xs, np.zeros((pad,) + xs.shape[1:], np.float32)]).reshape(-1, c, *xs.shape[1:])
  ys = tuple(
    np.concatenate([np.asarray(s.y_train_N, np.int32), np.full(pad, -1, np.int32)]).reshape(-1, c)
    for s in fit.cols.specs
  )
  cols = fit.cols
  return _Pass(
    put(np.ascontiguousarray(xs.transpose(0, 2, 3, 1))),
    put(np.asarray(fit.whiten[g0:g1], np.float32)),
    tuple(put(y) for y in ys),
    put(cols.l2_T),
    put(cols.inv_count_A),
    put(cols.block_T),
    put(cols.onehot_TQ),
  )


def _lbfgs_with_refit(fit, params, data, g0, fetch, profile):
  """L-BFGS from the Adam result; a probe that ends above min(its start's objective, the class-prior
  model's) is refitted from the class prior, and if that fails too the fit fails loudly. Success is
  decided on the penalised objective, never on accuracy (an uninformative group legitimately sits at
  the majority rate)."""
  cols = fit.cols
  run = functools.partial(
    _lbfgs, data, cols=cols, tol=fit.tol, max_iter=fit.max_iter, precondition=fit.precondition, fetch=fetch
  )
  params, f, iters, conv, f_start, passes = run(
    params, np.zeros((params[1].shape[0], len(cols.prior_objective_Q)), bool)
  )
  profile["group_columns"] += passes
  bound = np.minimum(f_start, cols.prior_objective_Q[None, :])
  failed = ~(f <= bound + 1e-4 * np.abs(bound) + 1e-6)
  if failed.any() and fit.max_iter > 0:
    fail_T = failed[:, cols.block_T]
    restart = (np.where(fail_T[:, None, :], 0.0, params[0]), np.where(fail_T, cols.prior_b_T[None, :], params[1]))
    params2, f2, iters2, conv2, _, passes = run(jax.device_put(restart, data.l2_T.device), ~failed)
    profile["group_columns"] += passes
    params = (np.where(fail_T[:, None, :], params2[0], params[0]), np.where(fail_T, params2[1], params[1]))
    f, iters, conv = np.where(failed, f2, f), np.where(failed, iters + iters2, iters), np.where(failed, conv2, conv)
    failed = ~(f <= bound + 1e-4 * np.abs(bound) + 1e-6)
  if failed.any():
    g_bad, q_bad = np.argwhere(failed)[0]
    raise RuntimeError(
      f"softmax probe fit failed for {failed.sum()} probe(s), e.g. group {g0 + g_bad}, task "
      f"{cols.specs[q_bad // cols.num_l2].name}, l2 {cols.l2_P[q_bad % cols.num_l2]:g}: objective {f[g_bad, q_bad]:.6g} "
      f"is above min(start {f_start[g_bad, q_bad]:.6g}, class prior {cols.prior_objective_Q[q_bad]:.6g})"
    )
  return params, f, iters, conv


def _fit_groups(fit, g0, g1, device, fetch, profile):
  """Adam, then L-BFGS, for groups g0..g1-1 on one device: (v, b, f_GQ, iterations_GQ, converged_GQ)."""
  put = lambda a: jax.device_put(a, device)
  clock = time.perf_counter()
  params = _adam(fit, g0, g1, put)
  jax.block_until_ready(params)
  profile["adam_s"] += time.perf_counter() - clock
  clock = time.perf_counter()
  params, f, iters, conv = _lbfgs_with_refit(fit, params, _pass_data(fit, g0, g1, put), g0, fetch, profile)
  profile["lbfgs_s"] += time.perf_counter() - clock
  return (np.asarray(params[0]), np.asarray(params[1]), f, iters, conv)


def _fit_all_groups(fit, num_g, max_devices, profile):
  """Groups are independent: split over the local devices (headspec/probing/fanout.py)."""
  return fanout.over_devices(
    lambda g0, g1, device, fetch: _fit_groups(fit, g0, g1, device, fetch, profile), num_g, max_devices
  )


def _choose_on_dev(x_dev_NGK, cols, mean, std, whiten, v, b, chunk):
  """Dev accuracy of every (group, task, λ) and per task the chosen λ (ties go to the larger λ):
  {name: (acc_GP, best_G)}, and W_GKT, b_GT in standardised coordinates."""
  w_GKT = np.einsum("gkl,glc->gkc", whiten.astype(np.float32), v)
  mean_j, std_j, b_j = mean.astype(np.float32), std.astype(np.float32), b
  hits = [np.zeros((mean.shape[0], cols.num_l2)) for _ in cols.specs]
  for x, _, ys in _chunks(x_dev_NGK, [s.y_dev_N for s in cols.specs], chunk):
    for h, c in zip(hits, _dev_correct(x, ys, mean_j, std_j, w_GKT, b_j, cols.layout, cols.num_l2)):
      h += np.asarray(c)
  chosen = {}
  for s, h in zip(cols.specs, hits):
    acc = h / max((np.asarray(s.y_dev_N) >= 0).sum(), 1)
    chosen[s.name] = (acc, cols.num_l2 - 1 - np.argmax(acc[:, ::-1], axis=1))
  return chosen, np.asarray(w_GKT), np.asarray(b_j)


def _fitted(cols, mean, std, chosen, w, b, f_GQ, iters_GQ, conv_GQ, starts, profile):
  """FittedProbes of the chosen λ per (group, task)."""
  num_g = mean.shape[0]
  out = {
    key: {}
    for key in (
      "weights",
      "biases",
      "l2",
      "dev_accuracy",
      "dev_accuracy_best",
      "train_objective",
      "iterations",
      "converged",
    )
  }
  for a, (s, (off, c)) in enumerate(zip(cols.specs, cols.layout)):
    acc, best = chosen[s.name]
    col_GC = off + best[:, None] * c + np.arange(c)[None, :]
    q = a * cols.num_l2 + best
    out["weights"][s.name] = np.take_along_axis(w, col_GC[:, None, :], axis=2)
    out["biases"][s.name] = np.take_along_axis(b, col_GC, axis=1)
    out["l2"][s.name] = cols.l2_P[best]
    out["dev_accuracy"][s.name] = acc
    out["dev_accuracy_best"][s.name] = acc[np.arange(num_g), best]
    out["train_objective"][s.name] = f_GQ[np.arange(num_g), q]
    out["iterations"][s.name] = iters_GQ[np.arange(num_g), q]
    out["converged"][s.name] = conv_GQ[np.arange(num_g), q]
  return FittedProbes(
    mean.astype(np.float32),
    std.astype(np.float32),
    l2_grid=tuple(float(v) for v in cols.l2_P),
    start=starts,
    profile=profile,
    **out,
  )


def fit_softmax_probes(
  x_train_NGK,
  x_dev_NGK,
  specs: Sequence[ProbeSpec],
  *,
  l2_grid: Sequence[float] = DEFAULT_L2_GRID,
  seed: int = 0,
  refine_samples: int = 200_000,
  batch_size: int = 2048,
  learning_rate: float = 3e-2,
  fork_fraction: float = 0.25,
  cov_samples: int = 32768,
  lda_ridge: float = 1e-3,
  chunk: int = 8192,
  max_devices: int | None = None,
  tol: float = DEFAULT_TOL,
  max_iter: int = DEFAULT_MAX_ITER,
  pass_chunk: int = 2048,
  precondition: bool = True,
  choose_with: dict[str, str] | None = None,
) -> FittedProbes:
  """Fits one softmax probe per (group, task) and picks its L2 on dev; see the module docstring.

  x_train_NGK / x_dev_NGK: float features (numpy or jax), G groups of K dims (heads: K = Dh; the
  residual stream: K = D, call again). Adam takes refine_samples / batch_size steps over shuffled
  training words (several passes only if refine_samples > N; 0: none), then full-batch L-BFGS runs
  every (group, task, l2) probe until an iteration lowers its penalised objective by less than
  tol (relative), at most max_iter iterations (0: no L-BFGS). A probe whose final objective is above
  its start's or the class-prior-only model's is refitted from the class prior; if that fails too,
  RuntimeError. precondition: L-BFGS with the class-block preconditioner (where it fits in memory;
  False: the plain γ·I start, for comparisons). choose_with {name: other}: the probe `name` keeps, per group,
  the λ chosen on `other`'s dev accuracy (Hewitt & Liang 2019: a control fitted at its task's λ).
  Deterministic given `seed`.
  """
  _check(x_train_NGK, x_dev_NGK, specs)
  names = {s.name for s in specs}
  for name, other in (choose_with or {}).items():
    if name not in names or other not in names:
      raise UserError(f"choose_with {name!r}: {other!r}: both must name one of the specs {sorted(names)}")
  specs = tuple(specs)
  profile = dict(adam_s=0.0, lbfgs_s=0.0, group_columns=0)
  clock = time.perf_counter()
  l2_P = np.asarray(sorted(l2_grid), np.float32)
  mean, std, corr, per_task, sub_idx = probe_start.statistics(x_train_NGK, specs, chunk, cov_samples)
  whiten, unwhiten = probe_start.whitening(corr)
  cols = _Columns.make(specs, l2_P, per_task)
  v0, b0, kinds = probe_start.starts(x_train_NGK, cols, corr, per_task, sub_idx, mean, std, unwhiten, lda_ridge)
  profile["start_s"] = time.perf_counter() - clock
  n = x_train_NGK.shape[0]
  profile.update(words=n, groups=x_train_NGK.shape[1], width=x_train_NGK.shape[2], columns=len(cols.block_T))
  steps = refine_samples // batch_size
  frac_labelled = [max((np.asarray(s.y_train_N) >= 0).mean(), 1e-12) for s in specs]
  fit = _Fit(
    x_train_NGK,
    cols,
    mean,
    std,
    whiten,
    v0,
    b0,
    _adam_order(n, steps, batch_size, seed),
    int(round(steps * fork_fraction)) if len(l2_P) > 1 else 0,
    learning_rate,
    np.asarray([1.0 / (batch_size * f) for f in frac_labelled], np.float32),
    tol,
    max_iter,
    pass_chunk,
    precondition,
  )
  v, b, f_GQ, iters_GQ, conv_GQ = _fit_all_groups(fit, mean.shape[0], max_devices, profile)
  clock = time.perf_counter()
  chosen, w, b = _choose_on_dev(x_dev_NGK, cols, mean, std, whiten, v, b, chunk)
  chosen |= {name: (chosen[name][0], chosen[other][1]) for name, other in (choose_with or {}).items()}
  profile["dev_s"] = time.perf_counter() - clock
  return _fitted(cols, mean, std, chosen, w, b, f_GQ, iters_GQ, conv_GQ, kinds, profile)


@jax.jit
def _predict_chunk(x_cGK, mean_GK, std_GK, w_GKC, b_GC):
  xs_GcK = jnp.transpose((x_cGK - mean_GK) / std_GK, (1, 0, 2))
  return jnp.argmax(jnp.einsum("gbk,gkc->gbc", xs_GcK, w_GKC) + b_GC[:, None, :], -1).T


def predict(fitted: FittedProbes, x_NGK, spec_name: str, *, chunk: int = 8192) -> np.ndarray:
  """Predicted class pred_NG (int32) of task `spec_name` for every word and group."""
  if spec_name not in fitted.weights:
    raise UserError(f"no fitted probe named {spec_name!r}; have {sorted(fitted.weights)}")
  w, b = jnp.asarray(fitted.weights[spec_name]), jnp.asarray(fitted.biases[spec_name])
  mean, std = jnp.asarray(fitted.mean_GK), jnp.asarray(fitted.std_GK)
  out = [np.asarray(_predict_chunk(x, mean, std, w, b))[: int(wt.sum())] for x, wt, _ in _chunks(x_NGK, [], chunk)]
  return np.concatenate(out).astype(np.int32) if out else np.zeros((0, fitted.mean_GK.shape[0]), np.int32)
