"""The Transformer: one flax.nnx model for encoders (masked LM) and decoders (causal LM).

Attention is written out per head, because heads are the object of study: every head's queries,
keys, values, attention map and context vector `Z_h = A_h V_h` can be returned and edited before the output
projection `W_O`.

Intervention sites (`SITES`, headspec/model/sites.py, docs/patching.md): named activations of every layer that a
forward pass can return (`capture`) and edit (`interventions`, a dict {site: edit}): an `Edit` of arrays over [L,
*the site's axes] (or one layer's, `Edit.at`), x -> x·keep + add, or an `Apply`, x -> fn(x, *args) on chosen layers
(headspec/model/edits.py has ready-made ones: projection ablation, clamping a direction, replacement, an SAE spliced
in). Edits are traced data: changing what is patched never recompiles (an `Apply` compiles once per function), and
the outputs are differentiable in them. Head masks and mean ablation are an Edit of the site `z`
(`edits.head_mask`). A `KVCache` turns the forward into a decoding step (headspec/model/generation.py) with the same sites
and edits. The blocks run as one `lax.scan` (`Transformer._run_blocks`), so the compiled forward
does not grow with depth.

Shape glossary: the capital letters at the end of an array's name are its axes, one letter per axis,
one meaning per letter throughout headspec (after penzai's model_parts.py):
  B batch (rows of a batch, also rows of packed sentences)   T tokens (query positions)
  S source tokens (key positions)   L layers   H heads   K head width (Dh in prose)   D model width
  F feed-forward width   V vocabulary   Y token types   E a fused projection's output width (H·K)
  X a last axis that is K or D (either works)   N words   U sentences   W words of one row or window
  J candidate heads of a word (ROOT, then the W words)   C classes   G feature groups probed together
  (a layer's H heads, or one residual stream)   A label sets fitted together (probe tasks and controls)
  P L2 penalties tried (the grid)   R bootstrap resamples   I inner width (rank) of the arc probe
  M head pairs i < j   O optimisation steps;   a digit is an axis of that size (u_BT3, w_D3E),
  and a lowercase c a chunk of the N words streamed through a probe fit (x_cGK).
So `q_BTHK` is a [batch, tokens, heads, head width] array and `probs_BHTS` an attention map.

The architecture follows BERT (Devlin et al. 2019; post-LayerNorm, token types, embedding LayerNorm,
masked-LM transform head) and GPT-2 (Radford et al. 2019; pre-LayerNorm, final LayerNorm), and the modern
decoders' options (rotary positions with partial rotation and Llama-3 scaling, RMSNorm, gated MLPs,
grouped-query attention, parallel residual, QK-norm, sublayer-output norms, soft-capping, sliding
windows), chosen by `ModelConfig`, so that Hugging Face checkpoints of every family in
headspec/pretrained/ import exactly. The defaults are GPT-2's: a config that sets none of the newer
options computes what it computed before they existed, and a seed draws the same weights.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Collection

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from headspec.errors import UserError
from headspec.model.config import ACTIVATIONS, ModelConfig
from headspec.model.layers import (
  Block,
  KVCache,
  norm_layer,
  norm_scale,
  normal_param,
  sinusoidal_positions,
  zeros_param,
)
from headspec.model.sites import (
  SITES,
  Edit,
  Intermediates,
  capture_names,
  check_interventions,
  edit_patterns,
  edit_xs,
  layer_edit,
)
from headspec.parallel import mesh as mesh_lib


def _attention_mask(cfg, valid_BT, positions_BT, segment_BT, kv_cache):
  """(mask_BTS, positions_BT, key_positions_BS, valid_BS) of a forward: padding, packed-row segments and
  the causal mask; when decoding with a KVCache, queries at slots index.. and keys at every slot written so
  far (key_positions_BS, valid_BS: the cache's, updated; None without a cache)."""
  B, T = valid_BT.shape
  key_positions_BS = valid_BS = None
  if kv_cache is not None:  # decoding: queries at slots index.., keys at every slot written so far
    S, index = kv_cache.valid_BS.shape[1], kv_cache.index
    slots_T = index + jnp.arange(T)
    positions_BT = jnp.broadcast_to(slots_T[None], (B, T)) if positions_BT is None else positions_BT
    valid_BS = jax.lax.dynamic_update_slice(kv_cache.valid_BS, valid_BT, (0, index))
    key_positions_BS = jax.lax.dynamic_update_slice(kv_cache.positions_BS, positions_BT.astype(jnp.int32), (0, index))
    mask_BTS = valid_BS[:, None, :] & (jnp.arange(S)[None, None, :] <= slots_T[None, :, None])
  if positions_BT is None:
    positions_BT = jnp.broadcast_to(jnp.arange(T)[None], (B, T))
  if kv_cache is None:
    mask_BTS = jnp.broadcast_to(valid_BT[:, None, :], (B, T, T))
  if segment_BT is not None:  # packed rows: a token attends within its own sequence only
    mask_BTS = mask_BTS & (segment_BT[:, :, None] == segment_BT[:, None, :])
  if cfg.kind == "decoder" and kv_cache is None:
    mask_BTS = mask_BTS & jnp.tril(jnp.ones((T, T), bool))[None]
  return mask_BTS, positions_BT, key_positions_BS, valid_BS


class Transformer(nnx.Module):
  """Encoder (bidirectional, masked-LM head) or decoder (causal, LM head), per `ModelConfig.kind`."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    self.cfg = cfg
    self.token_embed_VD = normal_param(rngs, (cfg.vocab_size, cfg.d_model))
    if cfg.positions == "learned":
      self.position_embed_TD = normal_param(rngs, (cfg.max_len, cfg.d_model))
    if cfg.type_vocab_size:
      self.type_embed_YD = normal_param(rngs, (cfg.type_vocab_size, cfg.d_model))
    if cfg.embedding_layernorm:
      self.ln_embed = norm_layer(cfg, rngs)
    self.embed_dropout = nnx.Dropout(cfg.dropout)
    self.blocks = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
    if cfg.final_norm:
      self.ln_final = norm_layer(cfg, rngs)
    if cfg.kind == "encoder":  # BERT's masked-LM transform: dense, activation, LayerNorm
      self.mlm_w_DD, self.mlm_b_D = normal_param(rngs, (cfg.d_model, cfg.d_model)), zeros_param((cfg.d_model,))
      self.ln_mlm = norm_layer(cfg, rngs)
    if not cfg.tie_embeddings:
      self.unembed_DV = normal_param(rngs, (cfg.d_model, cfg.vocab_size))
    self.unembed_bias_V = zeros_param((cfg.vocab_size,))

  def embed(self, tokens_BT, token_types_BT=None, positions_BT=None):
    """Token (+ position, + type) embeddings. positions_BT: each token's position (default 0..T−1 in
    every row; packed rows restart it at every sequence)."""
    cfg, dt = self.cfg, jnp.dtype(self.cfg.dtype)
    T = tokens_BT.shape[1]
    if positions_BT is None and T > cfg.max_len:
      raise UserError(f"sequence length {T} exceeds model.max_len={cfg.max_len}")
    x_BTD = jnp.take(self.token_embed_VD[...], tokens_BT, axis=0)
    if cfg.scale_embeddings:  # Gemma: sqrt(D) rounded to the compute dtype, as Hugging Face does
      x_BTD = x_BTD * jnp.sqrt(jnp.float32(cfg.d_model)).astype(dt)
    table_TD = self.position_embed_TD[...] if cfg.positions == "learned" else None
    if (
      cfg.positions == "sinusoidal"
    ):  # Vaswani et al. 2017, §3.4: embeddings scaled by sqrt(D) to the sinusoids' unit amplitude
      table_TD = sinusoidal_positions(cfg.max_len if positions_BT is not None else T, cfg.d_model)
      x_BTD = x_BTD * jnp.sqrt(jnp.float32(cfg.d_model))
    if table_TD is not None:  # rotary: positions enter every layer's queries and keys instead
      x_BTD = x_BTD + (table_TD[None, :T] if positions_BT is None else jnp.take(table_TD, positions_BT, axis=0))
    if cfg.type_vocab_size:
      types_BT = jnp.zeros_like(tokens_BT) if token_types_BT is None else token_types_BT
      x_BTD = x_BTD + jnp.take(self.type_embed_YD[...], types_BT, axis=0)
    if cfg.embedding_layernorm:
      x_BTD = self.ln_embed(x_BTD)
    return x_BTD.astype(dt)

  def __call__(
    self,
    tokens_BT: jax.Array,
    *,
    valid_BT: jax.Array | None = None,
    token_types_BT: jax.Array | None = None,
    positions_BT: jax.Array | None = None,
    segment_BT: jax.Array | None = None,
    interventions: dict[str, Edit] | None = None,
    capture: Collection[str] = (),
    dropout_rngs: nnx.Rngs | None = None,
    output: str = "logits",
    kv_cache: KVCache | None = None,
  ) -> tuple[jax.Array, Intermediates]:
    """Returns (logits_BTV in float32, Intermediates with the `capture`d fields, others None).

    valid_BT: True for real tokens; padded keys get zero attention. interventions: {site: Edit, Apply, a
    function or a list of these} (`SITES`, `check_interventions`); a head mask or mean ablation is
    `{"z": edits.head_mask(mask_LH, replacement_LHK)}` (traced: new values never recompile, and the loss is
    differentiable in them). capture: names from CAPTURE_FIELDS, each returned stacked over layers.
    dropout_rngs: None for deterministic. output: 'logits' or 'hidden' (the final hidden state). kv_cache: a
    `KVCache` (decoders): the tokens go to its slots index.., attend to every earlier valid slot, and the
    call returns (logits, Intermediates, the updated KVCache); positions_BT then defaults to the slots.
    Packed rows (several sequences side by side in one row): positions_BT restarts at each sequence
    and segment_BT (int, equal within a sequence) keeps attention inside it, so each sequence's
    outputs are those of running it alone.
    """
    x_BTD = self.embed(tokens_BT, token_types_BT, positions_BT)
    return self.from_embeddings(
      x_BTD,
      valid_BT=valid_BT,
      positions_BT=positions_BT,
      segment_BT=segment_BT,
      interventions=interventions,
      capture=capture,
      dropout_rngs=dropout_rngs,
      output=output,
      kv_cache=kv_cache,
    )

  def from_layer(self, x_BTD, layer, **kwargs):
    """Blocks `layer`.. on the residual stream `x_BTD` entering block `layer` (= `resid_post_LBTD[layer − 1]`
    of a full pass, or the embeddings for layer 0): `from_embeddings(x_BTD, start_layer=layer, ...)`; `layer`
    may be traced, so that a sweep over layers compiles one program."""
    return self.from_embeddings(x_BTD, start_layer=layer, **kwargs)

  def from_embeddings(
    self,
    x_BTD,
    *,
    valid_BT=None,
    positions_BT=None,
    segment_BT=None,
    interventions=None,
    capture=(),
    dropout_rngs=None,
    start_layer=0,
    output: str = "logits",
    kv_cache: KVCache | None = None,
  ):
    """The forward pass after the embedding layer (for gradients with respect to input embeddings).

    The blocks run as one `lax.scan` over their parameters stacked on a leading layer axis (`_run_blocks`),
    so the compiled program does not grow with depth; called outside any transform (and without dropout), the
    pass is one jitted program, compiled once per structure and shapes (an eager scan would compile at every
    call). interventions and capture: as for `__call__`.
    start_layer: `x_BTD` is the residual stream entering block `start_layer` (the output of block
    start_layer − 1, as captured in `resid_post_LBTD`), and only blocks start_layer.. run: the fast path for
    interventions that leave the layers below unchanged. A static int scans those L − start_layer blocks, and
    captured fields stack them only; a traced int32 scans all L blocks and steps over those below it (one
    program for every start: the sweeps of headspec/ablation and headspec/patching), and captured fields stack
    all L, zeros below start_layer. output: 'logits' (float32 logits_BTV) or 'hidden' (the final hidden state
    h_BTD: after the final LayerNorm of a pre-LN model, the last block's output otherwise, as Hugging Face's
    last_hidden_state). positions_BT: each token's position, for rotary models and sliding windows (default
    0..T−1 in every row; packed rows restart it at every sequence, as for `__call__`). kv_cache: as for
    `__call__`.
    """
    cfg = self.cfg
    L = cfg.num_layers
    capture = capture_names(capture)
    static_start = isinstance(start_layer, int | np.integer)
    eager = not isinstance(x_BTD, jax.core.Tracer) and not isinstance(self.token_embed_VD[...], jax.core.Tracer)
    if eager and static_start and dropout_rngs is None:  # a scan called eagerly would compile at every call
      arrays = dict(valid_BT=valid_BT, positions_BT=positions_BT, segment_BT=segment_BT, kv_cache=kv_cache)
      S = x_BTD.shape[1] if kv_cache is None else kv_cache.valid_BS.shape[1]
      interventions = check_interventions(cfg, interventions, x_BTD.shape[0], x_BTD.shape[1], S)
      graphdef, state = nnx.split(self)
      return _compiled_forward(graphdef, capture, int(start_layer), output, state, x_BTD, interventions, arrays)
    if output not in ("logits", "hidden") or (static_start and not 0 <= start_layer < L):
      raise UserError(f"output={output!r} must be 'logits' or 'hidden', start_layer={start_layer} in [0, {L})")
    B, T, _ = x_BTD.shape
    valid_BT = jnp.ones((B, T), bool) if valid_BT is None else valid_BT.astype(bool)
    if kv_cache is not None and (cfg.kind != "decoder" or segment_BT is not None or not static_start or start_layer):
      raise UserError("kv_cache: decoders only, without segment_BT or start_layer")
    mask_BTS, positions_BT, key_positions_BS, valid_BS = _attention_mask(cfg, valid_BT, positions_BT, segment_BT,
                                                                          kv_cache)  # fmt: skip
    S = mask_BTS.shape[-1]
    interventions = check_interventions(cfg, interventions, B, T, S)
    # A plain forward (no capture, edit or cache) lets the fused attention read grouped K/V as is.
    grouped_kv = not capture and not interventions and kv_cache is None
    block_capture = frozenset(set(capture) - {"embeddings", "ln_final_scale"})

    embeddings_BTD = x_BTD
    if not static_start or start_layer == 0:
      dropped_BTD = self.embed_dropout(x_BTD, deterministic=dropout_rngs is None, rngs=dropout_rngs)
      if dropped_BTD is not x_BTD:
        x_BTD = dropped_BTD if static_start else jnp.where(start_layer == 0, dropped_BTD, x_BTD)
    x_BTD, per_layer, kv_LBSHK = self._run_blocks(
      x_BTD, start_layer, mask_BTS, positions_BT, key_positions_BS, interventions, block_capture, dropout_rngs,
      kv_cache, grouped_kv,
    )  # fmt: skip
    h_BTD = self.ln_final(x_BTD) if cfg.final_norm else x_BTD
    logits_BTV = h_BTD if output == "hidden" else self.unembed(h_BTD)

    fields = {f"{name}_L{SITES[name]}": value for name, value in per_layer.items()}
    if "embeddings" in capture:
      fields["embeddings_BTD"] = embeddings_BTD
    if "ln_final_scale" in capture:
      fields["ln_final_scale_BT"] = norm_scale(self.ln_final, x_BTD) if cfg.final_norm else jnp.ones((B, T))
    if kv_cache is None:
      return logits_BTV, Intermediates(**fields)
    updated = KVCache(*kv_LBSHK, valid_BS, key_positions_BS, kv_cache.index + T)
    return logits_BTV, Intermediates(**fields), updated

  def _run_blocks(
    self, x_BTD, start_layer, mask_BTS, positions_BT, key_positions_BS, interventions, capture, dropout_rngs,
    kv_cache, grouped_kv,
  ):  # fmt: skip
    """(x_BTD after the last block, {site: captured, stacked over the layers scanned}, the KVCache's updated
    (k_LBSHK, v_LBSHK) or None): blocks start_layer.. as one `lax.scan`.

    The scanned data: the blocks' parameters stacked on a leading layer axis (inside the compiled program one
    extra copy of them, sharded as the parameters are; `self.blocks` keeps one Block per layer, so parameter
    paths and checkpoints are unchanged), and per layer its index, sliding window, slices of the Edits' arrays,
    KV cache and dropout key. The body merges one Block and calls it. An Apply on some layers only makes the
    layers differ in which edits they run: each distinct set is a branch of the body (`lax.switch`), traced
    once. A traced start_layer runs block start_layer, then scans all L blocks, those up to start_layer a
    branch that passes the stream through.
    """
    cfg, L = self.cfg, self.cfg.num_layers
    static = isinstance(start_layer, int | np.integer)
    first = int(start_layer) if static else 0
    layers = range(first, L)
    graphdef = nnx.graphdef(self.blocks[first])
    if any(nnx.graphdef(self.blocks[layer]) != graphdef for layer in layers):
      raise ValueError("Transformer.blocks differ in structure: they cannot run as one scan")
    state_L = jax.tree.map(lambda *xs: jnp.stack(xs), *(nnx.state(self.blocks[layer]) for layer in layers))
    windows_L = jnp.asarray(cfg.attention_windows[first:], jnp.int32) if any(cfg.attention_windows) else None
    patterns, pattern_L = edit_patterns(interventions, layers)
    edits_L = {name: tuple(edit_xs(edit, first, L) for edit in sequence) for name, sequence in interventions.items()}
    keys_L = None  # per layer its own dropout key; deterministic without dropout_rngs (or without dropout)
    if dropout_rngs is not None and (cfg.dropout or cfg.attention_dropout):
      keys_L = jax.random.split(dropout_rngs["dropout"](), len(layers))
    cache_L = None if kv_cache is None else (kv_cache.k_LBSHK, kv_cache.v_LBSHK)
    xs = (jnp.arange(first, L), state_L, windows_L, edits_L, jnp.asarray(pattern_L), cache_L, keys_L)

    def branch(pattern):
      def run(x_BTD, layer, state, window, edits_l, cache_l, key):
        block = nnx.merge(graphdef, state)
        edits = {
          name: tuple(layer_edit(interventions[name][i], edits_l[name][i], layer) for i in active)
          for name, active in pattern
        }
        cache = None if cache_l is None else (*cache_l, kv_cache.index)
        rngs = None if key is None else nnx.Rngs(dropout=key)
        y_BTD, captured = block(
          mesh_lib.constrain(x_BTD, "BTD"), mask_BTS, rngs, capture, edits, positions_BT, key_positions_BS, cache,
          grouped_kv, 0 if window is None else window,
        )  # fmt: skip
        return y_BTD.astype(x_BTD.dtype), captured

      return run

    runs = [branch(pattern) for pattern in patterns]

    def step(x_BTD, xs_l, skip=None):  # one layer: its pattern's branch; with `skip`, that below start_layer
      layer, state, window, edits_l, pattern, cache_l, key = xs_l
      operands = (x_BTD, layer, state, window, edits_l, cache_l, key)
      if skip is not None:
        return jax.lax.switch(jnp.where(layer > start_layer, pattern + 1, 0), [skip, *runs], *operands)
      return runs[0](*operands) if len(runs) == 1 else jax.lax.switch(pattern, runs, *operands)

    if static:
      x_BTD, per_layer = jax.lax.scan(step, x_BTD, xs)
    else:  # block start_layer first, on its own: a sweep's vmap then leaves what it computes ahead of an edit
      # unbatched (once for all the edits), as an unrolled program would; the scan passes it and those below
      x_BTD, captured = step(x_BTD, jax.tree.map(lambda a: a[start_layer], xs))
      skip = lambda x_BTD, *_: (x_BTD, jax.tree.map(jnp.zeros_like, captured))
      x_BTD, per_layer = jax.lax.scan(functools.partial(step, skip=skip), x_BTD, xs)
      per_layer = jax.tree.map(lambda a, c: a.at[start_layer].set(c), per_layer, captured)
    kv_LBSHK = per_layer.pop("kv_cache", None)
    return x_BTD, per_layer, kv_LBSHK

  def unembed(self, h_BTD):
    """Final hidden states to vocabulary logits (encoder: through the masked-LM transform first)."""
    cfg, dt = self.cfg, jnp.dtype(self.cfg.dtype)
    if cfg.kind == "encoder":
      h_BTD = self.ln_mlm(
        ACTIVATIONS[cfg.activation](h_BTD @ self.mlm_w_DD[...].astype(dt) + self.mlm_b_D[...].astype(dt))
      )
    w_DV = self.token_embed_VD[...].T if cfg.tie_embeddings else self.unembed_DV[...]
    logits_BTV = (h_BTD @ w_DV.astype(dt)).astype(jnp.float32) + self.unembed_bias_V[...]
    if cfg.final_softcap:  # Gemma-2
      logits_BTV = cfg.final_softcap * jnp.tanh(logits_BTV / cfg.final_softcap)
    return logits_BTV


@functools.partial(jax.jit, static_argnums=(0, 1, 2, 3))
def _compiled_forward(graphdef, capture, start_layer, output, state, x_BTD, interventions, arrays):
  """`Transformer.from_embeddings` called outside any transform, compiled once per structure and shapes."""
  model = nnx.merge(graphdef, state)
  return model.from_embeddings(
    x_BTD, interventions=interventions, capture=capture, start_layer=start_layer, output=output, **arrays
  )


def random_like(cfg: ModelConfig, seed: int) -> Transformer:
  """The architecture `cfg` with random weights, `Transformer(cfg, rngs=nnx.Rngs(params=seed))`: the
  random-weights control of the analyses, and bit for bit the step-0 weights of a run trained with
  `seed` (headspec/train/loop.py draws them the same way)."""
  return Transformer(cfg, rngs=nnx.Rngs(params=seed))


def cast(model: Transformer, dtype: str) -> Transformer:
  """`model` with its parameters and its compute dtype (`cfg.dtype`) in `dtype` ('float32' | 'bfloat16'):
  bfloat16 halves the parameters' bytes; attention logits, softmax and pooled features stay float32."""
  cfg = dataclasses.replace(model.cfg, dtype=dtype)  # checks the name
  if cfg == model.cfg and all(x.dtype == jnp.dtype(dtype) for x in jax.tree.leaves(nnx.state(model, nnx.Param))):
    return model
  graphdef, _ = nnx.split(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
  state = jax.tree.map(lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, nnx.state(model))
  return nnx.merge(graphdef, state)
