"""Reading a checkpoint's tensors (safetensors' `safe_open`, no PyTorch) and setting headspec's parameters
from them: `Tensors` pops each by name with its shape checked, reading it only then, and names what no
family mapping took; `assign` puts each where `placing` says (dtype, shards of a mesh), so an import holds
one tensor on the host at a time."""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import safetensors
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


@dataclasses.dataclass(frozen=True)
class Stored:
  """One tensor of a safetensors file, not read yet: its shape from the header, its values on `read()`
  (`safe_open` maps the file; only this tensor is copied into memory)."""

  file: pathlib.Path
  name: str
  shape: tuple[int, ...]

  def read(self) -> np.ndarray:
    try:
      with safetensors.safe_open(self.file, framework="numpy") as f:
        return f.get_tensor(self.name)
    except Exception as e:  # as in tensor_names
      raise _unreadable(self.file, e) from None


def read_tensors(files: list[pathlib.Path]) -> dict[str, Stored]:
  """Every tensor of the files by name, each read only when popped: host memory holds one tensor at a
  time (and what has been placed), not the checkpoint."""
  tensors = {}
  for file in files:
    try:
      with safetensors.safe_open(file, framework="numpy") as f:
        tensors.update({name: Stored(file, name, tuple(f.get_slice(name).get_shape())) for name in f.keys()})
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
    value = np.asarray(value.read() if isinstance(value, Stored) else value, np.float32)
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


@dataclasses.dataclass(frozen=True)
class Placement:
  """Where imported parameters go as each is read: `dtype`, and shards of `mesh` by headspec/parallel/mesh.py's
  rules (`names`: each parameter's name, by the id of its Variable, for the rules)."""

  dtype: str = "float32"
  mesh: object = None
  names: dict = dataclasses.field(default_factory=dict)


_PLACEMENT: contextvars.ContextVar[Placement | None] = contextvars.ContextVar("placement", default=None)


@contextlib.contextmanager
def placing(model, *, mesh=None, dtype: str = "float32"):
  """Within: `assign` puts each parameter of `model` (an abstract one) in `dtype`, sharded over `mesh`."""
  names = {}
  for path, variable in nnx.iter_graph(model):
    if isinstance(variable, nnx.Variable):
      names[id(variable)] = str(path[-1])
  token = _PLACEMENT.set(Placement(dtype, mesh, names))
  try:
    yield
  finally:
    _PLACEMENT.reset(token)


def assign(param: nnx.Param, value: np.ndarray) -> None:
  """Sets an (abstract or real) parameter from a host array, as the current `placing` says: without a mesh
  on the default device; with one, each device gets only its slice (`jax.make_array_from_callback`)."""
  where = _PLACEMENT.get() or Placement()
  value = np.asarray(value, jnp.dtype(where.dtype))
  if where.mesh is None:
    param.set_value(jnp.asarray(value))
    return
  from headspec.parallel import mesh as mesh_lib

  letters = mesh_lib.axes_of(where.names.get(id(param), ""))
  spec = mesh_lib.spec_for(letters, value.shape, where.mesh, mesh_lib.PARAM_RULES)
  sharding = jax.sharding.NamedSharding(where.mesh, spec)
  param.set_value(jax.make_array_from_callback(value.shape, sharding, lambda index: value[index]))


def assign_layernorm(ln: nnx.LayerNorm, t: Tensors, name: str, D: int) -> None:
  assign(ln.scale, t.pop(f"{name}.weight", (D,)))
  assign(ln.bias, t.pop(f"{name}.bias", (D,)))
