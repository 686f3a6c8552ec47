"""GPT-2: a pre-LN causal decoder with learned positions and a tied LM head.

Its Conv1D stores W as [in, out] and packs Q, K, V in one `c_attn` [D, 3D]; head h owns columns
h*K:(h+1)*K of each projection and rows h*K:(h+1)*K of the output projection."""

from __future__ import annotations

import numpy as np

from headspec.model.config import ModelConfig
from headspec.model.transformer import Transformer
from headspec.pretrained.common import activation, check
from headspec.pretrained.config_checks import HFConfig
from headspec.pretrained.tensors import Tensors, assign, assign_layernorm


def config(hf: HFConfig) -> ModelConfig:
  """GPT2Config -> ModelConfig (pre-LN causal decoder, final LayerNorm, tied LM head)."""
  path = hf.path
  check(hf.flag("scale_attn_weights", True), path, "scale_attn_weights=false is not supported")
  check(
    not hf.flag("scale_attn_by_inverse_layer_idx", False), path, "scale_attn_by_inverse_layer_idx=true is not supported"
  )
  check(not hf.flag("add_cross_attention", False), path, "add_cross_attention=true is not supported")
  D, H = hf.integer("n_embd"), hf.integer("n_head")
  check(D % H == 0, path, f"n_embd={D} is not a multiple of n_head={H}")
  # reorder_and_upcast_attn only changes mixed-precision rounding; we compute attention logits in float32.
  return ModelConfig(
    kind="decoder",
    vocab_size=hf.integer("vocab_size"),
    num_layers=hf.integer("n_layer"),
    num_heads=H,
    d_model=D,
    d_head=D // H,
    d_ff=hf.integer("n_inner", 4 * D, optional=True),
    max_len=hf.integer("n_positions"),
    dropout=hf.probability("resid_pdrop"),
    attention_dropout=hf.probability("attn_pdrop"),
    pre_layernorm=True,
    positions="learned",
    tie_embeddings=hf.flag("tie_word_embeddings", True),
    activation=activation(hf.text("activation_function", "gelu_new", optional=True), "activation_function", path),
    layer_norm_eps=hf.number("layer_norm_epsilon", 1e-5),
  )


def load(model: Transformer, t: Tensors) -> None:
  cfg = model.cfg
  V, D, H, K, F = cfg.vocab_size, cfg.d_model, cfg.num_heads, cfg.d_head, cfg.d_ff
  conv1d = lambda name, d_in, d_out: (t.pop(f"{name}.weight", (d_in, d_out)), t.pop(f"{name}.bias", (d_out,)))
  assign(model.token_embed_VD, t.pop("wte.weight", (V, D)))
  assign(model.position_embed_TD, t.pop("wpe.weight", (cfg.max_len, D)))
  for i, block in enumerate(model.blocks):
    prefix, attention = f"h.{i}.", block.attention
    assign_layernorm(block.ln_attention, t, f"{prefix}ln_1", D)
    w_D3E, b_3E = conv1d(f"{prefix}attn.c_attn", D, 3 * D)
    w_3DHK, b_3HK = w_D3E.reshape(D, 3, H, K), b_3E.reshape(3, H, K)
    for j, (w, b) in enumerate(
      (
        (attention.w_q_DHK, attention.b_q_HK),
        (attention.w_k_DHK, attention.b_k_HK),
        (attention.w_v_DHK, attention.b_v_HK),
      )
    ):
      assign(w, w_3DHK[:, j])
      assign(b, b_3HK[j])
    w_ED, b_D = conv1d(f"{prefix}attn.c_proj", D, D)
    assign(attention.w_o_HKD, w_ED.reshape(H, K, D))
    assign(attention.b_o_D, b_D)
    assign_layernorm(block.ln_mlp, t, f"{prefix}ln_2", D)
    w_DF, b_F = conv1d(f"{prefix}mlp.c_fc", D, F)
    assign(block.mlp.w_in_DF, w_DF)
    assign(block.mlp.b_in_F, b_F)
    w_FD, b_D = conv1d(f"{prefix}mlp.c_proj", F, D)
    assign(block.mlp.w_out_FD, w_FD)
    assign(block.mlp.b_out_D, b_D)
  assign_layernorm(model.ln_final, t, "ln_f", D)
  assign(model.unembed_bias_V, np.zeros(V))  # GPT-2's LM head has no bias
  if cfg.tie_embeddings:
    t.tensors.pop("lm_head.weight", None)
  else:
    assign(model.unembed_DV, t.pop("lm_head.weight", (V, D)).T)
