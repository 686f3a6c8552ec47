"""Reading a checkpoint's tensors (safetensors.numpy, no PyTorch) and setting headspec's parameters from them:
`Tensors` pops each by name with its shape checked, and names what no family mapping took."""

from __future__ import annotations

import pathlib

import jax.numpy as jnp
import numpy as np
import safetensors
import safetensors.numpy
from flax import nnx

from headspec.errors import UserError


def _unreadable(file: pathlib.Path, e: Exception) -> UserError:
  return UserError(
    f"{file}: not a readable safetensors file ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
  )


def tensor_names(files: list[pathlib.Path]) -> list[str]:
  """The tensor names in the files' headers (no tensor is read)."""
  names = []
  for file in files:
    try:
      with safetensors.safe_open(file, framework="numpy") as f:
        names.extend(f.keys())
    except Exception as e:  # safetensors raises its own SafetensorError / OSError on bad files
      raise _unreadable(file, e) from None
  return names


def read_tensors(files: list[pathlib.Path]) -> dict[str, np.ndarray]:
  """All tensors of the files."""
  tensors = {}
  for file in files:
    try:
      tensors.update(safetensors.numpy.load_file(file))
    except Exception as e:  # safetensors raises its own SafetensorError / OSError on bad files
      raise _unreadable(file, e) from None
  return tensors


class Tensors:
  """Pops checkpoint tensors by name, checking shapes; reports names left over. Errors name the file."""

  IGNORED = (
    "embeddings.position_ids",
    "embeddings.token_type_ids",
    "pooler.",
    "cls.seq_relationship.",
    "cls.predictions.decoder.bias",
    ".attn.bias",
    ".attn.masked_bias",
    ".attention.bias",  # GPT-NeoX's causal-mask buffers and rotary tables in older files
    ".attention.masked_bias",
    ".rotary_emb.inv_freq",
    "lm_head.decoder.bias",  # RoBERTa's copy of lm_head.bias
  )

  def __init__(self, tensors: dict[str, np.ndarray], prefix: str, path: pathlib.Path):
    self.path = path
    renamed = {}
    for name, value in tensors.items():
      name = name[len(prefix) :] if name.startswith(prefix) else name
      if name.endswith("LayerNorm.gamma"):  # original BERT checkpoints' LayerNorm names
        name = name[: -len("gamma")] + "weight"
      elif name.endswith("LayerNorm.beta"):
        name = name[: -len("beta")] + "bias"
      renamed[name] = value
    self.tensors = renamed

  def has(self, prefix: str) -> bool:
    return any(name.startswith(prefix) for name in self.tensors)

  def pop(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name not in self.tensors:
      raise UserError(f"{self.path}: tensor {name!r} is missing (config.json expects it, shape {list(shape)})")
    value = self.tensors.pop(name)
    if tuple(value.shape) != tuple(shape):
      raise UserError(f"{self.path}: tensor {name!r} has shape {list(value.shape)}, config.json implies {list(shape)}")
    value = np.asarray(value, np.float32)
    # A damaged file would otherwise compute NaN everywhere, silently. The sum is one cheap pass (NaN or inf
    # in, non-finite out); only a non-finite sum (or an overflowing one) counts the values themselves.
    if not np.isfinite(value.sum()) and (bad := int((~np.isfinite(value)).sum())):
      raise UserError(f"{self.path}: tensor {name!r} holds {bad} NaN or infinite values")
    return value

  def finish(self) -> None:
    unknown = sorted(n for n in self.tensors if not any(n.startswith(p) or p in n for p in self.IGNORED))
    if unknown:
      more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
      raise UserError(f"{self.path}: unexpected tensor(s) {', '.join(unknown[:3])}{more} for this config")


def assign(param: nnx.Param, value: np.ndarray) -> None:
  param.set_value(jnp.asarray(value, jnp.float32))  # works on the abstract (eval_shape) model too


def assign_layernorm(ln: nnx.LayerNorm, t: Tensors, name: str, D: int) -> None:
  assign(ln.scale, t.pop(f"{name}.weight", (D,)))
  assign(ln.bias, t.pop(f"{name}.bias", (D,)))
