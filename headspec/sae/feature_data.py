"""Per-feature tables of one SAE for the atlas's feature pages (docs/atlas.md, docs/sae.md), written by
`headspec sae` beside features.csv:

  sae/histograms.csv  the histogram of each live feature's nonzero activations on the evaluation tokens:
                      HISTOGRAM_BINS equal bins over [its smallest, its largest] nonzero activation, non-empty
                      bins only, so a feature's counts add up to the tokens where it fires
  sae/shares.csv      a_fh of every feature and head: its decoder direction's share in each head's slice of z
                      (Kissane et al. 2024; headspec.sae.metrics.sae_head_fractions)
  sae/logits.csv      the direct-path logit effect of each live feature: its decoder direction W_dec[f] (raw z
                      units, per unit of activation) through each head's W_O^h into the residual stream, summed,
                      then the final norm's gain (and its centring, for LayerNorm) and the unembedding W_U, the
                      TOP_TOKENS most promoted and most suppressed tokens (the direct logit attribution of
                      Elhage et al. 2021; TransformerLens folds the norm so, `fold_ln` with
                      `center_writing_weights`). Later layers, MLPs, biases and the norms' scale are left out.
                      Sites of the residual width (resid_*, attn_out, mlp_out, mlp_in) skip W_O; a Gemma-2/OLMo-2
                      model's norm of the attention output adds its gain. Decoders with a trained LM head only:
                      an encoder's masked-LM head (dense, activation, LayerNorm) is not linear and a model without
                      a trained head predicts nothing, so those, and sites q, k, v (which W_O never reads), get
                      no rows.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from headspec.io import tables
from headspec.model import tokens
from headspec.model.sites import SITES
from headspec.parallel import mesh as mesh_lib

HISTOGRAM_BINS = 20
TOP_TOKENS = 10
TABLES = (tables.SAE_HISTOGRAMS, tables.SAE_SHARES, tables.SAE_LOGITS)
_CHUNK = 256  # features per unembedding product (a [chunk, V] logits block)


def histogram_rows(key: dict, f_NF, bins: int = HISTOGRAM_BINS) -> list[dict]:
  """histograms.csv rows: per feature, `bins` equal bins over [min, max] of its nonzero activations in f_NF
  (one bin when they are all equal), the non-empty ones; none for a feature that never fires."""
  f_NF = np.asarray(f_NF)
  rows = []
  for f in range(f_NF.shape[1]):
    values = f_NF[:, f][f_NF[:, f] > 0].astype(np.float64)
    if not len(values):
      continue
    low, high = float(values.min()), float(values.max())
    n = bins if high > low else 1
    counts, edges = np.histogram(values, bins=n, range=(low, high) if high > low else (low, low + 1.0))
    if n == 1:
      edges = np.array([low, high])
    for b in np.nonzero(counts)[0]:
      rows.append(key | dict(feature=f, bin=int(b), low=float(edges[b]), high=float(edges[b + 1]),
                             count=int(counts[b])))  # fmt: skip
  return rows


def share_rows(key: dict, a_FH) -> list[dict]:
  """shares.csv rows: a_fh of every feature and head."""
  a_FH = np.asarray(a_FH, np.float64)
  return [
    key | dict(feature=f, head=h, share=float(a_FH[f, h])) for f in range(a_FH.shape[0]) for h in range(a_FH.shape[1])
  ]


def _host(x) -> np.ndarray:
  return mesh_lib.to_host(x[...], np.float64)


def _through(norm, r_FD) -> np.ndarray:
  """r_FD through a norm's linear part: centred for LayerNorm, times its gain (its scale is left out)."""
  if isinstance(norm, nnx.LayerNorm):
    r_FD = r_FD - r_FD.mean(-1, keepdims=True)
  scale = getattr(norm, "scale", None)
  return r_FD if scale is None else r_FD * _host(scale)


def residual_directions(model, w_dec_FK, site: str, layer: int) -> np.ndarray | None:
  """[F, D] what each feature's decoder direction adds to the residual stream on the direct path (module
  docstring): Σ_h W_dec[f, h] W_O^h for z (through the attention output's norm where the model has one),
  W_dec itself for a site of the residual width; None for a site that does not write the residual stream."""
  cfg = model.cfg
  w = np.asarray(w_dec_FK, np.float64)
  if SITES[site] == "BTD":
    return w
  if site != "z":
    return None
  block = model.blocks[layer]
  w_o_HKD = _host(block.attention.w_o_HKD)
  r_FD = np.einsum("fhk,hkd->fd", w.reshape(len(w), *w_o_HKD.shape[:2]), w_o_HKD)
  if cfg.sublayer_norm:  # x + norm(attention(x)): Gemma-2's extra norm, OLMo-2's only one
    r_FD = _through(block.ln_attention_out if cfg.pre_layernorm else block.ln_attention, r_FD)
  return r_FD


def unembedding(model, vocab: int) -> np.ndarray:
  """[D, V'] W_U of the first `vocab` tokens (the tied embedding's transpose where tied)."""
  w = _host(model.token_embed_VD).T if model.cfg.tie_embeddings else _host(model.unembed_DV)
  return w[:, :vocab]


@functools.partial(jax.jit, static_argnames="top")
def _top_both(r_CD, w_DV, top: int):
  logits_CV = jnp.matmul(r_CD, w_DV, precision=jax.lax.Precision.HIGHEST)
  high = jax.lax.top_k(logits_CV, top)
  low = jax.lax.top_k(-logits_CV, top)
  return high[0], high[1], -low[0], low[1]


def top_logits(model, r_FD, vocab: int, top: int = TOP_TOKENS):
  """(promoted values, ids, suppressed values, ids), each [F, top]: the largest and smallest direct-path
  logits of each row of r_FD (`logit_effects`), in chunks of features on the device (float32)."""
  r_FD = _through(model.ln_final, r_FD) if model.cfg.final_norm else r_FD
  w_DV = jnp.asarray(unembedding(model, vocab), jnp.float32)
  top = min(top, vocab)
  F = len(r_FD)
  out = [np.zeros((F, top)), np.zeros((F, top), np.int64), np.zeros((F, top)), np.zeros((F, top), np.int64)]
  for start in range(0, F, _CHUNK):
    chunk = np.zeros((_CHUNK, r_FD.shape[1]), np.float32)  # one compiled shape
    part = r_FD[start : start + _CHUNK]
    chunk[: len(part)] = part
    for array, got in zip(out, _top_both(jnp.asarray(chunk), w_DV, top)):
      array[start : start + len(part)] = np.asarray(got)[: len(part)]
  return tuple(out)


def logit_rows(key: dict, model, tokenizer, sae, site: str, layer: int, live_F) -> list[dict]:
  """logits.csv rows of the live features: the TOP_TOKENS most promoted and suppressed tokens, each with its
  direct-path logit per unit of activation; [] where there is no direct path (module docstring)."""
  if model.cfg.kind != "decoder":
    return []
  r_FD = residual_directions(model, np.asarray(sae.W_dec_FK), site, layer)
  if r_FD is None:
    return []
  live = np.nonzero(np.asarray(live_F))[0]
  vocab = min(int(model.cfg.vocab_size), int(getattr(tokenizer, "vocab_size", model.cfg.vocab_size)))
  up, up_ids, down, down_ids = top_logits(model, r_FD[live], vocab)
  text = {}
  rows = []
  for i, f in enumerate(live):
    for direction, values, ids in (("promoted", up, up_ids), ("suppressed", down, down_ids)):
      for rank, (value, token_id) in enumerate(zip(values[i], ids[i])):
        token_id = int(token_id)
        if token_id not in text:
          text[token_id] = tokens.str_token(tokenizer, token_id)
        rows.append(key | dict(feature=int(f), direction=direction, rank=rank, token_id=token_id,
                               token=text[token_id], value=float(value)))  # fmt: skip
  return rows


def feature_tables(key: dict, *, sae, f_NF, a_FH, model, tokenizer, site: str, layer: int, lm_head: bool) -> dict:
  """Every table of this module for one SAE (`key`: model, step, site, layer, sae): {Table: rows}."""
  live_F = (np.asarray(f_NF) > 0).any(0)
  logits = logit_rows(key, model, tokenizer, sae, site, layer, live_F) if lm_head else []
  return {
    tables.SAE_HISTOGRAMS: histogram_rows(key, f_NF),
    tables.SAE_SHARES: share_rows(key, a_FH) if a_FH is not None else [],
    tables.SAE_LOGITS: logits,
  }
