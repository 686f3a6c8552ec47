"""Compiled programs: the one cache of every program factory, and counting XLA compilations.

`program_cache(maxsize)` is the decorator of every factory that builds a jitted program from a model's
graphdef (and static keys): `factory(graphdef, *keys)` returns the same compiled program for equal
arguments, so a loop over batches or models of one shape compiles once. It is `functools.lru_cache`
(`cache_info`, `cache_clear` kept) plus one registry of every such cache: `programs()` lists them with
their sizes and hits, `clear_programs()` empties them all at once (a test that must compile afresh, a long
notebook that has loaded many models: each cached program holds its graphdef and its compiled executable).

jax reports every backend compilation as the monitoring event '/jax/core/compile/backend_compile_duration'
(with the compiled function's name); `Compilations` listens while open. Used by `headspec probe` (the
count per model step goes into probes/run_info.json and the log, issue 33) and benchmarks/bench_probe.py.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from jax import monitoring

EVENT = "/jax/core/compile/backend_compile_duration"
_PROGRAMS: dict[str, Callable] = {}  # "module.factory" -> its lru_cache wrapper


def program_cache(maxsize: int) -> Callable[[Callable], Callable]:
  """Decorator of a program factory `factory(graphdef, *static keys) -> jitted program`: at most `maxsize`
  programs kept (least recently used dropped), registered under "module.qualname" for `programs` and
  `clear_programs`. The factory's jit (static arguments, donation, shardings) is untouched."""

  def register(factory: Callable) -> Callable:
    cached = functools.lru_cache(maxsize=maxsize)(factory)
    _PROGRAMS[f"{factory.__module__}.{factory.__qualname__}"] = cached
    return cached

  return register


def programs() -> dict[str, functools._CacheInfo]:
  """{"module.factory": its cache_info (hits, misses, maxsize, currsize)} of every `program_cache`d factory."""
  return {name: cached.cache_info() for name, cached in sorted(_PROGRAMS.items())}


def clear_programs() -> None:
  """Empties every `program_cache`d factory: the next call of each builds (and compiles) its program again."""
  for cached in _PROGRAMS.values():
    cached.cache_clear()


class Compilations:
  """XLA backend compilations while the context is open: `count`, and per compiled function its
  `seconds` and `counts`."""

  def __enter__(self):
    self.seconds, self.counts = {}, {}

    def listener(event, duration, **kwargs):
      if event == EVENT:
        name = str(kwargs.get("fun_name", "?"))
        self.seconds[name] = self.seconds.get(name, 0.0) + duration
        self.counts[name] = self.counts.get(name, 0) + 1

    self._listener = listener
    monitoring.register_event_duration_secs_listener(listener)
    return self

  def __exit__(self, *exc):
    monitoring.unregister_event_duration_listener(self._listener)

  def seconds_of(self, *names) -> float:
    """Compile seconds of the functions whose name contains any of `names`."""
    return sum(v for k, v in self.seconds.items() if any(n in k for n in names))

  @property
  def count(self) -> int:
    return sum(self.counts.values())

  @property
  def total_seconds(self) -> float:
    return sum(self.seconds.values())
