"""Reading a site never changes the forward pass (headspec/model.py): capturing the per-head input sites
q_in, k_in, v_in returns each head's copy of the stream, and the logits are those of the pass without it."""

import jax.numpy as jnp
import numpy as np
from flax import nnx

from headspec.model import ModelConfig, Transformer


def _model(**options):
  sizes = dict(kind="decoder", vocab_size=40, num_layers=2, num_heads=4, num_kv_heads=2, d_model=32, d_head=8)
  cfg = ModelConfig(**(sizes | dict(d_ff=64, max_len=16, positions="rotary", norm="rmsnorm") | options))
  return Transformer(cfg, rngs=nnx.Rngs(params=0))


def test_capturing_the_input_sites_leaves_the_pass_as_it_is():
  """Bit for bit the logits of the plain pass (the per-head projections ran before, rounding them), and a
  grouped-query model with one RMS over all keys (qk_norm='full') can be read too (it raised, naming an
  intervention that was never given)."""
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 40, (2, 7)), jnp.int32)
  for qk_norm in ("head", "full"):
    model = _model(qk_norm=qk_norm)
    plain, _ = model(tokens)
    read, inter = model(tokens, capture=("q_in", "k_in", "v_in", "resid_pre"))
    np.testing.assert_array_equal(np.asarray(read), np.asarray(plain))
    per_head = jnp.broadcast_to(inter.resid_pre_LBTD[:, :, :, None], (2, 2, 7, 4, 32))
    for name in ("q_in", "k_in", "v_in"):
      np.testing.assert_array_equal(np.asarray(inter.site(name)), np.asarray(per_head))


def test_edits_of_one_heads_query_or_key_input_under_a_full_qk_norm_are_refused():
  """qk_norm='full' takes one RMS over all heads' queries (keys), so an edit of head h's q_in or k_in would
  change every head's queries (measured: 0.18-0.21 on the others against 1.56 on h): refused in one line,
  while v_in (no norm) still reaches its head only."""
  import pytest

  from headspec.errors import UserError
  from headspec.model import Edit

  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 40, (2, 7)), jnp.int32)
  model = _model(qk_norm="full", num_kv_heads=4)
  add = jnp.zeros((2, 2, 7, 4, 32)).at[:, :, :, 3].set(1.0)
  for name in ("q_in", "k_in"):
    with pytest.raises(UserError, match=rf"interventions\['{name}'\]: with qk_norm='full'"):
      model(tokens, interventions={name: Edit(add=add)})
  layer0 = jnp.zeros((2, 2, 7, 4, 32)).at[0, :, :, 3].set(1.0)  # layer 0's head 3 (layer 1 reads its output)
  _, inter = model(tokens, interventions={"v_in": Edit(add=layer0)}, capture=("v",))
  _, plain = model(tokens, capture=("v",))
  changed = np.abs(np.asarray(inter.site("v"))[0] - np.asarray(plain.site("v"))[0]).max(axis=(0, 1, 3))
  assert changed[3] > 0.1 and np.all(changed[:3] < 1e-6), changed  # (the per-head projections round: 6e-8)
