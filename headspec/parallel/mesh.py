"""The device mesh every command runs on, and the logical axis rules that shard parameters and activations.

One config key names the mesh (`mesh`, on every command's config; `headspec.load(mesh=...)` in the API):
'data=2,fsdp=2,tensor=2' (axes in any order, a missing axis has size 1, one axis may be -1: the devices
left); '' puts every device on `data` for training (data parallelism, parameters replicated) and leaves
the analyses on one device, as they ran before a mesh existed, except a multi-process analysis
(`config.multihost`), which runs over every process's devices on `data`. JAX's own engine does the
rest (GSPMD: `jax.jit` over `NamedSharding`s, as MaxText and big_vision run): nothing is copied per device.

Logical axes (MaxText's logical axis rules, Megatron's head and MLP split). A name's trailing capitals are
its axes (the shape glossary of model.py: `w_q_DHK`, `w_in_DF`, `token_embed_VD`, `z_LBTHK`), so the rules
are one table per kind, read off the name:
- parameters (PARAM_RULES): the model width D over `fsdp` (ZeRO-3/FSDP: each device holds 1/fsdp of every
  matrix and XLA gathers a layer's weights where they are used); heads H (and K/V groups), the MLP width F
  and the vocabulary V over `tensor`; names without axes (norm scales) and a dimension that the mesh axis
  does not divide stay replicated. Leading dimensions beyond the name's letters (stacked layers) are not
  sharded.
- activations (ACTIVATION_RULES): the batch B over `data` and `fsdp` together, heads H over `tensor`.
  `constrain(x, "BTHK")` pins an activation inside a traced function when a mesh is set (`jax.set_mesh`,
  which `using(mesh)` does) and is the identity otherwise, so one-device code is unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from headspec.errors import UserError

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")  # the batch is split over both: FSDP is data parallelism with sharded weights
PARAM_RULES = {"V": "tensor", "D": "fsdp", "H": "tensor", "F": "tensor"}
ACTIVATION_RULES = {"B": BATCH_AXES, "H": "tensor"}
_AXES_OF_NAME = re.compile(r"_([A-Z]+)$")
_WRAPPERS = {"value", "raw_value"}  # what an nnx.Variable's leaf path ends in


def parse(spec: str, devices=None, *, key: str = "mesh") -> Mesh:
  """The mesh of `spec` over `devices` (default: every device of every process), axes AXES in that order.

  A bad spec is a UserError naming `key`: an unknown axis, a size that is not an integer, two -1s, or
  sizes whose product is not the number of devices."""
  devices = list(devices if devices is not None else jax.devices())
  sizes = {axis: 1 for axis in AXES}
  given = [part.strip() for part in str(spec or "").split(",") if part.strip()]
  if not given:
    sizes["data"] = -1
  for part in given:
    axis, _, size = part.partition("=")
    axis = axis.strip()
    if axis not in AXES:
      raise UserError(f"{key}={spec!r}: unknown axis {axis!r} (axes: {', '.join(AXES)}, e.g. data=2,fsdp=2,tensor=2)")
    try:
      sizes[axis] = int(size)
    except ValueError:
      raise UserError(f"{key}={spec!r}: {axis}={size.strip()!r} is not an integer") from None
    if sizes[axis] == 0 or sizes[axis] < -1:
      raise UserError(f"{key}={spec!r}: {axis} must be a positive size or -1 (the devices left)")
    if sizes[axis] > len(devices):  # bounded before any product (numpy's int64 product wrapped to 0)
      raise UserError(f"{key}={spec!r}: {axis}={sizes[axis]} exceeds the {len(devices)} devices")
  rest = [axis for axis, size in sizes.items() if size == -1]
  if len(rest) > 1:
    raise UserError(f"{key}={spec!r}: only one axis may be -1")
  known = math.prod(size for size in sizes.values() if size != -1)
  if rest:
    if len(devices) % known:
      raise UserError(f"{key}={spec!r}: {known} does not divide the {len(devices)} devices")
    sizes[rest[0]] = len(devices) // known
  shape = tuple(sizes[axis] for axis in AXES)
  if math.prod(shape) != len(devices):
    raise UserError(
      f"{key}={spec!r}: data×fsdp×tensor = {math.prod(shape)}, but there are {len(devices)} devices "
      "(sizes must multiply to the device count; one may be -1)"
    )
  array = np.asarray(devices, dtype=object).reshape(shape)
  return Mesh(array, AXES, axis_types=(AxisType.Auto,) * len(AXES))


def describe(mesh: Mesh) -> str:
  """'data=2,fsdp=2,tensor=2' (the form `parse` reads)."""
  return ",".join(f"{axis}={mesh.shape[axis]}" for axis in mesh.axis_names)


def axes_of(name: str) -> str:
  """The axis letters a name ends in ('w_q_DHK' -> 'DHK'; 'scale' -> '')."""
  match = _AXES_OF_NAME.search(name)
  return match.group(1) if match else ""


def _size(mesh: Mesh, axis) -> int:
  names = axis if isinstance(axis, tuple) else (axis,)
  return int(np.prod([mesh.shape[a] for a in names]))


def spec_for(letters: str, shape, mesh: Mesh, rules: dict) -> PartitionSpec:
  """The PartitionSpec of an array whose trailing axes are `letters`, per `rules` (letter -> mesh axis or
  axes); a dimension the mesh axis does not divide, a size-1 mesh axis, and leading dimensions beyond the
  letters stay unsharded, and no mesh axis is used twice."""
  shape = tuple(shape)
  letters = letters[-len(shape) :] if letters and len(letters) > len(shape) else letters
  spec, used = [None] * (len(shape) - len(letters)), set()
  for letter, size in zip(letters, shape[len(shape) - len(letters) :]):
    axis = rules.get(letter)
    names = set(axis if isinstance(axis, tuple) else (axis,)) if axis else set()
    fits = axis is not None and not names & used and _size(mesh, axis) > 1 and size % _size(mesh, axis) == 0
    spec.append(axis if fits else None)
    used |= names if fits else set()
  return PartitionSpec(*spec)


def _leaf_name(path) -> str:
  """The last named key of a pytree path that is not a Variable's wrapper (`...['w_q_DHK'].value`)."""
  for key in reversed(path):
    name = getattr(key, "key", None) or getattr(key, "name", None)
    if isinstance(name, str) and name not in _WRAPPERS:
      return name
  return ""


def param_shardings(tree, mesh: Mesh):
  """A NamedSharding per leaf of `tree` (parameters, or an optimizer state that mirrors them: Adam's moments
  keep the parameters' paths), by PARAM_RULES on each leaf's name; scalars and unnamed leaves replicated."""

  def sharding(path, leaf):
    shape = tuple(getattr(leaf, "shape", np.shape(leaf)))  # arrays and ShapeDtypeStructs alike
    return NamedSharding(
      mesh, spec_for(axes_of(_leaf_name(path)), shape, mesh, PARAM_RULES) if shape else PartitionSpec()
    )

  return jax.tree_util.tree_map_with_path(sharding, tree)


def place(tree, mesh: Mesh):
  """`tree` on `mesh`, sharded by `param_shardings` (arrays already there move without a host copy)."""
  return jax.device_put(tree, param_shardings(tree, mesh))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
  """Rows over `data` and `fsdp` (the batch axis of every input), the other dimensions whole."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES, *[None] * (ndim - 1)))


def constrain(x, letters: str):
  """`x` (axes `letters`, e.g. 'BTHK') pinned by ACTIVATION_RULES to the mesh that `jax.set_mesh` set; the
  identity under no mesh or a one-device mesh."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1 or not set(AXES) <= set(mesh.axis_names):  # (pmap names its own axis)
    return x
  if AxisType.Manual in mesh.axis_types:  # inside `split_over_data`'s shard_map: each device has its own
    return x
  return jax.lax.with_sharding_constraint(x, spec_for(letters, x.shape, mesh, ACTIVATION_RULES))


def readable(tree):
  """`tree` (what a traced function returns) replicated on the mesh `jax.set_mesh` set, when the program
  spans several processes: a host reads back only its own devices' shards, so a result it reads
  (`np.asarray`) must be whole on each. The identity on one process (the program is unchanged), under no
  mesh, and inside `split_over_data`'s per-device map. What a multi-process analysis reads is small
  (per-head values, pooled features), so gathering it costs one all-gather per program."""
  if jax.process_count() == 1:
    return tree
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1 or AxisType.Manual in mesh.axis_types:
    return tree
  return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, PartitionSpec()), tree)


def jit(fn=None, **jit_kwargs):
  """`jax.jit` of `fn` with its outputs `readable`: the analyses' programs whose results a host reads back
  (as a decorator too: `@mesh.jit(static_argnames=...)`). On one process it is `jax.jit(fn)`."""
  if fn is None:
    return functools.partial(jit, **jit_kwargs)

  @functools.wraps(fn)
  def whole(*args, **kwargs):
    return readable(fn(*args, **kwargs))

  return jax.jit(whole, **jit_kwargs)


def to_host(x, dtype=None) -> np.ndarray:
  """np.asarray(x, dtype), also of an array sharded across processes (a parameter under `fsdp` or `tensor`
  spanning hosts: each host holds only its shards, so they are all-gathered, `process_allgather`, a
  collective every process of a multi-process command reaches at the same point)."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable and not x.is_fully_replicated:
    from jax.experimental import multihost_utils

    x = multihost_utils.process_allgather(x, tiled=True)
  return np.asarray(x, dtype)


def current() -> Mesh | None:
  """The mesh `using` set, or None (none set, or one device: nothing to shard)."""
  mesh = jax.sharding.get_mesh()
  return None if mesh.empty or mesh.size == 1 else mesh


def place_model(model, mesh: Mesh | None = None):
  """An nnx model with its parameters sharded on `mesh` (default: `current()`); unchanged without one."""
  from flax import nnx

  mesh = mesh or current()
  if mesh is None:
    return model
  graphdef, state = nnx.split(model)
  return nnx.merge(graphdef, place(state, mesh))


def put_batch(arrays, mesh: Mesh | None = None):
  """Model inputs (a pytree of [B, ...] arrays) with rows split over `data`×`fsdp` of `mesh` (default:
  `current()`) where the shards divide B, else replicated; unchanged without a mesh."""
  mesh = mesh or current()
  if mesh is None:
    return arrays
  shards = mesh.shape["data"] * mesh.shape["fsdp"]

  def put(x):
    whole = np.ndim(x) == 0 or np.shape(x)[0] % shards
    return jax.device_put(x, replicated(mesh) if whole else batch_sharding(mesh, np.ndim(x)))

  return jax.tree.map(put, arrays)


def split_over_data(fn, mesh: Mesh, *, axis: int, arg: int, outputs):
  """`fn(*args)` with argument `arg`'s dimension `axis` (a sweep's masks or patches) split over `mesh`'s
  `data` devices, each mapping its share (`jax.shard_map`); the other arguments whole on every device.
  outputs: per output, the dimension split the same way, or None for one computed alike on every device.
  The length of that dimension must divide by the `data` size (callers pad)."""
  from jax.sharding import PartitionSpec as P

  def split(dim):
    return P() if dim is None else P(*([None] * dim), "data")

  def run(*args):
    in_specs = tuple(split(axis) if i == arg else P() for i in range(len(args)))
    out_specs = tuple(split(d) for d in outputs) if isinstance(outputs, tuple) else split(outputs)
    out = jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=False)(*args)
    return readable(out)

  return jax.jit(run)


def split_for_current(fn, *, axis: int, arg: int, outputs):
  """(`fn`, 1), or under a current mesh with several `data` devices (`using`) (`split_over_data` of `fn`,
  the number of those devices): a sweep's masks or patches each device maps its share of, so every value is
  the one-device value. Cached by function and mesh, so a sweep compiles once per mesh."""
  grid = current()
  if grid is None or grid.shape["data"] == 1:
    return fn, 1
  key = (fn, grid, axis, arg, outputs)
  if key not in _SPLIT:
    _SPLIT[key] = split_over_data(fn, grid, axis=axis, arg=arg, outputs=outputs)
  return _SPLIT[key], grid.shape["data"]


_SPLIT: dict = {}


def pad_rows(x, multiple: int) -> np.ndarray:
  """`x` with copies of its first row appended up to a length that `multiple` divides: what a split sweep
  (`split_for_current`) runs beyond the rows asked for, whose results the caller drops."""
  x = np.asarray(x)
  pad = (-len(x)) % multiple
  return np.concatenate([x, np.repeat(x[:1], pad, axis=0)]) if pad else x


@contextlib.contextmanager
def using(mesh: Mesh | None):
  """Within: `mesh` is the one `constrain` reads and jit places uncommitted inputs on (None: nothing set)."""
  if mesh is None:
    yield None
    return
  with jax.set_mesh(mesh):
    yield mesh
