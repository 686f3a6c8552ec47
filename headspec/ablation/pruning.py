"""Iterative head pruning (Michel et al. 2019, §4): remove the lowest-ranked heads in steps of
`step_fraction` of all L·H heads (zero ablation, m_h = 0), recording the metric after every step.

Rankings (a head with the LOWEST score goes first):
  importance  I_h of headspec/ablation/metrics.py (Michel et al. 2019 eq. 2, normalised per layer),
              recomputed under the current mask after every step (it depends on the pruned model);
  ablation    the single-head zero-ablation loss change (or embedding shift) of the unpruned model:
              the heads whose removal alone hurts least go first (fixed order), the best-case reference;
  magnitude   ‖W_O^h‖_F (fixed order);
  entropy     minus the mean attention entropy: the most uniform (highest-entropy) heads go first.
              Why: a near-uniform head returns an average of the values over the whole context, a
              signal that barely depends on the query position and is largely recoverable from the
              residual stream; Voita et al. 2019 (§4, "confident" heads) find that the heads which
              survive pruning are the confident ones, with peaked (low-entropy) attention;
  probe       the head's probe selectivity (max over tasks, dev split) from RUN/probes/results.csv:
              the least selective heads go first (fixed order);
  random      a seeded random order, one per seed (the spread of chance).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

RANKINGS = ("importance", "ablation", "magnitude", "entropy", "probe", "random")


def schedule(num_heads: int, step_fraction: float) -> list[int]:
  """Heads pruned after each step: round(k · step_fraction · num_heads) for k = 0, 1, ... up to all."""
  steps = math.ceil(1.0 / step_fraction - 1e-9)
  counts = [min(num_heads, round(k * step_fraction * num_heads)) for k in range(steps + 1)] + [num_heads]
  return sorted(set(counts))


def fixed_masks(scores_LH, counts: list[int]) -> list[np.ndarray]:
  """Masks [L,H] with the counts[i] lowest-scoring heads removed (ties: lower layer, then head, first)."""
  scores = np.asarray(scores_LH, np.float64)
  order = np.argsort(scores.ravel(), kind="stable")
  masks = []
  for n in counts:
    mask = np.ones(scores.size, np.float32)
    mask[order[:n]] = 0.0
    masks.append(mask.reshape(scores.shape))
  return masks


def random_scores(shape, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).permutation(int(np.prod(shape))).reshape(shape).astype(np.float64)


def iterative_masks(score_fn: Callable[[np.ndarray], np.ndarray], shape, counts: list[int], progress=None):
  """Masks after each step when the ranking is recomputed under the current mask (`score_fn(mask)`)."""
  mask = np.ones(shape, np.float32)
  masks = []
  for n in counts:
    removed = int((mask == 0).sum())
    if n > removed:
      scores = np.where(mask > 0, score_fn(mask), np.inf).ravel()
      flat = mask.ravel().copy()
      flat[np.argsort(scores, kind="stable")[: n - removed]] = 0.0
      mask = flat.reshape(shape)
      if progress is not None:
        progress.update(1)
    masks.append(mask.copy())
  return masks
