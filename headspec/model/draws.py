"""Random draws that compile one XLA program per size bucket instead of one per shape.

`jax.random.normal(key, shape)` and `jax.random.uniform(key, shape, ...)` outside a trace compile their
threefry program for every new shape (XLA's CPU backend takes ~0.3-0.5 s a program): a model's parameter
init, and the arc and structural probes' initial maps (one shape per group count, width and rank), paid
seconds of compiling per process. With partitionable threefry (JAX's default) an element's bits depend only
on its flat index, and both transforms are elementwise, so the first n values of a draw of m ≥ n values are
the draw of n values, bit for bit (benchmarks/bench_init.py and tests/test_draws.py check it): here m is the
power of two ≥ n, so sizes share programs. jax.random offers no bucketed draw, hence this file.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

MAX_BUCKETED = 1 << 24  # a larger draw is made in place on its device (the bucket would double its memory)


def normal(key, shape, std: float = 1.0) -> jax.Array:
  """float32 `std * jax.random.normal(key, shape)`, bit for bit (one float32 product, on the host)."""
  head = _head(_normal, key, shape)
  if head is None:
    return std * jax.random.normal(key, shape, jnp.float32)
  return jnp.asarray(head * np.float32(std))


def uniform(key, shape, minval: float = 0.0, maxval: float = 1.0) -> jax.Array:
  """float32 `jax.random.uniform(key, shape, minval=minval, maxval=maxval)`, bit for bit."""
  head = _head(functools.partial(_uniform, minval=float(minval), maxval=float(maxval)), key, shape)
  if head is None:
    return jax.random.uniform(key, shape, jnp.float32, minval=minval, maxval=maxval)
  return jnp.asarray(head)


def _head(draw, key, shape) -> np.ndarray | None:
  """The first |shape| values of `draw(key, bucket)`, shaped, on the host; None where bucketing does not
  apply (non-partitionable threefry, a draw above MAX_BUCKETED, or inside a trace: a traced key, or a
  concrete one captured by someone's jit), and the caller draws with jax.random itself."""
  n = math.prod(shape)
  if isinstance(key, jax.core.Tracer) or not jax.config.jax_threefry_partitionable or n > MAX_BUCKETED:
    return None
  flat = draw(key, 1 << max(n - 1, 0).bit_length())
  return None if isinstance(flat, jax.core.Tracer) else np.asarray(flat)[:n].reshape(shape)


@functools.partial(jax.jit, static_argnums=1)
def _normal(key, size: int) -> jax.Array:
  return jax.random.normal(key, (size,), jnp.float32)


@functools.partial(jax.jit, static_argnums=(1,), static_argnames=("minval", "maxval"))
def _uniform(key, size: int, *, minval: float, maxval: float) -> jax.Array:
  return jax.random.uniform(key, (size,), jnp.float32, minval=minval, maxval=maxval)
