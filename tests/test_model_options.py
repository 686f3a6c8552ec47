"""ModelConfig's modern-decoder options: properties that hold whatever the weights (the parity with
transformers is tests/test_pretrained_families.py)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from headspec.errors import UserError
from headspec.model.config import ModelConfig
from headspec.model.transformer import random_like

BASE = dict(kind="decoder", vocab_size=40, num_layers=2, num_heads=4, d_model=32, d_head=8, d_ff=48, max_len=64)
LLAMA = dict(
  BASE,
  positions="rotary",
  norm="rmsnorm",
  gated_mlp=True,
  activation="silu",
  num_kv_heads=2,
  attention_bias=False,
  attention_out_bias=False,
  mlp_bias=False,
  tie_embeddings=False,
)
IDS = jnp.asarray(np.random.default_rng(0).integers(0, 40, (2, 12)))


# One model with every option on (jit-compiled once): rotary over half of each head, QK-norm, a window of
# 3 in layer 0, logits soft-capped at 0.01 (well below what these weights give).
ALL = ModelConfig(
  **LLAMA,
  rope_theta=100.0,
  rotary_fraction=0.5,
  qk_norm="head",
  attention_windows=(3, 0),
  final_softcap=0.01,
  attention_softcap=50.0,
  scale_embeddings=True,
)


@functools.partial(jax.jit, static_argnums=(0, 4))
def _forward(graphdef, state, ids_BT, positions_BT, capture):
  return nnx.merge(graphdef, state)(ids_BT, positions_BT=positions_BT, capture=capture)


@pytest.fixture(scope="module")
def forward():
  graphdef, state = nnx.split(random_like(ALL, 0))

  def run(ids_BT=IDS, shift=0):
    positions_BT = jnp.broadcast_to(jnp.arange(ids_BT.shape[1]) + shift, ids_BT.shape)
    return _forward(graphdef, state, ids_BT, positions_BT, ("q", "k", "v", "pattern"))

  return run


def test_grouped_query_heads_share_their_groups_keys_and_values(forward):
  assert ALL.kv_group_of_head == (0, 0, 1, 1)
  assert random_like(ALL, 0).blocks[0].attention.w_k_DHK.shape == (32, 2, 8)
  _, inter = forward()
  assert inter.k_LBTHK.shape == inter.q_LBTHK.shape == (2, 2, 12, 4, 8)  # per query head
  np.testing.assert_array_equal(inter.k_LBTHK[:, :, :, 0], inter.k_LBTHK[:, :, :, 1])
  np.testing.assert_array_equal(inter.v_LBTHK[:, :, :, 2], inter.v_LBTHK[:, :, :, 3])
  assert np.abs(inter.k_LBTHK[:, :, :, 1] - inter.k_LBTHK[:, :, :, 2]).max() > 1e-3
  assert np.abs(inter.pattern_LBHTS[:, :, 0] - inter.pattern_LBHTS[:, :, 1]).max() > 1e-3  # queries differ


def test_rotary_attention_depends_on_relative_positions_only(forward):
  base_logits, base = forward()
  logits, inter = forward(shift=37)
  np.testing.assert_allclose(inter.pattern_LBHTS, base.pattern_LBHTS, atol=1e-5)
  np.testing.assert_allclose(logits, base_logits, atol=1e-4)
  assert np.abs(forward(IDS[:, ::-1])[0][:, -1] - base_logits[:, -1]).max() > 1e-3  # but order matters


def test_partial_rotary_leaves_the_other_features_alone(forward):
  (_, a), (_, b) = forward(), forward(shift=5)
  np.testing.assert_array_equal(a.q_LBTHK[0, ..., 4:], b.q_LBTHK[0, ..., 4:])  # layer 0: same input
  assert np.abs(a.q_LBTHK[0, ..., :4] - b.q_LBTHK[0, ..., :4]).max() > 1e-3


def test_sliding_window_limits_how_far_back_a_token_looks(forward):
  probs = np.asarray(forward()[1].pattern_LBHTS)
  t, s = np.arange(12)[:, None], np.arange(12)[None]
  assert probs[0][..., (t - s >= 3) | (s > t)].max() == 0.0
  assert probs[1][..., (t - s >= 3) & (s <= t)].min() > 0.0  # the global layer sees everything before


def test_final_softcap_bounds_the_logits(forward):
  logits, _ = forward()
  assert 0.005 < np.abs(logits).max() <= 0.01


@pytest.mark.parametrize(
  "changes, message",
  [
    (dict(rope_scaling="yarn"), "model.rope_scaling must be one of"),
    (dict(num_kv_heads=3), "num_kv_heads=3 must divide num_heads=4"),
    (dict(norm="batchnorm"), "model.norm must be one of"),
    (dict(rotary_fraction=0.375), "rotary_fraction=0.375"),
    (dict(rope_scaling="llama3", rope_factor=8.0), "rope_original_max_len"),
    (dict(attention_windows=(4,)), "attention_windows has 1 entries"),
  ],
)
def test_bad_options_are_one_line(changes, message):
  with pytest.raises(UserError, match=message):
    ModelConfig(**{**LLAMA, **changes})
