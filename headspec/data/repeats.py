"""Repeated random sequences for studying induction heads: written into a text corpus, or mixed into
training batches.

Olsson et al. (2022) find induction heads by their behaviour on repeated random tokens; a small decoder
trained on short natural or grammar text meets few exact repeats, so `write_repeats` copies the corpus
folder DATA_DIR/text/<source>/ to text/<source>_repeats/ and, after each source document, with
probability `fraction`, inserts one document: a sequence of `min_words`..`max_words` words drawn
uniformly (with replacement) from the source's own words, written `copies` times on one line. The words
are the corpus' own, so the tokenizer trained on the mix has pieces for them. Seeded per split:
the same arguments give byte-identical files.

`RepeatRows` instead replaces a fraction of every training batch's rows with rows of repeated random
token sequences (`varied_repeat_batch`) drawn from the corpus' own ids (`data.repeat_rows`): measured on
the induction setting's 2-layer decoder (docs/study.md, "Induction"), an induction head forms within a
few thousand steps only where such sequences make up most of the rows; repeats written into the text as
words, at the shares tried, formed none.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import random

import numpy as np

from headspec.data.text_tfds import SPLITS, read_text_documents
from headspec.errors import UserError
from headspec.io import remote

SUFFIX = "_repeats"
_WORD_DOCUMENTS = 2000  # the word list comes from the first documents of the train split


def _words(train: pathlib.Path) -> list[str]:
  words = set()
  for i, document in enumerate(read_text_documents(train)):
    if i == _WORD_DOCUMENTS:
      break
    words.update(document.split())
  return sorted(words)


def write_repeats(
  data_dir, source: str, *, seed: int = 0, fraction: float = 0.25, min_words: int = 8, max_words: int = 24, copies=2
) -> pathlib.Path:
  """Writes DATA_DIR/text/<source>_repeats/{train,valid}.txt from text/<source>/; returns that folder."""
  source_dir = pathlib.Path(data_dir) / "text" / source
  missing = [s for s in SPLITS if not (source_dir / f"{s}.txt").is_file()]
  if missing:
    raise UserError(f"{source_dir}: no {', '.join(f'{s}.txt' for s in missing)} to mix repeated sequences into")
  if not (0 < fraction <= 1 and 1 <= min_words <= max_words and copies >= 2):
    raise UserError(
      f"repeats: need 0 < fraction <= 1, 1 <= min_words <= max_words, copies >= 2 (got {fraction}, "
      f"{min_words}, {max_words}, {copies})"
    )
  vocabulary = _words(source_dir / "train.txt")
  out_dir = source_dir.parent / f"{source}{SUFFIX}"
  out_dir.mkdir(parents=True, exist_ok=True)
  for split in SPLITS:
    rng = random.Random(f"headspec-repeats/{seed}/{split}")  # string seeds are stable across platforms
    documents = []
    for document in read_text_documents(source_dir / f"{split}.txt"):
      documents.append(document)
      if rng.random() < fraction:
        sequence = " ".join(rng.choices(vocabulary, k=rng.randint(min_words, max_words)))
        documents.append(" ".join([sequence] * copies))
    remote.write_bytes_atomic(out_dir / f"{split}.txt", ("\n\n".join(documents) + "\n").encode("utf-8"))
  return out_dir


def varied_repeat_batch(
  rng: np.random.Generator, count: int, seq_len: int, vocab_size: int, specials, *, lengths, bos=(2,)
):
  """[count, seq_len] training rows `BOS p_1 … p_m r_1 … r_n r_1 … r_n f_1 …` with n drawn from `lengths`,
  a random-length random prefix p (m uniform in 0 … seq_len − len(bos) − 2n) and random filler f, every
  token of a row distinct (drawn without replacement from the non-special vocabulary), so the second
  repeat is predictable only in context. Varying n and the repeat's start keeps a one-layer model from
  solving the task by attending to a fixed offset (`repeated_random_tokens` has one n and no prefix)."""
  allowed = np.setdiff1d(np.arange(vocab_size), np.asarray(specials, np.int64))
  lengths = np.asarray(lengths, np.int64)
  body = seq_len - len(bos)
  if lengths.min() < 1 or 2 * lengths.max() > body or body - lengths.min() > len(allowed):
    raise UserError(
      f"lengths {lengths.min()}…{lengths.max()}: 2n must fit {body} tokens after BOS, and the rest of a row in the vocabulary"
    )
  rows = np.empty((count, seq_len), np.int64)
  rows[:, : len(bos)] = bos
  for row in rows:
    n = int(rng.choice(lengths))
    m = int(rng.integers(0, body - 2 * n + 1))
    tokens = rng.choice(allowed, body - n, replace=False)
    r, others = tokens[:n], tokens[n:]
    row[len(bos) :] = np.concatenate([others[:m], r, r, others[m:]])
  return rows.astype(np.int32)


def repeat_chunks(rng, count: int, seq_len: int, chunk: int, vocab_size: int, not_drawn, bos, max_repeat: int = 30):
  """[count, seq_len] rows, each seq_len / chunk `varied_repeat_batch` chunks of `chunk` tokens
  (r of 5 … min(max_repeat, (chunk − len(bos)) / 2) tokens), none drawing an id of `not_drawn`."""
  lengths = range(5, min(max_repeat, (chunk - len(bos)) // 2) + 1)
  parts = [
    varied_repeat_batch(rng, count, chunk, vocab_size, not_drawn, lengths=lengths, bos=bos)
    for _ in range(seq_len // chunk)
  ]
  return np.concatenate(parts, axis=1)


@dataclasses.dataclass(frozen=True)
class RepeatRows:
  """Which rows of a training batch become repeated random sequences (`mix`): the first
  round(fraction · B) rows of each batch, `repeat_chunks` over `ids`, drawn from a generator seeded by
  (seed, process, batch index), so a resumed run draws the same rows."""

  fraction: float
  ids: np.ndarray  # the ids drawn from (the corpus' own, without specials)
  chunk: int
  bos: tuple[int, ...]
  vocab_size: int
  seed: int
  process_index: int = 0

  @functools.cached_property
  def not_drawn(self) -> np.ndarray:
    return np.setdiff1d(np.arange(self.vocab_size), self.ids)

  def mix(self, index: int, batch: dict) -> dict:
    tokens_BT = batch["tokens"]
    B, T = tokens_BT.shape
    k = round(self.fraction * B)
    if k == 0:
      return batch
    rng = np.random.default_rng([self.seed, self.process_index, index])
    rows_BT = repeat_chunks(rng, k, T, self.chunk, self.vocab_size, self.not_drawn, self.bos)
    return {**batch, "tokens": np.concatenate([rows_BT, tokens_BT[k:]])}
