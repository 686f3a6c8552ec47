"""Ready-made functional edits of an intervention site (headspec/model/sites.py `Apply`, docs/patching.md).

Each returns an `Apply` whose function is a fixed module-level function (or, for `splice` with plain
functions, an object equal for equal functions), so changing a direction, a value or an SAE's weights never
recompiles a jitted forward: only the function and `layers` are part of the program. Directions run along the
site's last axis (K for q, k, v, z; D for the residual stream, attn_out, mlp_out, head_out; F for mlp_post) and
broadcast against the activation's other axes, so a [H, K] direction of z gives each head its own.

  project_out(u)       x − (x·û) û          projection ablation of direction u (û = u / |u|)
  clamp(u, value)      x + (value − x·û) û  the component along û set to `value` (a steering clamp)
  replace(value)       value                the activation replaced (broadcast to its shape)
  splice(sae)          decode(encode(x))    a module spliced in, e.g. a sparse autoencoder's reconstruction

And the head ablations as an affine `Edit` of the site z (traced arrays, so a new mask never recompiles):

  head_mask(m, r)      Z_h·m_h + (1 − m_h)·r_h   zero (r None) or mean ablation (r the mean of Z_h), scaling
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp

from headspec.errors import UserError
from headspec.model.sites import Apply, Edit

__all__ = ["Apply", "Edit", "clamp", "head_mask", "project_out", "replace", "splice", "with_head_mask"]


def _unit(u):
  u = jnp.asarray(u, jnp.float32)
  return u / jnp.linalg.norm(u, axis=-1, keepdims=True)


def _project_out(x, u):
  unit = _unit(u)
  x32 = x.astype(jnp.float32)
  return x32 - jnp.sum(x32 * unit, axis=-1, keepdims=True) * unit


def _clamp(x, u, value):
  unit = _unit(u)
  x32 = x.astype(jnp.float32)
  along = jnp.sum(x32 * unit, axis=-1, keepdims=True)
  return x32 + (jnp.asarray(value, jnp.float32)[..., None] - along) * unit


def _replace(x, value):
  return jnp.broadcast_to(jnp.asarray(value, x.dtype), x.shape)


def _direction(direction, name: str):
  shape = jnp.shape(direction)
  if not shape or not shape[-1]:
    raise UserError(f"{name}: direction of shape {tuple(shape)}; give a vector along the site's last axis")
  return jnp.asarray(direction, jnp.float32)


def project_out(direction, layers=None) -> Apply:
  """Projection ablation: x − (x·û) û, the component of each activation vector along `direction` removed."""
  return Apply(_project_out, (_direction(direction, "project_out"),), layers)


def clamp(direction, value, layers=None) -> Apply:
  """x + (value − x·û) û: the component along the unit `direction` set to `value` (a scalar, or an array
  broadcasting to the activation without its last axis, e.g. [B, T] per token)."""
  return Apply(_clamp, (_direction(direction, "clamp"), jnp.asarray(value, jnp.float32)), layers)


def replace(value, layers=None) -> Apply:
  """The activation replaced by `value` (broadcast to one layer's activation, [*the site's axes])."""
  return Apply(_replace, (jnp.asarray(value),), layers)


@dataclasses.dataclass(frozen=True)
class _Functions:
  """decode(encode(x)) of plain functions: equal for equal functions, so a jitted forward reuses its program."""

  encode: Callable
  decode: Callable

  def __call__(self, x, *_):
    return _rows(x, lambda rows: self.decode(self.encode(rows)))


def _rows(x, fn):
  """fn on the activation as rows [first two axes, the rest flattened] (z: [B·T, H·K], as hook_z SAEs read it)."""
  rows = x.reshape(x.shape[0] * x.shape[1], -1)
  return jnp.asarray(fn(rows)).reshape(x.shape)


def _module(x, module):
  return _rows(x, lambda rows: module.decode(module.encode(rows)))


def splice(module=None, layers=None, *, encode: Callable | None = None, decode: Callable | None = None) -> Apply:
  """x -> decode(encode(x)) on each token's activation flattened (for z the concatenated heads, [B·T, H·K]).

  `module`: an object with `encode` and `decode` that is a pytree, such as headspec's SAE (headspec/sae/model.py,
  a flax struct): its arrays are traced data, so another SAE of the same shapes does not recompile (an object
  that is no pytree works outside jit only). Or plain functions `encode=`, `decode=` (part of the program,
  like an Apply's function: equal functions reuse it)."""
  if module is not None:
    if encode is not None or decode is not None or not (hasattr(module, "encode") and hasattr(module, "decode")):
      raise UserError("splice: give a module with encode and decode, or encode= and decode= functions, not both")
    return Apply(_module, (module,), layers)
  if not (callable(encode) and callable(decode)):
    raise UserError("splice: give a module with encode and decode, or both encode= and decode= functions")
  return Apply(_Functions(encode, decode), (), layers)


def head_mask(mask, replacement=None) -> Edit:
  """The head mask as an Edit of site z: Z_h·m_h + (1 − m_h)·r_h before W_O (keep m, add (1 − m)·r).

  mask: [L, H], or per example [B, L, H] (1 keeps a head, 0 removes it, between scales it; traced, so the
  loss is differentiable in it: L0 gates, DropHead). replacement: None (r = 0, plain masking) or [L, H, K] or
  [B, L, H, K], what a removed head outputs instead: with r_h = the mean of Z_h over a data set it is mean
  ablation (Wang et al. 2022). `model(tokens, interventions={"z": head_mask(m, r)})`."""
  mask = jnp.asarray(mask, jnp.float32)
  if mask.ndim not in (2, 3):
    raise UserError(f"head_mask of shape {tuple(mask.shape)}: expected [L, H] or per example [B, L, H]")
  keep = mask[:, None] if mask.ndim == 2 else jnp.transpose(mask, (1, 0, 2))  # [L, 1 or B, H]
  keep = keep[:, :, None, :, None]  # [L, B, T, H, K] broadcast
  if replacement is None:
    return Edit(keep=keep)
  replacement = jnp.asarray(replacement)
  if replacement.ndim != mask.ndim + 1 and not (mask.ndim == 3 and replacement.ndim == 3):
    raise UserError(
      f"head_mask: replacement of shape {tuple(replacement.shape)}: expected [L, H, K] or per example [B, L, H, K]"
    )
  r = replacement[:, None] if replacement.ndim == 3 else jnp.transpose(replacement, (1, 0, 2, 3))  # [L, 1|B, H, K]
  return Edit(keep=keep, add=((1 - keep[:, :, 0]) * r)[:, :, None])


def with_head_mask(interventions, edit: Edit | None) -> dict:
  """`interventions` with the head-mask `edit` first among the edits of z (None: unchanged). What is not a dict
  passes through as given, for the model's check to refuse in one line."""
  if edit is None or not isinstance(interventions, dict | None):
    return interventions
  interventions = dict(interventions or {})
  given = interventions.get("z", ())
  interventions["z"] = [edit, *(given if isinstance(given, list | tuple) else (given,))]
  return interventions
