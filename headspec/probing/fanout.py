"""Independent groups split over the processes of a multi-process command, then over each one's JAX devices
and fitted concurrently, one thread per device.

On a CPU host everything runs on one device in the calling thread: fit threads crashed jaxlib 0.10.2's
CPU backend (a segfault while compiling an L-BFGS program, 2 of 4 full test runs).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading

import jax
import numpy as np


class Turns:
  """The per-device fit threads take turns: one at a time runs Python and dispatches (and so compiles),
  and a thread gives up its turn only while it waits for a device result (`fetch`). Dispatch is
  asynchronous, so the devices still compute concurrently. Why: fit threads compiling at once crashed
  jaxlib 0.10.2's CPU backend (a segfault in backend_compile_and_load); taking turns did not stop it on
  CPU (one thread compiling while others waited crashed too), so CPU hosts use no fit threads at all."""

  def __init__(self):
    self._lock = threading.Lock()

  @contextlib.contextmanager
  def turn(self):
    with self._lock:
      yield

  def fetch(self, x, dtype=None):
    """np.asarray(x, dtype) of a device value, waiting for it outside the turn."""
    self._lock.release()
    try:
      return jax.device_get(x) if dtype is None else np.asarray(x, dtype)
    finally:
      self._lock.acquire()


def over_devices(fit_part, num_g: int, max_devices: int | None) -> tuple:
  """fit_part(g0, g1, device, fetch) for consecutive ranges of the num_g groups, one per device (at most
  max_devices a host; one on a CPU host), its tuple of arrays (group axis first) concatenated over the
  ranges. fetch reads a device value (jax.device_get, or a thread's `Turns.fetch`).

  A multi-process command (`config.multihost`) splits the groups over the processes first: each fits its
  consecutive share on its own devices (no collective: the processes need not keep pace), then one
  all-gather (`multihost_utils.process_allgather`, shares padded to the largest) gives every process every
  group's arrays, the same as one process fitting them all."""
  processes = jax.process_count()
  if processes == 1 or num_g < processes:
    return _over_local_devices(fit_part, 0, num_g, max_devices)
  from jax.experimental import multihost_utils

  bounds = np.linspace(0, num_g, processes + 1).round().astype(int)
  g0, g1 = int(bounds[jax.process_index()]), int(bounds[jax.process_index() + 1])
  mine = _over_local_devices(fit_part, g0, g1, max_devices)
  most = int(np.diff(bounds).max())
  padded = tuple(np.concatenate([a, np.zeros((most - len(a), *a.shape[1:]), a.dtype)]) for a in mine)
  every = multihost_utils.process_allgather(padded)  # each [processes, most, ...]
  return tuple(np.concatenate([a[p, : bounds[p + 1] - bounds[p]] for p in range(processes)]) for a in every)


def _over_local_devices(fit_part, g_start: int, g_end: int, max_devices: int | None) -> tuple:
  """`over_devices` of groups g_start..g_end-1 on this process's devices, each fit on its one device (the
  command's mesh, if any, is set aside: a fit's arrays live on one device, not across the mesh)."""
  with jax.set_mesh(None):
    num_g = g_end - g_start
    devices = jax.local_devices()[: max(1, min(num_g, max_devices or num_g))]
    if devices[0].platform == "cpu":
      devices = devices[:1]
    if len(devices) == 1:
      parts = [fit_part(g_start, g_end, devices[0], jax.device_get)]
    else:
      turns = Turns()

      def in_turn(g0, g1, device):
        with turns.turn():
          return fit_part(g0, g1, device, turns.fetch)

      bounds = [g_start + int(b) for b in np.linspace(0, num_g, len(devices) + 1).round()]
      with concurrent.futures.ThreadPoolExecutor(len(devices)) as pool:
        parts = list(pool.map(in_turn, bounds[:-1], bounds[1:], devices))
    return tuple(np.concatenate([p[i] for p in parts]) for i in range(len(parts[0])))
