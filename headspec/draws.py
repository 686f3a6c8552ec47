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


def _bucketed(key, shape) -> bool:
  n = math.prod(shape)
  return not isinstance(key, jax.core.Tracer) and jax.config.jax_threefry_partitionable and n <= MAX_BUCKETED


def _bucket(n: int) -> int:
  return 1 << max(n - 1, 0).bit_length()


def normal(key, shape, std: float = 1.0) -> jax.Array:
  """float32 `std * jax.random.normal(key, shape)`, bit for bit (one float32 product, on the host)."""
  if not _bucketed(key, shape):
    return std * jax.random.normal(key, shape, jnp.float32)
  n = math.prod(shape)
  flat = _normal(key, _bucket(n))
  if isinstance(flat, jax.core.Tracer):  # a concrete key inside someone's jit: jax.random's own draw
    return std * jax.random.normal(key, shape, jnp.float32)
  return jnp.asarray(np.asarray(flat)[:n].reshape(shape) * np.float32(std))


def uniform(key, shape, minval: float = 0.0, maxval: float = 1.0) -> jax.Array:
  """float32 `jax.random.uniform(key, shape, minval=minval, maxval=maxval)`, bit for bit."""
  if not _bucketed(key, shape):
    return jax.random.uniform(key, shape, jnp.float32, minval=minval, maxval=maxval)
  n = math.prod(shape)
  flat = _uniform(key, _bucket(n), float(minval), float(maxval))
  if isinstance(flat, jax.core.Tracer):  # a concrete key inside someone's jit: jax.random's own draw
    return jax.random.uniform(key, shape, jnp.float32, minval=minval, maxval=maxval)
  return jnp.asarray(np.asarray(flat)[:n].reshape(shape))


@functools.partial(jax.jit, static_argnums=1)
def _normal(key, size: int) -> jax.Array:
  return jax.random.normal(key, (size,), jnp.float32)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _uniform(key, size: int, minval: float, maxval: float) -> jax.Array:
  return jax.random.uniform(key, (size,), jnp.float32, minval=minval, maxval=maxval)
