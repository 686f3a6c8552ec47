"""The atlas's reader of `headspec circuit`'s edges (circuit/edges.csv; docs/circuits.md): per task and
scoring method, each head's strongest incoming and outgoing edge as metrics, and on its card its top edges
each way with every method's score. The edges' inputs are checked with the other rows (`grid.EDGE_INPUTS`).
"""

from __future__ import annotations

import collections
import re

from headspec.atlas.grid import RunData, num, warn
from headspec.io import tables

# headspec/patching/edges.py: the methods' names (JAX-free copy).
EDGE_METHODS = {"exact": "exact", "eap_ig": "EAP-IG", "eap": "EAP"}  # the order of preference for ranking
TOP_EDGES = 5  # circuit edges into and out of a head, per task
_GROUP_NODE = re.compile(r"L\d+G\d+")  # circuit/edges.csv: a grouped-query model's K/V group (downstream of k, v)


def circuit(run: RunData) -> None:
  """`headspec circuit` (circuit/edges.csv; docs/circuits.md): every edge's score by EAP (Syed et al. 2023),
  EAP-IG (Hanna et al. 2024) or exact edge patching, the change of the logit difference when that edge alone
  carries its corrupted value in the clean run (noising, the papers' convention; a `*_denoising` method: its
  clean value in the corrupted run), estimated or measured. Per task and method, the grid has
  each head's strongest (largest |score|) incoming edge — into its query, key or value input; a
  grouped-query head's key and value inputs are its K/V group's, shared — and its strongest outgoing edge;
  the card lists the primary model's latest step's top edges each way, ranked by the most exact method
  there (exact, then EAP-IG, then EAP), every method's score beside."""
  rows = run.rows[tables.CIRCUIT_EDGES.path]
  if not rows:
    return
  heads = run.shape[1]
  groups = {}  # model -> its number of K/V groups, from its k/v edges into L<l>G<g> nodes (none: not grouped)
  for r in rows:
    if r["input"] in ("k", "v") and _GROUP_NODE.fullmatch(r["downstream"]):
      groups[r["model"]] = max(groups.get(r["model"], 0), int(r["downstream_head"]) + 1)
  bad = sorted(model for model, g in groups.items() if heads % g)
  if bad:
    warn(
      f"{tables.path_of(run.workdir, tables.CIRCUIT_EDGES)}: {bad[0]}'s {groups[bad[0]]} K/V groups do not divide"
      f" the {heads} heads; its key and value edges are left off the heads"
    )
  incoming, outgoing = collections.defaultdict(list), collections.defaultdict(list)
  for r in rows:  # (model, step, task, method, steps, layer, head) -> [(upstream, downstream, input, score)]
    at = (r["model"], int(r["step"]), r["task"], r["method"], int(r["steps"]))
    edge = (r["upstream"], r["downstream"], r["input"], num(r["score"]))
    if int(r["upstream_head"]) >= 0:
      outgoing[at + (int(r["upstream_layer"]), int(r["upstream_head"]))].append(edge)
    if r["input"] not in ("q", "k", "v"):
      continue
    layer, target, g = int(r["downstream_layer"]), int(r["downstream_head"]), groups.get(r["model"])
    if r["input"] != "q" and _GROUP_NODE.fullmatch(r["downstream"]):  # a K/V group: each of its heads
      if g is None or heads % g:
        continue
      targets = range(target * (heads // g), (target + 1) * (heads // g))
    else:
      targets = (target,)
    for head in targets:
      incoming[at + (layer, head)].append(edge)
  for side, by_head in (("incoming", incoming), ("outgoing", outgoing)):
    for (model, step, task, method, steps, layer, head), edges in by_head.items():
      u, d, inp, score = max(edges, key=lambda e: -1 if e[3] is None else abs(e[3]))
      if side == "incoming":  # into this head's input, or its K/V group's
        where = f"from {u} into {inp}" + (f" of {d}" if d != f"L{layer}H{head}" else "")
      else:  # into a later head's q, k or v, an MLP or the logits
        where = f"into {d}'s {inp}" if inp in ("q", "k", "v") else f"into {d}"
      run.metric(
        f"circuit/{task}/{_method_id(method, steps)}/{side}{run.suffix(model)}",
        "Circuit edges",
        f"{task} · strongest {side} edge · {_method_label(method, steps)}{run.model_label(model)}",
        f"Score of the head's strongest {side} edge (largest |score|; "
        + (
          "into its query, key or value input, a grouped-query head's key and value through its K/V group"
          if side == "incoming"
          else "from its output into any later node"
        )
        + f") on {task} by {_method_label(method, steps)}: the change of the logit difference when that edge"
        " alone carries its corrupted value in the clean run (noising; a *_denoising method: its clean value in"
        " the corrupted run; estimated; exact: measured; docs/circuits.md).",
        diverging=True,
      ).set(step, layer, head, score, None, f"{where}; {len(edges)} {side} edges")
  _circuit_cards(run, incoming, outgoing)


def _circuit_cards(run: RunData, incoming: dict, outgoing: dict) -> None:
  """Per head and task (the primary model's latest step): its TOP_EDGES incoming and outgoing edges by |score|
  of the first of the methods there (`_method_order`), each edge with every method's score."""
  last = {}  # task -> the primary model's latest step
  for model, step, task, *_ in [*incoming, *outgoing]:
    if model == run.primary:
      last[task] = max(last.get(task, -1), step)
  for task, step in sorted(last.items()):
    here = [k for k in [*incoming, *outgoing] if k[:3] == (run.primary, step, task)]
    methods = sorted({k[3:5] for k in here}, key=_method_order)
    for layer, head in sorted({k[5:] for k in here}):
      entry = {"task": task, "step": step, "methods": [_method_label(*m) for m in methods]}
      for side, by_head in (("incoming", incoming), ("outgoing", outgoing)):
        scores = {}  # (upstream, downstream, input) -> the score of each method
        for i, (method, steps) in enumerate(methods):
          for u, d, inp, score in by_head.get((run.primary, step, task, method, steps, layer, head), ()):
            scores.setdefault((u, d, inp), [None] * len(methods))[i] = score
        ranked = sorted(scores.items(), key=lambda e: (e[1][0] is None, -abs(e[1][0] or 0.0), e[0]))
        entry[side] = [
          {"upstream": u, "downstream": d, "input": inp, "scores": s} for (u, d, inp), s in ranked[:TOP_EDGES]
        ]
        entry[f"{side}_total"] = len(scores)
      run.extra(layer, head).setdefault("circuit", []).append(entry)


def _method_label(method: str, steps: int) -> str:
  """An edge-scoring method as the card names it: 'EAP', 'EAP-IG (5 steps)', 'exact'."""
  return EDGE_METHODS.get(method, method) + (f" ({steps} steps)" if method == "eap_ig" else "")


def _method_id(method: str, steps: int) -> str:
  """A method in a metric id: 'eap', 'exact', 'eap_ig-5' (EAP-IG runs with other steps are their own)."""
  return method if method in ("eap", "exact") else f"{method}-{steps}"


def _method_order(method_steps: tuple[str, int]) -> tuple:
  """Most exact first: exact edge patching, EAP-IG (more steps first), EAP, any other by name."""
  method, steps = method_steps
  return (list(EDGE_METHODS).index(method) if method in EDGE_METHODS else len(EDGE_METHODS), -steps, method)
