"""The Transformer: one flax.nnx model for encoders (masked LM) and decoders (causal LM).

Attention is written out per head, because heads are the object of study: every head's queries,
keys, values, attention map and context vector `Z_h = A_h V_h` can be returned and edited before the output
projection `W_O`.

Intervention sites (`SITES`, docs/patching.md): named activations of every layer that a forward pass can
return (`capture`) and edit (`interventions`, a dict {site: edit}): an `Edit` of arrays over [L, *the site's
axes] (or one layer's, `Edit.at`), x -> x·keep + add, or an `Apply`, x -> fn(x, *args) on chosen layers
(headspec/model/edits.py has ready-made ones: projection ablation, clamping a direction, replacement, an SAE
spliced in). Edits are traced data: changing what is patched never recompiles (an `Apply` compiles once per
function), and the outputs are differentiable in them. Head masks and mean ablation are an Edit of the site
`z` (`edits.head_mask`). A `KVCache` turns the forward into a decoding step (headspec/generate.py) with the
same sites and edits. The blocks run as one `lax.scan` (`Transformer._run_blocks`), so the compiled forward
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
import math
from collections.abc import Callable, Collection

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from headspec.errors import UserError
from headspec.model import draws
from headspec.parallel import mesh as mesh_lib

ACTIVATIONS = {
  "gelu_exact": lambda x: jax.nn.gelu(x, approximate=False),  # BERT
  "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),  # GPT-2 "gelu_new"
  "relu": jax.nn.relu,
  "silu": jax.nn.silu,  # Llama's SwiGLU gate
}
NORMS = ("layernorm", "rmsnorm")
QK_NORMS = ("none", "head", "full")  # Qwen3: RMSNorm over each head's K features; OLMo-2: over all H*K
ROPE_SCALINGS = ("none", "linear", "llama3")
# Intervention sites: name -> the axes of one layer's activation (TransformerLens's hook names: docs/patching.md).
SITES = {
  "resid_pre": "BTD",  # the residual stream entering the block
  # Each head's own copy of the stream its queries, keys, values read (before the attention's norm): edits here
  # reach that head's q, k or v only (edge patching, docs/circuits.md); per query head, as k and v. With
  # qk_norm='full' one RMS spans every head's queries (keys), so q_in and k_in edits are refused there.
  "q_in": "BTHD",
  "k_in": "BTHD",
  "v_in": "BTHD",
  "q": "BTHK",  # queries after QK-norm and rotary; per query head (grouped K/V repeated over their heads)
  "k": "BTHK",  # T is the key position here
  "v": "BTHK",
  "attn_scores": "BHTS",  # the attention logits before the softmax: scaled, soft-capped, masked (float32 min)
  "pattern": "BHTS",  # the attention map A_h (after softmax, before attention dropout)
  "z": "BTHK",  # Z_h = A_h V_h before W_O (edits.head_mask: the head mask and mean ablation edit it)
  "head_out": "BTHD",  # each head's output Z_h W_O^h; attn_out = sum over heads + b_O
  "attn_out": "BTD",  # the attention sublayer's output as added to the residual stream
  "resid_mid": "BTD",  # the residual stream after attention (post-LN: after its LayerNorm)
  "mlp_in": "BTD",  # the stream the MLP reads (before its norm); edits reach the MLP only, not the residual
  "mlp_post": "BTF",  # the MLP's hidden activation per neuron (after the activation and gate, before W_out)
  "mlp_out": "BTD",  # the MLP sublayer's output as added (zero in attention-only blocks)
  "resid_post": "BTD",  # the block's output (= the next block's resid_pre)
  # The norms' scales, one per token: sqrt(var + eps) of LayerNorm (sqrt(mean x² + eps) of RMSNorm), which the
  # norm divides by. ln1 is the block's norm named ln_attention (before attention in pre-LN models, after
  # the attention's residual add in post-LN ones, on attention's output in OLMo-2), ln2 the MLP's likewise.
  "ln1_scale": "BT",
  "ln2_scale": "BT",
}
# Capture names: the sites, plus 'embeddings' and the final norm's scale 'ln_final_scale' [B,T] (1 without a final
# norm; read only). The Intermediates field of each is NAME_L<axes>.
CAPTURE_FIELDS = ("embeddings", "ln_final_scale", *SITES)


def capture_names(capture: Collection[str]) -> tuple[str, ...]:
  """`capture` checked (each a name of CAPTURE_FIELDS) and without repeats; UserError naming an unknown name."""
  names = []
  for name in capture:
    if name not in CAPTURE_FIELDS:
      raise UserError(f"unknown capture field {name!r}; choose from {CAPTURE_FIELDS}")
    names.append(name)
  return tuple(dict.fromkeys(names))


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Everything that changes the computation. `kind` is 'encoder' (bidirectional) or 'decoder' (causal)."""

  kind: str
  vocab_size: int
  num_layers: int
  num_heads: int
  d_model: int
  d_head: int
  d_ff: int
  max_len: int
  dropout: float = 0.0
  attention_dropout: float = 0.0
  pre_layernorm: bool = True
  positions: str = "learned"  # 'learned' | 'sinusoidal'
  tie_embeddings: bool = True
  activation: str = "gelu_tanh"
  layer_norm_eps: float = 1e-5
  type_vocab_size: int = 0  # BERT token types; 0 for none
  embedding_layernorm: bool = False  # BERT normalises the summed embeddings
  dtype: str = "float32"  # compute dtype; parameters stay float32
  mlp: bool = True  # False: attention-only blocks (Elhage et al. 2021), no MLP sublayer, d_ff ignored
  # Modern decoders (Llama, Mistral, Qwen, Gemma, GPT-NeoX, OLMo); the defaults leave GPT-2/BERT unchanged.
  norm: str = "layernorm"  # 'layernorm' | 'rmsnorm' (every norm of the model)
  num_kv_heads: int = 0  # grouped-query attention: K/V heads shared by H / num_kv_heads query heads; 0 = num_heads
  gated_mlp: bool = False  # act(x W_gate) * (x W_in) W_out: SwiGLU with 'silu', GeGLU with 'gelu_tanh'
  parallel_residual: bool = False  # GPT-NeoX: x + attn(ln1(x)) + mlp(ln2(x))
  sublayer_norm: bool = False  # a norm on each sublayer's output before the residual add (Gemma-2, OLMo-2)
  qk_norm: str = "none"  # 'none' | 'head' (Qwen3) | 'full' (OLMo-2): RMSNorm of queries and keys before rotary
  attention_bias: bool = True  # biases of W_Q, W_K, W_V
  attention_out_bias: bool = True  # bias of W_O
  mlp_bias: bool = True
  rope_theta: float = 10000.0  # positions='rotary': base of the rotation frequencies
  rotary_fraction: float = 1.0  # the leading fraction of each head's K features that rotate (GPT-NeoX rotary_pct)
  rope_scaling: str = "none"  # 'none' | 'linear' | 'llama3' (Llama-3.1's frequency-dependent scaling)
  rope_factor: float = 1.0
  rope_low_freq_factor: float = 1.0  # llama3 only
  rope_high_freq_factor: float = 4.0  # llama3 only
  rope_original_max_len: int = 0  # llama3 only: the context length the frequencies were trained for
  attention_scale: float = 0.0  # the logits' scale; 0 = d_head ** -0.5 (Gemma-2: query_pre_attn_scalar ** -0.5)
  attention_softcap: float = 0.0  # cap * tanh(logits / cap) on attention logits; 0 = none (Gemma-2)
  final_softcap: float = 0.0  # the same on the output logits (Gemma-2)
  scale_embeddings: bool = False  # token embeddings times sqrt(d_model) (Gemma)
  attention_windows: tuple[int, ...] = ()  # per layer: a token sees the last w tokens only (w > 0), 0 = all; () = all
  clip_qkv: float = 0.0  # clamp q, k, v to [-c, c] (OLMo); 0 = none

  @property
  def kv_heads(self) -> int:
    """The number of distinct K/V heads (num_heads unless grouped-query attention)."""
    return self.num_kv_heads or self.num_heads

  @property
  def kv_group_of_head(self) -> tuple[int, ...]:
    """Each query head's K/V group (head h reads K/V head h // (H / num_kv_heads), as Hugging Face's repeat_kv)."""
    per_group = self.num_heads // self.kv_heads
    return tuple(h // per_group for h in range(self.num_heads))

  @property
  def final_norm(self) -> bool:
    """Whether a norm follows the last block (pre-LN models and those with sublayer-output norms)."""
    return self.pre_layernorm or self.sublayer_norm

  def __post_init__(self):
    checks = [
      (self.kind in ("encoder", "decoder"), f"model.kind must be 'encoder' or 'decoder', got {self.kind!r}"),
      (
        self.positions in ("learned", "sinusoidal", "rotary"),
        f"model.positions must be 'learned', 'sinusoidal' or 'rotary', got {self.positions!r}",
      ),
      (self.norm in NORMS, f"model.norm must be one of {NORMS}, got {self.norm!r}"),
      (self.qk_norm in QK_NORMS, f"model.qk_norm must be one of {QK_NORMS}, got {self.qk_norm!r}"),
      (
        self.rope_scaling in ROPE_SCALINGS,
        f"model.rope_scaling must be one of {ROPE_SCALINGS}, got {self.rope_scaling!r}",
      ),
      (
        self.num_kv_heads >= 0 and self.num_heads % self.kv_heads == 0,
        f"model.num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}",
      ),
      (
        self.positions != "rotary"
        or (0.0 < self.rotary_fraction <= 1.0 and int(self.d_head * self.rotary_fraction) % 2 == 0),
        f"model.rotary_fraction={self.rotary_fraction} must be in (0, 1] and rotate an even number of "
        f"the d_head={self.d_head} features",
      ),
      (
        self.rope_scaling != "llama3"
        or (self.rope_original_max_len > 0 and self.rope_high_freq_factor > self.rope_low_freq_factor),
        "model.rope_scaling='llama3' needs rope_original_max_len > 0 and rope_high_freq_factor > rope_low_freq_factor",
      ),
      (
        not self.attention_windows or len(self.attention_windows) == self.num_layers,
        f"model.attention_windows has {len(self.attention_windows)} entries for num_layers={self.num_layers}",
      ),
      (
        self.activation in ACTIVATIONS,
        f"model.activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}",
      ),
      (self.dtype in ("float32", "bfloat16"), f"model.dtype must be 'float32' or 'bfloat16', got {self.dtype!r}"),
      (
        min(self.vocab_size, self.num_layers, self.num_heads, self.d_model, self.d_head, self.d_ff, self.max_len) > 0,
        "model sizes (vocab_size, num_layers, num_heads, d_model, d_head, d_ff, max_len) must be positive",
      ),
      (0.0 <= self.dropout < 1.0 and 0.0 <= self.attention_dropout < 1.0, "model dropout rates must be in [0, 1)"),
    ]
    for ok, message in checks:
      if not ok:
        raise UserError(message)


@flax.struct.dataclass
class Intermediates:
  """What a forward pass exposes, stacked over layers on a leading L axis; None when not requested.

  Each field is named after its site (`SITES`) and axes. `z_LBTHK` is each head's context vector A_h V_h
  before W_O (and before any edit of z, such as a head mask); `head_out_LBTHD` is the head's actual
  contribution to the residual stream, its edited Z_h W_O^h (the bias b_O belongs to no head).
  `resid_post_LBTD` is the residual stream after each block; `embeddings_BTD` the input to block 0 (probing
  reports it as layer -1). Every site is captured as computed in that pass, before its own edit (after edits
  upstream of it); `site(name)` reads one by its site name.
  """

  embeddings_BTD: jax.Array | None = None
  q_LBTHK: jax.Array | None = None
  k_LBTHK: jax.Array | None = None
  v_LBTHK: jax.Array | None = None
  pattern_LBHTS: jax.Array | None = None
  z_LBTHK: jax.Array | None = None
  head_out_LBTHD: jax.Array | None = None
  resid_post_LBTD: jax.Array | None = None
  resid_pre_LBTD: jax.Array | None = None
  q_in_LBTHD: jax.Array | None = None
  k_in_LBTHD: jax.Array | None = None
  v_in_LBTHD: jax.Array | None = None
  mlp_in_LBTD: jax.Array | None = None
  resid_mid_LBTD: jax.Array | None = None
  attn_out_LBTD: jax.Array | None = None
  mlp_out_LBTD: jax.Array | None = None
  attn_scores_LBHTS: jax.Array | None = None
  mlp_post_LBTF: jax.Array | None = None
  ln1_scale_LBT: jax.Array | None = None
  ln2_scale_LBT: jax.Array | None = None
  ln_final_scale_BT: jax.Array | None = None

  def site(self, name: str) -> jax.Array | None:
    """The captured activation of site (or capture name) `name`, [L, *SITES[name]]."""
    field = name
    matches = [f.name for f in dataclasses.fields(self) if f.name.rsplit("_", 1)[0] == field]
    if not matches:
      raise UserError(f"unknown site {name!r}; choose from {', '.join(SITES)}")
    return getattr(self, matches[0])


@flax.struct.dataclass
class Edit:
  """An edit of one site, x -> x·keep + add; keep and add broadcast to [L, *the site's axes] (None: 1, 0).

  Patching a site to a value v where mask m is 1 is `Edit.patch(v, m)` (keep = 1 − m, add = m·v); scaling
  by m is Edit(keep=m). Arrays are traced: new values never recompile, and outputs are differentiable in them.
  `at`: the one layer the edit applies at (an int, or a traced int32: a sweep over layers compiles once); keep
  and add are then that layer's alone, broadcasting to [*the site's axes], so a one-layer patch holds one
  layer's arrays, not L.
  """

  keep: jax.Array | None = None
  add: jax.Array | None = None
  at: jax.Array | int | None = None

  @classmethod
  def patch(cls, value, mask, at=None) -> Edit:
    """x becomes `value` where `mask` is 1 (x·(1 − m) + m·v between); `at`: as for `Edit`."""
    mask = jnp.asarray(mask, jnp.float32)
    return cls(keep=1.0 - mask, add=mask * value, at=at)

  def layer(self, layer) -> Edit:
    """The edit of one layer (an int, or traced): the leading L axis indexed (an axis of 1 serves every layer);
    an edit `at` one layer is the identity (keep 1, add 0) at the others."""
    if self.at is not None:
      here = jnp.asarray(layer) == self.at
      keep = None if self.keep is None else jnp.where(here, self.keep, 1.0)
      return Edit(keep, None if self.add is None else jnp.where(here, self.add, 0.0))
    return Edit(
      *(None if a is None else jnp.asarray(a)[layer if np.shape(a)[0] > 1 else 0] for a in (self.keep, self.add))
    )

  def __call__(self, x):
    x = x if self.keep is None else x * self.keep.astype(x.dtype)
    return x if self.add is None else x + self.add.astype(x.dtype)


@flax.struct.dataclass
class Apply:
  """An edit that is a function of the activation: x -> fn(x, *args) at the layers `layers` (None: every layer).

  `fn` is part of the program (one compile per function: give the same function object, not a new lambda, to
  reuse it); `args` (any pytree of arrays) are traced data, so new values never recompile and the outputs are
  differentiable in them. fn gets one layer's activation [*the site's axes] and returns that shape. Ready-made
  ones: headspec/model/edits.py (project_out, clamp, replace, splice).
  """

  fn: Callable = flax.struct.field(pytree_node=False)
  args: tuple = ()
  layers: tuple[int, ...] | None = flax.struct.field(pytree_node=False, default=None)

  def __post_init__(self):
    layers = self.layers
    if layers is not None and not isinstance(layers, tuple):  # hashable: it is part of the program
      layers = (layers,) if isinstance(layers, int | np.integer) else tuple(layers)
      object.__setattr__(self, "layers", tuple(int(layer) for layer in layers))
    if not isinstance(self.args, tuple):
      object.__setattr__(self, "args", (self.args,))

  def layer(self, layer: int) -> Apply | None:
    """This edit where it applies at `layer`, else None."""
    return self if self.layers is None or layer in self.layers else None

  def __call__(self, x):
    return self.fn(x, *self.args)


def _apply(edits: dict, name: str, x):
  """`x` through the edits of site `name` (a tuple of one layer's edits, in order), unchanged without."""
  for edit in edits.get(name, ()):
    y = edit(x)
    if isinstance(edit, Apply):
      if np.shape(y) != x.shape:
        raise UserError(
          f"interventions[{name!r}]: {getattr(edit.fn, '__name__', edit.fn)!r} returned shape {tuple(np.shape(y))} "
          f"for an activation of shape {tuple(x.shape)} (axes {SITES[name]})"
        )
      y = jnp.asarray(y).astype(x.dtype)
    x = y
  return x


def _edit_patterns(interventions: dict, layers) -> tuple[list, np.ndarray]:
  """(patterns, pattern_L): each distinct set of the edits active at a layer of `layers`, as ((site, (index of
  the edit in its sequence, ...)), ...), and each layer's index into them. An Edit is active at every layer (one
  `at` a layer is the identity at the others); an Apply at its `layers`."""
  patterns, pattern_L = [], []
  for layer in layers:
    active = tuple(
      (name, here)
      for name, sequence in interventions.items()
      if (here := tuple(i for i, e in enumerate(sequence) if not isinstance(e, Apply) or e.layer(layer) is not None))
    )
    if active not in patterns:
      patterns.append(active)
    pattern_L.append(patterns.index(active))
  return patterns, np.asarray(pattern_L, np.int32)


def _edit_xs(edit, first: int, L: int):
  """An edit's scanned data: an Edit's keep and add that have the L axis, layers first.. (None for an array
  without it, an Edit `at` one layer and an Apply, which the scan's body reads whole)."""
  if isinstance(edit, Apply) or edit.at is not None:
    return None
  return tuple(None if a is None or np.shape(a)[0] != L else jnp.asarray(a)[first:] for a in (edit.keep, edit.add))


def _layer_edit(edit, sliced, layer):
  """One layer's edit inside the scan: an Apply as it is, an Edit from its slices (`_edit_xs`; an axis of 1
  serves every layer), an Edit `at` one layer by `Edit.layer`."""
  if isinstance(edit, Apply):
    return edit
  if sliced is None:
    return edit.layer(layer)
  keep, add = (s if s is not None or a is None else a[0] for s, a in zip(sliced, (edit.keep, edit.add)))
  return Edit(keep, add)


def check_interventions(cfg: ModelConfig, interventions, B: int, T: int, S: int | None = None) -> dict:
  """{site: (edit, ...)}: each value an `Edit` (every array broadcastable to [L, *site axes]), an `Apply`, a
  bare function of the activation (made an Apply on every layer) or a list or tuple of these, applied in
  order; UserError naming the bad site. S: the key positions (T, or a KVCache's slots)."""
  if interventions is None:
    return {}
  if not isinstance(interventions, dict):
    raise UserError(f"interventions: a {type(interventions).__name__}; give a dict {{site: Edit}}")
  sizes = dict(B=B, T=T, S=T if S is None else S, H=cfg.num_heads, K=cfg.d_head, D=cfg.d_model)
  sizes["F"] = cfg.d_ff if cfg.mlp else 0  # attention-only blocks have no neurons
  out = {}
  for name, given in interventions.items():
    if name not in SITES:
      raise UserError(f"interventions: unknown site {name!r}; choose from {', '.join(SITES)}")
    edits = tuple(given) if isinstance(given, list | tuple) else (given,)
    edits = tuple(Apply(e) if callable(e) and not isinstance(e, Edit | Apply) else e for e in edits)
    for edit in edits:
      if not isinstance(edit, Edit | Apply):
        raise UserError(
          f"interventions[{name!r}]: a {type(edit).__name__}; give a headspec.model.transformer.Edit, an Apply or a function"
        )
    if name in ("q_in", "k_in") and cfg.qk_norm == "full":
      raise UserError(
        f"interventions[{name!r}]: with qk_norm='full' (OLMo-2) one RMS runs over every head's projection, so "
        f"an edit of one head's input would reach every head; edit {name[0]} (after the norm) or resid_pre instead"
      )
    full = (cfg.num_layers, *(sizes[a] for a in SITES[name]))
    for edit in edits:
      layers = edit.layers if isinstance(edit, Apply) else None if edit.at is None else (edit.at,)
      bad = [layer for layer in layers or () if isinstance(layer, int | np.integer) and not 0 <= layer < cfg.num_layers]
      if bad or layers == ():
        what = "layers" if isinstance(edit, Apply) else "at"
        raise UserError(
          f"interventions[{name!r}]: {what}={edit.layers if isinstance(edit, Apply) else edit.at} must be "
          f"layers of the model (0..{cfg.num_layers - 1})"
        )
      if isinstance(edit, Apply):
        continue
      shape, axes = (full, f"L,{','.join(SITES[name])}") if edit.at is None else (full[1:], ",".join(SITES[name]))
      for part in ("keep", "add"):
        array = getattr(edit, part)
        if array is not None and (np.ndim(array) != len(shape) or _broadcasts(np.shape(array), shape) is None):
          raise UserError(
            f"interventions[{name!r}].{part} of shape {tuple(np.shape(array))} does not broadcast to "
            f"[{axes}]={list(shape)}"
          )
    out[name] = edits
  if "ln1_scale" in out and {"q_in", "k_in", "v_in"} & set(out):
    raise UserError(
      "interventions: ln1_scale with q_in/k_in/v_in edits: each head's edited input is normed with its own "
      "scale; edit one or the other"
    )
  return out


def _broadcasts(shape, full):
  try:
    return np.broadcast_shapes(shape, full) == tuple(full) or None
  except ValueError:
    return None


def _normal(rngs: nnx.Rngs, shape, std=0.02) -> nnx.Param:
  """std · N(0, 1) of `shape`, drawn with the next key of `rngs.params` (headspec/model/draws.py: bit for bit
  `jax.random.normal`, compiled once per size bucket rather than per parameter shape)."""
  return nnx.Param(draws.normal(rngs.params(), shape, std))


def _zeros(shape) -> nnx.Param:
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


def _layernorm(cfg: ModelConfig, rngs: nnx.Rngs):
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
  """Every layer's keys and values of the tokens decoded so far, for `generate` (headspec/generate.py).

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
    self.w_q_DHK = _normal(rngs, (D, H, K))
    self.w_k_DHK, self.w_v_DHK = _normal(rngs, (D, G, K)), _normal(rngs, (D, G, K))
    bias = cfg.attention_bias
    self.b_q_HK = _zeros((H, K)) if bias else None
    self.b_k_HK, self.b_v_HK = (_zeros((G, K)), _zeros((G, K))) if bias else (None, None)
    self.w_o_HKD = _normal(rngs, (H, K, D))
    self.b_o_D = _zeros((D,)) if cfg.attention_out_bias else None
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
    q_BTHK, k_BSHK, v_BSHK = _apply(edits, "q", q_BTHK), _apply(edits, "k", k_BSHK), _apply(edits, "v", v_BSHK)
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
      logits_BHTS = _apply(edits, "attn_scores", logits_BHTS)
      probs_BHTS = mesh_lib.constrain(jax.nn.softmax(logits_BHTS, axis=-1), "BHTS")
      captured.update({"pattern": probs_BHTS} if "pattern" in capture else {})
      probs_BHTS = _apply(edits, "pattern", probs_BHTS)
      dropped_BHTS = self.attention_dropout(probs_BHTS, deterministic=dropout_rngs is None, rngs=dropout_rngs)
      z_BTHK = mesh_lib.constrain(jnp.einsum("bhts,bshk->bthk", dropped_BHTS.astype(dt), v_BSHK), "BTHK")
    else:  # fused: jax.nn.dot_product_attention, cuDNN or XLA as chosen above; K/V un-repeated (G heads)
      z_BTHK = jax.nn.dot_product_attention(
        q_BTHK, k_BSHK, v_BSHK, mask=mask_BTS[:, None], scale=scale, implementation=path
      )
    if "z" in capture:
      captured["z"] = z_BTHK
    masked_BTHK = _apply(edits, "z", z_BTHK)
    if "head_out" in capture or "head_out" in edits:
      head_out_BTHD = jnp.einsum("bthk,hkd->bthd", masked_BTHK, self.w_o_HKD[...].astype(dt))
      captured.update({"head_out": head_out_BTHD} if "head_out" in capture else {})
    if "head_out" in edits:
      out_BTD = _apply(edits, "head_out", head_out_BTHD).sum(2)
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
    self.w_in_DF, self.b_in_F = _normal(rngs, (cfg.d_model, cfg.d_ff)), _zeros((cfg.d_ff,)) if cfg.mlp_bias else None
    self.w_out_FD = _normal(rngs, (cfg.d_ff, cfg.d_model))
    self.b_out_D = _zeros((cfg.d_model,)) if cfg.mlp_bias else None
    self.w_gate_DF = _normal(rngs, (cfg.d_model, cfg.d_ff)) if cfg.gated_mlp else None
    self.b_gate_F = _zeros((cfg.d_ff,)) if cfg.gated_mlp and cfg.mlp_bias else None
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
    self.ln_attention = _layernorm(cfg, rngs)
    if cfg.mlp:
      self.ln_mlp = _layernorm(cfg, rngs)
    if cfg.sublayer_norm and cfg.pre_layernorm:  # Gemma-2's extra norms (without pre-norms, ln_* are the outputs')
      self.ln_attention_out = _layernorm(cfg, rngs)
      if cfg.mlp:
        self.ln_mlp_out = _layernorm(cfg, rngs)
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
      return _apply(edits, name, value)

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
    self.token_embed_VD = _normal(rngs, (cfg.vocab_size, cfg.d_model))
    if cfg.positions == "learned":
      self.position_embed_TD = _normal(rngs, (cfg.max_len, cfg.d_model))
    if cfg.type_vocab_size:
      self.type_embed_YD = _normal(rngs, (cfg.type_vocab_size, cfg.d_model))
    if cfg.embedding_layernorm:
      self.ln_embed = _layernorm(cfg, rngs)
    self.embed_dropout = nnx.Dropout(cfg.dropout)
    self.blocks = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.num_layers)])
    if cfg.final_norm:
      self.ln_final = _layernorm(cfg, rngs)
    if cfg.kind == "encoder":  # BERT's masked-LM transform: dense, activation, LayerNorm
      self.mlm_w_DD, self.mlm_b_D = _normal(rngs, (cfg.d_model, cfg.d_model)), _zeros((cfg.d_model,))
      self.ln_mlm = _layernorm(cfg, rngs)
    if not cfg.tie_embeddings:
      self.unembed_DV = _normal(rngs, (cfg.d_model, cfg.vocab_size))
    self.unembed_bias_V = _zeros((cfg.vocab_size,))

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
    patterns, pattern_L = _edit_patterns(interventions, layers)
    edits_L = {name: tuple(_edit_xs(edit, first, L) for edit in sequence) for name, sequence in interventions.items()}
    keys_L = None  # per layer its own dropout key; deterministic without dropout_rngs (or without dropout)
    if dropout_rngs is not None and (cfg.dropout or cfg.attention_dropout):
      keys_L = jax.random.split(dropout_rngs["dropout"](), len(layers))
    cache_L = None if kv_cache is None else (kv_cache.k_LBSHK, kv_cache.v_LBSHK)
    xs = (jnp.arange(first, L), state_L, windows_L, edits_L, jnp.asarray(pattern_L), cache_L, keys_L)

    def branch(pattern):
      def run(x_BTD, layer, state, window, edits_l, cache_l, key):
        block = nnx.merge(graphdef, state)
        edits = {
          name: tuple(_layer_edit(interventions[name][i], edits_l[name][i], layer) for i in active)
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
