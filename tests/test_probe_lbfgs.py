"""The batched L-BFGS engine (headspec/probing/lbfgs.py) on its own: quadratics with a closed-form optimum,
many problems at once, no probe anywhere."""

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from headspec.probing import lbfgs

G, K = 3, 6
BLOCK_T = np.asarray([0, 0, 1, 2, 2, 2, 3], np.int32)  # 4 problems per group over 7 columns
Q = 4


class _Data(NamedTuple):
  """f_gq = Σ_{t in q} ½ x_gtᵀ H_g x_gt − r_gtᵀ x_gt + ½ h_gt c_gt² − s_gt c_gt."""

  h_GKK: jax.Array
  r_GKT: jax.Array
  h_GT: jax.Array
  s_GT: jax.Array
  block_T: jax.Array
  onehot_TQ: jax.Array


@dataclasses.dataclass(frozen=True)
class _Quadratic:
  def __call__(self, params, data):
    x_GKT, c_GT = params
    hx_GKT = jnp.einsum("gkl,glt->gkt", data.h_GKK, x_GKT)
    f_GT = (0.5 * x_GKT * hx_GKT - data.r_GKT * x_GKT).sum(1) + 0.5 * data.h_GT * c_GT**2 - data.s_GT * c_GT
    return lbfgs.per_problem(f_GT, data.onehot_TQ), (hx_GKT - data.r_GKT, data.h_GT * c_GT - data.s_GT)

  def precondition(self, m, p):
    inv_GKK, inv_GT = m
    return jnp.einsum("gkl,glt->gkt", inv_GKK, p[0]), inv_GT * p[1]


class _Problem(lbfgs.Problem):
  """The quadratics, narrowing to the problems still running (and with the exact inverse Hessian as M)."""

  def __init__(self, data, *, exact_m=False):
    self.data, self.loss, self.narrowings = data, _Quadratic(), 0
    self.refresh_every = 5 if exact_m else 0
    self.pass_cost = 1.0

  def preconditioner(self, params, data, loss):
    return jnp.linalg.inv(data.h_GKK), 1.0 / data.h_GT

  def narrow_preconditioner(self, m, row_pos, col_pos, problem_pos, put):
    return put(m[0][row_pos]), put(m[1][row_pos][:, col_pos])

  def columns(self, problems):
    return np.flatnonzero(np.isin(BLOCK_T, problems)), None

  def restrict(self, rows, problems, col_T, key):
    self.narrowings += 1
    d = jax.device_get(self.data)
    data = _Data(
      d.h_GKK[rows],
      d.r_GKT[rows][..., col_T],
      d.h_GT[rows][:, col_T],
      d.s_GT[rows][:, col_T],
      np.searchsorted(problems, BLOCK_T[col_T]).astype(np.int32),
      d.onehot_TQ[np.ix_(col_T, problems)],
    )
    return jax.device_put(data), self.loss


def _quadratics(seed=0):
  """Data whose groups are conditioned from ~1 to ~1e3 (so problems stop at different iterations), and the
  optimum x* = H⁻¹r, c* = s/h with its objective."""
  rng = np.random.default_rng(seed)
  q_GKK = np.linalg.qr(rng.standard_normal((G, K, K)))[0]
  evals_GK = np.logspace(0, np.arange(G)[:, None] + 1, K, axis=-1)[:, 0]
  h_GKK = np.einsum("gkj,gj,glj->gkl", q_GKK, evals_GK, q_GKK)
  r_GKT, s_GT = rng.standard_normal((G, K, len(BLOCK_T))), rng.standard_normal((G, len(BLOCK_T)))
  h_GT = rng.uniform(0.5, 2.0, (G, len(BLOCK_T)))
  f32 = lambda a: np.asarray(a, np.float32)
  data = _Data(f32(h_GKK), f32(r_GKT), f32(h_GT), f32(s_GT), BLOCK_T, np.eye(Q, dtype=np.float32)[BLOCK_T])
  x_GKT, c_GT = np.linalg.solve(h_GKK, r_GKT), s_GT / h_GT
  f_GT = -0.5 * (r_GKT * x_GKT).sum(1) - 0.5 * s_GT * c_GT
  return jax.device_put(data), (x_GKT, c_GT), f_GT @ np.eye(Q)[BLOCK_T]


def test_batched_quadratics_reach_their_closed_form_optimum():
  """Every problem of every group ends at x* = H⁻¹r, c* = s/h and f*; a problem marked done never moves;
  the pass narrows as the well-conditioned groups stop and the result is still the optimum."""
  data, (x_star, c_star), f_star = _quadratics()
  start = (np.zeros((G, K, len(BLOCK_T)), np.float32), np.zeros((G, len(BLOCK_T)), np.float32))
  done_GQ = np.zeros((G, Q), bool)
  done_GQ[1, 2] = True  # columns 3-5 of group 1 stay at the start
  problem = _Problem(data)
  out = lbfgs.minimize(problem, jax.device_put(start), done_GQ, tol=1e-8, max_iter=300, narrowing_cost=0.0)
  moved_T = ~np.isin(BLOCK_T, [2])
  np.testing.assert_allclose(out.params[0][1][:, ~moved_T], 0.0)
  np.testing.assert_allclose(out.params[1][1][~moved_T], 0.0)
  keep = np.ones((G, len(BLOCK_T)), bool)
  keep[1, ~moved_T] = False
  want_f = np.where(done_GQ, 0.0, f_star)
  np.testing.assert_allclose(out.f, want_f, rtol=1e-5, atol=1e-5)
  # the parameters to about √(float32 resolution of f): the line search cannot tell closer points apart
  np.testing.assert_allclose(np.swapaxes(out.params[0], 1, 2)[keep], np.swapaxes(x_star, 1, 2)[keep], atol=3e-3)
  np.testing.assert_allclose(out.params[1][keep], c_star[keep], atol=3e-3)
  np.testing.assert_allclose(out.f_start, 0.0)
  assert out.converged.all() and out.iterations[1, 2] == 0 and (out.iterations[~done_GQ] > 3).all()
  assert problem.narrowings >= 1  # the group conditioned ~1 stops long before the one conditioned ~1e3
  assert out.group_columns > G * len(BLOCK_T)


def test_the_exact_inverse_hessian_as_preconditioner_solves_in_a_few_iterations():
  """H₀ = γ·M with M = H⁻¹: the first direction is the Newton step, so every problem is done within a few
  iterations, whatever its conditioning (without M the ~1e3-conditioned group needs many more)."""
  data, (x_star, c_star), f_star = _quadratics(1)
  start = jax.device_put((np.zeros((G, K, len(BLOCK_T)), np.float32), np.zeros((G, len(BLOCK_T)), np.float32)))
  kw = dict(tol=1e-8, max_iter=300)
  plain = lbfgs.minimize(_Problem(data), start, np.zeros((G, Q), bool), **kw)
  newton = lbfgs.minimize(_Problem(data, exact_m=True), start, np.zeros((G, Q), bool), **kw)
  np.testing.assert_allclose(newton.f, f_star, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(newton.params[1], c_star, atol=1e-4)
  # the last iterations chase tol=1e-8 at float32's resolution: 5 on one CPU, 6 on another (AMD EPYC, 2026-12-06)
  assert newton.iterations.max() <= 8 and 5 * newton.iterations.max() < plain.iterations.max(), (
    newton.iterations,
    plain.iterations,
  )
