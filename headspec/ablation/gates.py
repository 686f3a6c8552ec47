"""L0 head gates (Voita et al. 2019, §6; the hard-concrete distribution of Louizos et al. 2018, §4).

Each head gets a stochastic gate z_h ∈ [0, 1] multiplying Z_h (the model's head mask):
  u ~ U(0, 1),  s = σ((log u − log(1 − u) + log α_h) / β),  z = min(1, max(0, s·(ζ − γ) + γ))
with Louizos et al.'s temperature β = 2/3 and stretch (γ, ζ) = (−0.1, 1.1). The objective is
  E_z[ LM loss(z) ] + λ · Σ_h P(z_h ≠ 0),   P(z_h ≠ 0) = σ(log α_h − β · log(−γ / ζ)),
minimised over log α with Adam, one z per step shared by the batch. Unlike Voita et al., who fine-tune
the whole model with the gates, the model's weights stay FROZEN: the question is which heads this
checkpoint needs, and it keeps the cost to `steps` forward/backward passes per λ. At test time the
gate is deterministic, ẑ_h = min(1, max(0, σ(log α_h)(ζ − γ) + γ)) (Louizos et al. eq. 13), and a head
is kept when ẑ_h > 0. Gates are fitted on the even batches of the evaluation set and scored on the odd
ones (EvalSet.halves).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from headspec.ablation import core
from headspec.model.edits import head_mask
from headspec.parallel import mesh as mesh_lib
from headspec.parallel.compilations import program_cache
from headspec.words.evalset import EvalSet

BETA, GAMMA, ZETA = 2.0 / 3.0, -0.1, 1.1


def sample_gates(log_alpha, u):
  s = jax.nn.sigmoid((jnp.log(u) - jnp.log1p(-u) + log_alpha) / BETA)
  return jnp.clip(s * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)


def open_probability(log_alpha):
  """P(z_h ≠ 0) = σ(log α − β log(−γ/ζ)): the expected L0 norm is its sum."""
  return jax.nn.sigmoid(log_alpha - BETA * np.log(-GAMMA / ZETA))


def deterministic_gates(log_alpha):
  return jnp.clip(jax.nn.sigmoid(log_alpha) * (ZETA - GAMMA) + GAMMA, 0.0, 1.0)


@program_cache(4)
def _step_fn(graphdef, learning_rate: float):
  tx = optax.adam(learning_rate)

  @mesh_lib.jit
  def step(params, log_alpha, opt_state, key, penalty, inputs_BT, valid_BT, targets_BT, weights_BT):
    model = nnx.merge(graphdef, params)

    def objective(log_alpha):
      u = jax.random.uniform(key, log_alpha.shape, minval=1e-6, maxval=1 - 1e-6)
      logits, _ = model(inputs_BT, valid_BT=valid_BT, interventions={"z": head_mask(sample_gates(log_alpha, u))})
      sums = core._per_sequence("lm", logits, valid_BT, targets_BT, weights_BT)
      return sums[:, 0].sum() / jnp.maximum(sums[:, 2].sum(), 1.0) + penalty * open_probability(log_alpha).sum()

    loss, grad = jax.value_and_grad(objective)(log_alpha)
    updates, opt_state = tx.update(grad, opt_state)
    return optax.apply_updates(log_alpha, updates), opt_state, loss

  return step, tx


def fit_gates(
  model, evalset: EvalSet, penalty: float, *, steps: int, learning_rate: float, init_log_alpha: float, seed: int
) -> np.ndarray:
  """log α [L,H] after `steps` Adam steps on the batches of `evalset` (an 'lm' set), cycled in order."""
  graphdef, params = nnx.split(model)
  step, tx = _step_fn(graphdef, float(learning_rate))
  cfg = model.cfg
  log_alpha = jnp.full((cfg.num_layers, cfg.num_heads), init_log_alpha, jnp.float32)
  opt_state = tx.init(log_alpha)
  key = jax.random.key(seed)
  for i in range(steps):
    b = evalset.batches[i % len(evalset.batches)]
    log_alpha, opt_state, _ = step(
      params, log_alpha, opt_state, jax.random.fold_in(key, i), jnp.float32(penalty), *core._arrays(b)
    )
  return np.asarray(log_alpha)
