"""The BERT-shaped encoders: BERT, RoBERTa and DistilBERT (post-LN, embedding LayerNorm, masked-LM head).

nn.Linear stores W as [out, in], so W_Q^T is reshaped [D, H, K]; head h owns columns h*K:(h+1)*K of the
projections and rows h*K:(h+1)*K of the output projection. The three differ only in config keys and tensor
names (`NAMES`)."""

from __future__ import annotations

import dataclasses

import numpy as np
from absl import logging

from headspec.model.config import ModelConfig
from headspec.model.transformer import Transformer
from headspec.pretrained.common import activation, check
from headspec.pretrained.config_checks import HFConfig
from headspec.pretrained.tensors import Tensors, assign, assign_layernorm


def config(hf: HFConfig) -> ModelConfig:
  """BertConfig -> ModelConfig (post-LN encoder, embedding LayerNorm, token types, masked-LM head)."""
  path = hf.path
  position_type = hf.text("position_embedding_type", "absolute", optional=True)
  check(
    position_type == "absolute",
    path,
    f"position_embedding_type={position_type!r} is not supported (only 'absolute')",
  )
  for flag in ("is_decoder", "add_cross_attention", "is_encoder_decoder"):
    check(not hf.flag(flag, False), path, f"{flag}=true is not supported (encoder-only BERT)")
  D, H = hf.integer("hidden_size"), hf.integer("num_attention_heads")
  check(
    hf.integer("embedding_size", D, optional=True) == D,
    path,
    "embedding_size != hidden_size (factorised embeddings) is not supported",
  )
  check(D % H == 0, path, f"hidden_size={D} is not a multiple of num_attention_heads={H}")
  return ModelConfig(
    kind="encoder",
    vocab_size=hf.integer("vocab_size"),
    num_layers=hf.integer("num_hidden_layers"),
    num_heads=H,
    d_model=D,
    d_head=D // H,
    d_ff=hf.integer("intermediate_size"),
    max_len=hf.integer("max_position_embeddings"),
    dropout=hf.probability("hidden_dropout_prob"),
    attention_dropout=hf.probability("attention_probs_dropout_prob"),
    pre_layernorm=False,
    positions="learned",
    tie_embeddings=hf.flag("tie_word_embeddings", True),
    activation=activation(hf.text("hidden_act", "gelu", optional=True), "hidden_act", path),
    layer_norm_eps=hf.number("layer_norm_eps", 1e-12),
    type_vocab_size=hf.integer("type_vocab_size", 2),
    embedding_layernorm=True,
  )


def roberta_config(hf: HFConfig) -> ModelConfig:
  """RobertaConfig -> ModelConfig: BERT's, less the `pad_token_id + 1` position rows RoBERTa never uses
  for real tokens (its positions start after the padding index)."""
  cfg = config(hf)
  offset = hf.integer("pad_token_id", 1, low=0) + 1
  check(cfg.max_len > offset, hf.path, f"max_position_embeddings={cfg.max_len} leaves no positions after padding")
  return dataclasses.replace(cfg, max_len=cfg.max_len - offset, type_vocab_size=hf.integer("type_vocab_size", 1))


def distilbert_config(hf: HFConfig) -> ModelConfig:
  """DistilBertConfig -> ModelConfig (BERT without token types; LayerNorm eps 1e-12 as its code fixes)."""
  path = hf.path
  check(not hf.flag("sinusoidal_pos_embds", False), path, "sinusoidal_pos_embds=true is not supported")
  D, H = hf.integer("dim"), hf.integer("n_heads")
  check(D % H == 0, path, f"dim={D} is not a multiple of n_heads={H}")
  return ModelConfig(
    kind="encoder",
    vocab_size=hf.integer("vocab_size"),
    num_layers=hf.integer("n_layers"),
    num_heads=H,
    d_model=D,
    d_head=D // H,
    d_ff=hf.integer("hidden_dim"),
    max_len=hf.integer("max_position_embeddings"),
    dropout=hf.probability("dropout"),
    attention_dropout=hf.probability("attention_dropout"),
    pre_layernorm=False,
    positions="learned",
    tie_embeddings=hf.flag(("tie_word_embeddings", "tie_weights_"), True),
    activation=activation(hf.text("activation", "gelu", optional=True), "activation", path),
    layer_norm_eps=1e-12,
    type_vocab_size=0,
    embedding_layernorm=True,
  )


def _init_mlm_head(model: Transformer, seed: int = 0) -> None:
  """The masked-LM head a checkpoint lacks, initialised as model.py does (N(0, 0.02) weights, zero biases, unit LN)."""
  D, V = model.cfg.d_model, model.cfg.vocab_size
  rng = np.random.default_rng(seed)
  assign(model.mlm_w_DD, 0.02 * rng.standard_normal((D, D)))
  assign(model.mlm_b_D, np.zeros(D))
  assign(model.ln_mlm.scale, np.ones(D))
  assign(model.ln_mlm.bias, np.zeros(D))
  assign(model.unembed_bias_V, np.zeros(V))
  if not model.cfg.tie_embeddings:
    assign(model.unembed_DV, 0.02 * rng.standard_normal((D, V)))


# Tensor names of the BERT-shaped encoders: (embeddings, layer prefix, per-layer names, masked-LM head names).
NAMES = {
  "bert": dict(
    embeddings="embeddings.",
    layer="encoder.layer.{i}.",
    q="attention.self.query",
    k="attention.self.key",
    v="attention.self.value",
    o="attention.output.dense",
    ln_attention="attention.output.LayerNorm",
    mlp_in="intermediate.dense",
    mlp_out="output.dense",
    ln_mlp="output.LayerNorm",
    head="cls.predictions.",
    transform="cls.predictions.transform.dense",
    ln_head="cls.predictions.transform.LayerNorm",
    bias="cls.predictions.bias",
    decoder="cls.predictions.decoder.weight",
  ),
  "distilbert": dict(
    embeddings="embeddings.",
    layer="transformer.layer.{i}.",
    q="attention.q_lin",
    k="attention.k_lin",
    v="attention.v_lin",
    o="attention.out_lin",
    ln_attention="sa_layer_norm",
    mlp_in="ffn.lin1",
    mlp_out="ffn.lin2",
    ln_mlp="output_layer_norm",
    head="vocab_",
    transform="vocab_transform",
    ln_head="vocab_layer_norm",
    bias="vocab_projector.bias",
    decoder="vocab_projector.weight",
  ),
}
NAMES["roberta"] = dict(
  NAMES["bert"],
  head="lm_head.",
  transform="lm_head.dense",
  ln_head="lm_head.layer_norm",
  bias="lm_head.bias",
  decoder="lm_head.decoder.weight",
)


def load(model: Transformer, t: Tensors, family: str = "bert") -> None:
  """BERT, RoBERTa (positions from row pad_token_id + 1 on) and DistilBERT (no token types)."""
  cfg, names = model.cfg, NAMES[family]
  V, D, H, K, F = cfg.vocab_size, cfg.d_model, cfg.num_heads, cfg.d_head, cfg.d_ff
  linear = lambda name, d_in, d_out: (t.pop(f"{name}.weight", (d_out, d_in)).T, t.pop(f"{name}.bias", (d_out,)))
  emb = names["embeddings"]
  assign(model.token_embed_VD, t.pop(f"{emb}word_embeddings.weight", (V, D)))
  positions = t.tensors.get(f"{emb}position_embeddings.weight")
  offset = 0 if positions is None else positions.shape[0] - cfg.max_len  # RoBERTa: pad_token_id + 1
  table = t.pop(f"{emb}position_embeddings.weight", (cfg.max_len + offset, D))
  assign(model.position_embed_TD, table[offset:])
  if cfg.type_vocab_size:
    assign(model.type_embed_YD, t.pop(f"{emb}token_type_embeddings.weight", (cfg.type_vocab_size, D)))
  assign_layernorm(model.ln_embed, t, f"{emb}LayerNorm", D)
  for i, block in enumerate(model.blocks):
    prefix, attention = names["layer"].format(i=i), block.attention
    for proj, w, b in (
      ("q", attention.w_q_DHK, attention.b_q_HK),
      ("k", attention.w_k_DHK, attention.b_k_HK),
      ("v", attention.w_v_DHK, attention.b_v_HK),
    ):
      w_DE, b_E = linear(prefix + names[proj], D, H * K)
      assign(w, w_DE.reshape(D, H, K))
      assign(b, b_E.reshape(H, K))
    w_ED, b_D = linear(prefix + names["o"], H * K, D)
    assign(attention.w_o_HKD, w_ED.reshape(H, K, D))
    assign(attention.b_o_D, b_D)
    assign_layernorm(block.ln_attention, t, prefix + names["ln_attention"], D)
    w_DF, b_F = linear(prefix + names["mlp_in"], D, F)
    assign(block.mlp.w_in_DF, w_DF)
    assign(block.mlp.b_in_F, b_F)
    w_FD, b_D = linear(prefix + names["mlp_out"], F, D)
    assign(block.mlp.w_out_FD, w_FD)
    assign(block.mlp.b_out_D, b_D)
    assign_layernorm(block.ln_mlp, t, prefix + names["ln_mlp"], D)
  if not t.has(names["head"]):
    logging.warning(
      "%s: no masked-LM head (%s*, e.g. a plain BertModel); the MLM head and "
      "output bias are randomly initialised, so logits are meaningless until trained",
      t.path,
      names["head"],
    )
    _init_mlm_head(model)
    return
  w_DD, b_D = linear(names["transform"], D, D)
  assign(model.mlm_w_DD, w_DD)
  assign(model.mlm_b_D, b_D)
  assign_layernorm(model.ln_mlm, t, names["ln_head"], D)
  assign(model.unembed_bias_V, t.pop(names["bias"], (V,)))
  if cfg.tie_embeddings:  # transformers ties the decoder to the word embeddings, whatever the file holds
    t.tensors.pop(names["decoder"], None)
  else:
    assign(model.unembed_DV, t.pop(names["decoder"], (V, D)).T)
