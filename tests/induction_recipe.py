"""The attention-only decoder that forms an induction head, shared by tests/test_induction.py and
tests/test_patching_known.py (conftest's `attention_only_decoder` trains it once per test run): rows of
repeated random sequences of n tokens, n never INDUCTION_N, the n the tests score and patch."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from headspec.attention import induction as ind
from headspec.model.config import ModelConfig
from headspec.model.objectives import Objective
from headspec.model.transformer import Transformer
from headspec.train.loop import TrainState, train_step

INDUCTION_SEQ, INDUCTION_VOCAB, INDUCTION_SPECIALS, INDUCTION_N = 24, 64, (0, 1, 2), 6


def initial(num_layers: int, seed: int = 0):
  """(graphdef, params) of the untrained 4-head, d_model 64 attention-only decoder. Sinusoidal positions
  and an untied unembedding: with learned positions and tied embeddings no induction head formed within
  4,000 steps in our trials (docs/attention.md)."""
  cfg = ModelConfig(
    kind="decoder", vocab_size=INDUCTION_VOCAB, num_layers=num_layers, num_heads=4, d_model=64, d_head=16, d_ff=1,
    max_len=INDUCTION_SEQ, mlp=False, positions="sinusoidal", tie_embeddings=False,
  )  # fmt: skip
  return nnx.split(Transformer(cfg, rngs=nnx.Rngs(params=seed)))


def train_attention_only(num_layers: int, *, steps: int = 1500, seed: int = 0, batch: int = 128):
  """`initial`'s decoder trained with headspec's own train_step on `varied_repeat_batch` rows of
  n = 3..11 repeated tokens (n = INDUCTION_N left out)."""
  graphdef, params = initial(num_layers, seed)
  tx = optax.adam(1e-3)
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
  obj = Objective(kind="decoder", vocab_size=INDUCTION_VOCAB, mask_id=0)
  step = jax.jit(functools.partial(train_step, graphdef=graphdef, tx=tx, obj=obj), donate_argnums=0)
  rng, key, ids = np.random.default_rng(seed), jax.random.key(seed), np.arange(batch, dtype=np.int32)
  lengths = [n for n in range(3, 12) if n != INDUCTION_N]
  for _ in range(steps):
    rows = ind.varied_repeat_batch(rng, batch, INDUCTION_SEQ, INDUCTION_VOCAB, INDUCTION_SPECIALS, lengths=lengths)
    state, _ = step(state, {"tokens": rows, "example_id": ids}, key)
  return graphdef, state.params
