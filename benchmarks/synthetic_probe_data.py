"""Synthetic per-head features with realistic label structure, for the probe benchmark.

Word types follow a Zipf law; each type has a usual UPOS (90% of its tokens), XPOS refines UPOS,
DEPREL depends on UPOS. Each head mixes random projections of the three one-hot labels and of a
word-type embedding at its own strengths, adds noise, and squashes with tanh (so class-conditional
distributions are not Gaussian and logistic regression differs from LDA), then mixes dimensions.
"""

import numpy as np

NUM_UPOS, NUM_XPOS, NUM_DEPREL = 17, 50, 37


def synthetic_labels(n: int, rng: np.random.Generator, num_types: int = 20000):
  """Returns (upos_N, xpos_N, deprel_N, type_N), int32, correlated like real treebank labels."""
  upos_prior = rng.dirichlet(np.full(NUM_UPOS, 1.0))
  # Each XPOS belongs to one UPOS; every UPOS gets at least one XPOS.
  xpos_upos = np.concatenate([np.arange(NUM_UPOS), rng.choice(NUM_UPOS, NUM_XPOS - NUM_UPOS, p=upos_prior)])
  type_upos = rng.choice(NUM_UPOS, num_types, p=upos_prior)
  type_xpos = np.array([rng.choice(np.flatnonzero(xpos_upos == u)) for u in type_upos])
  deprel_given_upos = rng.dirichlet(np.full(NUM_DEPREL, 0.3), size=NUM_UPOS)
  zipf = 1.0 / (np.arange(num_types) + 2.7)
  types = rng.choice(num_types, n, p=zipf / zipf.sum())
  upos = type_upos[types].copy()
  ambiguous = rng.random(n) < 0.1
  upos[ambiguous] = rng.choice(NUM_UPOS, ambiguous.sum(), p=upos_prior)
  xpos = type_xpos[types].copy()
  for i in np.flatnonzero(ambiguous):
    xpos[i] = rng.choice(np.flatnonzero(xpos_upos == upos[i]))
  cum = np.cumsum(deprel_given_upos[upos], axis=1)
  deprel = (rng.random((n, 1)) < cum).argmax(axis=1)
  return upos.astype(np.int32), xpos.astype(np.int32), deprel.astype(np.int32), types.astype(np.int32)


def synthetic_head_features(labels, num_groups: int, k: int, seed: int = 0, num_types: int = 20000):
  """x_NGK float32 features for `labels` = (upos, xpos, deprel, type) from synthetic_labels; group g
  depends only on (seed, g), so a subset of groups can be regenerated alone."""
  upos, xpos, deprel, types = labels
  n = upos.shape[0]
  groups = range(num_groups) if isinstance(num_groups, int) else list(num_groups)
  x_NGK = np.empty((n, len(groups), k), np.float32)
  for i, g in enumerate(groups):
    grng = np.random.default_rng([seed, g])
    s_upos, s_xpos, s_dep, s_type = grng.uniform([0.2, 0.1, 0.2, 0.0], [1.6, 1.0, 1.2, 1.0])
    h = (
      s_upos * grng.standard_normal((NUM_UPOS, k))[upos]
      + s_xpos * grng.standard_normal((NUM_XPOS, k))[xpos]
      + s_dep * grng.standard_normal((NUM_DEPREL, k))[deprel]
      + s_type * grng.standard_normal((num_types, k))[types]
      + grng.standard_normal((n, k))
    )
    mix = grng.standard_normal((k, k)) / np.sqrt(k) + np.eye(k)
    x_NGK[:, i] = (np.tanh(h) @ mix).astype(np.float32)
  return x_NGK
