"""Built-in patching tasks: prompt pairs with answers (docs/patching.md).

induction (Olsson et al. 2022): clean [BOS] r_1..r_n r_1..r_{n−1}, whose next token r_n an induction head
predicts by copying what followed r_{n−1} the first time; corrupt [BOS] r'_1..r'_n r_1..r_{n−1}, the same
second half after a different random first half (nothing to copy). Answers (r_n, r'_n).

ioi (Wang et al. 2022): "When A and B went to the store, B gave a drink to" → A (the indirect object).
Answers (A, B). Two corruptions (`CORRUPTIONS`):
  abc  Wang et al.'s ABC distribution (the default): the same template with three other names, distinct and
       none of A and B ("When C and D went to the store, E gave a drink to"), so no name is repeated and
       neither answer is in the prompt;
  s2   only the second B (S2) replaced by a third name C ("..., C gave a drink to"): A and B stay in the prompt.
Names and templates are single tokens of the model's tokenizer, or the task is refused.

`TASKS` registers them by the config's `task`: each entry makes the prompt pairs of a config for a model and
its tokenizer, and names the tables' `task`. A new task is one entry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from headspec.errors import UserError

IOI_TEMPLATES = (
  "When {A} and {B} went to the store, {S} gave a drink to",
  "When {A} and {B} went to the park, {S} gave a ball to",
  "After {A} and {B} had lunch, {S} handed a book to",
)
IOI_NAMES = ("Mary", "John", "Tom", "Anna", "James", "Sarah", "David", "Emma", "Paul", "Lucy")
CORRUPTIONS = {"abc": 5, "s2": 3}
"""Each IOI corruption (module docstring) and the distinct names one prompt pair draws."""


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


def ioi_pairs(tokenizer, *, count: int, seed: int, corruption: str = "abc"):
  """(clean, corrupt, answers) from the templates with names that are one token each where the templates put
  them, after a space: the name's id is the one token that "When Mary" adds to "When", so byte-level BPE's
  leading-space tokens ("ĠMary"), SentencePiece's "▁Mary" and uncased WordPiece's "mary" are all the ids the
  prompts hold. `corruption`: 'abc' (every name replaced, Wang et al.'s ABC distribution) or 's2' (the second
  B only). Pairs whose names do not tokenize apart from their neighbours are skipped; UserError when too
  few names are single tokens (five for 'abc', three for 's2') or no pair is left."""
  if corruption not in CORRUPTIONS:
    raise UserError(f"ioi task: corruption={corruption!r}; choose one of {', '.join(map(repr, CORRUPTIONS))}")
  before = tokenizer.encode("When")

  def one_token(name):
    ids = tokenizer.encode("When " + name)
    return ids[-1] if len(ids) == len(before) + 1 and ids[: len(before)] == before else None

  names = [(name, one_token(name)) for name in IOI_NAMES]
  names = [(name, i) for name, i in names if i is not None]
  drawn = CORRUPTIONS[corruption]
  if len(names) < drawn:
    raise UserError(
      f"ioi task: {len(names)} of the built-in names are single tokens of this tokenizer; "
      f"corruption={corruption!r} needs {drawn}" + (" (corruption='s2' needs three)" if corruption == "abc" else "")
    )
  rng = np.random.default_rng(seed)
  clean, corrupt, answers = [], [], []
  for k in range(count):
    template = IOI_TEMPLATES[k % len(IOI_TEMPLATES)]
    picked = [names[i] for i in rng.choice(len(names), drawn, replace=False)]
    (a, a_id), (b, b_id), (c, c_id) = picked[:3]
    if corruption == "abc":  # A, B, S all replaced, by names that are neither A nor B
      (c, c_id), (d, d_id), (e, e_id) = picked[2:]
      texts, expected = ((a, b, b), (c, d, e)), [(a_id, c_id), (b_id, d_id), (b_id, e_id)]
    else:
      texts, expected = ((a, b, b), (a, b, c)), [(b_id, c_id)]
    ids = [list(tokenizer.prefix_ids) + tokenizer.encode(template.format(A=x, B=y, S=z)) for x, y, z in texts]
    differ = [(u, v) for u, v in zip(*ids) if u != v]
    aligned = len(ids[0]) == len(ids[1]) and differ == expected
    if not (aligned and ids[0].count(a_id) == 1 and ids[0].count(b_id) == 2):
      continue  # a name merged with its neighbours here; the pair would not align
    clean.append(ids[0])
    corrupt.append(ids[1])
    answers.append((a_id, b_id))
  if not clean:
    raise UserError(
      f"ioi task: no template gave clean and corrupt prompts (corruption={corruption!r}) that differ in the "
      "replaced names only"
    )
  return clean, corrupt, answers


def _induction(c, model, tokenizer):
  from headspec.data.tokenizer import bos_ids, special_ids

  bos = bos_ids(tokenizer) if model.cfg.kind == "decoder" else []
  return induction_pairs(model.cfg.vocab_size, special_ids(tokenizer), n=c.induction_n, count=c.count, seed=c.seed,
                         bos=bos)  # fmt: skip


def _ioi(c, model, tokenizer):
  return ioi_pairs(tokenizer, count=c.count, seed=c.seed, corruption=c.get("corruption", "abc"))


@dataclasses.dataclass(frozen=True)
class Task:
  """A built-in task: `pairs(config, model, tokenizer)` -> (clean, corrupt, answers) token-id lists, and
  `name(config)`: the tables' `task`."""

  pairs: Callable
  name: Callable


TASKS = {
  "induction": Task(_induction, lambda c: "induction"),
  "ioi": Task(_ioi, lambda c: "ioi_s2" if c.get("corruption", "abc") == "s2" else "ioi"),
}
"""The built-in tasks by the config's `task` (headspec patch, headspec circuit)."""
