"""headspec's benchmarks: `python -m benchmarks` runs them all (benchmarks/__main__.py)."""

import os


def uncached_environment() -> dict:
  """This process's environment without JAX's persistent compilation cache settings, for a benchmark's
  child processes that must compile (or choose their cache) themselves."""
  return {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION", "JAX_PERSISTENT"))}
