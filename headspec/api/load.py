"""Load a model by path, Hub name or run directory, and the checks every API function starts from.

Part of the notebook API (docs/api.md); `import headspec` reaches it lazily (headspec/__init__.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
from collections.abc import Iterator, Sequence

import jax
import numpy as np

from headspec import arguments as check
from headspec.errors import UserError
from headspec.parallel import mesh as mesh_lib
from headspec.runs import targets

Head = tuple[int, int]  # (layer, head)


@dataclasses.dataclass(frozen=True)
class Loaded:
  """A model, its tokenizer and the target it was loaded from (name, step, cache identity, LM head).

  Unpacks as `model, tokenizer = headspec.load(...)`.
  """

  model: object
  tokenizer: object
  target: targets.Target | None = None
  _cache: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

  @property
  def name(self) -> str:
    """The tables' `model` column: 'minilm', the directory's or the run folder's name."""
    return self.target.name if self.target else "model"

  @property
  def step(self) -> int:
    return self.target.step if self.target else 0

  @property
  def lm_head(self) -> bool:
    """Whether the LM head is trained (False for all-MiniLM-L6-v2: its logits and LM losses mean nothing)."""
    return self.target.lm_head if self.target else True

  @property
  def cfg(self):
    return self.model.cfg

  def __iter__(self) -> Iterator:
    return iter((self.model, self.tokenizer))


def _is_run_dir(path: pathlib.Path) -> bool:
  """A `headspec train` run directory: its config.json is a headspec training config (model and train)."""
  config = path / "config.json"
  if not config.is_file():
    return False
  try:
    data = json.loads(config.read_text())
  except (OSError, ValueError):
    return False
  return isinstance(data, dict) and "train" in data and "kind" in data.get("model", {})


@check.arguments(source=check.name_or_path, step=check.optional(check.integer(0)), revision=check.optional(check.text))
def load(
  source: str | os.PathLike, step: int | None = None, revision: str | None = None, *, mesh=None, dtype=None
) -> Loaded:
  """A model and its tokenizer: 'minilm', a Hugging Face-format directory (step 0), a Hugging Face Hub name
  ('gpt2', 'org/name', 'hf:org/name@revision'; `revision` a branch, tag or commit, through the local
  cache; docs/pretrained.md), or a `headspec train` run directory at `step` (its last saved step by default).

  Goes through the commands' planner (headspec/runs/targets.py), so the name, step and cache identity are
  the ones the commands write. mesh: where the parameters live, a `jax.sharding.Mesh` or the config key's
  text ('fsdp=4,tensor=2'; headspec/parallel/mesh.py's rules shard them; None: as loaded, on one device). dtype:
  'float32' (the default: exact parity with the reference implementations) or 'bfloat16' (parameters and
  compute; half the bytes). Anything else (no such directory, a step the run does not have, a step other
  than 0 for a pretrained model, a wrong type, a bad mesh) is one headspec.errors.UserError (a ValueError).
  """

  grid = mesh if mesh is None or isinstance(mesh, jax.sharding.Mesh) else mesh_lib.parse(mesh, key="load(mesh=...)")
  if dtype not in (None, "float32", "bfloat16"):
    raise UserError(f"load(dtype={dtype!r}): use 'float32' or 'bfloat16'")
  text = os.fspath(source)
  path = pathlib.Path(os.path.expanduser(text))
  if text != "minilm" and not path.is_dir():
    if not re.fullmatch(r"(hf:)?[\w.-]+(/[\w.-]+)?(@[\w./-]+)?", text):
      raise UserError(
        f"load({text!r}): no such directory; give 'minilm', a Hugging Face model directory or Hub name, or a "
        "headspec run directory"
      )
    from headspec import pretrained as pretrained_lib

    repo, named = pretrained_lib.parse_hub_name(text)  # not a folder: a Hub name
    if named and revision is not None and revision != named:
      raise UserError(f"load({text!r}, revision={revision!r}): two revisions; give it in the name or as revision=")
    text = pretrained_lib.HUB_PREFIX + repo + (f"@{revision or named}" if revision or named else "")
  elif revision is not None:
    raise UserError(f"load({text!r}, revision={revision!r}): revisions are of Hub names, not of local folders")
  if text != "minilm" and _is_run_dir(path):
    (target,) = targets.run_targets(path, "last" if step is None else int(step))
  else:
    if step not in (None, 0):
      raise UserError(f"load({text!r}, step={step}): a pretrained model has only step 0")
    target = targets.pretrained_target(text, mesh=grid, dtype=dtype or "float32")
  model, tokenizer = target.load()
  if dtype is not None:
    from headspec.model.transformer import cast

    model = cast(model, dtype)
    if dtype != "float32":  # another computation: feature caches must not mix them
      target = dataclasses.replace(target, identity={**target.identity, "dtype": dtype})
  return Loaded(mesh_lib.place_model(model, grid) if grid is not None else model, tokenizer, target)


def as_loaded(model_or_loaded) -> Loaded:
  """A Loaded from `load(...)`'s result or a (model, tokenizer) pair: the `model` rule of run, probe, ablate."""
  if isinstance(model_or_loaded, Loaded):
    return model_or_loaded
  if isinstance(model_or_loaded, tuple) and len(model_or_loaded) == 2 and hasattr(model_or_loaded[0], "cfg"):
    return Loaded(*model_or_loaded)
  raise check.Wrong(
    f": expected headspec.load(...)'s result or a (model, tokenizer) pair, got {type(model_or_loaded).__name__}"
  )


def model_rule(value):
  """The `model` rule of the patching functions: what `as_loaded` takes, or a bare Transformer."""
  return value if hasattr(value, "cfg") and not isinstance(value, Loaded | tuple) else as_loaded(value)


def check_heads(cfg, heads, what: str = "heads") -> list[Head]:
  """`heads` as a list of (layer, head) in range; UserError naming the first bad one."""
  L, H = cfg.num_layers, cfg.num_heads
  out = []
  for item in heads:
    if not (isinstance(item, Sequence) and len(item) == 2 and all(isinstance(v, int | np.integer) for v in item)):
      raise UserError(f"{what}: {item!r} is not a (layer, head) pair of ints")
    layer, head = int(item[0]), int(item[1])
    if not 0 <= layer < L:
      raise UserError(f"{what}: layer {layer} of {item!r} is out of range; the model has layers 0..{L - 1}")
    if not 0 <= head < H:
      raise UserError(f"{what}: head {head} of {item!r} is out of range; the model has heads 0..{H - 1}")
    out.append((layer, head))
  return out


def head_mask_array(cfg, head_mask) -> np.ndarray:
  """[L,H] float32 mask: None (all ones), an [L,H] array, or (layer, head) tuples to remove. A nested
  list is refused: [[1, 0], [1, 1]] could be either, and read as pairs it would remove heads silently."""
  L, H = cfg.num_layers, cfg.num_heads
  if head_mask is None:
    return np.ones((L, H), np.float32)
  if isinstance(head_mask, np.ndarray | jax.Array):
    if np.shape(head_mask) != (L, H):
      raise UserError(f"head_mask of shape {np.shape(head_mask)}: expected [L, H] = [{L}, {H}]")
    mask = np.asarray(head_mask, np.float32)
    if not np.all(np.isfinite(mask)):
      raise UserError("head_mask: NaN or infinite values; 1 keeps a head, 0 removes it, between scales it")
    return mask
  try:
    head_mask = list(head_mask)
  except TypeError:
    raise UserError(
      f"head_mask: a {type(head_mask).__name__} is neither an [L, H] array nor (layer, head) pairs"
    ) from None
  if any(isinstance(item, list) for item in head_mask):  # [[1, 0], [1, 1]] reads as pairs (1, 0), (1, 1)
    raise UserError(
      f"head_mask: a nested list is ambiguous (an [L, H] mask or pairs?); give np.asarray(...) of shape "
      f"[{L}, {H}] for a mask or (layer, head) tuples for the heads to remove"
    )
  mask = np.ones((L, H), np.float32)
  for layer, head in check_heads(cfg, head_mask, "head_mask"):
    mask[layer, head] = 0.0
  return mask


def set_option(c, key: str, value, function: str) -> None:
  """c[key] = value, a keyword option of `function`; a value of another type than the config's (a count
  given as '2000', a text where a tuple goes) is a UserError naming the option."""
  if isinstance(value, str) and check.unicode_problem(value):
    raise UserError(f"{function}: {key}={check.short(value)}: {check.unicode_problem(value)}; give valid Unicode text")
  try:
    c[key] = value
  except TypeError:
    raise UserError(
      f"{function}: {key}={check.short(value)} must be of type {type(c[key]).__name__} (it is "
      f"{check.short(c[key])} now), not {type(value).__name__}"
    ) from None


def model_and_tokenizer(model, tokenizer):
  """(Transformer, tokenizer) from `load(...)`'s result, a (model, tokenizer) pair or a bare Transformer."""
  if hasattr(model, "cfg") and not isinstance(model, Loaded | tuple):
    return model, tokenizer
  loaded = as_loaded(model)
  return loaded.model, tokenizer if tokenizer is not None else loaded.tokenizer
