"""Small utilities over per-head tensors, shared by the diversity metrics and the training regularizers.

`unit` normalises head vectors (cosines between heads); `intermediate` reads one captured field of a
forward pass (headspec/model/sites.py's Intermediates) and says which capture is missing when it is not there.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from headspec.errors import UserError

_EPS = 1e-12


def unit(x):
  """x / ||x|| along the last axis; zero vectors stay zero (their cosines count as 0, gradients stay finite)."""
  return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), _EPS))


def intermediate(intermediates: Any, name: str, needed_by: str):
  """Field `name` (e.g. 'z_LBTHK') of an Intermediates or a dict; UserError if it was not captured."""
  value = intermediates[name] if isinstance(intermediates, Mapping) else getattr(intermediates, name)
  if value is None:
    raise UserError(f"{needed_by} needs Intermediates.{name}; add {name.split('_')[0]!r} to the model's capture")
  return value
