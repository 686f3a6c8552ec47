"""The model's per-head capture, head mask and causality, against direct recomputation."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from tiny import call

from headspec.errors import UserError
from headspec.model.config import ModelConfig
from headspec.model.edits import head_mask
from headspec.model.sites import CAPTURE_FIELDS
from headspec.model.transformer import Transformer

jax.config.update("jax_default_matmul_precision", "highest")


def make(kind="decoder", **overrides):
  fields = dict(kind=kind, vocab_size=61, num_layers=3, num_heads=4, d_model=32, d_head=12, d_ff=48, max_len=16)
  if kind == "encoder":
    fields.update(pre_layernorm=False, type_vocab_size=2, embedding_layernorm=True, activation="gelu_exact")
  fields.update(overrides)
  return Transformer(ModelConfig(**fields), rngs=nnx.Rngs(0))


TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 61, (2, 11)), jnp.int32)


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_capture_does_not_change_outputs(kind):
  """Capturing A_h takes the explicit per-head path, capturing nothing the fused one: same outputs."""
  model = make(kind)
  plain, nothing = call(model, TOKENS)
  captured, _ = call(model, TOKENS, capture=CAPTURE_FIELDS)
  np.testing.assert_allclose(plain, captured, atol=2e-5)
  assert all(leaf is None for leaf in nothing.__dict__.values())


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_fused_attention_matches_the_explicit_path(kind):
  """jax.nn.dot_product_attention (used when no A_h is captured and attention dropout is off) against the
  explicit softmax(QKᵀ/√K)V: Z_h, the logits and the gradients, with padding, a head mask and mean
  replacement, causal and bidirectional."""
  model = make(kind)
  valid = jnp.ones_like(TOKENS, bool).at[1, 7:].set(False)
  mask = jnp.ones((3, 4)).at[1, 2].set(0.0).at[2, 0].set(0.5)
  replacement = jnp.asarray(np.random.default_rng(1).normal(size=(3, 4, 12)), jnp.float32)
  kw = dict(valid_BT=valid, interventions={"z": head_mask(mask, replacement)})
  fused, f_inter = call(model, TOKENS, capture=("z",), **kw)
  explicit, e_inter = call(model, TOKENS, capture=("z", "pattern"), **kw)
  np.testing.assert_allclose(fused, explicit, atol=2e-5)
  np.testing.assert_allclose(f_inter.z_LBTHK, e_inter.z_LBTHK, atol=2e-6)

  graphdef, params = nnx.split(model)

  def loss(params, probs):
    logits, _ = nnx.merge(graphdef, params)(TOKENS, capture=("pattern",) if probs else (), **kw)
    return (jax.nn.log_softmax(logits) * valid[..., None]).sum()

  grad = jax.jit(jax.grad(loss), static_argnums=1)
  g_fused, g_explicit = (grad(params, probs) for probs in (False, True))
  for a, b in zip(jax.tree.leaves(g_fused), jax.tree.leaves(g_explicit)):
    np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind,positions", [("encoder", "learned"), ("decoder", "learned"), ("decoder", "sinusoidal")])
def test_packed_rows_equal_each_sequence_alone(kind, positions):
  """Three sequences side by side in one row (positions restarting, segments keeping attention apart)
  give each sequence's own logits and Z_h, as run alone; the rest of the row is padding."""
  model = make(kind, positions=positions)
  lengths, width = (5, 3, 6), 16
  tokens, positions_T, segment_T = np.zeros(width, np.int32), np.zeros(width, np.int32), np.zeros(width, np.int32)
  start = 0
  for i, n in enumerate(lengths):
    tokens[start : start + n] = TOKENS[0, :n] if i != 1 else TOKENS[1, :n]
    positions_T[start : start + n], segment_T[start : start + n] = np.arange(n), i + 1
    start += n
  packed, p_inter = call(
    model,
    tokens[None],
    valid_BT=(segment_T > 0)[None],
    positions_BT=positions_T[None],
    segment_BT=segment_T[None],
    capture=("z",),
  )
  start = 0
  for n in lengths:
    alone, a_inter = call(model, jnp.asarray(tokens[None, start : start + n]), capture=("z",))
    np.testing.assert_allclose(packed[0, start : start + n], alone[0], atol=2e-5)
    np.testing.assert_allclose(p_inter.z_LBTHK[:, 0, start : start + n], a_inter.z_LBTHK[:, 0], atol=2e-5)
    start += n


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
def test_z_through_w_o_reproduces_attention_output(kind):
  """sum_h Z_h W_O^h + b_O equals what the attention sublayer adds, recomputed from its input."""
  model = make(kind)
  valid = jnp.ones_like(TOKENS, bool).at[1, 8:].set(False)
  _, inter = call(model, TOKENS, valid_BT=valid, capture=("z", "head_out", "resid_post", "embeddings", "pattern", "v"))
  block = model.blocks[1]
  attn = block.attention
  recombined_BTD = jnp.einsum("bthk,hkd->btd", inter.z_LBTHK[1], attn.w_o_HKD[...]) + attn.b_o_D[...]
  np.testing.assert_allclose(inter.head_out_LBTHD[1].sum(2) + attn.b_o_D[...], recombined_BTD, atol=1e-5)
  # Z_h = A_h V_h from the captured probabilities and values.
  np.testing.assert_allclose(
    jnp.einsum("bhts,bshk->bthk", inter.pattern_LBHTS[1], inter.v_LBTHK[1]), inter.z_LBTHK[1], atol=1e-5
  )
  # The block's output from its input, with the attention output replaced by the recombination.
  x_BTD = inter.resid_post_LBTD[0]
  if model.cfg.pre_layernorm:
    after_BTD = x_BTD + recombined_BTD
    expected = after_BTD + block.mlp(block.ln_mlp(after_BTD))
  else:
    after_BTD = block.ln_attention(x_BTD + recombined_BTD)
    expected = block.ln_mlp(after_BTD + block.mlp(after_BTD))
  np.testing.assert_allclose(inter.resid_post_LBTD[1], expected, atol=1e-5)
  # Padded keys get no attention.
  assert float(jnp.abs(inter.pattern_LBHTS[:, 1, :, :, 8:]).max()) == 0.0


def test_zero_in_head_mask_removes_exactly_that_head():
  model = make("decoder")
  _, full = call(model, TOKENS, capture=("head_out", "z", "resid_post"))
  mask = jnp.ones((3, 4)).at[0, 2].set(0.0)
  _, masked = call(model, TOKENS, interventions={"z": head_mask(mask)}, capture=("head_out", "z", "resid_post"))
  # Layer 0: same Z for every head, contribution of head 2 gone, others unchanged.
  np.testing.assert_allclose(masked.z_LBTHK[0], full.z_LBTHK[0], atol=1e-6)
  assert float(jnp.abs(masked.head_out_LBTHD[0, :, :, 2]).max()) == 0.0
  np.testing.assert_allclose(
    masked.head_out_LBTHD[0, :, :, [0, 1, 3]], full.head_out_LBTHD[0, :, :, [0, 1, 3]], atol=1e-6
  )
  # The residual after layer 0 differs from the unmasked one by exactly head 2's contribution (pre-LN).
  block = model.blocks[0]
  x0 = model.embed(TOKENS)
  attn_full = x0 + full.head_out_LBTHD[0].sum(2) + block.attention.b_o_D[...]
  attn_masked = attn_full - full.head_out_LBTHD[0, :, :, 2]
  expected = attn_masked + block.mlp(block.ln_mlp(attn_masked))
  np.testing.assert_allclose(masked.resid_post_LBTD[0], expected, atol=1e-5)
  # Per-example masks: example 0 masked, example 1 not.
  per_example = jnp.stack([mask, jnp.ones((3, 4))])
  logits_pe, _ = call(model, TOKENS, interventions={"z": head_mask(per_example)})
  logits_m, _ = call(model, TOKENS, interventions={"z": head_mask(mask)})
  logits_f, _ = call(model, TOKENS)
  np.testing.assert_allclose(logits_pe[0], logits_m[0], atol=1e-5)
  np.testing.assert_allclose(logits_pe[1], logits_f[1], atol=1e-5)


def test_head_mask_is_traced_and_differentiable():
  model = make("encoder")
  graphdef, state = nnx.split(model)

  def loss(state, mask):
    logits, _ = nnx.merge(graphdef, state)(TOKENS, interventions={"z": head_mask(mask)})
    return jax.nn.log_softmax(logits)[..., 0].mean()

  @jax.jit
  @chex.assert_max_traces(n=1)
  def grad_fn(state, mask):
    return jax.grad(loss, argnums=1)(state, mask)

  grads = [grad_fn(state, jnp.full((3, 4), v)) for v in (1.0, 0.5, 0.0)]
  assert grads[0].shape == (3, 4) and bool(jnp.all(jnp.isfinite(grads[0])))
  assert float(jnp.abs(grads[0]).min()) > 0.0
  # Finite difference agrees with the gradient for one head.
  eps = 3e-2  # float32: a larger step keeps rounding error below the curvature error
  mask = jnp.ones((3, 4))
  loss = jax.jit(loss)
  fd = (loss(state, mask.at[1, 3].add(eps)) - loss(state, mask.at[1, 3].add(-eps))) / (2 * eps)
  np.testing.assert_allclose(fd, grads[0][1, 3], rtol=5e-2, atol=2e-5)


def test_decoder_outputs_do_not_depend_on_future_tokens():
  model = make("decoder", positions="sinusoidal")
  embeds = model.embed(TOKENS)

  def through_embeddings(x_BTD, t):
    logits, _ = model.from_embeddings(x_BTD)
    return logits[:, t].sum()

  grad = jax.jit(jax.grad(through_embeddings))
  for t in (0, 4, 10):
    g_BTD = grad(embeds, t)
    per_position = jnp.abs(g_BTD).sum(axis=(0, 2))
    assert float(per_position[t + 1 :].sum()) == 0.0
    assert float(per_position[: t + 1].min()) > 0.0
  # And the encoder does look ahead.
  encoder = make("encoder")
  changed = TOKENS.at[:, -1].set((TOKENS[:, -1] + 1) % 61)
  assert not np.allclose(call(encoder, TOKENS)[0][:, 0], call(encoder, changed)[0][:, 0])


def test_inconsistent_config_is_a_user_error():
  with pytest.raises(UserError, match="model.kind"):
    make(kind="seq2seq")
  with pytest.raises(UserError, match="positive"):
    make(d_head=0)
  with pytest.raises(UserError, match="capture"):
    make()(TOKENS, capture=("attention",))


def test_initial_weights_are_the_per_shape_normal_draws_bit_for_bit():
  """`_normal` draws a power-of-two bucket and keeps its first |shape| values: bit-identical to
  `std * jax.random.normal(key, shape)` op by op (partitionable threefry), and the same under a trace."""
  from headspec.model.layers import normal_param
  from headspec.model.transformer import random_like

  for shape in [(1,), (3, 5), (24, 3, 5), (700, 24), (7, 13, 3)]:
    got = np.asarray(normal_param(nnx.Rngs(params=4), shape)[...])
    want = np.asarray(0.02 * jax.random.normal(nnx.Rngs(params=4).params(), shape, jnp.float32))
    assert got.shape == shape and np.array_equal(got, want), shape
  traced = jax.jit(lambda key: normal_param(nnx.Rngs(params=key), (24, 3, 5))[...])(jax.random.key(4))
  np.testing.assert_allclose(traced, np.asarray(normal_param(nnx.Rngs(params=4), (24, 3, 5))[...]), atol=1e-8)
  cfg = ModelConfig(kind="decoder", vocab_size=50, num_layers=1, num_heads=2, d_model=8, d_head=4, d_ff=16, max_len=8)
  a, b = nnx.state(random_like(cfg, 1)), nnx.state(Transformer(cfg, rngs=nnx.Rngs(params=1)))
  assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  assert not np.array_equal(nnx.state(random_like(cfg, 2)).token_embed_VD[...], a.token_embed_VD[...])
