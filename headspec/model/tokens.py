"""Token helpers for notebooks: a text's token ids, each token's text, one token's id (TransformerLens's
`to_tokens`, `to_str_tokens`, `to_single_token`), and the words of a text cut at token boundaries for `run`.

Text is tokenized exactly as written: `tokenizer.encode(text)` on the whole string, with the tokenizer's
own special tokens around it (BERT's [CLS] … [SEP]; none for GPT-2), as `patch` and `capture` read it.
`prepend_bos` chooses the start: None keeps the tokenizer's specials (what the model was trained with);
True opens with the beginning-of-sequence token (the prefix specials, else the document separator EOS:
GPT-2's <|endoftext|>, TransformerLens's BOS for GPT-2; data/tokenizer.bos_ids); False drops the
prefix specials. The suffix specials (BERT's [SEP]) follow the text in every case.
No JAX: numpy and the tokenizer only.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from headspec.data.tokenizer import bos_ids
from headspec.errors import UserError

# The words of `run` and `split_words`: runs of letters/digits (with inner ' or -), and each punctuation mark.
WORD = re.compile(r"\w+(?:['’-]\w+)*|[^\w\s]")


def token_ids(tokenizer, text: str, prepend_bos: bool | None = None) -> list[int]:
  """`text` tokenized as written, with the specials `prepend_bos` says (module docstring)."""
  if prepend_bos is None:
    prefix = list(tokenizer.prefix_ids)
  else:
    prefix = bos_ids(tokenizer) if prepend_bos else []
  return [int(i) for i in (*prefix, *tokenizer.encode(text), *tokenizer.suffix_ids)]


def str_token(tokenizer, token_id: int) -> str:
  """One token's text as TransformerLens's to_str_tokens shows it: the Hugging Face tokenizer's
  `decode([id])` with special tokens kept (GPT-2: ' store', '<|endoftext|>'; BERT: '[CLS]', '##ing'); a
  SentencePiece token's piece with its '▁' as a space (' store'); else `decode([id])`."""
  token_id = int(token_id)
  backend = getattr(tokenizer, "backend", None)  # headspec.pretrained.hf_tokenizer.HFTokenizer
  if backend is not None:
    return backend.decode([token_id], skip_special_tokens=False)
  sp = getattr(tokenizer, "_sp", None)  # headspec.data.tokenizer.SentencePieceTokenizer
  if sp is not None:
    return sp.id_to_piece(token_id).replace("\u2581", " ")
  return tokenizer.decode([token_id])


def check_ids(ids, vocab_size: int, what: str) -> list[int]:
  """A 1-D sequence of token ids in the vocabulary, as a list; UserError naming `what` otherwise. The one
  check of token ids given to the API (generate, capture, patch, to_str_tokens): a bool is no token id
  (numpy would make [True, 5] the ids [1, 5])."""
  if not isinstance(ids, np.ndarray) and isinstance(ids, Sequence) and not isinstance(ids, str):
    for i, t in enumerate(ids):
      if isinstance(t, bool | np.bool_):
        raise UserError(f"{what}[{i}]={t!r}: a bool is not a token id; give ints")
  array = np.asarray(ids)
  if array.ndim != 1 or not (array.dtype.kind in "iu" or array.size == 0):
    kind = "bools" if array.dtype.kind == "b" else f"an array of shape {array.shape}"
    raise UserError(f"{what}: expected a text or a 1-D list of token ids (ints), got {kind}")
  bad = [int(i) for i in array if not 0 <= i < vocab_size]
  if bad:
    raise UserError(f"{what}: token id {bad[0]} is outside the vocabulary 0..{vocab_size - 1}")
  return [int(i) for i in array]


def text_words(tokenizer, text: str) -> tuple[list[str], list[int], np.ndarray, np.ndarray]:
  """(words, ids, start_N, end_N): `text` tokenized as written (no specials) and its words (`WORD`) as
  runs of whole tokens: word n is ids[start_N[n]:end_N[n]].

  A word ends where the encoding of the text up to its end is a prefix of the whole text's encoding (so
  the tokens before it are the same with or without what follows). A token that spans two words (a
  SentencePiece piece '▁dog.') joins them into one word (the text between them as written); a word
  without tokens of its own joins the next. Tokens before the first word (spaces) belong to it and tokens
  after the last (trailing spaces) to the last, so every token belongs to exactly one word.
  """
  ids = [int(i) for i in tokenizer.encode(text)]
  spans = [(m.start(), m.end()) for m in WORD.finditer(text)]
  if not spans or not ids:
    return [], ids, np.zeros(0, np.int64), np.zeros(0, np.int64)
  words, starts, ends = [], [], []
  first_char, done = spans[0][0], 0  # the current group's first character; tokens assigned so far
  for n, (_, end) in enumerate(spans):
    if n == len(spans) - 1:
      count = len(ids)
    else:
      prefix = tokenizer.encode(text[:end])
      count = len(prefix) if list(prefix) == ids[: len(prefix)] else -1
    if count <= done and n < len(spans) - 1:  # no clean boundary here, or no tokens yet: the group goes on
      continue
    if count <= done:  # the last word has no tokens of its own: it joins the group before
      if not words:
        break
      words[-1] = text[starts[-1][1] : end]
      continue
    words.append(text[first_char:end])
    starts.append((done, first_char))
    ends.append(count)
    done = count
    if n + 1 < len(spans):
      first_char = spans[n + 1][0]
  start_N = np.asarray([s for s, _ in starts], np.int64)
  return words, ids, start_N, np.asarray(ends, np.int64)


def texts_or_ids(value, what: str) -> list:
  """One text, a list of texts, one list of ids, a list of id lists or a [B, T] array -> a list of
  prompts (each a text or a list of ids)."""
  if isinstance(value, str):
    return [value]
  array_like = type(value).__name__ in ("ndarray", "ArrayImpl") or hasattr(value, "__array__")
  if array_like:
    array = np.asarray(value)
    if array.ndim == 1:
      return [array.tolist()]
    if array.ndim == 2:
      return [row.tolist() for row in array]
    raise UserError(f"{what}: an array of shape {array.shape}; give [T] or [B, T] token ids")
  if not isinstance(value, Sequence) or not len(value):
    raise UserError(f"{what}: give a text, a list of texts or token ids ([T] or [B, T])")
  if all(isinstance(v, int | np.integer) for v in value):  # bools too: check_ids refuses them
    return [list(value)]
  return list(value)
