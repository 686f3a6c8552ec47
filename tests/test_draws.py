"""headspec/draws.py: bucketed draws equal jax.random's per-shape draws bit for bit, with one program per bucket."""

import jax
import numpy as np
import pytest

from headspec import draws

SHAPES = [(1,), (7,), (3, 16, 16), (5, 64, 40), (24, 32, 32), (2, 3, 5, 7)]


@pytest.mark.parametrize("seed", [0, 3])
def test_bucketed_draws_are_jax_randoms_bit_for_bit(seed):
  key = jax.random.PRNGKey(seed)
  for shape in SHAPES:
    want = np.asarray(0.02 * jax.random.normal(key, shape))
    np.testing.assert_array_equal(np.asarray(draws.normal(key, shape, 0.02)), want)
    want = np.asarray(jax.random.uniform(key, shape, minval=-0.05, maxval=0.05))
    np.testing.assert_array_equal(np.asarray(draws.uniform(key, shape, -0.05, 0.05)), want)
  # inside a trace the draw is jax.random's own: a traced key, or a concrete one captured by the jitted function
  traced = jax.jit(lambda k: draws.normal(k, (4, 5)))(key)
  np.testing.assert_array_equal(np.asarray(traced), np.asarray(jax.random.normal(key, (4, 5))))
  captured = jax.jit(lambda x: draws.uniform(key, (4, 5), -0.05, 0.05) + x)(np.zeros((4, 5), np.float32))
  np.testing.assert_array_equal(
    np.asarray(captured), np.asarray(jax.random.uniform(key, (4, 5), minval=-0.05, maxval=0.05))
  )


def test_a_draw_above_the_bucket_limit_is_jax_randoms_own(monkeypatch):
  monkeypatch.setattr(draws, "MAX_BUCKETED", 8)
  key = jax.random.PRNGKey(1)
  np.testing.assert_array_equal(
    np.asarray(draws.normal(key, (5, 7), 0.5)), np.asarray(0.5 * jax.random.normal(key, (5, 7)))
  )


def test_shapes_of_one_size_bucket_share_one_program():
  key = jax.random.PRNGKey(0)
  before = draws._uniform._cache_size()  # bounds no other draw uses, so the programs counted are these
  for shape in [(3, 50, 7), (33, 32), (1000,), (4, 4, 64)]:  # 1,050, 1,056, 1,000, 1,024 values: bucket 2,048 ...
    draws.uniform(key, shape, 0.25, 0.75)
  assert draws._uniform._cache_size() - before == 2  # ... and 1,024
