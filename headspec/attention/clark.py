"""Syntax from attention: Clark et al. (2019, §4.2) head-attachment accuracy per relation and head.

For a UD relation r (subtype stripped: `nmod:poss` -> `nmod`), the arcs (head h, dependent d) of the
split whose relation is r (ROOT excluded; `all` = every non-root arc), and one attention head with
word-level map a (headspec/attention/words.py):

  dependent_to_head: accuracy = 1/|arcs| · Σ_arcs [argmax_{v != d} a[d, v] = h]   (Clark et al. 2019 §4.2)
  head_to_dependent: accuracy = 1/|arcs| · Σ_arcs [argmax_{v != d} a[v, d] = h]

head_to_dependent is Clark et al.'s released second direction (clarkkev/attention-analysis,
`attn_head_predictor(mode="transpose")`): the map is transposed, so each dependent d predicts the word
that attends to it MOST (the column argmax), and the prediction is right when that word is d's head.
Every arc has its own prediction, so the ceiling is 1. (The row argmax of the head word would let a
head word with several dependents be right for at most one of them: it reads lower on the relations
with many dependents per head and often picks another best head; on MiniLM × EWT test, best head over
all relations 0.304 row vs 0.348 column.) The baseline is a fixed relative offset
k in −K..K, k != 0: dependent_to_head predicts h = d + k, head_to_dependent d = h + k (a position
outside the sentence is wrong; Clark et al. clip to the sentence instead).

Decoders attend only left, so dependent_to_head can only be right on arcs whose head precedes the
dependent (h < d, offsets k < 0) and head_to_dependent only on arcs with d < h (k < 0): a decoder is
scored on those reachable arcs only (`arcs='auto'`), and its share of all arcs is reported. With
`arcs='reachable'`, an encoder is scored on the same arcs (a decoder's reachable ones), so the two can be
compared; `arcs='all'` is refused for decoders.
"""

from __future__ import annotations

import dataclasses
from collections import Counter

import numpy as np

from headspec.errors import UserError

DIRECTIONS = ("dependent_to_head", "head_to_dependent")
ARC_SETS = ("auto", "reachable", "all")
ALL = "all"


def strip_subtype(deprel: str) -> str:
  return deprel.split(":", 1)[0]


@dataclasses.dataclass(frozen=True)
class Arcs:
  """The non-root arcs of a split, one per dependent word (global word indices n of the split)."""

  dep_N: np.ndarray
  head_N: np.ndarray
  relation_N: np.ndarray  # str, subtype stripped
  sentence_N: np.ndarray

  @property
  def num_arcs(self) -> int:
    return len(self.dep_N)


def split_arcs(sentences) -> Arcs:
  """Arcs of treebank `Sentence`s (headspec.data.treebank), words numbered in sentence order."""
  dep, head, rel, sent = [], [], [], []
  first = 0
  for u, s in enumerate(sentences):
    for j, (h, r) in enumerate(zip(s.heads, s.deprels)):
      if h == 0:
        continue  # ROOT excluded (Clark et al. 2019)
      dep.append(first + j)
      head.append(first + h - 1)
      rel.append(strip_subtype(r))
      sent.append(u)
    first += len(s.words)
  return Arcs(
    np.asarray(dep, np.int64), np.asarray(head, np.int64), np.asarray(rel, dtype=object), np.asarray(sent, np.int64)
  )


def relation_set(arcs: Arcs, *, min_count: int, wanted=(), where: str = "the split") -> list[str]:
  """Relations with >= min_count arcs in `arcs` (most frequent first), restricted to `wanted` if given,
  then `all` (always). A `wanted` filter that matches nothing (besides `all`) is a UserError."""
  counts = Counter(arcs.relation_N.tolist())
  frequent = [r for r, c in sorted(counts.items(), key=lambda x: (-x[1], x[0])) if c >= min_count]
  if wanted:
    wanted = [strip_subtype(r) for r in wanted]
    chosen = [r for r in frequent if r in wanted]
    if not chosen and set(wanted) != {ALL}:
      raise UserError(
        f"clark.relations={tuple(wanted)!r}: none occurs >= {min_count} times in {where} "
        f"(relations there that do: {', '.join(frequent) or 'none'}; clark.min_count sets the bar)"
      )
    return chosen + [ALL]
  return frequent + [ALL]


def reachable(arcs: Arcs, direction: str) -> np.ndarray:
  """Arcs a left-to-right decoder can get right: head before dependent (dependent_to_head), else after."""
  return arcs.head_N < arcs.dep_N if direction == "dependent_to_head" else arcs.dep_N < arcs.head_N


def scored_arcs(arcs: Arcs, direction: str, arc_set: str, causal: bool) -> np.ndarray:
  """Bool mask of the arcs scored: all, or the decoder-reachable ones (`arcs` config, module docstring)."""
  if arc_set not in ARC_SETS:
    raise UserError(f"clark.arcs={arc_set!r}: use one of {', '.join(ARC_SETS)}")
  if arc_set == "all" and causal:
    raise UserError(
      "clark.arcs='all' cannot score a decoder: it never sees a word to its right ('auto' scores reachable arcs)"
    )
  if arc_set == "reachable" or causal:
    return reachable(arcs, direction)
  return np.ones(arcs.num_arcs, bool)


def head_correct(stats, arcs: Arcs, direction: str) -> np.ndarray:
  """[L, H, arcs] bool: the dependent's prediction is its head — the word it attends to most
  (dependent_to_head, `stats.argmax_other_LHN`) or the word that attends to it most (head_to_dependent,
  `stats.argmax_col_other_LHN`); `stats` is a headspec/attention/words.py WordStats."""
  if direction == "dependent_to_head":
    return stats.argmax_other_LHN[:, :, arcs.dep_N] == arcs.head_N
  return stats.argmax_col_other_LHN[:, :, arcs.dep_N] == arcs.head_N


def offset_correct(arcs: Arcs, direction: str, offset: int) -> np.ndarray:
  """[arcs] bool: the fixed relative offset predicts the arc (h = d + k, or d = h + k)."""
  if direction == "dependent_to_head":
    return arcs.head_N - arcs.dep_N == offset
  return arcs.dep_N - arcs.head_N == offset


def offsets(max_offset: int, causal: bool) -> list[int]:
  """Candidate baseline offsets: −K..K without 0; only k < 0 for decoders."""
  return [k for k in range(-max_offset, max_offset + 1) if k != 0 and (k < 0 or not causal)]


@dataclasses.dataclass(frozen=True)
class SplitScores:
  """Clark accuracies of one split: accuracy[(relation, direction)] = [L, H], n[...] = arcs scored,
  total[...] = arcs of the relation before the reachable filter, baseline[(relation, direction)] =
  {offset: accuracy}; correct[direction] = [L, H, arcs] and mask[(relation, direction)] the arcs scored
  (for bootstrap CIs)."""

  accuracy: dict
  n: dict
  total: dict
  baseline: dict
  correct: dict
  mask: dict


def score_split(stats, arcs: Arcs, relations, *, causal: bool, arc_set: str, max_offset: int) -> SplitScores:
  """Every head's accuracy and every offset baseline for each relation and direction (`stats`: WordStats)."""
  LH = stats.argmax_other_LHN.shape[:2]
  accuracy, n, total, baseline, correct, mask = {}, {}, {}, {}, {}, {}
  for direction in DIRECTIONS:
    scored = scored_arcs(arcs, direction, arc_set, causal)
    correct[direction] = head_correct(stats, arcs, direction)
    base = {k: offset_correct(arcs, direction, k) for k in offsets(max_offset, causal)}
    for r in relations:
      of_r = np.ones(arcs.num_arcs, bool) if r == ALL else arcs.relation_N == r
      m = of_r & scored
      key = (r, direction)
      mask[key], n[key], total[key] = m, int(m.sum()), int(of_r.sum())
      denom = max(n[key], 1)
      accuracy[key] = correct[direction][:, :, m].sum(-1) / denom if n[key] else np.full(LH, np.nan)
      baseline[key] = {k: float(c[m].sum() / denom) if n[key] else float("nan") for k, c in base.items()}
  return SplitScores(accuracy, n, total, baseline, correct, mask)


def best_offset(baseline: dict) -> int:
  """The offset with the highest accuracy (ties: the smallest |k|, then the negative one)."""
  return max(baseline, key=lambda k: (np.nan_to_num(baseline[k], nan=-1.0), -abs(k), -k))


def clark_rows(scores: SplitScores, *, model: str, step: int, split: str) -> list[dict]:
  """Rows of attention/clark.csv for one split."""
  rows = []
  for (relation, direction), acc_LH in scores.accuracy.items():
    for l, h in np.ndindex(*acc_LH.shape):
      rows.append(
        dict(
          model=model,
          step=step,
          split=split,
          relation=relation,
          direction=direction,
          layer=l,
          head=h,
          accuracy=float(acc_LH[l, h]),
          n=scores.n[(relation, direction)],
        )
      )
  return rows


def baseline_rows(scores: SplitScores, chosen: dict, *, model: str, step: int, split: str) -> list[dict]:
  """Rows of attention/clark_baselines.csv for one split: per relation and direction, the offset
  `chosen[(relation, direction)]` (picked on the selection split) and its accuracy here."""
  return [
    dict(
      model=model,
      step=step,
      split=split,
      relation=relation,
      direction=direction,
      offset=chosen[(relation, direction)],
      accuracy=scores.baseline[(relation, direction)][chosen[(relation, direction)]],
      n=scores.n[(relation, direction)],
    )
    for relation, direction in scores.baseline
  ]
