"""Data parallelism: a one-axis device mesh for `jax.jit`, the `jax.pmap` path, and multi-host start.

Both paths run the same step function (headspec/train.py); only how arrays are laid out differs:
- jit: parameters replicated and the batch sharded along the mesh axis 'data' with `NamedSharding`;
  XLA inserts the gradient all-reduce.
- pmap: parameters carry a leading device axis, the batch is reshaped to [devices, B/devices, ...],
  and the step all-reduces gradients itself with `lax.psum` over the axis named `PMAP_AXIS`.
"""

from __future__ import annotations

import jax
import numpy as np
from absl import logging
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from headspec.errors import UserError

PMAP_AXIS = "batch"
PARALLELISMS = ("jit", "pmap")


def initialize_distributed(multihost: bool) -> None:
  """Starts `jax.distributed` on multi-host runs (TPU pods, SLURM); a no-op on one host.

  On Cloud TPU and SLURM, `jax.distributed.initialize()` finds the coordinator by itself; elsewhere set
  JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID (launch/ has examples).
  """
  if multihost:
    jax.distributed.initialize()
    logging.info(
      "process %d of %d, %d local devices", jax.process_index(), jax.process_count(), jax.local_device_count()
    )


def check_batch_size(global_batch_size: int, parallelism: str) -> int:
  """Returns the per-process batch size after checking it divides over processes and devices."""
  if parallelism not in PARALLELISMS:
    raise UserError(f"config parallelism must be one of {PARALLELISMS}, got {parallelism!r}")
  devices = jax.device_count()
  if global_batch_size % devices:
    raise UserError(f"train.batch_size={global_batch_size} is not divisible by the {devices} devices")
  return global_batch_size // jax.process_count()


def data_mesh(devices=None) -> Mesh:
  """The given devices (default: all devices of all processes) on one axis named 'data'."""
  return Mesh(np.asarray(devices or jax.devices()), ("data",))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec())


def batch_sharded(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, PartitionSpec("data"))


def global_batch(local_batch: dict, mesh: Mesh) -> dict:
  """This process's rows of the batch become one global array sharded over 'data' (multi-host safe)."""
  sharding = batch_sharded(mesh)
  return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local_batch.items()}


def pmap_batch(local_batch: dict, n: int) -> dict:
  """[B, ...] -> [n devices, B / n, ...] for `jax.pmap`."""
  return {k: np.reshape(v, (n, v.shape[0] // n) + v.shape[1:]) for k, v in local_batch.items()}


def replicate_for_pmap(tree, devices):
  """Copies a pytree onto each of `devices` (local ones) with a leading device axis."""
  n = len(devices)
  return jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (n,) + np.shape(x)), jax.device_get(tree))


def unreplicate(tree):
  """The first device's copy of a pmap-replicated pytree."""
  return jax.tree.map(lambda x: x[0], tree)
