"""Pairwise head interactions: is removing two heads together worse (or better) than the sum of each?

For the `top` heads by importance and every pair (a, b), with zero ablation:
  LM head:      interaction = Δloss(a, b) − (Δloss(a) + Δloss(b))   (joint − sum_of_singles)
  no LM head:   displacement vectors Δ_S(x) = e_S(x) − e_full(x) of the sentence embedding, and
                interaction = (1/N) Σ_x ½‖Δ_ab(x) − Δ_a(x) − Δ_b(x)‖², joint = (1/N) Σ_x ½‖Δ_ab(x)‖²,
                sum_of_singles = (1/N) Σ_x ½(‖Δ_a(x)‖² + ‖Δ_b(x)‖²)  (≥ 0: how non-additive the pair is).
Positive LM interactions mean redundancy-breaking (the pair hurts more than its parts), negative ones
redundancy or saturation. Pair effects of heads follow Michel et al. 2019's masking; the additivity
test is the usual second-order (interaction) term of a two-factor design.
"""

from __future__ import annotations

import itertools

import numpy as np

from headspec.ablation import core


def top_heads(scores_LH, top: int) -> list[tuple[int, int]]:
  scores = np.asarray(scores_LH)
  order = np.argsort(-scores.ravel(), kind="stable")[:top]
  return [tuple(int(i) for i in np.unravel_index(o, scores.shape)) for o in order]


def interactions(model, evalset, heads: list[tuple[int, int]], progress=None) -> list[dict]:
  """Rows {layer_a, head_a, layer_b, head_b, joint, sum_of_singles, interaction, metric} for every pair."""
  cfg = model.cfg
  shape = (cfg.num_layers, cfg.num_heads)
  pairs = list(itertools.combinations(range(len(heads)), 2))
  masks = [np.ones(shape, np.float32)]
  for group in [(i,) for i in range(len(heads))] + pairs:
    m = np.ones(shape, np.float32)
    for i in group:
      m[heads[i]] = 0.0
    masks.append(m)
  values = core.run_masks(model, evalset, masks, core.zero_replacement(model), progress=progress).astype(np.float64)
  full, singles, joints = values[0], values[1 : 1 + len(heads)], values[1 + len(heads) :]
  rows = []
  for (i, j), joint_NP in zip(pairs, joints):
    if evalset.kind == "lm":
      loss = lambda v: v[:, 0].sum() / max(full[:, 2].sum(), 1.0)
      joint, parts = loss(joint_NP) - loss(full), loss(singles[i]) - loss(full) + loss(singles[j]) - loss(full)
      metric, interaction = "loss_delta", joint - parts
    else:
      d_ab, d_a, d_b = joint_NP - full, singles[i] - full, singles[j] - full
      half_sq = lambda d: 0.5 * (d**2).sum(-1).mean()
      joint, parts = half_sq(d_ab), half_sq(d_a) + half_sq(d_b)
      metric, interaction = "embedding_displacement", half_sq(d_ab - d_a - d_b)
    (la, ha), (lb, hb) = heads[i], heads[j]
    rows.append(
      dict(
        metric=metric,
        layer_a=la,
        head_a=ha,
        layer_b=lb,
        head_b=hb,
        joint=float(joint),
        sum_of_singles=float(parts),
        interaction=float(interaction),
      )
    )
  return rows
