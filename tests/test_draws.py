"""headspec/model/draws.py: bucketed draws equal jax.random's per-shape draws bit for bit, with one program per bucket;
and the causal test's random head sets (headspec/ablation/causal.py): every candidate set when they
are few, else distinct draws, and an interval that resamples the draws too."""

import jax
import numpy as np
import pytest

from headspec.model import draws

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


# --- the causal test's random head sets ---


def _sets(masks):
  return {tuple(np.argwhere(np.asarray(m) == 0).ravel().tolist()) for m in masks}


def test_few_layer_matched_sets_are_enumerated_not_drawn_with_repeats():
  from headspec.ablation import causal

  sel = causal.selective_mask(np.arange(16.0).reshape(4, 4)[::-1], 1)  # k = 1: one head of a 4-head layer
  layer = int(np.argwhere(sel == 0)[0][0])
  masks, candidates = causal.layer_matched_masks(sel, 3, seed=0)
  assert candidates == 3 and len(masks) == 3  # 3 other heads of that layer: each ablated once
  assert len(_sets(masks)) == 3
  for m in masks:
    removed = np.argwhere(m == 0)
    assert len(removed) == 1 and removed[0][0] == layer and sel[tuple(removed[0])] == 1
  # before: 3 independent draws of the 3 candidates repeated a set for most seeds (1 − 3!/3³ = 7/9)
  old = [len(_sets([causal.layer_matched_masks(sel, 1, 1000 * t + s)[0][0] for s in range(3)])) < 3 for t in range(30)]
  assert sum(old) > 10
  more, candidates = causal.layer_matched_masks(sel, 5, seed=0)  # more seeds than sets: still the 3
  assert candidates == 3 and len(more) == 3


def test_many_layer_matched_sets_are_drawn_without_repeating_one():
  from headspec.ablation import causal

  sel = np.ones((4, 4), np.float32)
  sel[0, 0] = sel[1, 1] = 0.0  # k = 2 in two layers: 3 × 3 = 9 candidate sets
  masks, candidates = causal.layer_matched_masks(sel, 3, seed=0)
  assert candidates == 9 and len(_sets(masks)) == 3
  for m in masks:
    assert ((m == 0).sum(1) == (sel == 0).sum(1)).all() and not ((m == 0) & (sel == 0)).any()
  every, _ = causal.layer_matched_masks(sel, 9, seed=0)
  assert len(_sets(every)) == 9
  # a layer with more selective heads than others: all of them plus the fewest selective ones, C(3, 2) sets
  crowded = np.ones((1, 4), np.float32)
  crowded[0, :3] = 0.0
  masks, candidates = causal.layer_matched_masks(crowded, 5, seed=0)
  assert candidates == 3 and all((m == 0).sum() == 3 and m[0, 3] == 0 for m in masks)


def test_unlabelled_sets_enumerated_or_distinct():
  from headspec.ablation import causal

  top = np.ones((2, 4), np.float32)
  top[1, 0] = 0.0
  unlabelled = np.zeros((2, 4), bool)
  unlabelled[0, :3] = True  # a pool of 3 heads
  masks, candidates = causal.unlabelled_masks(unlabelled, top, 1, 5, seed=0)
  assert candidates == 3 and _sets(masks) == {(0, 0), (0, 1), (0, 2)}
  masks, candidates = causal.unlabelled_masks(unlabelled, top, 2, 2, seed=0)
  assert candidates == 3 and len(_sets(masks)) == 2
  assert causal.unlabelled_masks(unlabelled, top, 4, 3, seed=0) == ([], 0)
