"""Finite, sensible numeric options, declared per option: one check for every command's config and API.

A command declares a table of `Bound(key, kind, low, high)` (kind 'int': a whole number, 'float': a finite
number; `low`/`high` inclusive unless `above`) and calls `check(config, bounds, where)` first thing in its
config check: NaN, ±inf, a fraction where a count goes, and absurd sizes (`analysis.top=100000000`, a batch
of 2e8 tokens) are one UserError line naming the key, before any computation. `declare` registers a table
with the command's defaults and its check, so tests/test_faults_rows.py tries every declared option of every
user. No JAX, no numpy.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from headspec.errors import UserError


@dataclasses.dataclass(frozen=True)
class Bound:
  """An option's kind and range: `key` is its dotted path in the config ('sae.lr') or an argument's name."""

  key: str
  kind: str  # 'int' | 'float'
  low: float | None = None
  high: float | None = None
  above: bool = False  # `low` itself excluded (a learning rate > 0)
  optional: bool = False  # None allowed (a placeholder, such as sae.features)

  def __post_init__(self):
    assert self.kind in ("int", "float"), self

  def what(self) -> str:
    """What a value must be: 'a whole number in [1, 1048576]', 'a finite number > 0 and <= 10'."""
    noun = "a whole number" if self.kind == "int" else "a finite number"
    low = None if self.low is None else f"{'>' if self.above else '>='} {self.low:g}"
    high = None if self.high is None else f"<= {self.high:g}"
    if low and high and not self.above:
      return f"{noun} in [{self.low:g}, {self.high:g}]"
    return " and ".join(filter(None, [f"{noun} {low}" if low else noun, high]))

  def fits(self, value) -> bool:
    if value is None:
      return self.optional
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
      return False
    value = float(value)
    if not math.isfinite(value) or (self.kind == "int" and value != int(value)):
      return False
    if self.low is not None and (value <= self.low if self.above else value < self.low):
      return False
    return self.high is None or value <= self.high


def value_of(values, key: str):
  """`key`'s value in a config (dotted path), a mapping or an object."""
  for part in key.split("."):
    values = values[part] if isinstance(values, Mapping) or hasattr(values, "__getitem__") else getattr(values, part)
  return values


def check(values, bounds, where: str) -> None:
  """UserError naming the first option of `bounds` whose value in `values` is out of its bound."""
  for b in bounds:
    value = value_of(values, b.key)
    if not b.fits(value):
      raise UserError(f"{where}: {b.key}={value!r} must be {b.what()}")


@dataclasses.dataclass(frozen=True)
class Declared:
  """A user of the check: its bounds, a function giving valid values (a config, a dict of arguments), and
  its own check of such values (which calls `check` first)."""

  where: str
  bounds: tuple[Bound, ...]
  defaults: Callable[[], Any]
  check: Callable[[Any], None]


DECLARED: dict[str, Declared] = {}
"""Every table of bounds by its user ('sae', 'fit_sae', ...), as `declare` registered them."""


def declare(where: str, bounds, *, defaults: Callable[[], Any], check: Callable[[Any], None]) -> tuple[Bound, ...]:
  DECLARED[where] = Declared(where, tuple(bounds), defaults, check)
  return tuple(bounds)
