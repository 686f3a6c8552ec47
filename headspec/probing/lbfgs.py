"""Batched full-batch L-BFGS: many independent smooth minimisations that share each pass over their data.

The problems sit on two axes. Groups G are rows: the leading axis of every parameter array. Columns T are
the last axis, and each column belongs to one problem q of Q per group (`block_T`, (T,) int32, and its
one-hot `onehot_TQ`, which the caller's data carries). A parameter set is any pytree of (G, ..., T)
arrays. Problem (g, q) gets its own two-loop direction, curvature pairs, Armijo step and stopping test
(Nocedal & Wright 2006, Alg. 7.4/7.5), but every problem shares each pass, which the caller's loss
computes for all of them at once. One iteration, line search included, is one compiled call (`_lbfgs_step`)
and one read of which problems are still running. Stopped problems stay in the pass, masked, so the
shapes are fixed and nothing recompiles as problems stop. Once the groups × columns that still have a
problem running (groups padded with finished ones to a power of two) are at most 3/4 of those in the
pass, and the saving is worth a compile (`narrowing_cost`), the state and the data are gathered to them
(`Problem.columns`, `Problem.restrict`). Each narrowing cuts the pass by a quarter, so a run compiles
the step for at most 1 + log_{4/3}(G·T) shapes however many iterations it makes.

This module knows nothing about the caller's models: `Problem` is the whole interface (the softmax
probes are one caller: headspec/probing/probe_objective.py's `ProbeProblem`).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np


class Problem:
  """The caller's side of a run: its data, its loss and how to narrow and precondition it.

  data: a pytree that the loss reads, with `block_T` (each column's problem, int32 (T,)) and `onehot_TQ`
  (float32 (T, Q)) among its attributes, on the device the run uses.
  loss: a hashable value (a static argument of the compiled step) that is called as
  loss(params, data) -> (f_GQ, grad), the objective of every problem and its gradient (a pytree shaped like
  params); with a preconditioner, loss.precondition(m, p) is M·p for a pytree p shaped like params.
  refresh_every: every how many iterations `preconditioner` recomputes M (H₀ = γ·M, Nocedal & Wright
  2006, §7.2); 0: none, H₀ = γ·I. refresh_narrowed: whether M is also recomputed once the pass has narrowed.
  pass_cost: the multiply-adds of one pass per group × column (what narrowing saves); 0: never narrow.
  """

  data: Any
  loss: Any
  refresh_every: int = 0
  refresh_narrowed: bool = True
  pass_cost: float = 0.0

  def preconditioner(self, params, data, loss):
    """M at `params` for the pass `data` (loss: that pass's loss)."""
    raise NotImplementedError

  def narrow_preconditioner(self, m, row_pos, col_pos, problem_pos, put):
    """M of the rows, columns and problems kept (positions in the current pass), on the device (put)."""
    raise NotImplementedError

  def columns(self, problems):
    """(col_T, key): the columns of the problems `problems` (sorted ids q), ascending, and whatever
    `restrict` needs to build their pass."""
    raise NotImplementedError

  def restrict(self, rows, problems, col_T, key):
    """(data, loss) of the pass over the groups `rows` and the problems `problems` (columns col_T)."""
    raise NotImplementedError


class State(NamedTuple):
  """L-BFGS state, every array with the group axis first (so dropping finished groups is one gather):
  params and gradient, f_GQ, the last `memory` curvature pairs oldest first (s, y: params' leaves with a
  slot axis second, (G, M, ..., T); rho_GMQ, an empty slot has rho 0), per problem done, iterations and
  the decrease of its objective in its last iteration, and the caller's preconditioner (or None)."""

  params: Any
  f_GQ: jax.Array
  grad: Any
  s_hist: Any
  y_hist: Any
  rho_GMQ: jax.Array
  done_GQ: jax.Array
  iters_GQ: jax.Array
  last_GQ: jax.Array
  precond: Any = None


class Result(NamedTuple):
  """Host arrays: params (the input's pytree), final and starting f_GQ, iterations_GQ, converged_GQ, and
  Σ over the passes made of groups × columns in the pass."""

  params: Any
  f: np.ndarray
  iterations: np.ndarray
  converged: np.ndarray
  f_start: np.ndarray
  group_columns: int


def per_problem(a_GT, onehot_TQ):
  """Σ over each problem's columns: (G, T) -> (G, Q)."""
  return a_GT @ onehot_TQ


def _by_column(s_GT, a):
  """s_GT broadcast against a parameter leaf (G, ..., T)."""
  return s_GT if a.ndim == 2 else s_GT[(slice(None),) + (None,) * (a.ndim - 2) + (slice(None),)]


def _vdot(p, q, onehot_TQ):
  """Per-problem inner product (G, Q) of two parameter pytrees."""
  total = None
  for a, b in zip(jax.tree_util.tree_leaves(p), jax.tree_util.tree_leaves(q)):
    part = (a * b).sum(tuple(range(1, a.ndim - 1))) if a.ndim > 2 else a * b
    total = part if total is None else total + part
  return per_problem(total, onehot_TQ)


def _scale(s_GQ, p, block_T):
  s_GT = s_GQ[:, block_T]
  return jax.tree_util.tree_map(lambda a: a * _by_column(s_GT, a), p)


def _axpy(s_GQ, p, q, block_T):
  """q + s·p per problem."""
  return jax.tree_util.tree_map(lambda a, b: a + b, q, _scale(s_GQ, p, block_T))


@functools.partial(jax.jit, static_argnames=("loss", "memory"))
def _init_state(params, data, done_GQ, *, loss, memory):
  """The state at `params` (one pass); problems marked done_GQ never move."""
  f, g = loss(params, data)
  hist = lambda p: jnp.zeros((p.shape[0], memory, *p.shape[1:]), p.dtype)
  return State(
    params,
    f,
    g,
    jax.tree_util.tree_map(hist, g),
    jax.tree_util.tree_map(hist, g),
    hist(f),
    done_GQ,
    jnp.zeros(f.shape, jnp.int32),
    jnp.full(f.shape, jnp.inf, jnp.float32),
  )


def _direction(state, block_T, onehot_TQ, loss):
  """The L-BFGS direction −H·g per problem: the two-loop recursion (Nocedal & Wright 2006, Alg. 7.4) over
  a fixed number of slots, each loop a lax.scan (small programs compile fast); an empty slot has
  rho = 0, so its alpha and beta are 0 and it changes nothing. H₀ = γ·M with the state's
  preconditioner M (γ·I without one), γ = sᵀy / yᵀMy from the newest pair (1 before any)."""
  treedef = jax.tree_util.tree_structure(state.grad)
  slots = lambda a: jnp.moveaxis(a, 1, 0)  # (G, M, ...) -> (M, G, ...)
  s_leaves = [slots(a) for a in jax.tree_util.tree_leaves(state.s_hist)]
  y_leaves = [slots(a) for a in jax.tree_util.tree_leaves(state.y_hist)]
  hist = (*s_leaves, *y_leaves, slots(state.rho_GMQ))
  n = len(s_leaves)
  tree = lambda leaves: jax.tree_util.tree_unflatten(treedef, leaves)

  def newest_first(q, slot):
    s, y, rho = tree(slot[:n]), tree(slot[n : 2 * n]), slot[-1]
    alpha = rho * _vdot(s, q, onehot_TQ)
    return _axpy(-alpha, y, q, block_T), alpha

  q, alphas = jax.lax.scan(newest_first, state.grad, hist, reverse=True)
  s, y, newest = tree([a[-1] for a in hist[:n]]), tree([a[-1] for a in hist[n : 2 * n]]), hist[-1][-1]
  h0 = (lambda p: p) if state.precond is None else (lambda p: loss.precondition(state.precond, p))
  yy = _vdot(y, h0(y), onehot_TQ)
  gamma = jnp.where((newest > 0) & (yy > 0), _vdot(s, y, onehot_TQ) / jnp.maximum(yy, 1e-30), 1.0)
  q = h0(q)

  def oldest_first(r, slot):
    slot, alpha = slot
    s, y, rho = tree(slot[:n]), tree(slot[n : 2 * n]), slot[-1]
    beta = rho * _vdot(y, r, onehot_TQ)
    return _axpy(alpha - beta, s, r, block_T), None

  r, _ = jax.lax.scan(oldest_first, _scale(gamma, q, block_T), (hist, alphas))
  return jax.tree_util.tree_map(lambda a: -a, r)


def _line_search(state, d, slope_GQ, done_GQ, data, *, loss, max_trials):
  """Armijo backtracking per problem (t = 1, ½, ¼, ... ; done problems t = 0), all problems sharing each
  trial pass, in one lax.while_loop. After max_trials trials, a problem that none lowered goes back to
  t = 0 (one more pass, so every problem's f and gradient are those of its accepted point). Returns
  (trial params, f, gradient, t_GQ, passes made)."""
  f = state.f_GQ
  at = lambda t: _axpy(t, d, state.params, data.block_T)
  # (slack: a float32 objective summed over many terms has resolution ~1e-6 relative)
  bound = lambda t: f + 1e-4 * t * slope_GQ + 1e-6 * jnp.abs(f)

  def trial(carry):
    t, accepted, _, _, k = carry
    give_up = k == max_trials
    t = jnp.where(give_up & ~accepted, 0.0, t)
    f_new, g_new = loss(at(t), data)
    accepted = accepted | give_up | (jnp.isfinite(f_new) & (f_new <= bound(t)))
    return jnp.where(accepted, t, 0.5 * t), accepted, f_new, g_new, k + 1

  t0 = jnp.where(done_GQ, 0.0, 1.0).astype(jnp.float32)
  carry = (t0, done_GQ, f, state.grad, jnp.int32(0))
  t, _, f_new, g_new, k = jax.lax.while_loop(lambda c: ~c[1].all(), trial, carry)
  return at(t), f_new, g_new, t, k


@functools.partial(jax.jit, static_argnames=("loss", "tol", "min_iter", "max_trials"))
def _lbfgs_step(state, data, *, loss, tol, min_iter=3, max_trials=12):
  """One L-BFGS iteration of every problem, line search included, as one compiled call: returns the new
  state, the passes over the data it made and which problems still run. A problem stops when its last
  step lowered f by less than tol·|f| AND the quasi-Newton decrement −½gᵀd (≈ f − f*, Boyd & Vandenberghe
  2004, §9.5) is below tol·|f| too, after at least min_iter iterations (so the curvature pairs say
  something), or when no step lowers it. A direction that is not a descent direction is replaced by
  steepest descent."""
  g, block_T, onehot_TQ = state.grad, data.block_T, data.onehot_TQ
  d = _direction(state, block_T, onehot_TQ, loss)
  bad_T = ~(_vdot(g, d, onehot_TQ) < 0)[:, block_T]
  d = jax.tree_util.tree_map(lambda gg, dd: jnp.where(_by_column(bad_T, gg), -gg, dd), g, d)
  slope = _vdot(g, d, onehot_TQ)
  f = state.f_GQ
  small = (state.last_GQ <= tol * jnp.abs(f)) & (-0.5 * slope <= tol * jnp.abs(f)) & (state.iters_GQ >= min_iter)
  done = state.done_GQ | small
  trial, f_new, g_new, t, passes = _line_search(state, d, slope, done, data, loss=loss, max_trials=max_trials)
  s = jax.tree_util.tree_map(lambda a, b: a - b, trial, state.params)
  y = jax.tree_util.tree_map(lambda a, b: a - b, g_new, g)
  sy = _vdot(s, y, onehot_TQ)
  push = lambda stack, new: jnp.concatenate([stack[:, 1:], new[:, None]], axis=1)
  moving = ~done
  new = State(
    trial,
    jnp.where(done, f, f_new),
    g_new,
    jax.tree_util.tree_map(push, state.s_hist, s),
    jax.tree_util.tree_map(push, state.y_hist, y),
    push(state.rho_GMQ, jnp.where(sy > 1e-12, 1.0 / jnp.maximum(sy, 1e-12), 0.0)),
    done | (moving & (t == 0)),
    state.iters_GQ + moving,
    jnp.where(moving, f - f_new, state.last_GQ),
    state.precond,
  )
  return new, passes, ~new.done_GQ


def _narrow_state(problem, state, row_pos, col_pos, problem_pos, put):
  """The state of the rows, columns and problems kept (positions in the current state), gathered on
  the host (a few small arrays; a compiled gather would compile once per shape)."""
  state = jax.device_get(state)
  by_col = lambda a: put(a[row_pos][..., col_pos])
  by_problem = lambda a: put(a[row_pos][..., problem_pos])
  m = state.precond
  return State(
    jax.tree_util.tree_map(by_col, state.params),
    by_problem(state.f_GQ),
    jax.tree_util.tree_map(by_col, state.grad),
    jax.tree_util.tree_map(by_col, state.s_hist),
    jax.tree_util.tree_map(by_col, state.y_hist),
    by_problem(state.rho_GMQ),
    by_problem(state.done_GQ),
    by_problem(state.iters_GQ),
    by_problem(state.last_GQ),
    None if m is None else problem.narrow_preconditioner(m, row_pos, col_pos, problem_pos, put),
  )


def _pow2_at_least(n):
  return 1 << max(0, int(n) - 1).bit_length()


def minimize(
  problem: Problem,
  params,
  done_GQ: np.ndarray,
  *,
  tol: float,
  max_iter: int,
  fetch=jax.device_get,
  memory: int = 10,
  narrowing_cost: float = math.inf,
) -> Result:
  """L-BFGS of every problem from `params` (problems marked done_GQ stay where they are) until each stops
  (see `_lbfgs_step`) or max_iter iterations. fetch: how device values are read (the device fan-out's
  threads wait for them outside their turn). narrowing_cost: the multiply-adds a compile of the step is
  worth (the pass narrows when the multiply-adds saved, if the problems still running need as many
  iterations again as they have had, are at least that: a deterministic rule, so a run's arithmetic
  never depends on timing)."""
  return _Run(problem, tol, max_iter, fetch, memory, narrowing_cost).run(params, done_GQ)


class _Run:
  def __init__(self, problem, tol, max_iter, fetch, memory, narrowing_cost):
    self.problem, self.tol, self.max_iter, self.fetch, self.memory = problem, tol, max_iter, fetch, memory
    self.narrowing_cost = narrowing_cost
    self.group_columns = 0  # Σ over passes of groups × columns in the pass

  def run(self, params, done_GQ):
    problem = self.problem
    leaves, self.treedef = jax.tree_util.tree_flatten(params)
    num_g, total_t = leaves[0].shape[0], leaves[0].shape[-1]
    rows, probs = np.arange(num_g), np.arange(done_GQ.shape[1])
    col_T, loss, data = np.arange(total_t), problem.loss, problem.data
    state = _init_state(params, data, jnp.asarray(done_GQ), loss=loss, memory=self.memory)
    self.group_columns += num_g * total_t
    every = problem.refresh_every
    if every:
      state = state._replace(precond=problem.preconditioner(state.params, data, loss))
    out = self._write(state, rows, col_T, probs, None)
    f_start = out[-3].astype(np.float64)
    for iteration in range(1, self.max_iter + 1):
      state, passes, running_GQ = _lbfgs_step(state, data, loss=loss, tol=self.tol)
      passes, running_GQ = self.fetch((passes, running_GQ))
      narrowed = len(rows) < num_g or len(col_T) < total_t
      if every and iteration % every == 0 and (problem.refresh_narrowed or not narrowed):
        state = state._replace(precond=problem.preconditioner(state.params, data, loss))
      self.group_columns += int(passes) * len(rows) * len(col_T)
      live_g = np.flatnonzero(running_GQ.any(1))
      if not len(live_g):
        break
      if not problem.pass_cost:
        continue
      keep_q = np.flatnonzero(running_GQ.any(0))
      size = _pow2_at_least(len(live_g))
      new_col_T, key = problem.columns(probs[keep_q])
      if self._worth_narrowing(len(rows) * len(col_T), size * len(new_col_T), iteration):
        out = self._write(state, rows, col_T, probs, out)
        pick = np.concatenate([live_g, np.flatnonzero(~running_GQ.any(1))[: size - len(live_g)]])
        put = functools.partial(jax.device_put, device=problem.data.block_T.device)
        state = _narrow_state(problem, state, pick, np.searchsorted(col_T, new_col_T), keep_q, put)
        rows, probs, col_T = rows[pick], probs[keep_q], new_col_T
        data, loss = problem.restrict(rows, probs, col_T, key)
    out = self._write(state, rows, col_T, probs, out)
    *leaves, f, iters, done = out
    params = jax.tree_util.tree_unflatten(self.treedef, leaves)
    return Result(params, f.astype(np.float64), iters, done, f_start, self.group_columns)

  def _worth_narrowing(self, now, narrowed, iteration):
    """Narrow the pass from `now` to `narrowed` groups × columns when that cuts it by a quarter and the
    passes saved, if the problems still running need as many iterations again as they have had,
    outweigh compiling the step for the new shape."""
    saved = (now - narrowed) * self.problem.pass_cost * iteration
    return narrowed <= 0.75 * now and saved >= self.narrowing_cost

  def _write(self, state, rows, col_T, probs, out):
    """Host copies of (params' leaves..., f, iterations, done) with the state's rows, columns and problems
    written."""
    now = self.fetch((*jax.tree_util.tree_leaves(state.params), state.f_GQ, state.iters_GQ, state.done_GQ))
    if out is None:
      return [np.array(a) for a in now]
    for a, new in zip(out[:-3], now[:-3]):
      a[np.ix_(rows, *(np.arange(n) for n in a.shape[1:-1]), col_T)] = new
    for a, new in zip(out[-3:], now[-3:]):
      a[np.ix_(rows, probs)] = new
    return out
