"""Control tasks (Hewitt & Liang 2019, "Designing and Interpreting Probes with Control Tasks").

A control task keeps the output space of a linguistic task but makes each label a fixed function of
the word *type*, so a probe can only solve it by memorising types. selectivity = task accuracy −
control accuracy (reported per head) says how much of the probe's accuracy the representation, not
the probe, is responsible for.

- Labelling tasks (upos, xpos, deprel): each lowercased word type gets one label drawn from the task's
  empirical label distribution on train, once, with a seed.
- Dependency arcs (Hewitt & Liang 2019, §3.2, "dependency edge prediction"): each word type (case
  kept) draws once, uniformly, one of three behaviours: attach to itself, to the first word, or to the
  last word of its sentence. Punctuation can be left out of training and scoring for task and control
  alike (`ignore`). control='four_behaviours' is a variant with lowercased types and a fourth behaviour
  "attach to ROOT", kept to reproduce tables made with it.

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


ARC_CONTROLS = ("hewitt_liang", "four_behaviours")


def arc_behaviours(types: Iterable[str], seed: int, control: str = "hewitt_liang") -> dict[str, int]:
  """Maps every type to a behaviour, uniformly: 'hewitt_liang': ARC_SELF, ARC_FIRST or ARC_LAST, the
  type taken as written (case kept); 'four_behaviours': ARC_ROOT, ARC_SELF, ARC_FIRST or ARC_LAST, the
  type lowercased (the variant kept for older tables)."""
  if control not in ARC_CONTROLS:
    raise UserError(f"arc control {control!r}: use one of {', '.join(ARC_CONTROLS)}")
  choices = (ARC_SELF, ARC_FIRST, ARC_LAST) if control == "hewitt_liang" else (ARC_ROOT, ARC_SELF, ARC_FIRST, ARC_LAST)
  out = {}
  for t in types:
    key = t if control == "hewitt_liang" else t.lower()
    if key not in out:
      # the hash lowercases its input, so case is kept by salting with the exact spelling
      u = _type_uniform(key, seed, "arc" if control == "four_behaviours" else f"arc-hl\x1f{key}")
      out[key] = choices[min(int(u * len(choices)), len(choices) - 1)]
  return out


def control_heads(
  sentences: Sequence[Sequence[str]], seed: int, *, control: str = "hewitt_liang", ignore=None
) -> list[np.ndarray]:
  """Control head of every word, 1-based with 0 = ROOT (CoNLL-U HEAD convention), per sentence.

  control='hewitt_liang' (default): Hewitt & Liang 2019, §3.2 ("dependency edge prediction" control):
  each word type, case kept, draws once one of three behaviours — attach to itself, to the sentence's
  first word or to its last word. control='four_behaviours': lowercased types,
  with attach-to-ROOT as a fourth behaviour (kept for older tables). ignore: optional per-sentence boolean masks (e.g.
  punctuation); an ignored word gets head -1 (neither trained on nor scored), as its gold head does.
  """
  table = arc_behaviours((w for s in sentences for w in s), seed, control)
  out = []
  for u, words in enumerate(sentences):
    n = len(words)
    heads = np.empty(n, np.int32)
    for i, w in enumerate(words):
      behaviour = table[w if control == "hewitt_liang" else w.lower()]
      heads[i] = {ARC_ROOT: 0, ARC_SELF: i + 1, ARC_FIRST: 1, ARC_LAST: n}[behaviour]
    if ignore is not None:
      heads[np.asarray(ignore[u], bool)] = -1
    out.append(heads)
  return out


def control_tree_heads(sentences: Sequence[Sequence[str]], seed: int) -> list[np.ndarray]:
  """A control TREE per sentence for the structural probes (headspec/probing/structural.py): the first
  word is the root, and every later word attaches to the first word or to the word before it, chosen
  once per lowercased word type (uniformly, seeded). Hewitt & Liang's control principle (structure a
  fixed function of word identity, so only memorising types solves it) restricted to leftward
  attachments, because their arc control (self, first, last word) does not make trees and distances
  need one. Same words and lengths as the gold trees; 1-based heads, 0 = ROOT."""
  out = []
  for words in sentences:
    heads = np.array(
      [0] + [1 if _type_uniform(w, seed, "tree") < 0.5 else i for i, w in enumerate(words[1:], start=1)], np.int32
    )
    out.append(heads)
  return out
