"""The intervention protocol: named sites, the edits of them, and what a forward pass captures.

Every analysis reads and edits the model through these (docs/patching.md): `SITES` names each layer's
activations and their axes (TransformerLens's hook names), an `Edit` (x -> x·keep + add, traced data) or an
`Apply` (x -> fn(x, *args)) changes one, `check_interventions` checks a dict of them against a config, and
`Intermediates` holds what a pass captured, stacked over layers. The Transformer applies them
(headspec/model/layers.py, transformer.py); headspec/model/edits.py has ready-made edits.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from headspec.errors import UserError
from headspec.model.config import ModelConfig

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


def apply_edits(edits: dict, name: str, x):
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


def edit_patterns(interventions: dict, layers) -> tuple[list, np.ndarray]:
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


def edit_xs(edit, first: int, L: int):
  """An edit's scanned data: an Edit's keep and add that have the L axis, layers first.. (None for an array
  without it, an Edit `at` one layer and an Apply, which the scan's body reads whole)."""
  if isinstance(edit, Apply) or edit.at is not None:
    return None
  return tuple(None if a is None or np.shape(a)[0] != L else jnp.asarray(a)[first:] for a in (edit.keep, edit.add))


def layer_edit(edit, sliced, layer):
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
          f"interventions[{name!r}]: a {type(edit).__name__}; give a headspec.model.sites.Edit, an Apply or a function"
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
