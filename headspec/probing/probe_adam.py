"""The softmax probes' minibatch Adam stage (stage 2 of the fit): all tasks × groups in the same matmuls,
in whitened coordinates, the l2 grid as a warm-started path (a shared phase at the weakest λ, then one
column block per λ). The method: headspec/probing/probe.py's docstring.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax

from headspec.probing import probe_objective


def _optimizer(learning_rate, total_steps):
  return optax.adam(optax.cosine_decay_schedule(learning_rate, max(total_steps, 1)))


@functools.partial(jax.jit, static_argnames=("learning_rate", "total_steps"))
def _adam_init(params, *, learning_rate, total_steps):
  return _optimizer(learning_rate, total_steps).init(params)


def _minibatch_grad(params, xs_GKB, ys_AB, whiten_GKK, l2_T, label_scale_A, layout):
  """Gradient of Σ over probes of label_scale·Σ_batch CE + (λ/2)‖W‖² with respect to (v, b), written
  out as the full pass's (probe_objective.softmax_ce)."""
  v_GKT, b_GT = params
  w_GKT = jnp.einsum("gkl,glc->gkc", whiten_GKK, v_GKT)
  _, (gw_GKT, gb_GT) = probe_objective.softmax_ce(xs_GKB, w_GKT, b_GT, ys_AB, label_scale_A, layout, True)
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


@functools.partial(jax.jit, static_argnames=("n", "count"))
def _shuffles(seed, *, n, count):
  keys = jax.random.split(jax.random.PRNGKey(seed), count)
  return jax.vmap(lambda key: jax.random.permutation(key, n))(keys)


def adam_order(n, steps, batch_size, seed):
  """Consecutive shuffles of the training words (more than one pass only when steps·batch > N)."""
  if steps <= 0:
    return None
  order = np.asarray(_shuffles(seed, n=n, count=-(-steps * batch_size // n))).reshape(-1)[: steps * batch_size]
  return order.reshape(steps, batch_size)


@functools.partial(jax.jit, static_argnames=("layout_one", "num_l2", "total_one"))
def _fork(tree, *, layout_one, num_l2, total_one):
  return _fork_columns(tree, layout_one, num_l2, total_one)


def adam(fit, g0, g1, put):
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
