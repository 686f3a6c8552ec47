"""Control tasks (Hewitt & Liang 2019, "Designing and Interpreting Probes with Control Tasks").

A control task keeps the output space of a linguistic task but makes each label a fixed function of
the word *type*, so a probe can only solve it by memorising types. selectivity = task accuracy −
control accuracy (reported per head) says how much of the probe's accuracy the representation, not
the probe, is responsible for.

- Labelling tasks (upos, xpos, deprel): each lowercased word type gets one label drawn from the task's
  empirical label distribution on train, once, with a seed.
- Dependency arcs: each lowercased type gets one of four behaviours, uniformly, as in the authors'
  code (control-tasks/probing-internal/task.py, CorruptedEdgePositionTask): attach to ROOT (head 0),
  to itself, to the first word, or to the last word of its sentence.

The draw for a type depends only on (seed, type): a hash of both is the uniform variate, so a type
gets the same control label in every sentence and every split, whichever vocabulary is passed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from headspec.errors import UserError

ARC_ROOT, ARC_SELF, ARC_FIRST, ARC_LAST = 0, 1, 2, 3
NUM_ARC_BEHAVIOURS = 4


def _type_uniform(word_type: str, seed: int, salt: str) -> float:
  """A uniform number in [0, 1) fixed by (seed, salt, lowercased type): blake2b, 53 bits."""
  digest = hashlib.blake2b(f"{seed}\x1f{salt}\x1f{word_type.lower()}".encode(), digest_size=8).digest()
  return (int.from_bytes(digest, "little") >> 11) / float(1 << 53)


def control_labels(
  types: Iterable[str], label_counts: Sequence[float] | Mapping[int, float], seed: int
) -> dict[str, int]:
  """Maps every lowercased word type to a control label drawn from the label distribution.

  label_counts: counts (or probabilities) per label id, as a sequence indexed by label or a mapping
  label → count; usually the task's train counts (np.bincount of the gold labels).
  """
  if isinstance(label_counts, Mapping):
    size = max(label_counts) + 1 if label_counts else 0
    counts = np.zeros(size)
    for label, count in label_counts.items():
      counts[label] = count
  else:
    counts = np.asarray(label_counts, np.float64)
  if counts.ndim != 1 or counts.size == 0 or (counts < 0).any() or counts.sum() <= 0:
    raise UserError(f"control_labels: label_counts must be non-negative with a positive total, got {counts}")
  cdf = np.cumsum(counts) / counts.sum()
  out = {}
  for t in types:
    key = t.lower()
    if key not in out:
      label = int(np.searchsorted(cdf, _type_uniform(key, seed, "label"), side="right"))
      out[key] = min(label, counts.size - 1)
  return out


def control_labels_N(words_N: Sequence[str], label_counts, seed: int) -> np.ndarray:
  """Control label of every word occurrence (int32), per control_labels."""
  table = control_labels(words_N, label_counts, seed)
  return np.asarray([table[w.lower()] for w in words_N], np.int32)


def arc_behaviours(types: Iterable[str], seed: int) -> dict[str, int]:
  """Maps every lowercased type to one of ARC_ROOT, ARC_SELF, ARC_FIRST, ARC_LAST, uniformly."""
  out = {}
  for t in types:
    key = t.lower()
    if key not in out:
      out[key] = min(int(_type_uniform(key, seed, "arc") * NUM_ARC_BEHAVIOURS), NUM_ARC_BEHAVIOURS - 1)
  return out


def control_heads(sentences: Sequence[Sequence[str]], seed: int) -> list[np.ndarray]:
  """Control head of every word, 1-based with 0 = ROOT (CoNLL-U HEAD convention), per sentence."""
  table = arc_behaviours((w for s in sentences for w in s), seed)
  out = []
  for words in sentences:
    n = len(words)
    heads = np.empty(n, np.int32)
    for i, w in enumerate(words):
      behaviour = table[w.lower()]
      heads[i] = {ARC_ROOT: 0, ARC_SELF: i + 1, ARC_FIRST: 1, ARC_LAST: n}[behaviour]
    out.append(heads)
  return out


def control_heads_BN(words_BN: Sequence[Sequence[str]], heads_BN: np.ndarray, seed: int) -> np.ndarray:
  """control_heads for a padded batch: heads_BN's -1 padding is kept, words beyond it ignored."""
  heads_BN = np.asarray(heads_BN)
  lengths = (heads_BN >= 0).sum(1)
  out = np.full_like(heads_BN, -1)
  for b, h in enumerate(control_heads([list(w[:n]) for w, n in zip(words_BN, lengths)], seed)):
    out[b, : len(h)] = h
  return out
