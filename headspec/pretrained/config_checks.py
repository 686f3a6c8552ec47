"""Type and range checks of the Hugging Face `config.json` keys the import reads (headspec/pretrained/).

Every family's translation reads its keys through one `HFConfig`, so a malformed value (a head count of
`"4"`, `4.0` or `true`, `vocab_size: null`, a negative `rope_theta`, `layer_norm_epsilon: "1e-5"`) is one
line naming the file and the key as the file spells it, before any computation, instead of a traceback or
a model that computes NaN. JSON objects are read with `read_json_object` (UTF-8, an object at the top).
"""

from __future__ import annotations

import json
import math
import os

from headspec.errors import UserError

REQUIRED = object()  # the default of a key the file must have


def read_json_object(path: os.PathLike, what: str = "a JSON object") -> dict:
  """The JSON object in `path`; one line naming the file when it is unreadable, not UTF-8, not JSON, or
  not an object (a list or a string at the top level)."""
  try:
    with open(path, "rb") as f:
      data = json.loads(f.read().decode("utf-8"))
  except (OSError, UnicodeDecodeError, ValueError) as e:  # json.JSONDecodeError is a ValueError
    raise UserError(f"{path}: cannot read JSON ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
  if not isinstance(data, dict):
    raise UserError(f"{path}: not {what} (the top level is {_json_type(data)})")
  return data


def _json_type(value) -> str:
  """What a JSON value is, with its article: 'null', 'a string', 'a decimal number' (4.0), 'a list', ..."""
  names = {bool: "a boolean", int: "an integer", float: "a decimal number", str: "a string", list: "a list"}
  return "null" if value is None else names.get(type(value), "an object" if isinstance(value, dict) else "a value")


def show(value) -> str:
  """A value as the JSON file writes it (`"4"`, `true`, `null`), cut to a readable length."""
  try:
    text = json.dumps(value, ensure_ascii=False)
  except (TypeError, ValueError):
    text = repr(value)
  return text if len(text) <= 60 else text[:57] + "..."


class HFConfig:
  """A config.json object read key by key with checks. `names` maps a key to how messages name it
  (`rope_parameters.factor` for a key of a nested object), `prefix` names the keys it does not list. A key
  may be a tuple of alternatives, the first present read (`("rms_norm_eps", "layer_norm_eps")`). With
  `optional=True`, null means the default."""

  def __init__(self, values: dict, path: os.PathLike, names: dict[str, str] | None = None, prefix: str = ""):
    self.values, self.path, self.names, self.prefix = values, path, dict(names or {}), prefix

  def name(self, key: str) -> str:
    return self.names.get(key, self.prefix + key)

  def fail(self, key: str, message: str) -> None:
    raise UserError(f"{self.path}: {self.name(key)}={show(self.values.get(key))} {message}")

  def has(self, key: str) -> bool:
    return key in self.values

  def raw(self, key, default=None):
    """The value as stored (no check): for keys only compared, never computed with."""
    return self.values.get(key, default)

  def _lookup(self, key, default, optional: bool):
    """(key read, value) or (None, default) when absent (or null with `optional`)."""
    for k in (key,) if isinstance(key, str) else key:
      if k in self.values and not (optional and self.values[k] is None):
        return k, self.values[k]
    if default is REQUIRED:
      raise UserError(f"{self.path}: missing key {self.name(key if isinstance(key, str) else key[0])!r}")
    return None, default

  def integer(self, key, default=REQUIRED, *, low: int = 1, optional: bool = False) -> int:
    """An integer >= `low` (1: a size); a bool, a float such as 4.0 or a string such as "4" is refused."""
    k, value = self._lookup(key, default, optional)
    if k is None:
      return value
    if isinstance(value, bool) or not isinstance(value, int):
      self.fail(k, f"must be an integer, not {_json_type(value)}")
    if value < low:
      self.fail(k, "must be positive" if low == 1 else f"must be at least {low}")
    return value

  def number(
    self,
    key,
    default=REQUIRED,
    *,
    low: float = 0.0,
    low_open: bool = True,
    high: float | None = None,
    high_open: bool = False,
    optional: bool = False,
  ) -> float:
    """A finite number in the range (`low`, `high`]; open or closed ends as given (default: positive)."""
    k, value = self._lookup(key, default, optional)
    if k is None:
      return value
    if isinstance(value, bool) or not isinstance(value, int | float):
      self.fail(k, f"must be a number, not {_json_type(value)}")
    value = float(value)
    above = value > low if low_open else value >= low
    below = high is None or (value < high if high_open else value <= high)
    if not (math.isfinite(value) and above and below):
      if high is not None:
        where = f"a number in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
      else:
        where = (
          "a positive number" if (low, low_open) == (0.0, True) else f"a number {'>' if low_open else '>='} {low:g}"
        )
      self.fail(k, f"must be {where}")
    return value

  def probability(self, key, default=0.0) -> float:
    """A dropout rate in [0, 1) (null: 0)."""
    return self.number(key, default, low=0.0, low_open=False, high=1.0, high_open=True, optional=True)

  def flag(self, key, default: bool) -> bool:
    k, value = self._lookup(key, default, False)
    if k is not None and not isinstance(value, bool):
      self.fail(k, f"must be true or false, not {_json_type(value)}")
    return value

  def text(self, key, default=REQUIRED, *, optional: bool = False):
    k, value = self._lookup(key, default, optional)
    if k is not None and not isinstance(value, str):
      self.fail(k, f"must be a string, not {_json_type(value)}")
    return value

  def mapping(self, key) -> dict:
    """An object (null or absent: {})."""
    k, value = self._lookup(key, {}, True)
    if k is not None and not isinstance(value, dict):
      self.fail(k, f"must be an object, not {_json_type(value)}")
    return value

  def strings(self, key):
    """A list of strings, or None when absent or null."""
    k, value = self._lookup(key, None, True)
    if k is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
      self.fail(k, "must be a list of strings")
    return value

  def token_ids(self, key, vocab_size: int) -> list[int] | None:
    """A special token id (or a list of them, as Llama-3's eos_token_id), or None when absent or null. The
    type is checked (transformers refuses `"</s>"` or `true` too); an id outside the vocabulary, which
    transformers loads (random tiny models keep GPT-2's bos_token_id=50256 with vocab_size=300), is one
    warning and treated as absent: no such special token."""
    k, value = self._lookup(key, None, True)
    if k is None:
      return None
    ids = value if isinstance(value, list) else [value]
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
      self.fail(k, "must be a token id (an integer) or a list of them")
    outside = [i for i in ids if not 0 <= i < vocab_size]
    if outside:
      _warn_once(
        f"{self.path}: {self.name(k)}={show(value)} is outside the vocabulary (token ids 0..{vocab_size - 1}: "
        f"vocab_size={vocab_size}); loading as if the config named no {self.name(k).removesuffix('_id')}"
      )
      return None
    return ids


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
  """One warning per message in a process (a command reads config.json when it plans and when it loads)."""
  if message not in _WARNED:
    _WARNED.add(message)
    from absl import logging

    logging.warning("%s", message)
