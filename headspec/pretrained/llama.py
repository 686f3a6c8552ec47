"""The rotary decoders' config (Llama, Mistral, Qwen2/3, Gemma/Gemma-2, OLMo/OLMo-2, and GPT-NeoX's through
`decoder_config`) and the Llama layout's weights (nn.Linear [out, in], separate q/k/v/o and gate/up/down)."""

from __future__ import annotations

import math

import numpy as np
from flax import nnx

from headspec.model.config import ModelConfig
from headspec.model.transformer import Transformer
from headspec.pretrained.common import GATED_ACTIVATIONS, activation, check
from headspec.pretrained.config_checks import HFConfig
from headspec.pretrained.tensors import Tensors, assign


def rope(hf: HFConfig, d_head: int, d_head_source: str) -> dict:
  """Rotary settings from `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling` (older files,
  as on the Hub); GPT-NeoX's `rotary_pct` / `rotary_emb_base` too. Unknown scaling types are refused, and so
  is an odd number of rotating features per head (`d_head_source` names the key that set d_head)."""
  legacy, current = hf.mapping("rope_scaling"), hf.mapping("rope_parameters")
  names = {**{k: f"rope_scaling.{k}" for k in legacy}, **{k: f"rope_parameters.{k}" for k in current}}
  prefix = "rope_parameters." if current or not legacy else "rope_scaling."
  params = HFConfig({**legacy, **current}, hf.path, names, prefix)
  where = params if params.has("rope_theta") else hf
  theta = where.number(("rope_theta", "rotary_emb_base"), 10000.0, optional=True)
  where = params if params.has("partial_rotary_factor") else hf
  fraction_key = next((k for k in ("partial_rotary_factor", "rotary_pct") if where.raw(k) is not None), None)
  fraction = where.number(("partial_rotary_factor", "rotary_pct"), 1.0, high=1.0, optional=True)
  rotating = int(d_head * fraction)
  check(
    rotating % 2 == 0,
    hf.path,
    f"{d_head_source}"
    + (f" with {where.name(fraction_key)}={fraction:g}" if fraction_key else "")
    + f" rotates {rotating} features per head; rotary positions turn pairs of features, so it must be even",
  )
  kind = params.text(("rope_type", "type"), "default")
  options = dict(positions="rotary", rope_theta=theta, rotary_fraction=fraction)
  if kind == "linear":
    return {**options, "rope_scaling": "linear", "rope_factor": params.number("factor")}
  if kind == "llama3":
    low, high = params.number("low_freq_factor"), params.number("high_freq_factor")
    if high <= low:
      params.fail("high_freq_factor", f"must exceed low_freq_factor={low:g}")
    return {
      **options,
      "rope_scaling": "llama3",
      "rope_factor": params.number("factor"),
      "rope_low_freq_factor": low,
      "rope_high_freq_factor": high,
      "rope_original_max_len": params.integer("original_max_position_embeddings"),
    }
  check(
    kind == "default",
    hf.path,
    f"rope_scaling type {kind!r} is not supported (supported: 'default', 'linear', 'llama3')",
  )
  return options


def windows(hf: HFConfig, family: str, num_layers: int) -> tuple[int, ...]:
  """Each layer's sliding window (0: global) from `layer_types`, or as each family's config class derives it."""
  path = hf.path
  window = hf.integer("sliding_window", 0, low=0, optional=True)  # null or 0: no window
  if family in ("qwen2", "qwen3") and not hf.flag("use_sliding_window", False):
    window = 0
  types = hf.strings("layer_types")
  if types is None:
    if family == "gemma2":
      types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)]
    elif family in ("qwen2", "qwen3"):
      first = hf.integer("max_window_layers", num_layers, low=0, optional=True)
      types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    else:
      types = ["sliding_attention"] * num_layers
  unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
  check(not unknown, path, f"layer_types {unknown} are not supported ('sliding_attention', 'full_attention')")
  check(len(types) == num_layers, path, f"layer_types has {len(types)} entries for {num_layers} layers")
  if not window:
    return ()
  windows = tuple(window if t == "sliding_attention" else 0 for t in types)
  return windows if any(windows) else ()


# Per Llama-layout family, the spec of decoder_config: (norm, gated MLP, biases: q/k/v, o, mlp, default activation, QK-norm, norm layout).
LAYOUTS = {
  "llama": dict(norm="rmsnorm"),
  "mistral": dict(norm="rmsnorm"),
  "qwen2": dict(norm="rmsnorm", qkv_bias=True, out_bias=False),
  "qwen3": dict(norm="rmsnorm", qk_norm="head"),
  "gemma": dict(norm="rmsnorm", act_key="hidden_activation", act="gelu_pytorch_tanh", embed_scale=True),
  "gemma2": dict(norm="rmsnorm", act_key="hidden_activation", act="gelu_pytorch_tanh", embed_scale=True, sandwich=True),
  "olmo": dict(norm="layernorm"),
  "olmo2": dict(norm="rmsnorm", qk_norm="full", post_norms=True),
}


def decoder_config(hf: HFConfig, spec: dict) -> ModelConfig:
  """The config of a rotary decoder (Llama, Mistral, Qwen2/3, Gemma/Gemma-2, OLMo/OLMo-2, GPT-NeoX), its
  family's structure given by `spec` (a LAYOUTS row, or gpt_neox.SPEC); the family-specific keys by model_type."""
  path, family = hf.path, hf.text("model_type")
  D, H = hf.integer("hidden_size"), hf.integer("num_attention_heads")
  head_dim = hf.integer("head_dim", 0, optional=True)  # null or absent: hidden_size / num_attention_heads
  K = head_dim or D // H
  check(head_dim or D % H == 0, path, f"hidden_size={D} is not a multiple of num_attention_heads={H}")
  G = hf.integer("num_key_value_heads", H, optional=True)
  check(H % G == 0, path, f"num_attention_heads={H} is not a multiple of num_key_value_heads={G}")
  L = hf.integer("num_hidden_layers")
  act_key = spec.get("act_key", "hidden_act")
  act_key = next((k for k in (act_key, "hidden_act") if hf.raw(k) is not None), act_key)
  act = hf.text(act_key, spec.get("act", "silu"), optional=True)
  if family in ("gemma", "gemma2") and act == "gelu":  # Gemma's legacy value, meant (and run) as the tanh form
    act = "gelu_pytorch_tanh"
  bias = hf.flag("attention_bias", family == "gpt_neox")
  for flag in ("is_encoder_decoder", "add_cross_attention"):
    check(not hf.flag(flag, False), path, f"{flag}=true is not supported (decoder-only)")
  if family == "gpt_neox":
    check(bias, path, "attention_bias=false is not supported for gpt_neox")
  gemma2 = family == "gemma2"
  cap = dict(low=0.0, low_open=False, optional=True)  # a soft-cap or clip of 0 (or null) is none
  # c·tanh(x/c) is the same for -c: transformers loads a negative soft-cap and computes what |c| computes
  softcap = dict(low=-math.inf, optional=True)
  source = f"head_dim={head_dim}" if head_dim else f"hidden_size={D} / num_attention_heads={H} = {K}"
  return ModelConfig(
    kind="decoder",
    vocab_size=hf.integer("vocab_size"),
    num_layers=L,
    num_heads=H,
    d_model=D,
    d_head=K,
    d_ff=hf.integer("intermediate_size"),
    max_len=hf.integer("max_position_embeddings", 2048),
    dropout=hf.probability("hidden_dropout"),
    attention_dropout=hf.probability("attention_dropout"),
    pre_layernorm=not spec.get("post_norms", False),
    tie_embeddings=hf.flag("tie_word_embeddings", family in ("gemma", "gemma2")),
    activation=activation(act, act_key, path, GATED_ACTIVATIONS),
    layer_norm_eps=hf.number(("rms_norm_eps", "layer_norm_eps"), 1e-5) if family != "olmo" else 1e-5,
    norm=spec["norm"],
    num_kv_heads=G if G != H else 0,
    gated_mlp=spec.get("gated", True),
    parallel_residual=spec.get("parallel", False) and hf.flag("use_parallel_residual", True),
    sublayer_norm=spec.get("sandwich", False) or spec.get("post_norms", False),
    qk_norm=spec.get("qk_norm", "none"),
    attention_bias=bool(spec.get("qkv_bias", bias)),
    attention_out_bias=bool(spec.get("out_bias", bias)),
    mlp_bias=hf.flag("mlp_bias", family == "gpt_neox"),
    # Gemma-2 scales logits by query_pre_attn_scalar ** -0.5, not by d_head's
    attention_scale=hf.number("query_pre_attn_scalar", K, optional=True) ** -0.5 if gemma2 else 0.0,
    attention_softcap=abs(hf.number("attn_logit_softcapping", 0.0, **softcap)) if gemma2 else 0.0,
    final_softcap=abs(hf.number("final_logit_softcapping", 0.0, **softcap)) if gemma2 else 0.0,
    scale_embeddings=spec.get("embed_scale", False),
    attention_windows=windows(hf, family, L) if family in ("mistral", "qwen2", "qwen3", "gemma2") else (),
    clip_qkv=hf.number("clip_qkv", 0.0, **cap),
    **rope(hf, K, source),
  )


def config(hf: HFConfig) -> ModelConfig:
  """LlamaConfig, MistralConfig, Qwen2/3, Gemma/Gemma-2, OLMo/OLMo-2 -> ModelConfig (the row of LAYOUTS)."""
  return decoder_config(hf, LAYOUTS[hf.text("model_type")])


def _set_norm(norm, t: Tensors, name: str, width: int, family: str) -> None:
  """A norm's parameters: OLMo's have none (scale 1, bias 0); Gemma stores RMSNorm scales as scale − 1."""
  if family == "olmo":
    assign(norm.scale, np.ones(width))
    assign(norm.bias, np.zeros(width))
    return
  assign(norm.scale, t.pop(f"{name}.weight", (width,)) + (1.0 if family in ("gemma", "gemma2") else 0.0))
  if isinstance(norm, nnx.LayerNorm):
    assign(norm.bias, t.pop(f"{name}.bias", (width,)))


# Which checkpoint norm each of headspec's block norms is, per norm layout.
_BLOCK_NORMS = {
  "gemma2": dict(
    ln_attention="input_layernorm",
    ln_attention_out="post_attention_layernorm",
    ln_mlp="pre_feedforward_layernorm",
    ln_mlp_out="post_feedforward_layernorm",
  ),
  "olmo2": dict(ln_attention="post_attention_layernorm", ln_mlp="post_feedforward_layernorm"),
}


def load(model: Transformer, t: Tensors, family: str) -> None:
  """Llama-layout checkpoints: Llama, Mistral, Qwen2/3, Gemma/Gemma-2, OLMo/OLMo-2 (nn.Linear [out, in])."""
  cfg = model.cfg
  V, D, H, G, K, F = cfg.vocab_size, cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.d_head, cfg.d_ff
  weight = lambda name, d_in, d_out: t.pop(f"{name}.weight", (d_out, d_in)).T
  assign(model.token_embed_VD, t.pop("embed_tokens.weight", (V, D)))
  norms = _BLOCK_NORMS.get(family, dict(ln_attention="input_layernorm", ln_mlp="post_attention_layernorm"))
  for i, block in enumerate(model.blocks):
    prefix, attention = f"layers.{i}.", block.attention
    for proj, w, b, heads in (
      ("q", attention.w_q_DHK, attention.b_q_HK, H),
      ("k", attention.w_k_DHK, attention.b_k_HK, G),
      ("v", attention.w_v_DHK, attention.b_v_HK, G),
    ):
      assign(w, weight(f"{prefix}self_attn.{proj}_proj", D, heads * K).reshape(D, heads, K))
      if b is not None:
        assign(b, t.pop(f"{prefix}self_attn.{proj}_proj.bias", (heads * K,)).reshape(heads, K))
    assign(attention.w_o_HKD, weight(f"{prefix}self_attn.o_proj", H * K, D).reshape(H, K, D))
    if attention.b_o_D is not None:
      assign(attention.b_o_D, t.pop(f"{prefix}self_attn.o_proj.bias", (D,)))
    if cfg.qk_norm != "none":
      width_q, width_k = (K, K) if cfg.qk_norm == "head" else (H * K, G * K)
      assign(attention.q_norm.scale, t.pop(f"{prefix}self_attn.q_norm.weight", (width_q,)))
      assign(attention.k_norm.scale, t.pop(f"{prefix}self_attn.k_norm.weight", (width_k,)))
    mlp = block.mlp
    for proj, w, b, d_in, d_out in (
      ("gate", mlp.w_gate_DF, mlp.b_gate_F, D, F),
      ("up", mlp.w_in_DF, mlp.b_in_F, D, F),
      ("down", mlp.w_out_FD, mlp.b_out_D, F, D),
    ):
      assign(w, weight(f"{prefix}mlp.{proj}_proj", d_in, d_out))
      if b is not None:
        assign(b, t.pop(f"{prefix}mlp.{proj}_proj.bias", (d_out,)))
    for ours, theirs in norms.items():
      _set_norm(getattr(block, ours), t, prefix + theirs, D, family)
  _set_norm(model.ln_final, t, "norm", D, family)
  assign(model.unembed_bias_V, np.zeros(V))  # these LM heads have no bias
  if cfg.tie_embeddings:
    t.tensors.pop("lm_head.weight", None)
  else:
    assign(model.unembed_DV, t.pop("lm_head.weight", (V, D)).T)
