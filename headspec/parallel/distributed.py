"""How training lays arrays out: the `jax.jit` mesh path, the `jax.pmap` path, and multi-host start.

Both paths run the same step function (headspec/train/loop.py); only how arrays are laid out differs:
- jit: the mesh of `config.mesh` (headspec/parallel/mesh.py): parameters and optimizer state sharded by the
  logical axis rules (replicated on a data-only mesh), the batch split over `data` and `fsdp`; XLA inserts
  the gradient reduction and the weight gathers.
- pmap: parameters carry a leading device axis, the batch is reshaped to [devices, B/devices, ...],
  and the step all-reduces gradients itself with `lax.psum` over the axis named `PMAP_AXIS`.
"""

from __future__ import annotations

import os

import jax
import numpy as np
from absl import logging
from jax.sharding import Mesh

from headspec.errors import UserError
from headspec.io import remote
from headspec.parallel import mesh as mesh_lib

PMAP_AXIS = "batch"
PARALLELISMS = ("jit", "pmap")


def initialize_distributed(multihost: bool) -> None:
  """Starts `jax.distributed` on multi-process runs (TPU pods, SLURM, several GPU hosts); a no-op otherwise.

  On Cloud TPU and under SLURM (`srun`), `jax.distributed.initialize()` finds the coordinator, the
  process count and this process's id by itself. Elsewhere set JAX_COORDINATOR_ADDRESS (host:port of
  process 0), JAX_NUM_PROCESSES and JAX_PROCESS_ID (headspec/launch/ does). CPU processes exchange
  gradients over gloo (TCP), so the same code runs as several processes on one machine (the tests).
  Idempotent: a second call in the same process does nothing.
  """
  if not multihost or jax.distributed.is_initialized():
    return
  if jax.config.jax_cpu_collectives_implementation is None:  # only the CPU backend reads it
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  kwargs = {}
  for key, env in (("num_processes", "JAX_NUM_PROCESSES"), ("process_id", "JAX_PROCESS_ID")):
    if os.environ.get(env):
      try:
        kwargs[key] = int(os.environ[env])
      except ValueError:
        raise UserError(f"{env}={os.environ[env]!r}: must be an integer") from None
  try:
    jax.distributed.initialize(**kwargs)
  except (ValueError, RuntimeError) as e:
    raise UserError(
      f"config.multihost=True, but jax.distributed could not start ({str(e).splitlines()[0]}); on neither "
      "Cloud TPU nor SLURM, set JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID"
    ) from None
  logging.info("process %d of %d, %d local devices", jax.process_index(), jax.process_count(), jax.local_device_count())


def is_lead() -> bool:
  """Whether this process writes the run's single-writer files (config.json, metrics, tokenizer): process 0,
  the same writer the analyses have (`remote.is_writer`)."""
  return remote.is_writer()


def any_process(flag: bool) -> bool:
  """True on every process when `flag` is True on any (one small all-gather); `flag` itself on one process.

  Multi-process runs stop on a SIGTERM only when all processes agree at the same step, so they all
  save the same checkpoint and no process waits forever in a collective the others have left.
  """
  if jax.process_count() == 1:
    return flag
  from jax.experimental import multihost_utils

  return bool(np.any(multihost_utils.process_allgather(np.array(flag, np.int32))))


def check_batch_size(global_batch_size: int, parallelism: str, batch_shards: int | None = None) -> int:
  """Returns the per-process batch size after checking it divides over processes and the batch's shards
  (the mesh's data × fsdp; default every device)."""
  if parallelism not in PARALLELISMS:
    raise UserError(f"config parallelism must be one of {PARALLELISMS}, got {parallelism!r}")
  shards = batch_shards or jax.device_count()
  if global_batch_size % shards or global_batch_size % jax.process_count():
    raise UserError(
      f"train.batch_size={global_batch_size} is not divisible by the {shards} batch shards (mesh data×fsdp)"
    )
  return global_batch_size // jax.process_count()


def global_batch(local_batch: dict, mesh: Mesh) -> dict:
  """This process's rows of the batch become one global array split over `data` and `fsdp` (multi-host safe)."""
  return {
    k: jax.make_array_from_process_local_data(mesh_lib.batch_sharding(mesh, np.ndim(v)), v)
    for k, v in local_batch.items()
  }


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
