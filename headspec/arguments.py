"""The Python API's argument checks: a wrong type is one UserError naming the function and the argument.

Every public function of headspec/api/ (and `headspec.read_table`, `read_tables`) is wrapped by
`arguments(name=rule, ...)`: before its body runs, each named argument goes through its rule, a function
that returns the value (normalised: an int, a bool, a tuple of texts) or raises `Wrong` saying what the
argument must be. So `load(None)`, a list where a text goes, `by_position="no"`, a count given as "2000"
or a text with a lone surrogate are `headspec.errors.UserError`s like

    patch: site=['z'] must be a text (str), not list

instead of a TypeError from deep inside, and nothing has been computed. Values (a site's name, a layer in
range) are still checked by the functions themselves, with the same kind of message. No JAX, no numpy at
import: `headspec/__init__.py` uses it too.
"""

from __future__ import annotations

import functools
import inspect
import numbers
import os
import reprlib
from collections.abc import Callable, Mapping, Sequence

from headspec.errors import UserError

_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 60
_SHORT.maxlist = _SHORT.maxtuple = 4


def short(value) -> str:
  """A value's repr for a one-line message (long texts and lists cut; an array's rows on one line)."""
  return " ".join(_SHORT.repr(value).splitlines())


class Wrong(Exception):
  """Raised by a rule: `text` follows the argument's name in the message ('=3 must be ...', '[2]: ...')."""

  def __init__(self, text: str):
    super().__init__(text)
    self.text = text


def _must(value, what: str) -> Wrong:
  return Wrong(f"={short(value)} must be {what}, not {type(value).__name__}")


def arguments(**rules: Callable) -> Callable:
  """Decorator: checks the named arguments of every call by their rules before the function runs (a
  wrong call, e.g. a missing argument, is a UserError too); each checked value is passed on as its rule
  returned it. A rule whose argument is not given (left at its default) is not run."""

  def wrap(function):
    signature = inspect.signature(function)
    unknown = set(rules) - set(signature.parameters)
    assert not unknown, f"{function.__name__}: no parameters {unknown}"
    name = function.__qualname__.replace(".<locals>", "")

    @functools.wraps(function)
    def checked(*args, **kwargs):
      try:
        bound = signature.bind(*args, **kwargs)
      except TypeError as e:
        raise UserError(f"{name}: {e}") from None
      for argument, rule in rules.items():
        if argument in bound.arguments:
          try:
            bound.arguments[argument] = rule(bound.arguments[argument])
          except Wrong as e:
            raise UserError(f"{name}: {argument}{e.text}") from None
      return function(*bound.args, **bound.kwargs)

    return checked

  return wrap


def unicode_problem(s: str) -> str | None:
  """What makes `s` not valid Unicode text (a lone surrogate, which no UTF-8 file or tokenizer holds), or None."""
  try:
    s.encode("utf-8")
  except UnicodeEncodeError as e:
    return f"a lone surrogate U+{ord(s[e.start]):04X} at character {e.start}"
  return None


# ------------------------------------------------------------------------------------------ rules


def optional(rule: Callable) -> Callable:
  """None, or what `rule` accepts."""
  return lambda value: None if value is None else rule(value)


def text(value) -> str:
  """A str of valid Unicode."""
  if not isinstance(value, str):
    raise _must(value, "a text (str)")
  problem = unicode_problem(value)
  if problem:
    raise Wrong(f"={short(value)}: {problem}; give valid Unicode text")
  return str(value)


def path(value) -> str | os.PathLike:
  """A path: str or os.PathLike (a pathlib.Path, an etils epath) that the file system can encode."""
  if not isinstance(value, str | os.PathLike) or not isinstance(os.fspath(value), str):
    raise _must(value, "a path (str or os.PathLike)")
  try:
    os.fsencode(os.fspath(value))
  except UnicodeError as e:
    raise Wrong(f"={short(value)}: a character the file system cannot encode ({e.reason})") from None
  return value


def name_or_path(value) -> str | os.PathLike:
  """A model name or a path: what `load` takes."""
  if not isinstance(value, str | os.PathLike):
    raise _must(value, "a model name or a path (str or os.PathLike)")
  return path(value)


def _is_int(value) -> bool:
  return isinstance(value, numbers.Integral) and not isinstance(value, bool) and type(value).__name__ != "bool_"


def integer(minimum: int | None = None) -> Callable:
  """An int (numpy integers too; a bool or a numeric text is refused), at least `minimum`."""

  def rule(value) -> int:
    if not _is_int(value):
      raise _must(value, "an int" + (f" >= {minimum}" if minimum is not None else ""))
    if minimum is not None and value < minimum:
      raise Wrong(f"={value} must be >= {minimum}")
    return int(value)

  return rule


SEED_LIMIT = 2**63  # jax.random.key takes a seed below this (2**70: OverflowError); numpy refuses a negative one


def seed(value) -> int:
  """A random seed: an int in 0..2**63-1 (what both jax.random.key and numpy.random.default_rng take)."""
  if not _is_int(value):
    raise _must(value, "an int seed")
  if not 0 <= value < SEED_LIMIT:
    raise Wrong(f"={value} must be a seed in 0..2**63-1")
  return int(value)


def is_token_id(value) -> bool:
  """Whether `value` may be a token id: an int (numpy integers too), never a bool (True is not token 1)."""
  return _is_int(value)


def boolean(value) -> bool:
  """True or False (numpy's bool too): a text like 'no' is not taken as true."""
  if not (isinstance(value, bool) or type(value).__name__ == "bool_"):
    raise _must(value, "True or False")
  return bool(value)


def _items(value, what: str) -> list:
  """The items of a list, tuple, range or 1-D numpy array; a text or anything else refused."""
  if isinstance(value, str | bytes) or not (isinstance(value, Sequence) or type(value).__name__ == "ndarray"):
    raise _must(value, what)
  if getattr(value, "ndim", 1) != 1:
    raise Wrong(f" of shape {value.shape} must be {what}")
  return list(value)


def texts(value) -> tuple[str, ...]:
  """A list or tuple of texts (not one text: 'dev' is not ('dev',))."""
  items = _items(value, "a list of texts")
  for i, item in enumerate(items):
    try:
      text(item)
    except Wrong as e:
      raise Wrong(f"[{i}]{e.text}") from None
  return tuple(str(item) for item in items)


def ints(value) -> list[int]:
  """One int or a list of ints (layers, heads or positions)."""
  if _is_int(value):
    return [int(value)]
  items = _items(value, "an int or a list of ints")
  for i, item in enumerate(items):
    if not _is_int(item):
      raise Wrong(f"[{i}]={short(item)} must be an int, not {type(item).__name__}")
  return [int(item) for item in items]


def pairs(value) -> list[tuple[int, int]]:
  """A list of (layer, head) pairs of ints (a numpy [n, 2] array too)."""
  if getattr(value, "ndim", 1) == 2 and type(value).__name__ == "ndarray":
    value = list(value)
  items = _items(value, "a list of (layer, head) pairs")
  out = []
  for i, item in enumerate(items):
    if isinstance(item, str) or not (isinstance(item, Sequence) or type(item).__name__ == "ndarray"):
      raise Wrong(f"[{i}]={short(item)} is not a (layer, head) pair of ints but a {type(item).__name__}")
    if len(item) != 2 or not all(_is_int(v) for v in item):
      raise Wrong(f"[{i}]={short(item)} is not a (layer, head) pair of ints")
    out.append((int(item[0]), int(item[1])))
  return out


def config(value):
  """An ml_collections.ConfigDict (a command's config, e.g. probing/config.probe_config())."""
  import ml_collections

  if not isinstance(value, ml_collections.ConfigDict):
    raise _must(value, "an ml_collections.ConfigDict (e.g. headspec.probing.config.probe_config())")
  return value


def paths(value, what: str = "a path or a list of paths") -> list:
  """One path or a list of paths (run directories to compare) -> a list."""
  if isinstance(value, str | os.PathLike):
    return [path(value)]
  items = _items(value, what)
  for i, item in enumerate(items):
    try:
      path(item)
    except Wrong as e:
      raise Wrong(f"[{i}]{e.text}") from None
  return items


def runs(value):
  """Run directories: one path, a list of paths, or a dict {label: path}."""
  if isinstance(value, Mapping):
    for label, item in value.items():
      try:
        path(item)
      except Wrong as e:
        raise Wrong(f"[{short(label)}]{e.text}") from None
    return value
  return paths(value, "a run directory, a list of them or a dict {label: directory}")


def prompts(value) -> list:
  """A list of prompts (texts or token-id lists); headspec/patching/patch.prompts checks each one."""
  if isinstance(value, str):
    raise Wrong(f"={short(value)} must be a list of prompts (texts or token-id lists), not one text")
  if type(value).__name__ == "ndarray" and value.ndim == 2:
    return list(value)
  return _items(value, "a list of prompts (texts or token-id lists)")


def metric(value):
  """'logit_diff' or a callable on the logits."""
  if callable(value):
    return value
  return text(value)


def tokenizer(value):
  """A tokenizer (headspec/data/tokenizer.Tokenizer, what `load(...)` gives: ids of a text, special tokens)."""
  if isinstance(value, str | bytes) or not (callable(getattr(value, "encode", None)) and hasattr(value, "prefix_ids")):
    raise _must(value, "a tokenizer (headspec.load(...).tokenizer)")
  return value
