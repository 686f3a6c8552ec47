"""GPT-NeoX / Pythia: the rotary decoders' config with LayerNorm, an ungated MLP and a parallel residual;
its own weight layout (a fused query_key_value per head)."""

from __future__ import annotations

import numpy as np

from headspec.model.config import ModelConfig
from headspec.model.transformer import Transformer
from headspec.pretrained import llama
from headspec.pretrained.config_checks import HFConfig
from headspec.pretrained.tensors import Tensors, assign, assign_layernorm

# The decoder spec of llama.decoder_config (LayerNorm, ungated MLP, GELU, parallel residual).
SPEC = dict(norm="layernorm", gated=False, act="gelu", parallel=True)


def config(hf: HFConfig) -> ModelConfig:
  """GPTNeoXConfig -> ModelConfig (rotary_pct / rotary_emb_base read by llama.rope)."""
  return llama.decoder_config(hf, SPEC)


def load(model: Transformer, t: Tensors) -> None:
  """GPT-NeoX / Pythia: fused query_key_value [H·3·K, D] (each head's q, k, v side by side), parallel residual."""
  cfg = model.cfg
  V, D, H, K, F = cfg.vocab_size, cfg.d_model, cfg.num_heads, cfg.d_head, cfg.d_ff
  linear = lambda name, d_in, d_out: (t.pop(f"{name}.weight", (d_out, d_in)).T, t.pop(f"{name}.bias", (d_out,)))
  assign(model.token_embed_VD, t.pop("embed_in.weight", (V, D)))
  for i, block in enumerate(model.blocks):
    prefix, attention = f"layers.{i}.", block.attention
    assign_layernorm(block.ln_attention, t, f"{prefix}input_layernorm", D)
    assign_layernorm(block.ln_mlp, t, f"{prefix}post_attention_layernorm", D)
    w_DE, b_E = linear(f"{prefix}attention.query_key_value", D, 3 * H * K)
    w_DH3K, b_H3K = w_DE.reshape(D, H, 3, K), b_E.reshape(H, 3, K)
    for j, (w, b) in enumerate(
      (
        (attention.w_q_DHK, attention.b_q_HK),
        (attention.w_k_DHK, attention.b_k_HK),
        (attention.w_v_DHK, attention.b_v_HK),
      )
    ):
      assign(w, w_DH3K[:, :, j])
      assign(b, b_H3K[:, j])
    w_ED, b_D = linear(f"{prefix}attention.dense", H * K, D)
    assign(attention.w_o_HKD, w_ED.reshape(H, K, D))
    assign(attention.b_o_D, b_D)
    w_DF, b_F = linear(f"{prefix}mlp.dense_h_to_4h", D, F)
    assign(block.mlp.w_in_DF, w_DF)
    assign(block.mlp.b_in_F, b_F)
    w_FD, b_D = linear(f"{prefix}mlp.dense_4h_to_h", F, D)
    assign(block.mlp.w_out_FD, w_FD)
    assign(block.mlp.b_out_D, b_D)
  assign_layernorm(model.ln_final, t, "final_layer_norm", D)
  assign(model.unembed_bias_V, np.zeros(V))
  if cfg.tie_embeddings:
    t.tensors.pop("embed_out.weight", None)
  else:
    assign(model.unembed_DV, t.pop("embed_out.weight", (V, D)).T)
