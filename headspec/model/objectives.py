"""The language-model objectives and the evaluation step: what training optimises and analyses score.

`Objective` names the objective (masked LM for encoders, causal LM for decoders) and the training
regularizers' weights; `loss_inputs` turns a batch into (inputs, targets, weights) for it, with BERT's
masking (`mlm_corrupt`) drawn per example from `fold_in(key, example_id)`, so masks do not depend on the
device layout. `token_nll` is the one token loss: training, evaluation and every analysis that scores
a model's next (or masked) token take it from here. `eval_step` is the summed loss of a batch. Below
training (headspec/train/loop.py) and the analyses alike, so scoring a model does not import the trainer.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax
from flax import nnx


@dataclasses.dataclass(frozen=True)
class Objective:
  """What a step computes, beyond the model: static (hashable) so it can close over the step."""

  kind: str  # 'encoder': masked LM; 'decoder': causal LM
  vocab_size: int
  mask_id: int
  mlm_probability: float = 0.15
  subspace: float = 0.0  # disagreement regularization weights (Li et al. 2018)
  position: float = 0.0
  output: float = 0.0
  query_orthogonality: float = 0.0
  drophead: float = 0.0  # DropHead p_max (Zhou et al. 2020)
  drophead_schedule: str = "constant"
  drophead_turn: float = 0.5  # the V schedule's turning point, a fraction of total_steps
  total_steps: int = 1
  num_layers: int = 1
  num_heads: int = 1

  @property
  def capture(self) -> tuple[str, ...]:
    return tuple(name for name, w in (("v", self.subspace), ("pattern", self.position), ("z", self.output)) if w)


def mlm_corrupt(tokens_BT, example_id_B, key, obj: Objective):
  """BERT's masking (Devlin et al. 2019, §3.1): pick 15% of tokens; of those 80% -> [MASK], 10% -> a
  random token, 10% unchanged. Returns (inputs_BT, weights_BT: 1 where the loss is taken)."""
  keys_B = jax.vmap(lambda i: jax.random.fold_in(key, i))(example_id_B)
  T = tokens_BT.shape[1]
  u_BT3 = jax.vmap(lambda k: jax.random.uniform(k, (T, 3)))(keys_B)
  chosen_BT = u_BT3[..., 0] < obj.mlm_probability
  random_BT = (u_BT3[..., 2] * obj.vocab_size).astype(tokens_BT.dtype)
  replaced_BT = jnp.where(u_BT3[..., 1] < 0.8, obj.mask_id, jnp.where(u_BT3[..., 1] < 0.9, random_BT, tokens_BT))
  return jnp.where(chosen_BT, replaced_BT, tokens_BT), chosen_BT.astype(jnp.float32)


def loss_inputs(batch, key, obj: Objective):
  """(inputs_BT, targets_BT, weights_BT) for the objective."""
  tokens_BT = batch["tokens"]
  if obj.kind == "encoder":
    inputs_BT, weights_BT = mlm_corrupt(tokens_BT, batch["example_id"], key, obj)
    return inputs_BT, tokens_BT, weights_BT
  targets_BT = jnp.concatenate([tokens_BT[:, 1:], tokens_BT[:, -1:]], axis=1)
  weights_BT = jnp.ones(tokens_BT.shape, jnp.float32).at[:, -1].set(0.0)  # the last token has no next
  return tokens_BT, targets_BT, weights_BT


def token_nll(logits_BTV, targets_BT):
  """NLL_BT = logsumexp(logits) − logits[target] per token: optax's integer-label softmax cross-entropy
  (in the logits' dtype), the token loss training optimises and the analyses score (ablation's loss change,
  in-context learning, the patching metric 'loss'), written once so their numbers agree bit for bit."""
  return optax.softmax_cross_entropy_with_integer_labels(logits_BTV, targets_BT)


def eval_step(params, batch, key, *, graphdef, obj: Objective):
  """(summed loss, scored-token count) on a batch, with a fixed key so eval masks never change."""
  inputs_BT, targets_BT, weights_BT = loss_inputs(batch, key, obj)
  logits_BTV, _ = nnx.merge(graphdef, params)(inputs_BT)
  token_loss_BT = token_nll(logits_BTV, targets_BT)
  return (token_loss_BT * weights_BT).sum(), weights_BT.sum()
