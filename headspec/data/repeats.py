"""A text corpus with repeated random-word sequences mixed in, for studying induction heads.

Olsson et al. (2022) find induction heads by their behaviour on repeated random tokens; a small decoder
trained on short natural or grammar text meets few exact repeats, so `write_repeats` copies the corpus
folder DATA_DIR/text/<source>/ to text/<source>_repeats/ and, after each source document, with
probability `fraction`, inserts one document: a sequence of `min_words`..`max_words` words drawn
uniformly (with replacement) from the source's own words, written `copies` times on one line. The words
are the corpus' own, so the tokenizer trained on the mix has pieces for them. Seeded per split:
the same arguments give byte-identical files.
"""

from __future__ import annotations

import pathlib
import random

from headspec.data.text_tfds import SPLITS, read_text_documents
from headspec.errors import UserError

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
    (out_dir / f"{split}.txt").write_text("\n\n".join(documents) + "\n", encoding="utf-8")
  return out_dir
