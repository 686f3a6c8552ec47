"""Which attention path a forward takes (headspec.model.layers.attention_implementation) and that the fused path,
with grouped-query K/V un-repeated, computes the written-out per-head path's logits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from headspec.model.config import ModelConfig
from headspec.model.edits import head_mask
from headspec.model.layers import attention_implementation
from headspec.model.transformer import random_like

BASE = dict(kind="decoder", vocab_size=40, num_layers=2, num_heads=4, d_model=32, d_head=8, d_ff=64, max_len=64)
CFG = ModelConfig(**BASE)


def test_selection():
  pick = lambda cfg=CFG, **kw: attention_implementation(
    cfg, **{"need_pattern": False, "platform": "gpu", "dtype": jnp.bfloat16, **kw}
  )
  assert pick()[0] == "cudnn"
  assert pick(dtype=jnp.float16)[0] == "cudnn"
  assert pick(platform="cpu") == ("xla", "platform cpu: cuDNN runs on GPUs only")
  assert pick(platform="tpu")[0] == "xla"
  assert pick(need_pattern=True)[0] == "per_head"
  assert pick(need_pattern=True, platform="cpu")[0] == "per_head"
  assert pick(dropout=True)[0] == "per_head"
  path, reason = pick(ModelConfig(**BASE, attention_softcap=50.0))
  assert path == "per_head" and "attention_softcap" in reason
  path, reason = pick(dtype=jnp.float32)
  assert path == "xla" and "float32" in reason
  path, reason = pick(ModelConfig(**{**BASE, "d_head": 12}))
  assert path == "xla" and "d_head=12" in reason
  assert pick(ModelConfig(**{**BASE, "d_head": 256}))[0] == "xla"
  assert pick(lengths=(12, 12))[0] == "cudnn"
  path, reason = pick(lengths=(7, 7))
  assert path == "xla" and "even" in reason
  # grouped-query attention, sliding windows, qk-norm, rotary: the fused kernel takes them (mask, G | H)
  options = dict(num_kv_heads=2, attention_windows=(3, 0), qk_norm="head", positions="rotary", norm="rmsnorm")
  assert pick(ModelConfig(**BASE, **options))[0] == "cudnn"


OPTIONS = {
  "gpt2": {},
  "gqa": dict(num_kv_heads=2, positions="rotary", norm="rmsnorm", gated_mlp=True, activation="silu"),
  "mqa": dict(num_kv_heads=1),
  "window": dict(num_kv_heads=2, attention_windows=(3, 0)),
  "qk_norm": dict(num_kv_heads=2, qk_norm="head", positions="rotary"),
  "encoder": dict(kind="encoder", num_kv_heads=2),
}


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_fused_equals_per_head(name):
  model = random_like(ModelConfig(**{**BASE, **OPTIONS[name]}), 0)
  tokens_BT = jax.random.randint(jax.random.key(1), (2, 12), 0, 40)
  valid_BT = jnp.arange(12)[None] < jnp.array([[12], [7]])  # one row padded
  fused_BTV, _ = model(tokens_BT, valid_BT=valid_BT)
  per_head_BTV, cache = model(tokens_BT, valid_BT=valid_BT, capture=("pattern",))  # forces the per-head path
  assert cache.pattern_LBHTS is not None
  keep_BT = np.asarray(valid_BT)
  np.testing.assert_allclose(np.asarray(fused_BTV)[keep_BT], np.asarray(per_head_BTV)[keep_BT], atol=1e-5)


def test_fused_keeps_grouped_kv():
  """A plain forward (no capture, edit or head mask) never repeats K/V to every query head (jnp.repeat's
  broadcast to [B,S,G,H/G,K]); a forward with captures or edits still does, so it stays bit for bit what it
  was. (On CPU the XLA path still writes out the logits: the temp bytes in docs/scale.md.)"""
  cfg = ModelConfig(**{**BASE, "num_heads": 8, "num_kv_heads": 2})
  model = random_like(cfg, 0)
  tokens_BT = jnp.zeros((1, 16), jnp.int32)
  repeat = "f32[1,16,2,4,8] = broadcast_in_dim"
  jaxpr = lambda capture: str(jax.make_jaxpr(lambda tokens: model(tokens, capture=capture)[0])(tokens_BT))
  assert repeat not in jaxpr(())
  assert repeat in jaxpr(("z", "resid_post"))
  assert repeat in jaxpr(("k",))
  assert repeat in jaxpr(("pattern",))
  masked = str(
    jax.make_jaxpr(lambda tokens: model(tokens, interventions={"z": head_mask(jnp.ones((2, 8)))})[0])(tokens_BT)
  )
  assert repeat in masked
