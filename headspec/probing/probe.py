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
     clipped at zero), kept per probe only if its objective on a subset beats the class-prior start;
  2. minibatch Adam on the exact penalised cross-entropy from that start, over `refine_samples`
     shuffled training words, with ALL tasks × groups in the same matmuls (X_b @ W[K, Σ C]).
     Parameters live in whitened coordinates (W = R^(-1/2) V, R the feature correlation), which
     conditions the feature side of the Hessian (Böhning 1992 bounds it by ½(I − 11ᵀ/C) ⊗ R). The l2
     grid is a warm-started path: all grid values share the first (1 − fork_fraction) of the steps at
     the weakest l2, then each value continues with its own penalty;
  3. full-batch L-BFGS (`_lbfgs`) per probe until its relative decrease and its quasi-Newton decrement
     are both below `tol` (or `max_iter`), every probe with its own direction, curvature pairs, step and
     stopping test, all sharing each pass; the pass narrows to the groups and (task, λ) column blocks
     still running. A probe that ends above min(its start's objective, the class-prior model's) is
     refitted from the class prior, and the fit fails loudly if that does not help either.
Groups are independent, so on accelerators they are split over the local JAX devices and fitted
concurrently, one thread per device taking turns (`_Turns`); on a CPU host they are fitted on one
device in the calling thread (fit threads crashed jaxlib 0.10.2's CPU backend).
No library provides batched multi-task logistic regression over a group axis in JAX, hence this file.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import math
import threading
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import scipy.sparse

from headspec.errors import UserError

DEFAULT_L2_GRID = (1e-5, 1e-4, 1e-3)
DEFAULT_TOL = 1e-5  # L-BFGS stops a probe when its objective changes (and is predicted to change) by less, relatively
DEFAULT_MAX_ITER = 500  # L-BFGS iterations at most (each one pass over the training words; XPOS needs up to ~400)
_EMPTY_CLASS_BIAS = -30.0  # log-prior of a class absent from train: never predicted


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


@jax.jit
def _second_moment(x_cGK, shift_GK):
  xg_GcK = jnp.transpose(x_cGK - shift_GK, (1, 0, 2))
  return jnp.einsum("gck,gcl->gkl", xg_GcK, xg_GcK)


def floored_std(mean, std):
  """The one standard deviation used everywhere (standardising, whitening, the LDA start, arc probes).

  A feature is treated as constant (std 1, so x̂ = x − mean ≈ 0) only when its spread is below float
  resolution of its own magnitude (std ≤ 1e-6·|mean|, or exactly 0); anything else keeps its own std,
  however small, so standardised logistic regression stays invariant to rescaling a feature (a feature
  multiplied by 1e-7 is standardised to the same x̂ as before).
  """
  mean, std = np.asarray(mean, np.float64), np.asarray(std, np.float64)
  return np.where(std > 1e-6 * np.abs(mean) + 1e-30, std, 1.0)


def _statistics(x_NGK, specs, chunk, cov_samples):
  """mean, floored std (float64), the correlation of x̂ and per-task standardised class means / priors.

  One streaming pass in NumPy (XLA's CPU reductions and scatters are slower here): shifted sums and
  sums of squares, and class sums as a sparse one-hot product (nnz = N, so no factor C). The K×K
  second moment of x̂ = (x − mean)/std only whitens and shapes the LDA start, so it uses an evenly
  strided subset of about cov_samples words (a full pass would cost K times more than everything else
  here); it is standardised with the SAME mean and std as everything else (not the subset's own), so
  a near-constant feature cannot blow up one matrix and not the others. Also returns the subset's
  indices (the start is checked on them).
  """
  n = x_NGK.shape[0]
  shift_GK = np.asarray(x_NGK[: min(n, 1024)], np.float64).mean(0).astype(np.float32)
  s1, s2 = 0.0, 0.0
  sums = [0.0] * len(specs)
  counts = [
    np.bincount(np.asarray(s.y_train_N)[np.asarray(s.y_train_N) >= 0], minlength=s.num_classes).astype(np.float64)
    for s in specs
  ]
  for start in range(0, n, chunk):
    x = np.asarray(x_NGK[start : start + chunk], np.float32)
    xc = x - shift_GK
    s1 = s1 + xc.sum(0, dtype=np.float64)
    s2 = s2 + np.square(xc).sum(0, dtype=np.float64)
    flat = x.reshape(len(x), -1)
    for i, spec in enumerate(specs):
      y = np.asarray(spec.y_train_N[start : start + chunk])
      keep = np.flatnonzero(y >= 0)
      onehot = scipy.sparse.csr_matrix(
        (np.ones(len(keep), np.float32), (y[keep], keep)), shape=(spec.num_classes, len(x))
      )
      sums[i] = sums[i] + np.asarray(onehot @ flat, np.float64)
  m1 = s1 / n
  mean = shift_GK + m1
  std = floored_std(mean, np.sqrt(np.maximum(s2 / n - m1**2, 0.0)))
  sub_idx = np.arange(0, n, max(1, n // cov_samples))
  sub = np.asarray(x_NGK[sub_idx], np.float32)
  sub_m1 = (sub.mean(0, dtype=np.float64) - mean) / std
  scale = (1.0 / std).astype(np.float32)
  cov = np.asarray(_second_moment(sub * scale, (mean * scale).astype(np.float32)), np.float64) / len(sub)
  corr = cov - np.einsum("gk,gl->gkl", sub_m1, sub_m1)  # covariance of x̂ on the subset (≈ correlation)
  per_task = []
  for spec, cs, cc in zip(specs, sums, counts):
    cs = cs.reshape(spec.num_classes, *mean.shape)
    # class means in standardised coordinates; empty classes get mean 0 and prior 0
    mu_CGK = (cs / np.maximum(cc, 1.0)[:, None, None] - mean) / std * (cc > 0)[:, None, None]
    per_task.append((mu_CGK, cc / cc.sum()))
  return mean, std, corr, per_task, sub_idx


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


def _lda_start(corr_GKK, mu_CGK, prior_C, ridge):
  """Fisher LDA weights in standardised coordinates: W = Σ_w⁻¹ μ_c, b = log π_c − ½ μ_cᵀ W_c.

  Σ_w = Σ − Σ_c π_c (μ_c − μ̄)(μ_c − μ̄)ᵀ is a difference of two estimates (the total from a subset,
  the class means from every word), so it can come out indefinite: its eigenvalues are clipped at 0
  before the ridge is added (a negative one would flip or blow up the start)."""
  mbar_GK = np.einsum("c,cgk->gk", prior_C, mu_CGK)
  d_CGK = mu_CGK - mbar_GK
  # optimize=True: NumPy otherwise contracts these naively (seconds per 384-dim group; MDL refits often)
  within_GKK = corr_GKK - np.einsum("c,cgk,cgl->gkl", prior_C, d_CGK, d_CGK, optimize=True)
  evals, evecs = np.linalg.eigh(0.5 * (within_GKK + np.swapaxes(within_GKK, -1, -2)))
  inv = 1.0 / (np.maximum(evals, 0.0) + ridge)
  w_GKC = np.einsum("gkj,gj,glj,cgl->gkc", evecs, inv, evecs, mu_CGK, optimize=True)
  quad_GC = np.einsum("cgk,gkc->gc", mu_CGK, w_GKC)
  b_GC = _prior_bias(prior_C)[None, :] - 0.5 * quad_GC
  b_GC = b_GC - b_GC.max(-1, keepdims=True)
  return w_GKC, b_GC


def _prior_bias(prior_C):
  """log π_c: the class-prior-only model (W = 0), the start the LDA start must beat."""
  return np.where(prior_C > 0, np.log(np.maximum(prior_C, 1e-300)), _EMPTY_CLASS_BIAS)


@functools.partial(jax.jit, static_argnames=("num_classes",))
def _objective_G(xs_GnK, y_n, w_GKC, b_GC, l2, *, num_classes):
  """Penalised objective per group on a (sub)set of words: mean CE over labelled words + (λ/2)‖W‖²."""
  z = jnp.einsum("gnk,gkc->gnc", xs_GnK, w_GKC) + b_GC[:, None, :]
  nll = jax.nn.logsumexp(z, -1) - jnp.take_along_axis(z, jnp.maximum(y_n, 0)[None, :, None], -1)[..., 0]
  mask = (y_n >= 0).astype(z.dtype)
  return (nll * mask).sum(1) / jnp.maximum(mask.sum(), 1.0) + 0.5 * l2 * jnp.square(w_GKC).sum((1, 2))


def _columns(specs, num_l2):
  """Column layout of the packed weight matrix: task s, l2 index l occupy a block of C_s columns."""
  offsets, off = [], 0
  for s in specs:
    offsets.append(off)
    off += num_l2 * s.num_classes
  return offsets, off


def _logits_GBC(xs_GBK, whiten_GKK, v_GKC, b_GC):
  w_GKC = jnp.einsum("gkl,glc->gkc", whiten_GKK, v_GKC)
  return jnp.einsum("gbk,gkc->gbc", xs_GBK, w_GKC) + b_GC[:, None, :]


def _loss(params, xs_GBK, ys_AB, whiten_GKK, l2_P, label_scale_A, layout):
  """Σ over tasks and L2 values of the mean cross-entropy + (λ/2)‖W‖² (exact, per column block)."""
  v_GKC, b_GC = params
  logits_GBC = _logits_GBC(xs_GBK, whiten_GKK, v_GKC, b_GC)
  w_GKC = jnp.einsum("gkl,glc->gkc", whiten_GKK, v_GKC)
  total = 0.0
  num_l2 = l2_P.shape[0]
  for (off, c), y_B, scale in zip(layout, ys_AB, label_scale_A):
    z_GBPC = logits_GBC[:, :, off : off + num_l2 * c].reshape(*logits_GBC.shape[:2], num_l2, c)
    lse_GBP = jax.nn.logsumexp(z_GBPC, axis=-1)
    picked_GBP = jnp.take_along_axis(z_GBPC, jnp.maximum(y_B, 0)[None, :, None, None], axis=-1)[..., 0]
    nll = ((lse_GBP - picked_GBP) * (y_B >= 0)[None, :, None]).sum() * scale
    w_GKPC = w_GKC[:, :, off : off + num_l2 * c].reshape(*w_GKC.shape[:2], num_l2, c)
    total = total + nll + 0.5 * jnp.einsum("l,gklc->", l2_P, jnp.square(w_GKPC))
  return total


def _optimizer(learning_rate, total_steps):
  return optax.adam(optax.cosine_decay_schedule(learning_rate, max(total_steps, 1)))


@functools.partial(jax.jit, static_argnames=("layout", "learning_rate", "total_steps", "groups"))
def _refine(
  params,
  opt_state,
  x_NGK,
  ys_AN,
  order_OB,
  mean_GK,
  std_GK,
  whiten_GKK,
  l2_P,
  label_scale_A,
  *,
  layout,
  learning_rate,
  total_steps,
  groups,
):
  """Minibatch Adam over the words in order_OB (T steps of B words), cosine-decayed over total_steps,
  for the groups in range(*groups) of x_NGK (params and statistics hold just those groups)."""
  opt = _optimizer(learning_rate, total_steps)
  grad_fn = jax.grad(_loss)

  def step(carry, idx_B):
    params, opt_state = carry
    xs_GBK = jnp.transpose((x_NGK[idx_B, groups[0] : groups[1]] - mean_GK) / std_GK, (1, 0, 2))
    ys_AB = tuple(y_N[idx_B] for y_N in ys_AN)
    grads = grad_fn(params, xs_GBK, ys_AB, whiten_GKK, l2_P, label_scale_A, layout)
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


def _per_probe(a_GT, onehot_TQ):
  return a_GT @ onehot_TQ


def _vdot(p, q, onehot_TQ):
  """Per-probe inner product (G, Q) of two packed parameter pairs (v_GKT, b_GT)."""
  return _per_probe((p[0] * q[0]).sum(1) + p[1] * q[1], onehot_TQ)


def _scale(s_GQ, p, block_T):
  s_GT = s_GQ[:, block_T]
  return (p[0] * s_GT[:, None, :], p[1] * s_GT)


def _axpy(s_GQ, p, q, block_T):
  """q + s·p per probe."""
  sp = _scale(s_GQ, p, block_T)
  return (q[0] + sp[0], q[1] + sp[1])


@functools.partial(jax.jit, static_argnames=("layout", "with_grad"))
def _full_objective(
  params, x_CcGK, ys_ACc, mean_GK, std_GK, whiten_GKK, l2_T, inv_count_A, onehot_TQ, *, layout, with_grad
):
  """Exact penalised objective f_GQ of every probe (mean CE over its labelled train words + (λ/2)‖W‖²),
  and its gradient, over all training words: one pass, chunk by chunk (value and gradient accumulated
  per chunk, so no chunk's logits outlive it). layout: per label set (ys_ACc, inv_count_A) its
  (first column, classes C, probes P): P consecutive blocks of C columns; l2_T: each column's λ."""

  def ce_sum(p, xs_GBK, ys_AB):
    logits_GBT = _logits_GBC(xs_GBK, whiten_GKK, p[0], p[1])
    out = []
    for (off, c, num_p), y_B, inv in zip(layout, ys_AB, inv_count_A):
      z = logits_GBT[:, :, off : off + num_p * c].reshape(*logits_GBT.shape[:2], num_p, c)
      lse = jax.nn.logsumexp(z, axis=-1)
      picked = jnp.take_along_axis(z, jnp.maximum(y_B, 0)[None, :, None, None], axis=-1)[..., 0]
      out.append(((lse - picked) * (y_B >= 0)[None, :, None]).sum(1) * inv)  # (G, P)
    f_GQ = jnp.concatenate(out, axis=1)
    return f_GQ.sum(), f_GQ

  def penalty(p):
    w_GKT = jnp.einsum("gkl,glc->gkc", whiten_GKK, p[0])
    f_GQ = _per_probe(0.5 * l2_T * jnp.square(w_GKT).sum(1), onehot_TQ)
    return f_GQ.sum(), f_GQ

  def body(carry, chunk):
    x_cGK, ys = chunk
    xs_GcK = jnp.transpose((x_cGK - mean_GK) / std_GK, (1, 0, 2))
    if with_grad:
      (_, f_GQ), g = jax.value_and_grad(ce_sum, has_aux=True)(params, xs_GcK, ys)
      return (carry[0] + f_GQ, jax.tree_util.tree_map(jnp.add, carry[1], g)), None
    return (carry[0] + ce_sum(params, xs_GcK, ys)[1], carry[1]), None

  zero_f = jnp.zeros((mean_GK.shape[0], onehot_TQ.shape[1]), jnp.float32)
  zero_g = jax.tree_util.tree_map(jnp.zeros_like, params)
  (f_GQ, g), _ = jax.lax.scan(body, (zero_f, zero_g), (x_CcGK, ys_ACc))
  if with_grad:
    (_, pen_GQ), pen_g = jax.value_and_grad(penalty, has_aux=True)(params)
    return f_GQ + pen_GQ, jax.tree_util.tree_map(jnp.add, g, pen_g)
  return f_GQ + penalty(params)[1], None


@jax.jit
def _direction(g, history, block_T, onehot_TQ):
  """The L-BFGS direction −H·g per probe: the two-loop recursion (Nocedal & Wright 2006, Alg. 7.4) over
  `history` = (s, y, rho) stacked oldest first, with a fixed number of slots; an empty slot has rho = 0,
  so its alpha and beta are 0 and it changes nothing. One compiled call per iteration instead of ~40
  small dispatches (run eagerly, those dispatches are most of a CPU probe suite's time)."""
  (s_v, s_b), (y_v, y_b), rho_M = history
  pair = lambda v, b, m: (v[m], b[m])
  q, alphas = g, []
  for m in reversed(range(rho_M.shape[0])):
    alpha = rho_M[m] * _vdot(pair(s_v, s_b, m), q, onehot_TQ)
    q = _axpy(-alpha, pair(y_v, y_b, m), q, block_T)
    alphas.append(alpha)
  s, y, rho = pair(s_v, s_b, -1), pair(y_v, y_b, -1), rho_M[-1]
  yy = _vdot(y, y, onehot_TQ)
  gamma = jnp.where((rho > 0) & (yy > 0), _vdot(s, y, onehot_TQ) / jnp.maximum(yy, 1e-30), 1.0)
  r = _scale(gamma, q, block_T)
  for m, alpha in zip(range(rho_M.shape[0]), reversed(alphas)):
    beta = rho_M[m] * _vdot(pair(y_v, y_b, m), r, onehot_TQ)
    r = _axpy(alpha - beta, pair(s_v, s_b, m), r, block_T)
  return (-r[0], -r[1])


@jax.jit
def _push(history, s, y, rho):
  """history with (s, y, rho) appended as the newest slot and the oldest dropped."""
  shift = lambda stack, new: jnp.concatenate([stack[1:], new[None]])
  (s_v, s_b), (y_v, y_b), rho_M = history
  return (shift(s_v, s[0]), shift(s_b, s[1])), (shift(y_v, y[0]), shift(y_b, y[1])), shift(rho_M, rho)


class _Turns:
  """The per-device fit threads take turns: one at a time runs Python and dispatches (and so compiles),
  and a thread gives up its turn only while it waits for a device result (`fetch`). Dispatch is
  asynchronous, so the devices still compute concurrently. Why: fit threads compiling at once crashed
  jaxlib 0.10.2's CPU backend (a segfault in backend_compile_and_load); taking turns did not stop it on
  CPU (one thread compiling while others waited crashed too), so CPU hosts use no fit threads at all."""

  def __init__(self):
    self._lock = threading.Lock()

  @contextlib.contextmanager
  def turn(self):
    with self._lock:
      yield

  def fetch(self, x, dtype=None):
    """np.asarray(x, dtype) of a device value, waiting for it outside the turn."""
    self._lock.release()
    try:
      return jax.device_get(x) if dtype is None else np.asarray(x, dtype)
    finally:
      self._lock.acquire()


def _lbfgs(evaluate, params, block_T, onehot_TQ, *, tol, max_iter, memory=10, min_iter=3, fetch=np.asarray):
  """Full-batch L-BFGS (Nocedal & Wright 2006, Alg. 7.4/7.5), one independent problem per probe.

  Every probe (group g, task × l2 block q) has its own direction, curvature pairs, Armijo backtracking
  step and stopping test, but all probes share each pass over the data (`evaluate(params, running_GQ)
  -> f_GQ, grad`: running_GQ marks the probes still running, None all; the evaluation may skip the
  others, returning NaN for their f and 0 for their gradient, which stopped probes never read). A probe stops when its last step lowered the objective by less than tol·|f| and its
  predicted remaining decrease is below tol·|f| too (after at least min_iter iterations), or when no
  step lowers it; the loop ends when every probe has stopped or after max_iter iterations.
  fetch(x, dtype): reads a device value back (`_Turns.fetch` in the per-device threads).
  Returns (params, f_GQ, iterations_GQ, converged_GQ).
  """
  f, g = evaluate(params, None)
  f = fetch(f, np.float64)
  shape = f.shape
  done = np.zeros(shape, bool)
  iters = np.zeros(shape, np.int32)
  last_decrease = np.full(shape, np.inf)
  zeros = lambda p: jnp.zeros((memory, *p.shape), p.dtype)
  history = ((zeros(g[0]), zeros(g[1])), (zeros(g[0]), zeros(g[1])), jnp.zeros((memory, *shape), jnp.float32))
  for _ in range(max_iter):
    if done.all():
      break
    d = _direction(g, history, block_T, onehot_TQ)
    slope = fetch(_vdot(g, d, onehot_TQ), np.float64)
    bad = ~(slope < 0)
    if bad.any():  # not a descent direction: steepest descent for that probe
      bad_j = jnp.asarray(bad)
      d = (
        jnp.where(bad_j[:, block_T][:, None, :], -g[0], d[0]),
        jnp.where(bad_j[:, block_T], -g[1], d[1]),
      )
      slope = fetch(_vdot(g, d, onehot_TQ), np.float64)
    # Stopping test (per probe): the last step lowered f by less than tol·|f| AND the quasi-Newton
    # decrement −½ gᵀd (≈ f − f*, Boyd & Vandenberghe 2004, §9.5) is below tol·|f| too, after at
    # least `min_iter` iterations (so the curvature pairs say something).
    small = (last_decrease <= tol * np.abs(f)) & (-0.5 * slope <= tol * np.abs(f)) & (iters >= min_iter)
    done |= small
    if done.all():
      break
    t = np.where(done, 0.0, 1.0)
    accepted = done.copy()
    for _ in range(12):  # Armijo backtracking, per probe
      trial = _axpy(jnp.asarray(t, jnp.float32), d, params, block_T)
      f_new, g_new = evaluate(trial, ~done)
      f_new = fetch(f_new, np.float64)
      # (slack: the float32 objective is summed over many words, resolution ~1e-6 relative)
      ok = np.isfinite(f_new) & (f_new <= f + 1e-4 * t * slope + 1e-6 * np.abs(f))
      accepted |= ok
      if accepted.all():
        break
      t = np.where(accepted, t, 0.5 * t)
    t = np.where(accepted, t, 0.0)  # no step lowers the objective: the probe stops where it is
    if not accepted.all():
      trial = _axpy(jnp.asarray(t, jnp.float32), d, params, block_T)
      f_new, g_new = evaluate(trial, ~done)
      f_new = fetch(f_new, np.float64)
    s = (trial[0] - params[0], trial[1] - params[1])
    y = (g_new[0] - g[0], g_new[1] - g[1])
    sy = _vdot(s, y, onehot_TQ)
    rho = jnp.where(sy > 1e-12, 1.0 / jnp.maximum(sy, 1e-12), 0.0)
    history = _push(history, s, y, rho)
    moving = ~done
    iters += moving
    last_decrease = np.where(moving, f - f_new, last_decrease)
    params, f, g = trial, np.where(done, f, f_new), g_new
    done |= moving & (t == 0)
  return params, f, iters, done


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
  pass_chunk: int = 4096,
) -> FittedProbes:
  """Fits one softmax probe per (group, task) and picks its L2 on dev; see the module docstring.

  x_train_NGK / x_dev_NGK: float features (numpy or jax), G groups of K dims (heads: K = Dh; the
  residual stream: K = D, call again). Adam takes refine_samples / batch_size steps over shuffled
  training words (several passes only if refine_samples > N; 0: none), then full-batch L-BFGS runs
  every (group, task, l2) probe until an iteration lowers its penalised objective by less than
  tol (relative), at most max_iter iterations (0: no L-BFGS). A probe whose final objective is above
  its start's or the class-prior-only model's is refitted from the class prior; if that fails too,
  RuntimeError. Deterministic given `seed`.
  """
  _check(x_train_NGK, x_dev_NGK, specs)
  specs = tuple(specs)
  l2_P = np.asarray(sorted(l2_grid), np.float32)
  num_l2 = len(l2_P)
  mean, std, corr, per_task, sub_idx = _statistics(x_train_NGK, specs, chunk, cov_samples)
  num_g, k = mean.shape

  # Whitening A = (R + εI)^(-1/2) of the feature covariance R (of x̂), per group.
  evals, evecs = np.linalg.eigh(corr + 1e-6 * np.eye(k))
  evals = np.maximum(evals, 1e-4 * np.maximum(evals.max(-1, keepdims=True), 1e-12))
  whiten = np.einsum("gkj,gj,glj->gkl", evecs, evals**-0.5, evecs)
  unwhiten = np.einsum("gkj,gj,glj->gkl", evecs, evals**0.5, evecs)

  # Packed columns: first one block per task (shared phase at the weakest l2), later num_l2 blocks.
  offsets_one, total_one = _columns(specs, 1)
  layout_one = tuple((off, s.num_classes) for off, s in zip(offsets_one, specs))
  offsets, total_c = _columns(specs, num_l2)
  layout = tuple((off, s.num_classes) for off, s in zip(offsets, specs))
  v0 = np.zeros((num_g, k, total_one), np.float32)
  b0 = np.zeros((num_g, total_one), np.float32)
  xs_sub = jnp.asarray(
    np.transpose((np.asarray(x_train_NGK[sub_idx], np.float32) - mean) / std, (1, 0, 2)), jnp.float32
  )
  starts = {}
  for s, (off, c), (mu, prior) in zip(specs, layout_one, per_task):
    w, b = _lda_start(corr, mu, prior, lda_ridge)
    prior_b = np.broadcast_to(_prior_bias(prior), b.shape)
    y_sub = jnp.asarray(np.asarray(s.y_train_N)[sub_idx], jnp.int32)
    f_lda, f_prior = (
      np.asarray(
        _objective_G(
          xs_sub, y_sub, jnp.asarray(ww, jnp.float32), jnp.asarray(bb, jnp.float32), float(l2_P[0]), num_classes=c
        )
      )
      for ww, bb in ((w, b), (np.zeros_like(w), prior_b))
    )
    use_lda = np.isfinite(f_lda) & (f_lda <= f_prior)  # else the class-prior start (W = 0)
    starts[s.name] = np.where(use_lda, "lda", "prior")
    v0[:, :, off : off + c] = np.einsum("gkl,glc->gkc", unwhiten, w) * use_lda[:, None, None]
    b0[:, off : off + c] = np.where(use_lda[:, None], b, prior_b)
  xs_sub = None

  n = x_train_NGK.shape[0]
  steps = refine_samples // batch_size
  forked_steps = int(round(steps * fork_fraction)) if num_l2 > 1 else 0
  opt = _optimizer(learning_rate, steps)
  if steps > 0:
    # consecutive shuffles of the training words (more than one pass only when refine_samples > N)
    keys = jax.random.split(jax.random.PRNGKey(seed), -(-steps * batch_size // n))
    order = np.concatenate([np.asarray(jax.random.permutation(key, n)) for key in keys])[: steps * batch_size]
    order = order.reshape(steps, batch_size)
  frac_labelled = [max((np.asarray(s.y_train_N) >= 0).mean(), 1e-12) for s in specs]
  label_scale = np.asarray([1.0 / (batch_size * f) for f in frac_labelled], np.float32)
  inv_count = np.asarray([1.0 / max((np.asarray(s.y_train_N) >= 0).sum(), 1) for s in specs], np.float32)
  # the class-prior-only model's objective (W = 0, b = log prior): the train label entropy
  prior_objective = np.asarray([-(pr[pr > 0] * np.log(pr[pr > 0])).sum() for _, pr in per_task], np.float64).repeat(
    num_l2
  )
  block_T = _block_map(layout, num_l2)
  l2_T = l2_P[block_T % num_l2]  # each packed column's λ
  onehot_TQ = np.eye(len(specs) * num_l2, dtype=np.float32)[block_T]
  prior_b0 = np.concatenate([np.tile(_prior_bias(pr), num_l2) for _, pr in per_task]).astype(np.float32)

  turns = _Turns()

  def fit_groups(g0, g1, device):
    with turns.turn():
      return fit_groups_in_turn(g0, g1, device)

  def fit_groups_in_turn(g0, g1, device):
    """Adam, then L-BFGS, for groups g0..g1-1 on one device (a CPU device runs one program at a time)."""
    fetch = turns.fetch
    put = lambda a: jax.device_put(a, device)
    params = (put(v0[g0:g1]), put(b0[g0:g1]))
    opt_state = opt.init(params)
    stats = tuple(put(np.asarray(a[g0:g1], np.float32)) for a in (mean, std, whiten))
    x_part = np.asarray(x_train_NGK[:, g0:g1], np.float32)
    ys = [np.asarray(s.y_train_N, np.int32) for s in specs]
    # the full-batch passes read the training words in chunks of pass_chunk (the last padded, label -1)
    c = min(pass_chunk, n)
    pad = -n % c
    x_chunks = put(
      np.concatenate([x_part, np.zeros((pad,) + x_part.shape[1:], np.float32)]).reshape(-1, c, *x_part.shape[1:])
    )
    y_chunks = tuple(put(np.concatenate([y, np.full(pad, -1, np.int32)]).reshape(-1, c)) for y in ys)
    full = functools.partial(
      _full_objective,
      x_CcGK=x_chunks,
      ys_ACc=y_chunks,
      mean_GK=stats[0],
      std_GK=stats[1],
      whiten_GKK=stats[2],
      l2_T=put(l2_T),
      inv_count_A=put(inv_count),
      onehot_TQ=put(onehot_TQ),
      layout=tuple((off, c, num_l2) for off, c in layout),
    )
    f_start = fetch(full(_fork_columns(params, layout_one, num_l2, total_one), with_grad=False)[0], np.float64)
    if steps > 0:
      x_dev = put(x_part)
      data = (tuple(put(y) for y in ys), put(order), put(label_scale))
      common = dict(learning_rate=learning_rate, total_steps=steps, groups=(0, g1 - g0))
      if steps - forked_steps > 0:
        params, opt_state = _refine(
          params,
          opt_state,
          x_dev,
          data[0],
          data[1][: steps - forked_steps],
          *stats,
          put(l2_P[:1]),
          data[2],
          layout=layout_one,
          **common,
        )
      params, opt_state = _fork_columns((params, opt_state), layout_one, num_l2, total_one)
      if forked_steps > 0:
        params, opt_state = _refine(
          params,
          opt_state,
          x_dev,
          data[0],
          data[1][steps - forked_steps :],
          *stats,
          put(l2_P),
          data[2],
          layout=layout,
          **common,
        )
      x_dev = None
    else:
      params = _fork_columns(params, layout_one, num_l2, total_one)

    def narrowing_evaluate():
      """A fresh `evaluate` for one L-BFGS run: its pass starts with every group and probe."""
      pass_now = {"groups": np.arange(g1 - g0), "probes": np.arange(len(specs) * num_l2), "fn": None}

      def evaluate(p, running_GQ):
        """f_GQ and the gradient, computed on the probes still running (and the others of their pass):
        once the running groups × columns are at most 3/4 of those in the pass, the pass narrows to the
        groups with a probe running and the (task, λ) column blocks with one running. XPOS (50 classes)
        at the weakest λ often runs hundreds of iterations after UPOS or a stronger λ has stopped, and
        each pass costs N·K per group and column; the 3/4 bounds the recompilations a fit makes."""
        groups = np.flatnonzero(running_GQ.any(1)) if running_GQ is not None else pass_now["groups"]
        probes = np.flatnonzero(running_GQ[groups].any(0)) if running_GQ is not None else pass_now["probes"]
        width = lambda qs: sum(layout[q // num_l2][1] for q in qs)
        if len(groups) * width(probes) <= 0.75 * len(pass_now["groups"]) * width(pass_now["probes"]):
          blocks = []  # [task, first λ index, λ count]: runs of consecutive λ blocks of one task
          for q in probes:
            a, lam = divmod(int(q), num_l2)
            if blocks and blocks[-1][0] == a and sum(blocks[-1][1:]) == lam:
              blocks[-1][2] += 1
            else:
              blocks.append([a, lam, 1])
          cols = np.concatenate(
            [layout[a][0] + np.arange(lam * layout[a][1], (lam + n) * layout[a][1]) for a, lam, n in blocks]
          )
          starts = np.cumsum([0] + [n * layout[a][1] for a, _, n in blocks[:-1]]).tolist()
          g = put(groups)
          pass_now.update(
            groups=groups,
            probes=probes,
            cols=put(cols),
            fn=functools.partial(
              full,
              x_CcGK=x_chunks[:, :, g],  # one copy of the running groups' x at a time
              mean_GK=stats[0][g],
              std_GK=stats[1][g],
              whiten_GKK=stats[2][g],
              ys_ACc=tuple(y_chunks[a] for a, _, _ in blocks),
              l2_T=put(l2_T[cols]),
              inv_count_A=put(inv_count[[a for a, _, _ in blocks]]),
              onehot_TQ=put(onehot_TQ[np.ix_(cols, probes)]),
              layout=tuple((start, layout[a][1], n) for start, (a, _, n) in zip(starts, blocks)),
            ),
          )
        if pass_now["fn"] is None:
          return full(p, with_grad=True)
        groups, probes, cols = pass_now["groups"], pass_now["probes"], pass_now["cols"]
        g = put(groups)
        f_sub, (gv, gb) = pass_now["fn"]((p[0][g][:, :, cols], p[1][g][:, cols]), with_grad=True)
        f_GQ = np.full((g1 - g0, len(specs) * num_l2), np.nan)
        f_GQ[np.ix_(groups, probes)] = fetch(f_sub, np.float64)
        zv, zb = (
          jnp.zeros((len(groups),) + p[0].shape[1:], p[0].dtype),
          jnp.zeros((len(groups), p[1].shape[1]), p[1].dtype),
        )
        gv, gb = zv.at[:, :, cols].set(gv), zb.at[:, cols].set(gb)
        return f_GQ, (jnp.zeros_like(p[0]).at[g].set(gv), jnp.zeros_like(p[1]).at[g].set(gb))

      return evaluate

    if max_iter > 0:
      params, f, iters, conv = _lbfgs(
        narrowing_evaluate(), params, block_T, put(onehot_TQ), tol=tol, max_iter=max_iter, fetch=fetch
      )
    else:
      f, iters, conv = (
        fetch(full(params, with_grad=False)[0], np.float64),
        np.zeros(f_start.shape, np.int32),
        np.zeros(f_start.shape, bool),
      )
    # Success is decided on the penalised objective, never on accuracy (an uninformative group
    # legitimately sits at the majority rate): the fit must end no worse than its start and than the
    # class-prior-only model.
    bound = np.minimum(f_start, prior_objective[None, :])
    failed = ~(f <= bound + 1e-4 * np.abs(bound) + 1e-6)
    if failed.any() and max_iter > 0:
      fail_T = jnp.asarray(failed[:, block_T])
      restart = (
        jnp.where(fail_T[:, None, :], 0.0, params[0]),
        jnp.where(fail_T, put(prior_b0)[None, :], params[1]),
      )
      params2, f2, iters2, conv2 = _lbfgs(
        narrowing_evaluate(), restart, block_T, put(onehot_TQ), tol=tol, max_iter=max_iter, fetch=fetch
      )
      params = (jnp.where(fail_T[:, None, :], params2[0], params[0]), jnp.where(fail_T, params2[1], params[1]))
      f, iters, conv = np.where(failed, f2, f), np.where(failed, iters + iters2, iters), np.where(failed, conv2, conv)
      failed = ~(f <= bound + 1e-4 * np.abs(bound) + 1e-6)
    if failed.any():
      g_bad, q_bad = np.argwhere(failed)[0]
      raise RuntimeError(
        f"softmax probe fit failed for {failed.sum()} probe(s), e.g. group {g0 + g_bad}, task "
        f"{specs[q_bad // num_l2].name}, l2 {l2_P[q_bad % num_l2]:g}: objective {f[g_bad, q_bad]:.6g} is above "
        f"min(start {f_start[g_bad, q_bad]:.6g}, class prior {prior_objective[q_bad]:.6g})"
      )
    return fetch(params) + (f, iters, conv)

  # Groups are independent: split them over the local accelerator devices.
  devices = jax.local_devices()[: max(1, min(num_g, max_devices or num_g))]
  if devices[0].platform == "cpu":
    # On CPU hosts one device, fitted in the calling thread: the per-device fit threads crashed
    # jaxlib 0.10.2's CPU backend (a segfault while compiling an L-BFGS program, 2 of 4 full test runs).
    devices = devices[:1]
  bounds = np.linspace(0, num_g, len(devices) + 1).round().astype(int)
  if len(devices) == 1:
    parts = [fit_groups(0, num_g, devices[0])]
  else:
    with concurrent.futures.ThreadPoolExecutor(len(devices)) as pool:
      parts = list(pool.map(fit_groups, bounds[:-1], bounds[1:], devices))
  params = tuple(jnp.concatenate([p[i] for p in parts]) for i in range(2))
  f_GQ, iters_GQ, conv_GQ = (np.concatenate([p[i] for p in parts]) for i in (2, 3, 4))
  mean_j, std_j = jnp.asarray(mean, jnp.float32), jnp.asarray(std, jnp.float32)
  whiten_j = jnp.asarray(whiten, jnp.float32)
  w_GKC = jnp.einsum("gkl,glc->gkc", whiten_j, params[0])
  b_GC = params[1]

  # Dev accuracy of every (group, task, l2); ties go to the larger l2.
  hits = [np.zeros((num_g, num_l2)) for _ in specs]
  for x, _, ys in _chunks(x_dev_NGK, [s.y_dev_N for s in specs], chunk):
    for h, c in zip(hits, _dev_correct(x, ys, mean_j, std_j, w_GKC, b_GC, layout, num_l2)):
      h += np.asarray(c)
  w_np, b_np = np.asarray(w_GKC), np.asarray(b_GC)
  weights, biases, l2, dev_acc, dev_best = {}, {}, {}, {}, {}
  objective, iterations, converged = {}, {}, {}
  for a, (s, (off, c), h) in enumerate(zip(specs, layout, hits)):
    acc = h / max((np.asarray(s.y_dev_N) >= 0).sum(), 1)
    best = num_l2 - 1 - np.argmax(acc[:, ::-1], axis=1)
    cols = off + best[:, None] * c + np.arange(c)[None, :]  # (G, C)
    weights[s.name] = np.take_along_axis(w_np, cols[:, None, :], axis=2)
    biases[s.name] = np.take_along_axis(b_np, cols, axis=1)
    l2[s.name] = l2_P[best]
    dev_acc[s.name] = acc
    dev_best[s.name] = acc[np.arange(num_g), best]
    q = a * num_l2 + best
    objective[s.name] = f_GQ[np.arange(num_g), q]
    iterations[s.name] = iters_GQ[np.arange(num_g), q]
    converged[s.name] = conv_GQ[np.arange(num_g), q]
  return FittedProbes(
    mean.astype(np.float32),
    std.astype(np.float32),
    weights,
    biases,
    l2,
    dev_acc,
    dev_best,
    tuple(float(v) for v in l2_P),
    objective,
    iterations,
    converged,
    starts,
  )


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
