"""Treebank words ↔ model sub-word tokens, and windows for sentences longer than the model's context.

Each syntactic word (UD's integer-ID lines; multiword tokens such as "don't" are already split into
"do" + "n't" by headspec.data.treebank) is encoded with `tokenizer.word_pieces`, so a word always owns
>= 1 consecutive token. A word's vector is pooled from its pieces: `first`, `last` or `mean`
(Hewitt & Manning 2019 and Tenney et al. 2019 use the first or the mean; `last` suits causal models,
whose last piece has seen the whole word).

A sentence whose pieces do not fit in `max_len` minus the tokenizer's prefix/suffix specials is cut into
overlapping word-aligned windows (stride about half the context); every word is taken from the window
where it has the most context (encoders: the larger min(left, right) context; decoders: the most left
context), so no word is dropped. Written here because no library aligns UD words to arbitrary tokenizers
with windows.

A sentence is representable when it has words and each word's pieces fit in that context (a word with
more pieces than the context holds would be cut: no window can hold it). Every command that reads a
treebank keeps only representable sentences with `representable` (one rule, here): it logs how many
sentences and words it skipped and why, and refuses with one line only when none is left.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from headspec.errors import UserError
from headspec.io import provenance

POOLINGS = ("first", "last", "mean")


@dataclasses.dataclass(frozen=True)
class Alignment:
  """Model inputs (windows) and where each of the N words of a list of sentences sits in them.

  windows: token ids of each window with the tokenizer's prefix/suffix specials.
  window_sentence: the sentence each window comes from; window_words: the words [first, end) of that
    sentence the window holds (it may hold more words than are taken from it).
  word_window_N, word_start_N, word_end_N: the window holding word n and its pieces' token span
    [start, end) in that window (positions include the prefix specials). Words are numbered in
    sentence order, so word n of the split is word `n - offset` of its sentence.
  word_sentence_N: the sentence of each word (for bootstrap over sentences).
  num_split_sentences: how many sentences needed more than one window.
  num_truncated_words: words with more pieces than the context holds (their pieces are cut to fit).
  representable_U: per sentence, whether it is representable (no word cut, at least one word).
  """

  windows: list[np.ndarray]
  window_sentence: np.ndarray
  window_words: np.ndarray
  word_window_N: np.ndarray
  word_start_N: np.ndarray
  word_end_N: np.ndarray
  word_sentence_N: np.ndarray
  num_split_sentences: int
  num_truncated_words: int
  representable_U: np.ndarray

  @property
  def num_words(self) -> int:
    return len(self.word_window_N)


def _spans(counts: np.ndarray, context: int) -> list[tuple[int, int]]:
  """Word ranges [s, e) of the windows of one sentence whose words have `counts` pieces each (<= context).

  Each window holds as many whole words as fit; the next one starts about half a context later, but no
  later than the previous window's last word, so consecutive windows overlap and every word is covered.
  """
  n = len(counts)
  offsets = np.concatenate([[0], np.cumsum(counts)])
  spans, s = [], 0
  while True:
    e = int(np.searchsorted(offsets, offsets[s] + context, side="right")) - 1  # last e with pieces <= context
    e = max(e, s + 1)
    spans.append((s, e))
    if e >= n:
      return spans
    target = offsets[s] + max(1, context // 2)
    s_next = int(np.searchsorted(offsets, target, side="left"))
    s = max(s + 1, min(s_next, e - 1))  # overlap by at least one word whenever the window holds two


def context_tokens(tokenizer, max_len: int) -> int:
  """Word pieces a window holds: `max_len` minus the tokenizer's prefix/suffix specials (UserError if none)."""
  specials = len(tokenizer.prefix_ids) + len(tokenizer.suffix_ids)
  if max_len - specials < 1:
    raise UserError(f"model max_len={max_len} leaves no room for words after the tokenizer's {specials} special tokens")
  return max_len - specials


# Why a sentence cannot be represented (`_problem`), as logs and summaries say it.
PROBLEMS = {
  "long_word": "a word of more sub-word pieces than the model's context holds",
  "empty": "no words",
}


def _problem(pieces: Sequence[Sequence[int]], context: int) -> str:
  """'' when a sentence with these word pieces is representable, else its PROBLEMS key."""
  if not pieces:
    return "empty"
  return "long_word" if max(len(p) for p in pieces) > context else ""


def align(sentences: Sequence[Sequence[str]], tokenizer, max_len: int, *, causal: bool = False) -> Alignment:
  """Aligns the words of each sentence (a sequence of word strings) to windows of at most `max_len` tokens."""
  prefix, suffix = tuple(tokenizer.prefix_ids), tuple(tokenizer.suffix_ids)
  context = context_tokens(tokenizer, max_len)
  representable = np.ones(len(sentences), bool)
  windows, window_sentence, window_words = [], [], []
  word_window, word_start, word_end, word_sentence = [], [], [], []
  num_split = num_truncated = 0
  for i, words in enumerate(sentences):
    pieces = tokenizer.word_pieces(list(words))
    representable[i] = not _problem(pieces, context)
    for p in pieces:
      num_truncated += len(p) > context
    pieces = [list(p[:context]) for p in pieces]
    counts = np.array([len(p) for p in pieces], np.int64)
    spans = _spans(counts, context)
    num_split += len(spans) > 1
    first_window = len(windows)
    best, choice = np.full(len(words), -1), np.zeros(len(words), np.int64)
    for w, (s, e) in enumerate(spans):
      windows.append(np.asarray(list(prefix) + [t for p in pieces[s:e] for t in p] + list(suffix), np.int32))
      window_sentence.append(i)
      window_words.append((s, e))
      left_W = np.concatenate([[0], np.cumsum(counts[s:e])[:-1]])  # pieces before each word in the window
      right_W = counts[s:e].sum() - left_W - counts[s:e]
      score_W = left_W if causal else np.minimum(left_W, right_W)
      better = score_W > best[s:e]  # ties keep the earlier window
      best[s:e] = np.where(better, score_W, best[s:e])
      choice[s:e] = np.where(better, w, choice[s:e])
    for j in range(len(words)):
      s, _ = spans[choice[j]]
      start = len(prefix) + int(counts[s:j].sum())
      word_window.append(first_window + int(choice[j]))
      word_start.append(start)
      word_end.append(start + int(counts[j]))
      word_sentence.append(i)
  return Alignment(
    windows=windows,
    window_sentence=np.asarray(window_sentence, np.int32),
    window_words=np.asarray(window_words, np.int32).reshape(-1, 2),
    word_window_N=np.asarray(word_window, np.int32),
    word_start_N=np.asarray(word_start, np.int32),
    word_end_N=np.asarray(word_end, np.int32),
    word_sentence_N=np.asarray(word_sentence, np.int32),
    num_split_sentences=num_split,
    num_truncated_words=num_truncated,
    representable_U=representable,
  )


@dataclasses.dataclass(frozen=True)
class Representable:
  """Which sentences of a split a model can represent, and why the others cannot.

  problem_U: per sentence, '' when representable, else its PROBLEMS key; words_U: its words;
  context: the word pieces a window holds.
  """

  where: str
  problem_U: tuple[str, ...]
  words_U: np.ndarray
  context: int

  @property
  def index_U(self) -> np.ndarray:
    """The representable sentences' indices, in order."""
    return np.flatnonzero([not p for p in self.problem_U])

  @property
  def num_skipped(self) -> int:
    return len(self.problem_U) - len(self.index_U)

  @property
  def skipped_words(self) -> int:
    return int(self.words_U.sum() - self.words_U[self.index_U].sum())

  def select(self, items: Sequence) -> list:
    """The representable ones of `items` (one per sentence, e.g. the sentences themselves)."""
    return [items[u] for u in self.index_U]

  def reasons(self) -> str:
    counts = {k: sum(p == k for p in self.problem_U) for k in PROBLEMS}
    why = {"long_word": f"{PROBLEMS['long_word']} ({self.context} tokens after special tokens)"}
    return ", ".join(f"{n} with {why.get(k, PROBLEMS[k])}" for k, n in counts.items() if n)

  def summary(self) -> str:
    """One line: how many sentences (and words) were skipped and why; '' when none was."""
    if not self.num_skipped:
      return ""
    return (
      f"{self.where}: skipped {self.num_skipped} of {len(self.problem_U)} sentences ({self.skipped_words} of "
      f"{int(self.words_U.sum())} words) the model cannot represent: {self.reasons()}"
    )


def representable(
  sentences: Sequence[Sequence[str]],
  tokenizer,
  max_len: int,
  *,
  where: str,
  names: Sequence[str] | None = None,
  log: Callable[[str], None] | None = None,
  required: bool = True,
) -> Representable:
  """Which of `sentences` (each a sequence of word strings) a model with `max_len` tokens can represent.

  The readers of treebanks keep `.select(...)` of their sentences, so one sentence the model cannot hold
  (a word of more pieces than its context) costs that sentence, not the run. Logs `.summary()` when a
  sentence is skipped; a one-line UserError naming `where` and the first sentence (`names`, default its
  index) when none is left, unless `required` is False (optional extras, such as example sentences).
  """
  context = context_tokens(tokenizer, max_len)
  problems = tuple(_problem(tokenizer.word_pieces(list(words)), context) for words in sentences)
  out = Representable(where, problems, np.array([len(w) for w in sentences], np.int64), context)
  provenance.note("unrepresentable_sentences", out.num_skipped, under=where)  # run_info.json
  if required and sentences and not len(out.index_U):
    first = f"sentence {names[0] if names is not None else '#0'}"
    if problems[0] == "long_word":
      counts = [len(p) for p in tokenizer.word_pieces(list(sentences[0]))]
      w = int(np.argmax(counts))
      first += f", word {w} {sentences[0][w][:20]!r} of {counts[w]} pieces"
    raise UserError(
      f"{where}: none of the {len(sentences)} sentences can be represented: {out.reasons()}, so no window can "
      f"hold them (first: {first}); use a model with a longer context"
    )
  if out.num_skipped and log:
    log(f"  {out.summary()}")
  return out


def resolve_pooling(pooling: str, kind: str) -> str:
  """probe.pooling 'auto' → 'last' for decoders (a causal model's last piece is the only one that has
  read the whole word), 'first' for encoders; any other value is returned as is."""
  if pooling == "auto":
    return "last" if kind == "decoder" else "first"
  return pooling


def check_pooling(pooling: str) -> None:
  """UserError unless `pooling` is one of POOLINGS (the one check of probe.pooling)."""
  if pooling not in POOLINGS:
    raise UserError(f"probe.pooling={pooling!r}: use one of {', '.join(POOLINGS)}")


def pooling_matrix(start_BW: np.ndarray, end_BW: np.ndarray, num_tokens: int, pooling: str) -> np.ndarray:
  """[B, W, T] float32 weights that pool word w's pieces [start, end) of row b: a one-hot row on the first or
  last piece, or 1/len on each piece for `mean`. Padding words (start == end) get all-zero rows."""
  check_pooling(pooling)
  t_T = np.arange(num_tokens)
  start, end = start_BW[..., None], end_BW[..., None]
  real = end > start
  if pooling == "first":
    return ((t_T == start) & real).astype(np.float32)
  if pooling == "last":
    return ((t_T == end - 1) & real).astype(np.float32)
  inside = (t_T >= start) & (t_T < end)
  return inside.astype(np.float32) / np.maximum(end - start, 1).astype(np.float32)
