"""The layers as one scan: the scanned forward equals the blocks called one by one (captures, edits, start_layer,
sliding windows, the KV cache), and the compiled forward and sweeps do not grow with depth."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from headspec.ablation import core as ablation
from headspec.model.config import ModelConfig
from headspec.model.edits import head_mask
from headspec.model.layers import KVCache
from headspec.model.sites import SITES, Apply, Edit, check_interventions
from headspec.model.transformer import _attention_mask, random_like
from headspec.patching import core as patching
from headspec.words import evalset

H, K, D = 4, 8, 32
CONFIGS = {
  # rotary, grouped-query K/V, a gated MLP and sliding windows of 3 and 2 tokens in layers 1 and 3
  "decoder": ModelConfig(kind="decoder", vocab_size=40, num_layers=4, num_heads=H, d_model=D, d_head=K, d_ff=48,
                         max_len=16, positions="rotary", num_kv_heads=2, gated_mlp=True, activation="silu",
                         attention_windows=(0, 3, 0, 2)),
  # post-LN, windows both ways
  "encoder": ModelConfig(kind="encoder", vocab_size=40, num_layers=4, num_heads=H, d_model=D, d_head=K, d_ff=48,
                         max_len=16, pre_layernorm=False, attention_windows=(2, 0, 4, 0)),
}  # fmt: skip
ALL_SITES = tuple(SITES)


def _model(kind):
  model = random_like(CONFIGS[kind], 0)
  for block in model.blocks:  # larger weights than the 0.02 init, so that every layer matters
    for name in ("w_q_DHK", "w_k_DHK", "w_v_DHK", "w_o_HKD"):
      p = getattr(block.attention, name)
      p[...] = p[...] * 10
  return model


def looped(model, x_BTD, *, valid_BT=None, interventions=None, capture=(), start_layer=0, kv_cache=None):
  """The reference: the forward as an unrolled loop runs it, `model.blocks[l]` called layer by layer with that
  layer's edits (`Edit.layer`, `Apply.layer`; a site without an edit at a layer is absent there) and window.
  (logits, {site: captured [L − start_layer, ...]}[, the updated KVCache])."""
  cfg = model.cfg
  B, T, _ = x_BTD.shape
  valid_BT = jnp.ones((B, T), bool) if valid_BT is None else valid_BT
  mask_BTS, positions_BT, key_positions_BS, valid_BS = _attention_mask(cfg, valid_BT, None, None, kv_cache)
  edits = check_interventions(cfg, interventions, B, T, mask_BTS.shape[-1])
  windows = cfg.attention_windows or (0,) * cfg.num_layers
  grouped_kv = not capture and not edits and kv_cache is None
  per_layer, new_k, new_v = {name: [] for name in capture}, [], []
  for layer in range(start_layer, cfg.num_layers):
    here = {name: tuple(e for e in (edit.layer(layer) for edit in seq) if e is not None) for name, seq in edits.items()}
    cache = None if kv_cache is None else (kv_cache.k_LBSHK[layer], kv_cache.v_LBSHK[layer], kv_cache.index)
    x_BTD, captured = model.blocks[layer](
      x_BTD, mask_BTS, None, frozenset(capture), {name: seq for name, seq in here.items() if seq}, positions_BT,
      key_positions_BS, cache, grouped_kv, windows[layer],
    )  # fmt: skip
    for name in capture:
      per_layer[name].append(captured[name])
    if cache is not None:
      new_k.append(captured["kv_cache"][0])
      new_v.append(captured["kv_cache"][1])
  logits_BTV = model.unembed(model.ln_final(x_BTD) if cfg.final_norm else x_BTD)
  stacked = {name: jnp.stack(values) for name, values in per_layer.items()}
  if kv_cache is None:
    return logits_BTV, stacked
  return (
    logits_BTV,
    stacked,
    KVCache(jnp.stack(new_k), jnp.stack(new_v), valid_BS, key_positions_BS, T + kv_cache.index),
  )


def _same(scanned_logits, inter, reference, layers=None):
  """Logits and every captured site equal the reference's to 1e-6 of the largest value of each (what float32
  rounding leaves between an op-by-op and a compiled program; masked attention scores, float32's minimum,
  are left out of that scale)."""
  logits, captured = reference
  for name, want in (("logits", logits), *captured.items()):
    got = scanned_logits if name == "logits" else inter.site(name) if layers is None else inter.site(name)[layers]
    finite = np.abs(np.asarray(want))[np.abs(np.asarray(want)) < 1e30]
    np.testing.assert_allclose(got, want, atol=1e-6 * max(1.0, finite.max(initial=0.0)), rtol=0, err_msg=name)


def _edits(L, B, T):
  """A head mask on z (an Edit over [L,...]), Applies on some layers only (resid_mid on 1 and 3, head_out on 2,
  which changes how layer 2 sums its heads), an Edit of mlp_out whose layer axis of 1 serves every layer, and an
  Edit of the pattern held at layer 3 alone."""
  rng = np.random.default_rng(4)
  mask_LH = np.ones((L, H), np.float32)
  mask_LH[1, 2] = mask_LH[3, 0] = 0.0
  return {
    "z": head_mask(mask_LH, rng.normal(size=(L, H, K)).astype(np.float32)),
    "resid_mid": Apply(_halve, layers=(1, 3)),
    "head_out": [Apply(_halve, layers=2)],
    "mlp_out": Edit(add=jnp.asarray(rng.normal(size=(1, 1, T, D)), jnp.float32) * 0.1),
    "pattern": Edit(keep=jnp.asarray(rng.uniform(size=(1, H, T, T)), jnp.float32), at=3),
  }


def _halve(x):
  return 0.5 * x


@pytest.mark.parametrize("kind", ["decoder", "encoder"])
def test_scan_equals_the_blocks_one_by_one(kind):
  """Logits and every captured site to 1e-6: plain, with edits, and from layer 2 with start_layer static and
  traced (captures then stack the L − 2 layers run, or all L with zeros below 2)."""
  model = _model(kind)
  L = model.cfg.num_layers
  tokens_BT = jnp.asarray(np.random.default_rng(1).integers(0, 40, (2, 9)))
  valid_BT = jnp.asarray(np.arange(9)[None] < np.array([[9], [6]]))
  x_BTD = model.embed(tokens_BT)
  logits, inter = model(tokens_BT, valid_BT=valid_BT, capture=ALL_SITES)
  _same(logits, inter, looped(model, x_BTD, valid_BT=valid_BT, capture=ALL_SITES))

  edits = _edits(L, 2, 9)
  logits, inter = model(tokens_BT, valid_BT=valid_BT, interventions=edits, capture=ALL_SITES)
  _same(logits, inter, looped(model, x_BTD, valid_BT=valid_BT, interventions=edits, capture=ALL_SITES))
  assert not np.allclose(logits, model(tokens_BT, valid_BT=valid_BT)[0], atol=1e-2)

  x2_BTD = inter.resid_pre_LBTD[2]
  reference = looped(model, x2_BTD, valid_BT=valid_BT, interventions=edits, capture=ALL_SITES, start_layer=2)
  logits, inter = model.from_layer(x2_BTD, 2, valid_BT=valid_BT, interventions=edits, capture=ALL_SITES)
  assert inter.z_LBTHK.shape[0] == L - 2
  _same(logits, inter, reference)
  traced = jax.jit(
    lambda x, start: model.from_layer(x, start, valid_BT=valid_BT, interventions=edits, capture=ALL_SITES)
  )
  logits, inter = traced(x2_BTD, jnp.int32(2))
  assert inter.z_LBTHK.shape[0] == L and not np.any(inter.z_LBTHK[:2])
  _same(logits, inter, reference, layers=slice(2, None))


def test_kv_cache_steps_equal_the_blocks_one_by_one():
  """A prefill of 5 tokens then three one-token steps (windows shorter than the context) under edits: logits,
  captures and every layer's cached keys and values."""
  model = _model("decoder")
  L = model.cfg.num_layers
  tokens_BT = jnp.asarray(np.random.default_rng(2).integers(0, 40, (2, 8)))
  edits = {
    "z": head_mask(np.where(np.arange(L * H).reshape(L, H) == 5, 0.0, 1.0)),
    "resid_mid": Apply(_halve, layers=1),
  }
  ours = reference = KVCache.empty(model.cfg, 2, 8)
  for start, stop in ((0, 5), (5, 6), (6, 7), (7, 8)):
    x_BTD = model.embed(
      tokens_BT[:, start:stop], positions_BT=jnp.broadcast_to(jnp.arange(start, stop), (2, stop - start))
    )
    logits, inter, ours = model(tokens_BT[:, start:stop], interventions=edits, capture=("z", "k"), kv_cache=ours)
    *expected, reference = looped(model, x_BTD, interventions=edits, capture=("z", "k"), kv_cache=reference)
    _same(logits, inter, expected)
    np.testing.assert_allclose(ours.k_LBSHK, reference.k_LBSHK, atol=1e-6)
    np.testing.assert_allclose(ours.v_LBSHK, reference.v_LBSHK, atol=1e-6)
    assert int(ours.index) == stop


def test_dropout_draws_a_key_per_layer_and_repeats():
  """The same Rngs give the same forward, another seed another one; each layer drops its own entries (the
  dropped attention outputs, zeros of the captured attn_out, differ between layers of the same shape)."""
  cfg = ModelConfig(kind="decoder", vocab_size=40, num_layers=3, num_heads=H, d_model=D, d_head=K, d_ff=48, max_len=16,
                    dropout=0.3, attention_dropout=0.3)  # fmt: skip
  model = random_like(cfg, 0)
  tokens_BT = jnp.asarray(np.random.default_rng(3).integers(0, 40, (2, 9)))
  run = lambda seed: model(tokens_BT, capture=("attn_out",), dropout_rngs=nnx.Rngs(dropout=seed))
  (a, inter), (b, _), (c, _) = run(0), run(0), run(1)
  np.testing.assert_array_equal(a, b)
  assert not np.allclose(a, c) and not np.allclose(a, model(tokens_BT)[0])
  dropped_LBTD = np.asarray(inter.attn_out_LBTD == 0)
  assert np.all(np.abs(dropped_LBTD.mean(axis=(1, 2, 3)) - 0.3) < 0.05)
  assert not np.array_equal(dropped_LBTD[0], dropped_LBTD[1]) and not np.array_equal(dropped_LBTD[1], dropped_LBTD[2])


def _op_counts(text: str) -> tuple[int, int]:
  """(dot_general ops, all ops) of a lowered program's StableHLO."""
  ops = re.findall(r"= (?:\"?)([a-z_]+\.[a-z_]+)", text)
  return sum(op == "stablehlo.dot_general" for op in ops), len(ops)


def _tiny(L):
  return random_like(
    ModelConfig(kind="decoder", vocab_size=40, num_layers=L, num_heads=H, d_model=D, d_head=K, d_ff=48, max_len=16), 0
  )


def _forward_text(L):
  graphdef, params = nnx.split(_tiny(L))
  fn = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x, capture=("z",))[0])
  return fn.lower(params, jnp.zeros((2, 8), jnp.int32)).as_text()


def _ablation_text(L):
  model = _tiny(L)
  tokens = np.random.default_rng(0).integers(1, 40, (4, 8)).astype(np.int32)

  class Tok:
    mask_id, unk_id, vocab_size = 1, 0, 40

  es = evalset.lm_eval_set(
    tokens, np.ones_like(tokens, bool), model_kind="decoder", tokenizer=Tok(), batch_size=4, seed=0
  )
  graphdef, params = nnx.split(model)
  masks = jnp.asarray(np.broadcast_to(1 - np.eye(H, dtype=np.float32), (L, H, H)))
  fn = ablation.compiled(graphdef, "lm")["sweep"]
  return fn.lower(params, *ablation._arrays(es.batches[0]), masks, ablation.zero_replacement(model)).as_text()


def _patching_text(L):
  model = _tiny(L)
  T = 8
  base = jnp.asarray(np.random.default_rng(0).integers(1, 40, (2, T)), jnp.int32)
  patches = patching.grid(model.cfg, "z", T, True, range(L), range(H), range(T))
  graphdef, params = nnx.split(model)
  fn = patching._sweep(graphdef, "z", "logit_diff")
  args = (base, base[::-1], jnp.ones((2, T), bool), jnp.full((2,), T - 1), jnp.asarray([[1, 2], [3, 4]]))
  return fn.lower(params, *args, jnp.asarray(patching._packed(*patches, 1))).as_text()


@pytest.mark.parametrize("program", [_forward_text, _ablation_text, _patching_text], ids=lambda f: f.__name__[1:-5])
def test_programs_do_not_grow_with_depth(program):
  """The lowered forward, ablation sweep and per-head z patching sweep (by position) of a 4- and a 16-layer
  decoder: the same matrix products, and the same ops but one per parameter array and added layer in each of the
  program's forwards (at most 3), which stack the layers' arrays. Unrolled, the 16-layer sweeps held 10 times
  the 4-layer ones' products (ablation 117 and 1,233, patching 150 and 1,362)."""
  (dots_4, ops_4), (dots_16, ops_16) = _op_counts(program(4)), _op_counts(program(16))
  assert dots_4 == dots_16 > 0
  per_layer_arrays = len(jax.tree.leaves(nnx.state(_tiny(1).blocks[0])))
  assert ops_16 - ops_4 <= 3 * per_layer_arrays * (16 - 4), (ops_4, ops_16)
