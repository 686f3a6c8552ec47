"""Counting XLA compilations: how a command or a benchmark shows that nothing recompiles per iteration.

jax reports every backend compilation as the monitoring event '/jax/core/compile/backend_compile_duration'
(with the compiled function's name); `Compilations` listens while open. Used by `headspec probe` (the
count per model step goes into probes/run_info.json and the log, issue 33) and benchmarks/bench_probe.py.
"""

from __future__ import annotations

from jax import monitoring

EVENT = "/jax/core/compile/backend_compile_duration"


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
