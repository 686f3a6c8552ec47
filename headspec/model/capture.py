"""`headspec.capture`: one jitted forward pass that returns the chosen sites' activations as a `Cache`,
with TransformerLens's cache helpers (docs/api.md, docs/transformerlens.md).

The forward is `Transformer.__call__(tokens, capture=sites)` under `jax.jit`, one program per model
structure, site set and padded shape [B, P] (`forward`): rows are right-padded to P, the next power of two
of their length (`bucket_length`, the one bucket rule), masked, and the arrays cut back to the
rows' length on the host, so a loop over batches of varied lengths compiles once per bucket (seconds),
later calls run at once. The weights are an argument of the program, not constants in it, so a model with
other weights of the same structure reuses it. Values equal the eager model's. headspec/api/store.py runs the
same program over a corpus (`headspec.activations`).

Names are the sites of docs/patching.md (`headspec.model.sites.SITES`: resid_pre, q, k, v, pattern, z,
head_out, attn_out, resid_mid, mlp_in, mlp_out, resid_post, ...), `embeddings` (block 0's input: token +
position embeddings) and, as TransformerLens splits it, `embed` (the token embedding alone) and `pos_embed`
(the position embedding; none with rotary positions), computed from the weights and the tokens whether
captured or not (`embed_part`). TransformerLens's hook names (`blocks.3.attn.hook_z`, `hook_embed`,
`hook_pos_embed`) map to them (`TL_HOOKS`, `EMBED_HOOKS`). Every site is [L, B, ...] (`cache["z"]`), one
layer [B, ...] (`cache["z", 3]`). An unknown name is one line naming the close valid ones (`unknown_site`).

Helpers (after TransformerLens's ActivationCache; Elhage et al. 2021 for the residual decomposition and
direct logit attribution, nostalgebraist 2020 for the logit lens):
  accumulated_resid   the residual stream entering each layer, and the final one
  decompose_resid     its additive pieces: the embeddings, each layer's attn_out and mlp_out
  stack_head_results  every head's output Z_h W_O^h (head_out), [L·H, B, T, D]
  apply_ln_to_stack   the final norm linearised at the final residual stream (its scale fixed), as TL
  stack_to_logit_diff a stack's direct effect on logit(correct) − logit(wrong) at each prompt's last token
  head_dla            per-head direct logit attribution [L, H, B]
  logit_lens          each accumulated residual through the final norm (recomputed on it) and the unembedding
"""

from __future__ import annotations

import dataclasses
import difflib
import re

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from headspec.arguments import short
from headspec.errors import UserError
from headspec.model.layers import sinusoidal_positions
from headspec.model.sites import CAPTURE_FIELDS, SITES
from headspec.parallel import mesh as mesh_lib
from headspec.parallel.compilations import program_cache

# TransformerLens's hook of each site (docs/patching.md's table), `blocks.{layer}.` before it.
TL_HOOKS = {
  "hook_resid_pre": "resid_pre",
  "hook_q_input": "q_in",
  "hook_k_input": "k_in",
  "hook_v_input": "v_in",
  "attn.hook_q": "q",
  "attn.hook_rot_q": "q",
  "attn.hook_k": "k",
  "attn.hook_rot_k": "k",
  "attn.hook_v": "v",
  "attn.hook_pattern": "pattern",
  "attn.hook_z": "z",
  "attn.hook_result": "head_out",
  "hook_attn_out": "attn_out",
  "hook_resid_mid": "resid_mid",
  "hook_mlp_in": "mlp_in",
  "hook_mlp_out": "mlp_out",
  "hook_resid_post": "resid_post",
  "attn.hook_attn_scores": "attn_scores",  # the sites below where headspec.model.sites.SITES has them
  "mlp.hook_post": "mlp_post",
  "ln1.hook_scale": "ln1_scale",
  "ln2.hook_scale": "ln2_scale",
  "ln_final.hook_scale": "ln_final_scale",
}
# TransformerLens's top-level embedding hooks: its `hook_embed` is the token embedding alone (W_E[tokens]; for
# Gemma times sqrt(d_model), folded into W_E there), `hook_pos_embed` the position embedding added to it.
EMBED_HOOKS = {"hook_embed": "embed", "hook_pos_embed": "pos_embed"}
EMBED_PARTS = ("embed", "pos_embed")  # computed from the weights and tokens (`embed_part`), not by the forward
_TL_NAME = re.compile(r"blocks\.(\d+)\.(.+)")
# Per-head copies of the stream (H × D per token): captured only when asked for, as TransformerLens's
# use_split_qkv_input.
NOT_BY_DEFAULT = ("q_in", "k_in", "v_in")
TRACES: dict = {}  # (site set, tokens shape) -> times the forward was traced (compiled); for tests


def bucket_length(num_tokens: int, max_len: int, minimum: int = 16) -> int:
  """The padded length of a window: the next power of two >= num_tokens (at least `minimum`), capped at max_len:
  the one bucket rule of every batch of words or tokens, so each bucket compiles one program."""
  return min(max_len, max(minimum, 1 << max(0, int(num_tokens) - 1).bit_length()))


def default_sites() -> tuple[str, ...]:
  """What `capture` records without `sites=`: every capture name but the per-head stream copies."""
  return tuple(name for name in CAPTURE_FIELDS if name not in NOT_BY_DEFAULT)


NAMES = (*EMBED_PARTS, *CAPTURE_FIELDS)  # every name a Cache answers to, in the order keys() lists them


def unknown_site(name: str, what: str, names=NAMES) -> UserError:
  """The one line for a name that is no site: the close valid names (difflib; a TransformerLens name keeps
  its `blocks.l.`), the valid ones and an example."""
  match = _TL_NAME.fullmatch(name)
  prefix, rest = (f"blocks.{match.group(1)}.", match.group(2)) if match else ("", name)
  candidates = list(TL_HOOKS) if prefix else [*names, *TL_HOOKS, *(EMBED_HOOKS if names == NAMES else ())]
  close = difflib.get_close_matches(rest, candidates, n=3, cutoff=0.6)
  hint = f"did you mean {' or '.join(repr(prefix + c) for c in close)}? " if close else ""
  return UserError(
    f"{what}: unknown site {name!r}; {hint}sites: {', '.join(names)} (or TransformerLens's hook names), "
    "e.g. 'z' or 'blocks.0.attn.hook_z' (docs/patching.md)"
  )


def _capture_name(name: str) -> str:
  """The capture name of a site's name or a TransformerLens hook name (without `blocks.l.`)."""
  return EMBED_HOOKS.get(name, TL_HOOKS.get(name, name))


def check_sites(sites, what: str = "capture", *, embed_parts: bool = False) -> tuple[str, ...]:
  """Capture names (sites of docs/patching.md, 'embeddings', or TransformerLens hook names without
  `blocks.l.`; with `embed_parts` also 'embed' and 'pos_embed', which `run_capture` computes), in a fixed
  order; UserError (from function `what`) naming an unknown one and the close valid ones."""
  names = NAMES if embed_parts else CAPTURE_FIELDS
  out = []
  for name in (sites,) if isinstance(sites, str) else sites:
    site = _capture_name(name)
    if site not in names:
      raise unknown_site(name, what, names)
    out.append(site)
  if not out:
    raise UserError(f"{what}: sites=() captures nothing; give site names (docs/patching.md) or leave sites out")
  return tuple(name for name in names if name in out)


def embed_part(net, tokens_BT, name: str, what: str) -> np.ndarray:
  """TransformerLens's `hook_embed` ('embed': the token embedding W_E[tokens], times sqrt(D) where the model
  scales it: Gemma, and Vaswani et al.'s sinusoidal models) or `hook_pos_embed` ('pos_embed': the learned or
  sinusoidal position embedding of positions 0..T−1), [B, T, D] in the model's dtype: the two terms
  `Transformer.embed` adds (before BERT's token types and embedding LayerNorm)."""
  cfg, dt = net.cfg, jnp.dtype(net.cfg.dtype)
  tokens_BT = jnp.asarray(tokens_BT, jnp.int32)
  B, T = tokens_BT.shape
  if name == "embed":
    x_BTD = jnp.take(net.token_embed_VD[...], tokens_BT, axis=0)
    if cfg.scale_embeddings:
      x_BTD = x_BTD * jnp.sqrt(jnp.float32(cfg.d_model)).astype(dt)
    if cfg.positions == "sinusoidal":
      x_BTD = x_BTD * jnp.sqrt(jnp.float32(cfg.d_model))
    return np.asarray(x_BTD.astype(dt))
  if cfg.positions == "learned":
    table_TD = net.position_embed_TD[...][:T]
  elif cfg.positions == "sinusoidal":
    table_TD = sinusoidal_positions(T, cfg.d_model)
  else:
    raise UserError(
      f"{what}: this model has {cfg.positions} positions (they enter each layer's queries and keys): it has no "
      "position embedding; its embeddings are 'embed' alone"
    )
  return np.asarray(jnp.broadcast_to(table_TD[None], (B, T, cfg.d_model)).astype(dt))


@program_cache(32)
def forward(graphdef, sites: tuple[str, ...], output: str = "logits", picks: tuple | None = None):
  """jit(state, tokens_BT, valid_BT, interventions) -> (logits_BTV, Intermediates), one program per padded
  shape. output: 'logits' or 'hidden' (the final hidden state: no unembedding, for a caller that reads only
  the sites). picks: ((capture name, layer or None), ...) to return those arrays instead of the
  Intermediates, one layer cut inside the program (so only it leaves the device)."""

  @mesh_lib.jit
  def program(state, tokens_BT, valid_BT, interventions):
    key = (sites, tokens_BT.shape) + (() if (output, picks) == ("logits", None) else (output, picks))
    TRACES[key] = TRACES.get(key, 0) + 1  # runs only while tracing
    net = nnx.merge(graphdef, state)
    out, inter = net(tokens_BT, valid_BT=valid_BT, interventions=interventions, capture=sites, output=output)
    if picks is None:
      return out, inter
    return out, tuple(_site_of(inter, name) if layer is None else _site_of(inter, name)[layer] for name, layer in picks)

  return program


def _site_of(inter, name: str):
  return inter.embeddings_BTD if name == "embeddings" else inter.site(name)


def token_axes(name: str, layered: bool = True) -> tuple[int, ...]:
  """The token axes (T, and S of an attention map) of capture name `name`'s array: [L, B, ...] as the
  Intermediates hold it (`layered`), else one layer's [B, ...]."""
  axes = {"embeddings": "BTD", "ln_final_scale": "BT"}.get(name) or SITES[name]
  shift = int(layered and name in SITES)
  return tuple(i + shift for i, letter in enumerate(axes) if letter in "TS")


def run_capture(net, tokens_BT, valid_BT, sites, interventions=None) -> Cache:
  """The jitted forward on right-padded token rows (`valid_BT` marks the real tokens), padded further to
  the bucket length of T (one program per bucket) and cut back to T: numpy arrays, as if run at T."""
  tokens_BT, valid_BT = np.asarray(tokens_BT, np.int32), np.asarray(valid_BT, bool)
  B, T = tokens_BT.shape
  P = max(T, bucket_length(T, net.cfg.max_len))
  pad = ((0, 0), (0, P - T))
  graphdef, state = nnx.split(net)
  captured = tuple(name for name in sites if name not in EMBED_PARTS)  # the embedding parts: from the weights
  run = forward(graphdef, captured)
  logits_BPV, inter = run(state, np.pad(tokens_BT, pad), np.pad(valid_BT, pad), interventions)
  logits_BPV, padded = jax.device_get((logits_BPV, {name: _site_of(inter, name) for name in captured}))
  acts = {}
  for name in sites:
    if name in EMBED_PARTS:
      acts[name] = embed_part(net, tokens_BT, name, "capture")
      continue
    value = padded[name]
    cut = [slice(None)] * value.ndim
    for axis in token_axes(name):
      cut[axis] = slice(0, T)
    acts[name] = np.asarray(value[tuple(cut)])
  return Cache(net, tokens_BT, valid_BT, np.asarray(logits_BPV[:, :T]), acts)


@dataclasses.dataclass(frozen=True, eq=False)
class Cache:
  """What `headspec.capture` returns: the token rows, their logits and every captured site.

  tokens_BT (int32, right-padded with the tokenizer's pad id), valid_BT (True at real tokens),
  last_B (each row's last real token), logits_BTV (float32). `cache[site]` is [L, B, ...] as the site's
  axes in docs/patching.md ('embeddings', 'embed', 'pos_embed': [B, T, D], the last two computed when read
  if not captured); `cache[site, layer]` one layer; TransformerLens's names work too
  (`cache["blocks.0.attn.hook_z"]`, `cache["hook_embed"]`). Arrays are numpy arrays on the host, T long (the
  program's bucket padding cut off).
  """

  model: object = dataclasses.field(repr=False)
  tokens_BT: np.ndarray
  valid_BT: np.ndarray
  logits_BTV: np.ndarray = dataclasses.field(repr=False)
  activations: dict = dataclasses.field(repr=False)

  def __repr__(self) -> str:
    return f"Cache(tokens {list(self.tokens_BT.shape)}, sites {', '.join(self.activations)})"

  @property
  def last_B(self) -> np.ndarray:
    return self.valid_BT.sum(1).astype(np.int64) - 1

  @property
  def cfg(self):
    return self.model.cfg

  def keys(self) -> list[str]:
    return list(self.activations)

  def __contains__(self, name) -> bool:
    return name in self.activations

  def __getitem__(self, key):
    layer = None
    if isinstance(key, tuple):
      if len(key) != 2 or not isinstance(key[1], int | np.integer):
        raise UserError(f"cache[{key!r}]: give cache[site] or cache[site, layer]")
      key, layer = key
    if not isinstance(key, str):
      raise UserError(f"cache[{key!r}]: a site's name (str), e.g. cache['z'] or cache['z', 0]")
    given = key
    match = _TL_NAME.fullmatch(key)
    if match and layer is None:
      layer, key = int(match.group(1)), match.group(2)
    site = _capture_name(key)
    if site not in NAMES or (match and site not in SITES):
      raise unknown_site(given, f"cache[{given!r}]")
    if site in EMBED_PARTS and site not in self.activations:  # the weights and tokens give it: no capture needed
      value = embed_part(self.model, self.tokens_BT, site, f"cache[{given!r}]")
    else:
      value = self._site(site, f"cache[{key!r}]")
    if layer is None:
      return value
    L = self.cfg.num_layers
    if site not in SITES:  # embeddings, the final norm's scale
      raise UserError(f"cache[{key!r}, {layer}]: {site!r} has no layer axis; read cache[{key!r}]")
    if not -L <= layer < L:
      raise UserError(f"cache[{key!r}, {layer}]: layer out of range 0..{L - 1}")
    return value[layer]

  def _site(self, site: str, what: str) -> np.ndarray:
    if site not in self.activations:
      known = ", ".join(self.activations)
      raise UserError(f"{what}: site {site!r} was not captured (captured: {known}); capture it: sites=[..., {site!r}]")
    return self.activations[site]

  # ------------------------------------------------------------------------------- the residual stream

  def _layer_arg(self, layer, what: str) -> int:
    L = self.cfg.num_layers
    layer = L if layer is None else int(layer)
    if not 0 <= layer <= L:
      raise UserError(f"{what}: layer={layer} must be in 0..{L} (the stream entering that block; {L}: the final one)")
    return layer

  def accumulated_resid(self, layer=None, *, incl_mid: bool = False, apply_ln: bool = False, return_labels=False):
    """The residual stream entering each block up to `layer`, that one included (default: every block's,
    then the final stream after the last block): [C, B, T, D], labels 'l_pre' (and 'l_mid' of the blocks
    below `layer` with incl_mid), then f'{layer}_pre' or 'final_post' (TransformerLens's accumulated_resid:
    layer=0 is the embeddings alone). apply_ln: through `apply_ln_to_stack` (the final norm, its scale
    fixed at the final stream)."""
    layer = self._layer_arg(layer, "accumulated_resid")
    parts, labels = [], []
    for l in range(layer):
      parts.append(self._site("resid_pre", "accumulated_resid")[l])
      labels.append(f"{l}_pre")
      if incl_mid:
        parts.append(self._site("resid_mid", "accumulated_resid(incl_mid=True)")[l])
        labels.append(f"{l}_mid")
    if layer == self.cfg.num_layers:
      parts.append(self._final_resid("accumulated_resid"))
      labels.append("final_post")
    else:
      parts.append(self._site("resid_pre", "accumulated_resid")[layer])
      labels.append(f"{layer}_pre")
    stack = jnp.stack(parts)
    stack = self.apply_ln_to_stack(stack) if apply_ln else stack
    return (stack, labels) if return_labels else stack

  def _final_resid(self, what: str) -> jax.Array:
    return self._site("resid_post", what)[self.cfg.num_layers - 1]

  def _additive(self, what: str) -> None:
    cfg = self.cfg
    if not (cfg.pre_layernorm or cfg.sublayer_norm or cfg.parallel_residual):
      raise UserError(
        f"{what}: a post-LN model (BERT, MiniLM) renormalises its residual stream after every sublayer, so "
        "the stream is no sum of the sublayers' outputs"
      )

  def decompose_resid(
    self, layer=None, *, mode: str = "all", apply_ln: bool = False, incl_embeds: bool = True, return_labels=False
  ):
    """The residual stream entering block `layer` (default: the final stream) as the sum of its pieces:
    'embed' (block 0's input, token and position embeddings together: `cache["embeddings"]`, where
    `cache["embed"]` is the token embedding alone), then per block below `layer` 'l_attn_out' and 'l_mlp_out'
    (mode 'all'; 'attn' or 'mlp' keeps one kind): [C, B, T, D] (TransformerLens's decompose_resid; its
    'embed' and 'pos_embed' are one 'embed' here). With mode='all' and the embeddings the pieces sum to `accumulated_resid`'s
    entry for `layer` (exactly, up to float rounding; a post-LN model has no such sum and is refused)."""
    self._additive("decompose_resid")
    layer = self._layer_arg(layer, "decompose_resid")
    if mode not in ("all", "attn", "mlp"):
      raise UserError(f"decompose_resid: mode={mode!r}; use 'all', 'attn' or 'mlp'")
    parts, labels = [], []
    if incl_embeds:
      parts.append(self._site("embeddings", "decompose_resid"))
      labels.append("embed")
    for l in range(layer):
      for kind in ("attn", "mlp"):
        if mode in ("all", kind):
          parts.append(self._site(f"{kind}_out", "decompose_resid")[l])
          labels.append(f"{l}_{kind}_out")
    if not parts:
      raise UserError(f"decompose_resid(layer={layer}, mode={mode!r}, incl_embeds=False): no pieces")
    stack = jnp.stack(parts)
    stack = self.apply_ln_to_stack(stack) if apply_ln else stack
    return (stack, labels) if return_labels else stack

  def stack_head_results(self, layer=None, *, apply_ln: bool = False, return_labels=False):
    """Every head's output Z_h W_O^h (site head_out, the head mask applied) of the blocks below `layer`
    (default all): [L·H, B, T, D], labels 'L{l}H{h}' (TransformerLens's stack_head_results; attn_out is
    their sum plus W_O's bias)."""
    layer = self._layer_arg(layer, "stack_head_results")
    heads_LBTHD = self._site("head_out", "stack_head_results")[:layer]
    L, B, T, H, D = heads_LBTHD.shape
    stack = jnp.transpose(heads_LBTHD, (0, 3, 1, 2, 4)).reshape(L * H, B, T, D)
    labels = [f"L{l}H{h}" for l in range(L) for h in range(H)]
    stack = self.apply_ln_to_stack(stack) if apply_ln else stack
    return (stack, labels) if return_labels else stack

  # ----------------------------------------------------------------------------------------- logits

  def final_scale_BT1(self) -> jax.Array:
    """The final norm's divisor at the final residual stream: sqrt(var + eps) (LayerNorm) or sqrt(mean x² +
    eps) (RMSNorm), [B, T, 1]; 1 for a model without a final norm."""
    x_BTD = self._final_resid("the final norm's scale").astype(jnp.float32)
    if not self.cfg.final_norm:
      return jnp.ones(x_BTD.shape[:-1] + (1,), jnp.float32)
    eps = self.model.ln_final.epsilon
    if self.cfg.norm == "layernorm":
      return jnp.sqrt(jnp.var(x_BTD, axis=-1, keepdims=True) + eps)
    return jnp.sqrt(jnp.mean(x_BTD**2, axis=-1, keepdims=True) + eps)

  def apply_ln_to_stack(self, stack_CBTD) -> jax.Array:
    """The final norm linearised at the final residual stream: each piece centred (LayerNorm), divided by
    `final_scale_BT1` and times the norm's weight, without its bias (TransformerLens's apply_ln_to_stack
    with the final layer's cached scale; TL folds the weight into W_U, here it is applied). Linear: the
    pieces of `decompose_resid` through it, summed, plus the bias are the final norm's output."""
    stack = jnp.asarray(stack_CBTD, jnp.float32)
    if not self.cfg.final_norm:
      return stack
    if self.cfg.norm == "layernorm":
      stack = stack - stack.mean(-1, keepdims=True)
    return stack / self.final_scale_BT1() * self.model.ln_final.scale[...].astype(jnp.float32)

  def _ln_bias_D(self) -> jax.Array:
    norm = getattr(self.model, "ln_final", None)
    bias = getattr(norm, "bias", None) if self.cfg.final_norm else None
    return jnp.zeros(self.cfg.d_model) if bias is None else bias[...].astype(jnp.float32)

  def _unembed_DV(self) -> jax.Array:
    m = self.model
    return (m.token_embed_VD[...].T if self.cfg.tie_embeddings else m.unembed_DV[...]).astype(jnp.float32)

  def _directions_BD(self, answers, what: str) -> jax.Array:
    cfg = self.cfg
    if cfg.kind == "encoder":
      raise UserError(
        f"{what}: an encoder's logits pass its masked-LM head (dense, activation, LayerNorm): no direct path"
      )
    answers_B2 = np.asarray(answers)
    B = self.tokens_BT.shape[0]
    if answers_B2.shape != (B, 2) or answers_B2.dtype.kind not in "iu":
      raise UserError(
        f"{what}: answers must be one (correct_id, wrong_id) pair of ints per prompt, [{B}, 2]; got {short(answers)}"
      )
    if answers_B2.min() < 0 or answers_B2.max() >= cfg.vocab_size:
      raise UserError(f"{what}: answers hold a token id outside the vocabulary 0..{cfg.vocab_size - 1}")
    w_DV = self._unembed_DV()
    return (w_DV[:, answers_B2[:, 0]] - w_DV[:, answers_B2[:, 1]]).T

  def stack_to_logit_diff(self, stack_CBTD, answers) -> jax.Array:
    """Each piece's direct effect on logit(correct) − logit(wrong) at each prompt's last real token:
    [C, B], the piece (already through `apply_ln_to_stack`) dotted with W_U[:, correct] − W_U[:, wrong].
    answers: one (correct_id, wrong_id) per prompt. Before Gemma-2's final soft-cap, as TransformerLens."""
    u_BD = self._directions_BD(answers, "stack_to_logit_diff")
    stack = jnp.asarray(stack_CBTD, jnp.float32)
    at_CBD = stack[:, np.arange(stack.shape[1]), self.last_B]
    return jnp.einsum("cbd,bd->cb", at_CBD, u_BD)

  def logit_diff_constant_B(self, answers) -> jax.Array:
    """The part of the logit difference no piece carries: the final norm's bias and the unembedding's bias
    (so `stack_to_logit_diff` of every piece, summed, plus this is the logit difference)."""
    u_BD = self._directions_BD(answers, "logit_diff_constant_B")
    answers_B2 = np.asarray(answers)
    bias_V = self.model.unembed_bias_V[...].astype(jnp.float32)
    return u_BD @ self._ln_bias_D() + bias_V[answers_B2[:, 0]] - bias_V[answers_B2[:, 1]]

  def head_dla(self, answers) -> jax.Array:
    """Per-head direct logit attribution [L, H, B]: each head's output through the linearised final norm
    onto W_U[:, correct] − W_U[:, wrong] at each prompt's last token (Elhage et al. 2021; TransformerLens's
    stack_head_results(apply_ln=True) then the logit difference). Refused where the heads' outputs are
    normalised together before the residual add (Gemma-2, OLMo-2: sublayer_norm)."""
    if self.cfg.sublayer_norm:
      raise UserError(
        "head_dla: this model normalises the sum of its heads' outputs (sublayer_norm): no per-head direct path"
      )
    self._additive("head_dla")
    L, H = self.cfg.num_layers, self.cfg.num_heads
    values_CB = self.stack_to_logit_diff(self.stack_head_results(apply_ln=True), answers)
    return values_CB.reshape(L, H, -1)

  def logit_lens(self, *, incl_mid: bool = False, return_labels=False):
    """Each `accumulated_resid` entry through the final norm (recomputed on that stream, nostalgebraist
    2020) and the unembedding: [C, B, T, V] float32; the last ('final_post') is the model's logits."""
    stack, labels = self.accumulated_resid(incl_mid=incl_mid, return_labels=True)
    net = self.model
    normed = net.ln_final(stack) if self.cfg.final_norm else stack
    logits = net.unembed(normed)  # any leading axes
    return (logits, labels) if return_labels else logits
