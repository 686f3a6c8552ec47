"""Attention rollout and attention flow (Abnar & Zuidema 2020, "Quantifying Attention Flow in Transformers").

Both start from each layer's raw attention with the residual connection added (their §3):

  Ã_l = rownorm(0.5 · mean_h A_{l,h} + 0.5 · I)                  the heads of layer l averaged

Rollout multiplies them: R_l = Ã_l · Ã_{l-1} ··· Ã_0, so R_l[i, j] is how much position i after block
l draws on input position j. Flow treats the same matrices as a layered graph: node (l, i) is position
i entering block l (l = 0 the inputs, l = L the outputs), an edge (l+1, i) -> (l, j) has capacity
Ã_l[i, j], and F[i, j] is the value of a maximum flow from output node (L, i) to input node (0, j);
as in their released code, each row is then divided by its sum (`normalize=True`). The maximum flows
are computed with networkx (Edmonds-Karp on float capacities, as their code does: SciPy's
`maximum_flow` takes integer capacities only). Flow costs T² max-flow problems on (L+1)·T nodes, so it
is meant for short sentences (the command draws it for one example sentence).

Arrays: probs_LHTT (a sentence's token-level maps, headspec.attention.words.token_maps) or any
[L, H, T, T] row-stochastic maps, e.g. word-level ones.
"""

from __future__ import annotations

import numpy as np


def residual_attention(probs_LHTT: np.ndarray) -> np.ndarray:
  """Ã_LTT = rownorm(0.5 · mean over heads + 0.5 · I) per layer (Abnar & Zuidema 2020 §3)."""
  probs_LHTT = np.asarray(probs_LHTT, np.float64)
  T = probs_LHTT.shape[-1]
  mixed_LTT = 0.5 * probs_LHTT.mean(1) + 0.5 * np.eye(T)[None]
  return mixed_LTT / mixed_LTT.sum(-1, keepdims=True)


def rollout(probs_LHTT: np.ndarray) -> np.ndarray:
  """R_LTT: R_l = Ã_l ··· Ã_0 (Abnar & Zuidema 2020 §3, attention rollout); R_{L-1} is the model's."""
  mixed_LTT = residual_attention(probs_LHTT)
  out_LTT = np.empty_like(mixed_LTT)
  joint_TT = np.eye(mixed_LTT.shape[-1])
  for l, a_TT in enumerate(mixed_LTT):
    joint_TT = a_TT @ joint_TT
    out_LTT[l] = joint_TT
  return out_LTT


def flow_graph(probs_LHTT: np.ndarray):
  """The networkx DiGraph of attention flow: nodes (l, i), edges (l+1, i) -> (l, j) with capacity Ã_l[i, j]."""
  import networkx as nx

  mixed_LTT = residual_attention(probs_LHTT)
  L, T, _ = mixed_LTT.shape
  graph = nx.DiGraph()
  graph.add_nodes_from((l, i) for l in range(L + 1) for i in range(T))
  for l in range(L):
    for i, j in zip(*np.nonzero(mixed_LTT[l] > 0)):
      graph.add_edge((l + 1, int(i)), (l, int(j)), capacity=float(mixed_LTT[l, i, j]))
  return graph


def flow(probs_LHTT: np.ndarray, *, normalize: bool = True) -> np.ndarray:
  """F_TT[i, j] = max-flow value from output position i to input position j through all L layers
  (Abnar & Zuidema 2020 §3, attention flow), rows divided by their sums when `normalize`."""
  import networkx as nx
  from networkx.algorithms.flow import edmonds_karp

  graph = flow_graph(probs_LHTT)
  L, T = probs_LHTT.shape[0], probs_LHTT.shape[-1]
  out_TT = np.zeros((T, T))
  for i in range(T):
    for j in range(T):
      if nx.has_path(graph, (L, i), (0, j)):
        out_TT[i, j] = nx.maximum_flow_value(graph, (L, i), (0, j), flow_func=edmonds_karp)
  if normalize:
    out_TT = out_TT / np.maximum(out_TT.sum(-1, keepdims=True), 1e-12)
  return out_TT
