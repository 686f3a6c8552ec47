"""The Transformer's layers: positions, norms, the KV cache, per-head attention, the MLP and the block.

Each layer applies the edits of its sites and returns what was asked to be captured (headspec/model/sites.py);
the Transformer (transformer.py) runs the blocks as one scan. Shape letters: transformer.py's glossary.
"""

from __future__ import annotations

import math

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from headspec.errors import UserError
from headspec.model import draws
from headspec.model.config import ACTIVATIONS, ModelConfig
from headspec.model.sites import apply_edits
from headspec.parallel import mesh as mesh_lib


def normal_param(rngs: nnx.Rngs, shape, std=0.02) -> nnx.Param:
  """std · N(0, 1) of `shape`, drawn with the next key of `rngs.params` (headspec/model/draws.py: bit for bit
  `jax.random.normal`, compiled once per size bucket rather than per parameter shape)."""
  return nnx.Param(draws.normal(rngs.params(), shape, std))


def zeros_param(shape) -> nnx.Param:
  return nnx.Param(jnp.zeros(shape, jnp.float32))


def sinusoidal_positions(max_len: int, d_model: int) -> jax.Array:
  """Fixed positional encodings of Vaswani et al. 2017, §3.5: sin on even, cos on odd features."""
  pos_T1 = jnp.arange(max_len, dtype=jnp.float32)[:, None]
  freq = jnp.exp(-jnp.log(10000.0) * jnp.arange(0, d_model, 2, dtype=jnp.float32) / d_model)
  table_TD = jnp.zeros((max_len, d_model), jnp.float32)
  table_TD = table_TD.at[:, 0::2].set(jnp.sin(pos_T1 * freq))
  return table_TD.at[:, 1::2].set(jnp.cos(pos_T1 * freq)[:, : d_model // 2])


def rotary_frequencies(cfg: ModelConfig) -> np.ndarray:
  """The rotation frequencies of the rotating features' pairs, [K_rot / 2] float32, scaled per
  `cfg.rope_scaling` (Su et al. 2021; Llama-3.1's scaling divides low frequencies by the factor, keeps high
  ones, blends between). A constant of the config, computed in NumPy: the power in float64 rounded once,
  because at position p an ulp of a frequency moves the angle by p ulps (1e-5 at p = 170)."""
  dim = int(cfg.d_head * cfg.rotary_fraction)
  exponent = np.arange(0, dim, 2).astype(np.float32) / np.float32(dim)
  inv_freq = np.float32(1.0) / (np.float64(cfg.rope_theta) ** exponent.astype(np.float64)).astype(np.float32)
  f32 = np.float32
  if cfg.rope_scaling == "linear":
    return inv_freq / f32(cfg.rope_factor)
  if cfg.rope_scaling == "llama3":
    factor, low, high = f32(cfg.rope_factor), f32(cfg.rope_low_freq_factor), f32(cfg.rope_high_freq_factor)
    original = f32(cfg.rope_original_max_len)
    wavelen = f32(2 * math.pi) / inv_freq
    scaled = np.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return np.where(medium, smoothed, scaled).astype(np.float32)
  return inv_freq


def apply_rotary(x_BTHK, positions_BT, inv_freq):
  """Rotates the leading 2·len(inv_freq) features of every head by position (Hugging Face's rotate_half
  layout: feature i pairs with i + K_rot/2); the rest pass unchanged (partial rotary)."""
  rot = 2 * inv_freq.shape[0]
  angles_BTR = positions_BT.astype(jnp.float32)[..., None] * inv_freq
  angles_BTR = jnp.concatenate([angles_BTR, angles_BTR], axis=-1)[:, :, None]
  cos, sin = jnp.cos(angles_BTR).astype(x_BTHK.dtype), jnp.sin(angles_BTR).astype(x_BTHK.dtype)
  x_rot, x_pass = x_BTHK[..., :rot], x_BTHK[..., rot:]
  half = rot // 2
  rotated = jnp.concatenate([-x_rot[..., half:], x_rot[..., :half]], axis=-1)
  return jnp.concatenate([x_rot * cos + rotated * sin, x_pass], axis=-1)


def norm_layer(cfg: ModelConfig, rngs: nnx.Rngs):
  """A norm over d_model: LayerNorm or RMSNorm per `cfg.norm`."""
  cls = nnx.LayerNorm if cfg.norm == "layernorm" else nnx.RMSNorm
  return cls(cfg.d_model, epsilon=cfg.layer_norm_eps, dtype=jnp.dtype(cfg.dtype), rngs=rngs)


def norm_scale(norm, x_BTD):
  """[B,T] float32: what `norm` divides each token by, sqrt(var + eps) for LayerNorm (its fast variance E[x²] −
  E[x]², clipped at 0, as flax computes it) and sqrt(mean x² + eps) for RMSNorm (TransformerLens's hook_scale)."""
  x32 = x_BTD.astype(jnp.float32)
  mean_sq = jnp.mean(x32 * x32, axis=-1)
  if isinstance(norm, nnx.LayerNorm):
    mean = jnp.mean(x32, axis=-1)
    mean_sq = jnp.maximum(mean_sq - mean * mean, 0.0)
  return jnp.sqrt(mean_sq + norm.epsilon)


def normed_by(norm, x_BTD, scale_BT):
  """`norm` applied to `x_BTD` with the given per-token scale in place of its own (edits of ln*_scale)."""
  x32 = x_BTD.astype(jnp.float32)
  y = x32 - jnp.mean(x32, axis=-1, keepdims=True) if isinstance(norm, nnx.LayerNorm) else x32
  y = y / scale_BT.astype(jnp.float32)[..., None]
  if getattr(norm, "scale", None) is not None:
    y = y * norm.scale[...].astype(jnp.float32)
  if getattr(norm, "bias", None) is not None:
    y = y + norm.bias[...].astype(jnp.float32)
  return y.astype(norm.dtype or x_BTD.dtype)


@flax.struct.dataclass
class KVCache:
  """Every layer's keys and values of the tokens decoded so far, for `generate` (headspec/model/generation.py).

  Slots 0..S−1 along S; `index` (a traced int32) is the first slot the next forward writes its T tokens to.
  k and v are per query head (after QK-norm, rotary and the sites' edits, so an edit of k or v stays in the
  cache as in a full pass); `valid_BS` marks slots that hold a real token, `positions_BS` their positions
  (for sliding windows). `KVCache.empty(cfg, B, S)` is an empty one.
  """

  k_LBSHK: jax.Array
  v_LBSHK: jax.Array
  valid_BS: jax.Array
  positions_BS: jax.Array
  index: jax.Array

  @classmethod
  def empty(cls, cfg: ModelConfig, B: int, S: int) -> KVCache:
    shape = (cfg.num_layers, B, S, cfg.num_heads, cfg.d_head)
    zeros = jnp.zeros(shape, jnp.dtype(cfg.dtype))
    return cls(zeros, zeros, jnp.zeros((B, S), bool), jnp.zeros((B, S), jnp.int32), jnp.zeros((), jnp.int32))


ATTENTION_PATHS = ("cudnn", "xla", "per_head")


def attention_implementation(
  cfg: ModelConfig, *, need_pattern: bool, platform: str, dtype, dropout: bool = False, lengths=(0, 0)
) -> tuple[str, str]:
  """(path, reason): how one attention layer computes softmax(q kᵀ) v (docs/scale.md, "Which attention path").

  'per_head' writes out each head's [B,H,T,S] scores and map: needed when the pattern or attention scores are
  captured or edited (`need_pattern`), under attention dropout, and with soft-capped logits, which neither fused
  kernel computes. Otherwise `jax.nn.dot_product_attention` fuses it: 'cudnn' (flash attention, Dao et al.
  2022) on a GPU in float16/bfloat16 with d_head <= 128 and a multiple of 8, else 'xla'. platform: a
  `jax.default_backend()` name ('cpu', 'gpu', 'tpu'); dtype: the compute dtype of q, k, v; lengths: (T, S), the
  queries' and keys' lengths (cuDNN's masked kernel, differentiated, needs both even).
  """
  if need_pattern:
    return "per_head", "the pattern or attention scores are captured or edited"
  if dropout:
    return "per_head", "attention dropout drops entries of the pattern"
  if cfg.attention_softcap:
    return "per_head", "attention_softcap: the fused kernels do not soft-cap logits"
  if platform not in ("gpu", "cuda"):
    return "xla", f"platform {platform}: cuDNN runs on GPUs only"
  if jnp.dtype(dtype) not in (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16)):
    return "xla", f"dtype {jnp.dtype(dtype).name}: cuDNN's flash attention needs float16 or bfloat16"
  if cfg.d_head > 128 or cfg.d_head % 8:
    return "xla", f"d_head={cfg.d_head}: cuDNN's flash attention needs d_head <= 128 and a multiple of 8"
  if any(n % 2 for n in lengths):
    return "xla", f"lengths (T, S)={tuple(lengths)}: cuDNN's masked attention needs even lengths"
  return "cudnn", "GPU, half precision, pattern not needed"


class Attention(nnx.Module):
  """Multi-head self-attention with per-head projections W_Q [D,H,K], W_K, W_V [D,G,K] and W_O [H,K,D].

  G = `cfg.kv_heads` (= H unless grouped-query attention); W_K and W_V keep their `_DHK` names with G on
  that axis. A head is a query head: with G < H, head h reads K/V group `cfg.kv_group_of_head[h]`, and the
  captured k and v are per query head (each group repeated over its heads).
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    D, H, G, K = cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.d_head
    self.w_q_DHK = normal_param(rngs, (D, H, K))
    self.w_k_DHK, self.w_v_DHK = normal_param(rngs, (D, G, K)), normal_param(rngs, (D, G, K))
    bias = cfg.attention_bias
    self.b_q_HK = zeros_param((H, K)) if bias else None
    self.b_k_HK, self.b_v_HK = (zeros_param((G, K)), zeros_param((G, K))) if bias else (None, None)
    self.w_o_HKD = normal_param(rngs, (H, K, D))
    self.b_o_D = zeros_param((D,)) if cfg.attention_out_bias else None
    self.attention_dropout = nnx.Dropout(cfg.attention_dropout)
    self.dtype = jnp.dtype(cfg.dtype)
    self.cfg = cfg
    if cfg.qk_norm != "none":  # created last: a seed draws the other weights as without the option
      width_q, width_k = (K, K) if cfg.qk_norm == "head" else (H * K, G * K)
      self.q_norm, self.k_norm = _rms(cfg, rngs, width_q), _rms(cfg, rngs, width_k)

  def _project(self, x_BTD, w, b):
    """x W + b per head; x is [B,T,D], or [B,T,H,D] with one input per query head (sites q_in, k_in, v_in),
    whose K/V are then per query head (each group's weights repeated over its heads)."""
    dt = self.dtype
    w, b = w[...], None if b is None else b[...]
    if x_BTD.ndim == 4:
      per_group = self.cfg.num_heads // w.shape[1]
      w, b = jnp.repeat(w, per_group, axis=1), None if b is None else jnp.repeat(b, per_group, axis=0)
      y_BTHK = jnp.einsum("bthd,dhk->bthk", x_BTD, w.astype(dt))
    else:
      y_BTHK = jnp.einsum("btd,dhk->bthk", x_BTD, w.astype(dt))
    y_BTHK = y_BTHK if b is None else y_BTHK + b.astype(dt)
    if self.cfg.clip_qkv:
      y_BTHK = jnp.clip(y_BTHK, -self.cfg.clip_qkv, self.cfg.clip_qkv)
    return y_BTHK

  def _qk_norm(self, norm, y_BTHK):
    if self.cfg.qk_norm == "head":
      return norm(y_BTHK)
    B, T, H, K = y_BTHK.shape
    if H * K != norm.scale.shape[0]:  # per-query-head keys of grouped heads: the G·K-wide norm has no meaning
      raise UserError("interventions k_in: grouped-query attention with qk_norm='full' reads all groups' keys at once")
    return norm(y_BTHK.reshape(B, T, H * K)).reshape(B, T, H, K)

  def __call__(self, x_BTD, mask_BTS, dropout_rngs, capture, edits, positions_BT, cache=None, grouped_kv=False):
    """(out_BTD, captured) with `edits` {site: (edit of this layer, ...)} applied at q, k, v, attn_scores,
    pattern, z, head_out. x_BTD: the normed input, or a tuple of the queries', keys' and values' inputs ([B,T,D]
    or per head [B,T,H,D]). cache: this layer's (k_BSHK, v_BSHK, index) of a KVCache: the T new keys and
    values are written at slots index.., attention reads all S slots (mask_BTS), and captured['kv_cache'] is
    the updated (k_BSHK, v_BSHK). grouped_kv: a fused path may read grouped-query K/V un-repeated (a forward
    without captures or edits; with them, K/V are repeated per query head as always, so they stay bit for bit)."""
    dt, cfg = self.dtype, self.cfg
    x_q, x_k, x_v = x_BTD if isinstance(x_BTD, tuple) else (x_BTD,) * 3
    q_BTHK = mesh_lib.constrain(self._project(x_q, self.w_q_DHK, self.b_q_HK), "BTHK")  # heads over `tensor`
    k_BSHK = mesh_lib.constrain(self._project(x_k, self.w_k_DHK, self.b_k_HK), "BTHK")
    v_BSHK = mesh_lib.constrain(self._project(x_v, self.w_v_DHK, self.b_v_HK), "BTHK")
    if cfg.qk_norm != "none":
      q_BTHK, k_BSHK = self._qk_norm(self.q_norm, q_BTHK), self._qk_norm(self.k_norm, k_BSHK)
    if cfg.positions == "rotary":
      inv_freq = rotary_frequencies(cfg)
      q_BTHK, k_BSHK = apply_rotary(q_BTHK, positions_BT, inv_freq), apply_rotary(k_BSHK, positions_BT, inv_freq)
    scale = cfg.attention_scale or q_BTHK.shape[-1] ** -0.5
    dropout_on = dropout_rngs is not None and self.attention_dropout.rate > 0
    need_pattern = bool({"pattern", "attn_scores"} & (set(capture) | set(edits)))
    path, _ = attention_implementation(
      cfg,
      need_pattern=need_pattern,
      platform=jax.default_backend(),
      dtype=q_BTHK.dtype,
      dropout=dropout_on,
      lengths=(q_BTHK.shape[1], k_BSHK.shape[1]),
    )
    # K/V per query head wherever one is read, edited or cached per head; the fused kernels take the groups as is.
    per_head_kv = path == "per_head" or cache is not None or not grouped_kv
    if cfg.kv_heads != cfg.num_heads and per_head_kv:  # grouped-query attention: each query head gets its K, V
      per_group = cfg.num_heads // cfg.kv_heads
      group = lambda y: y if y.shape[2] == cfg.num_heads else jnp.repeat(y, per_group, axis=2)  # per head already
      k_BSHK, v_BSHK = group(k_BSHK), group(v_BSHK)
    captured = {name: value for name, value in (("q", q_BTHK), ("k", k_BSHK), ("v", v_BSHK)) if name in capture}
    q_BTHK, k_BSHK, v_BSHK = (
      apply_edits(edits, "q", q_BTHK),
      apply_edits(edits, "k", k_BSHK),
      apply_edits(edits, "v", v_BSHK),
    )
    if cache is not None:  # decoding: the new keys and values join the cached ones
      k_cache, v_cache, index = cache
      k_BSHK = jax.lax.dynamic_update_slice(k_cache, k_BSHK.astype(k_cache.dtype), (0, index, 0, 0))
      v_BSHK = jax.lax.dynamic_update_slice(v_cache, v_BSHK.astype(v_cache.dtype), (0, index, 0, 0))
      captured["kv_cache"] = (k_BSHK, v_BSHK)
    probs_BHTS = None
    if path == "per_head":  # the written-out path: A_h needed or changed
      logits_BHTS = jnp.einsum("bthk,bshk->bhts", q_BTHK, k_BSHK).astype(jnp.float32) * scale
      if cfg.attention_softcap:
        logits_BHTS = cfg.attention_softcap * jnp.tanh(logits_BHTS / cfg.attention_softcap)
      logits_BHTS = jnp.where(mask_BTS[:, None], logits_BHTS, jnp.finfo(jnp.float32).min)
      if "attn_scores" in capture:
        captured["attn_scores"] = logits_BHTS
      logits_BHTS = apply_edits(edits, "attn_scores", logits_BHTS)
      probs_BHTS = mesh_lib.constrain(jax.nn.softmax(logits_BHTS, axis=-1), "BHTS")
      captured.update({"pattern": probs_BHTS} if "pattern" in capture else {})
      probs_BHTS = apply_edits(edits, "pattern", probs_BHTS)
      dropped_BHTS = self.attention_dropout(probs_BHTS, deterministic=dropout_rngs is None, rngs=dropout_rngs)
      z_BTHK = mesh_lib.constrain(jnp.einsum("bhts,bshk->bthk", dropped_BHTS.astype(dt), v_BSHK), "BTHK")
    else:  # fused: jax.nn.dot_product_attention, cuDNN or XLA as chosen above; K/V un-repeated (G heads)
      z_BTHK = jax.nn.dot_product_attention(
        q_BTHK, k_BSHK, v_BSHK, mask=mask_BTS[:, None], scale=scale, implementation=path
      )
    if "z" in capture:
      captured["z"] = z_BTHK
    masked_BTHK = apply_edits(edits, "z", z_BTHK)
    if "head_out" in capture or "head_out" in edits:
      head_out_BTHD = jnp.einsum("bthk,hkd->bthd", masked_BTHK, self.w_o_HKD[...].astype(dt))
      captured.update({"head_out": head_out_BTHD} if "head_out" in capture else {})
    if "head_out" in edits:
      out_BTD = apply_edits(edits, "head_out", head_out_BTHD).sum(2)
    else:
      out_BTD = jnp.einsum("bthk,hkd->btd", masked_BTHK, self.w_o_HKD[...].astype(dt))
    if self.b_o_D is not None:
      out_BTD = out_BTD + self.b_o_D[...].astype(dt)
    return out_BTD, captured


def _rms(cfg: ModelConfig, rngs: nnx.Rngs, width: int) -> nnx.RMSNorm:
  return nnx.RMSNorm(width, epsilon=cfg.layer_norm_eps, dtype=jnp.dtype(cfg.dtype), rngs=rngs)


class MLP(nnx.Module):
  """act(x W_in + b_in) W_out + b_out, or gated (`cfg.gated_mlp`): (act(x W_gate) * x W_in) W_out."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.w_in_DF, self.b_in_F = (
      normal_param(rngs, (cfg.d_model, cfg.d_ff)),
      zeros_param((cfg.d_ff,)) if cfg.mlp_bias else None,
    )
    self.w_out_FD = normal_param(rngs, (cfg.d_ff, cfg.d_model))
    self.b_out_D = zeros_param((cfg.d_model,)) if cfg.mlp_bias else None
    self.w_gate_DF = normal_param(rngs, (cfg.d_model, cfg.d_ff)) if cfg.gated_mlp else None
    self.b_gate_F = zeros_param((cfg.d_ff,)) if cfg.gated_mlp and cfg.mlp_bias else None
    self.activation = ACTIVATIONS[cfg.activation]
    self.dtype = jnp.dtype(cfg.dtype)

  def __call__(self, x_BTD, post=None):
    """post: a function of the hidden activation h_BTF (the site mlp_post: read and edited), None for none."""
    dt = self.dtype
    linear = lambda x, w, b: x @ w[...].astype(dt) + (0 if b is None else b[...].astype(dt))
    if self.w_gate_DF is None:
      h_BTF = self.activation(linear(x_BTD, self.w_in_DF, self.b_in_F))
    else:
      h_BTF = self.activation(linear(x_BTD, self.w_gate_DF, self.b_gate_F)) * linear(x_BTD, self.w_in_DF, self.b_in_F)
    h_BTF = h_BTF if post is None else post(h_BTF)
    return linear(h_BTF, self.w_out_FD, self.b_out_D)


class Block(nnx.Module):
  """Attention and MLP sublayers with residuals; pre-LN (GPT-2) or post-LN (BERT) by config; without the
  MLP sublayer when `ModelConfig.mlp` is False (attention-only). `sublayer_norm` adds a norm on each
  sublayer's output (Gemma-2 with pre-norms, OLMo-2 without); `parallel_residual` adds attention and MLP
  of the same input (GPT-NeoX). Every layer's Block has the same structure (the Transformer scans them); the
  sliding window `attention_windows[layer]` is an argument of the call, not an attribute."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    # Created in this order so that a seed draws the same weights as before the attention-only option.
    self.attention = Attention(cfg, rngs=rngs)
    self.has_mlp = cfg.mlp
    if cfg.mlp:  # an attention-only model has no MLP sublayer and no LayerNorm before it
      self.mlp = MLP(cfg, rngs=rngs)
    self.ln_attention = norm_layer(cfg, rngs)
    if cfg.mlp:
      self.ln_mlp = norm_layer(cfg, rngs)
    if cfg.sublayer_norm and cfg.pre_layernorm:  # Gemma-2's extra norms (without pre-norms, ln_* are the outputs')
      self.ln_attention_out = norm_layer(cfg, rngs)
      if cfg.mlp:
        self.ln_mlp_out = norm_layer(cfg, rngs)
    self.dropout = nnx.Dropout(cfg.dropout)
    self.pre_layernorm = cfg.pre_layernorm
    self.sublayer_norm, self.parallel_residual = cfg.sublayer_norm, cfg.parallel_residual
    self.causal = cfg.kind == "decoder"

  def __call__(
    self,
    x_BTD,
    mask_BTS,
    dropout_rngs,
    capture,
    edits,
    positions_BT,
    key_positions_BS=None,
    cache=None,
    grouped_kv=False,
    window=0,
  ):
    """(resid_post_BTD, captured): the sites resid_pre, attn_out, resid_mid, mlp_in, mlp_post, mlp_out,
    resid_post, ln1_scale and ln2_scale read and edited where each is defined for this block's layout
    (`SITES`), the attention's sites inside it. key_positions_BS: the keys' positions when they are not the
    queries' (a KVCache's slots); cache, grouped_kv: this layer's part of the KVCache, and as `Attention.__call__`.
    window: this layer's sliding window (`ModelConfig.attention_windows`; an int or a traced int32, 0 = all)."""
    drop = lambda y: self.dropout(y, deterministic=dropout_rngs is None, rngs=dropout_rngs)
    if not isinstance(window, int) or window:  # sliding-window attention: keys fewer than `window` positions back
      key_positions_BS = positions_BT if key_positions_BS is None else key_positions_BS
      distance_BTS = positions_BT[:, :, None] - key_positions_BS[:, None, :]
      distance_BTS = distance_BTS if self.causal else jnp.abs(distance_BTS)
      mask_BTS = mask_BTS & ((window == 0) | (distance_BTS < window))
    captured = {}

    def site(name, value):  # captured as computed, then edited
      if name in capture:
        captured[name] = value
      return apply_edits(edits, name, value)

    def scaled(norm, name):  # the norm itself unless its scale (site `name`) is read or edited
      if name not in capture and name not in edits:
        return norm

      def apply(y_BTD):
        scale_BT = site(name, norm_scale(norm, y_BTD))
        return normed_by(norm, y_BTD, scale_BT) if name in edits else norm(y_BTD)  # only read: the plain pass

      return apply

    ln_attention = scaled(self.ln_attention, "ln1_scale")
    ln_mlp = scaled(self.ln_mlp, "ln2_scale") if self.has_mlp else None
    x_BTD = site("resid_pre", x_BTD)
    same = lambda y: y
    if self.sublayer_norm:  # Gemma-2 (pre-norm too) and OLMo-2 (no pre-norm): x + norm(sublayer(x))
      pre_attention, post_attention = (
        (ln_attention, self.ln_attention_out) if self.pre_layernorm else (same, ln_attention)
      )
      if self.has_mlp:
        pre_mlp, post_mlp = (ln_mlp, self.ln_mlp_out) if self.pre_layernorm else (same, ln_mlp)
    elif self.pre_layernorm or self.parallel_residual:
      pre_attention, post_attention = ln_attention, same
      pre_mlp, post_mlp = (ln_mlp, same) if self.has_mlp else (None, None)
    else:  # post-LN (BERT): the norms follow the residual adds
      pre_attention, post_attention, pre_mlp, post_mlp = same, same, same, same
    attn_in_BTD = pre_attention(x_BTD)
    head_norm = self.ln_attention if pre_attention is ln_attention else pre_attention  # per-head copies: own scale

    def head_input(name):  # q_in, k_in, v_in: each head's own copy of the stream, read or edited only if asked
      if name not in capture and name not in edits:
        return attn_in_BTD
      B, T, D = x_BTD.shape
      edited = site(name, jnp.broadcast_to(x_BTD[:, :, None], (B, T, self.attention.cfg.num_heads, D)))
      return head_norm(edited) if name in edits else attn_in_BTD  # only read: the pass is the plain one

    attn_in = tuple(head_input(name) for name in ("q_in", "k_in", "v_in"))
    attn_in = attn_in_BTD if all(x is attn_in_BTD for x in attn_in) else attn_in
    attn_BTD, inner = self.attention(attn_in, mask_BTS, dropout_rngs, capture, edits, positions_BT, cache, grouped_kv)
    captured.update(inner)
    attn_out_BTD = site("attn_out", drop(post_attention(attn_BTD)))
    post_ln = not (self.sublayer_norm or self.pre_layernorm or self.parallel_residual)
    mid_BTD = site("resid_mid", ln_attention(x_BTD + attn_out_BTD) if post_ln else x_BTD + attn_out_BTD)
    if not self.has_mlp:  # attention-only: mlp_out is zero; mlp_in is the stream an MLP would read (edits: no effect)
      site("mlp_in", mid_BTD)
      B, T, _ = mid_BTD.shape
      if "mlp_post" in capture or "mlp_post" in edits:  # no neurons: [B,T,0]
        site("mlp_post", jnp.zeros((B, T, 0), mid_BTD.dtype))
      if "ln2_scale" in capture or "ln2_scale" in edits:  # no MLP norm: 1
        site("ln2_scale", jnp.ones((B, T), jnp.float32))
      if "mlp_out" in capture or "mlp_out" in edits:
        mid_BTD = mid_BTD + site("mlp_out", jnp.zeros_like(mid_BTD))
      return site("resid_post", mid_BTD), captured
    mlp_in_BTD = (
      x_BTD if self.parallel_residual and not self.sublayer_norm else mid_BTD
    )  # GPT-NeoX: both sublayers read the block's input
    mlp_in_BTD = site("mlp_in", mlp_in_BTD)  # the MLP's own copy: its edits leave the residual stream alone
    post = (lambda h_BTF: site("mlp_post", h_BTF)) if "mlp_post" in capture or "mlp_post" in edits else None
    mlp_out_BTD = site("mlp_out", drop(post_mlp(self.mlp(pre_mlp(mlp_in_BTD), post))))
    post_BTD = ln_mlp(mid_BTD + mlp_out_BTD) if post_ln else mid_BTD + mlp_out_BTD
    return site("resid_post", post_BTD), captured
