"""The softmax probes' full-batch objective, its class-block preconditioner, and the probes as problems of
the batched L-BFGS engine (headspec/probing/lbfgs.py): stage 3 of the fit.

`softmax_ce` and `_full_objective`: the exact penalised cross-entropy of every (group, task, λ) probe in
one pass over the training words; `_curvature_blocks`, `_preconditioner`, `_SharedBlocks`: the Hessian's
class blocks, inverted; `ProbeProblem`: all of it as the engine's problems, narrowing to the probes still
running. The method: headspec/probing/probe.py's docstring.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from headspec.probing import lbfgs

# Preconditioned L-BFGS (see _preconditioner): the class blocks are recomputed every PRECONDITION_EVERY
# iterations from about PRECONDITION_WORDS training words, where it pays (ProbeProblem._preconditioned): a
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


def block_map(layout, num_l2):
  """block_T: the probe (task, l2) index q = a·P + l of every packed column (layout: per-P blocks)."""
  block_T = []
  for a, (_, c) in enumerate(layout):
    for l in range(num_l2):
      block_T += [a * num_l2 + l] * c
  return np.asarray(block_T, np.int32)


class Pass(NamedTuple):
  """The device arrays of a full-batch pass over the training words for some groups: xs_CGKc, the
  standardised features in chunks of c words (the last padded with label -1), group-major and words
  last, as each chunk's matmuls and softmax read them (softmax_ce); whiten_GKK per group; the rest per
  column (l2_T), per label set (ys_ACc, inv_count_A) or mapping columns to probes (block_T, onehot_TQ)."""

  xs_CGKc: jax.Array
  whiten_GKK: jax.Array
  ys_ACc: tuple
  l2_T: jax.Array
  inv_count_A: jax.Array
  block_T: jax.Array
  onehot_TQ: jax.Array


def softmax_ce(xs_GKB, w_GKT, b_GT, ys_AB, scale_A, layout, with_grad):
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
  the gradient xsᵀ·dz) and one exp per logit (softmax_ce). layout: per label set its (first
  column, classes C, probes P): P consecutive blocks of C columns. Traced inside the compiled L-BFGS
  calls below."""
  v_GKT, b_GT = params
  w_GKT = jnp.einsum("gkl,glc->gkc", data.whiten_GKK, v_GKT)

  def body(carry, chunk):
    xs_GKc, ys = chunk
    f_GQ, grad = softmax_ce(xs_GKc, w_GKT, b_GT, ys, data.inv_count_A, layout, with_grad)
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


class ProbeProblem(lbfgs.Problem):
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
    data = Pass(
      xs,
      whiten,
      tuple(base.ys_ACc[a] for a, _, _ in runs),
      put(cols.l2_T[col_T]),
      put(cols.inv_count_A[[a for a, _, _ in runs]]),
      put(np.searchsorted(problems, cols.block_T[col_T]).astype(np.int32)),
      put(cols.onehot_TQ[np.ix_(col_T, problems)]),
    )
    return data, _SoftmaxLoss(layout)
