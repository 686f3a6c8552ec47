"""Built-in patching tasks: prompt pairs with answers (docs/patching.md).

induction (Olsson et al. 2022): clean [BOS] r_1..r_n r_1..r_{n−1}, whose next token r_n an induction head
predicts by copying what followed r_{n−1} the first time; corrupt [BOS] r'_1..r'_n r_1..r_{n−1}, the same
second half after a different random first half (nothing to copy). Answers (r_n, r'_n).

ioi (Wang et al. 2022): "When A and B went to the store, B gave a drink to" → A (the indirect object);
corrupt: the same with a third name C for the second B ("..., C gave a drink to"), so no name is repeated.
Answers (A, B). Names and templates are single tokens of the model's tokenizer, or the task is refused.
"""

from __future__ import annotations

import numpy as np

from headspec.errors import UserError

IOI_TEMPLATES = (
  "When {A} and {B} went to the store, {S} gave a drink to",
  "When {A} and {B} went to the park, {S} gave a ball to",
  "After {A} and {B} had lunch, {S} handed a book to",
)
IOI_NAMES = ("Mary", "John", "Tom", "Anna", "James", "Sarah", "David", "Emma", "Paul", "Lucy")


def induction_pairs(vocab_size: int, specials, *, n: int, count: int, seed: int, bos=()):
  """(clean, corrupt, answers) as token-id lists: see the module docstring; tokens drawn from the
  vocabulary minus `specials`, distinct within a prompt pair."""
  allowed = np.setdiff1d(np.arange(vocab_size), np.asarray(specials, np.int64))
  if len(allowed) < 2 * n or n < 2:
    raise UserError(f"induction task: n={n} needs 2 ≤ n and 2n ≤ {len(allowed)} ordinary tokens")
  rng = np.random.default_rng(seed)
  clean, corrupt, answers = [], [], []
  for _ in range(count):
    tokens = rng.choice(allowed, 2 * n, replace=False).tolist()
    r, other = tokens[:n], tokens[n:]
    clean.append(list(bos) + r + r[:-1])
    corrupt.append(list(bos) + other + r[:-1])
    answers.append((r[-1], other[-1]))
  return clean, corrupt, answers


def ioi_pairs(tokenizer, *, count: int, seed: int):
  """(clean, corrupt, answers) from the templates with names that are one token each where the templates put
  them, after a space: the name's id is the one token that "When Mary" adds to "When", so byte-level BPE's
  leading-space tokens ("ĠMary"), SentencePiece's "▁Mary" and uncased WordPiece's "mary" are all the ids the
  prompts hold. Pairs whose names do not tokenize apart from their neighbours are skipped; UserError when
  fewer than three names are single tokens or no pair is left."""
  before = tokenizer.encode("When")

  def one_token(name):
    ids = tokenizer.encode("When " + name)
    return ids[-1] if len(ids) == len(before) + 1 and ids[: len(before)] == before else None

  names = [(name, one_token(name)) for name in IOI_NAMES]
  names = [(name, i) for name, i in names if i is not None]
  if len(names) < 3:
    raise UserError("ioi task: fewer than three of the built-in names are single tokens of this tokenizer")
  rng = np.random.default_rng(seed)
  clean, corrupt, answers = [], [], []
  for k in range(count):
    template = IOI_TEMPLATES[k % len(IOI_TEMPLATES)]
    (a, a_id), (b, b_id), (c, c_id) = (names[i] for i in rng.choice(len(names), 3, replace=False))
    ids = [list(tokenizer.prefix_ids) + tokenizer.encode(template.format(A=a, B=b, S=s)) for s in (b, c)]
    differ = [(u, v) for u, v in zip(*ids) if u != v]
    aligned = len(ids[0]) == len(ids[1]) and differ == [(b_id, c_id)]
    if not (aligned and ids[0].count(a_id) == 1 and ids[0].count(b_id) == 2):
      continue  # a name merged with its neighbours here; the pair would not align
    clean.append(ids[0])
    corrupt.append(ids[1])
    answers.append((a_id, b_id))
  if not clean:
    raise UserError("ioi task: no template gave clean and corrupt prompts that differ in the second name only")
  return clean, corrupt, answers
