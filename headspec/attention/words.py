"""Word-level attention (Clark et al. 2019, §4.1), reduced on device so only word-level numbers leave it.

A sentence's words are aligned to the model's sub-word pieces, and long sentences cut into windows, by
headspec/words/alignment.py (the same alignment and windows as probing), and batched, padded and pooled by
headspec/words/batches.py (the same batches, rows and word matrices). For one window, with `to_WT[w,t]
= 1` when token t is a piece of word w and `from_WT = to_WT / (pieces of w)`:

  attn_WW = from_WT · A_TS · to_WTᵀ      attention FROM a word = mean of its pieces' rows,
                                          attention TO a word   = sum of its pieces' columns
  special_W = from_WT · A_TS · s_S       the share of each word's attention on the special tokens
                                          ([CLS]/[SEP] of BERT, a BOS prefix), kept for the delimiter role

Special tokens get no row or column of their own in the word map; each row of `attn_WW` plus
`special_W` sums to 1. A word's row is taken from the window alignment.py assigns it (where it has the most
context: encoders the larger min(left, right), decoders the most left context); in that row, words of
the sentence outside that window get 0 (the model never saw them together). A sentence with a word of
more pieces than the context holds cannot be represented (no window can hold that word): the command
keeps only representable sentences (align.representable, which counts what it skips), and these
functions refuse any other (UserError).

Everything a score needs is computed per query word under `jax.jit` (`query_stats`): the most-attended
other word (Clark §4.2), the most-attended column (Voita et al. 2019), the mass on the previous / same /
next word, on specials and on punctuation (Clark §3), and the entropy of the row (Clark §3). Only
these [L, H, words] arrays are copied back; full word maps only for the few example sentences.

Shape letters (headspec/model/transformer.py's glossary): L layers, B windows of a batch, H heads, T/S tokens, W words
of one window — used twice for a word map, `attn_LBHWW[l, b, h, w, v]` = how much word w attends to
word v of the same window — and N words of a split (query words) or of one sentence (`attn_LHNN`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from headspec.errors import UserError
from headspec.parallel import mesh as mesh_lib
from headspec.parallel.compilations import program_cache
from headspec.words import alignment as align_lib
from headspec.words import batches as words_lib

STAT_FIELDS = ("prev", "self", "next", "special", "punct", "entropy") + (
  "token_prev",
  "token_prev_n",
  "token_next",
  "token_next_n",
)


def pool_words(probs_LBHTS, to_BWT, special_BT):
  """Token attention -> word attention (Clark et al. 2019 §4.1: sum over a word's columns, mean over its rows).

  Returns (attn_LBHWW, special_LBHW: Σ over special columns, special_plogp_LBHW: Σ p·log p over the
  special columns, special_max_LBHW: the largest single special column). Padding words (no pieces) get
  zero rows and columns.
  """
  f32 = jnp.float32
  to_BWT = to_BWT.astype(f32)
  from_BWT = to_BWT / jnp.maximum(to_BWT.sum(-1, keepdims=True), 1.0)
  rows_LBHWS = jnp.einsum("bwt,lbhts->lbhws", from_BWT, probs_LBHTS.astype(f32))
  attn_LBHWW = jnp.einsum("lbhws,bvs->lbhwv", rows_LBHWS, to_BWT)
  special_LBHWS = rows_LBHWS * special_BT.astype(f32)[None, :, None, None, :]
  special_plogp_LBHW = jax.scipy.special.xlogy(special_LBHWS, special_LBHWS).sum(-1)
  return attn_LBHWW, special_LBHWS.sum(-1), special_plogp_LBHW, special_LBHWS.max(-1)


def query_stats(
  attn_LBHWW, special_LBHW, special_plogp_LBHW, special_max_LBHW, punct_BW, word_valid_BW, row_owner_BW, causal
):
  """Per query word w of every head: what the scores read (window-local word indices).

  argmax_other: argmax_{v visible, v != w} attn[w, v] (Clark et al. 2019 §4.2), -1 when no other visible
    word gets any weight (a decoder's first word);
  argmax_col_other / col_max_other: per KEY word w, the other word that attends to it most,
    argmax_{v != w, w visible to v} attn[v, w] over the rows this window owns (`row_owner_BW`: the words
    whose row comes from this window), and that weight (-1 when none) — Clark et al.'s released second
    direction (attention-analysis `attn_head_predictor(mode="transpose")`); `word_stats` keeps, per word,
    the window whose owned rows give the largest weight;
  argmax_any: argmax over every column, the word itself and the special tokens included (Voita et al.
    2019), -1 when a special token gets the most;
  prev / self / next: attn[w, w-1], attn[w, w], attn[w, w+1] (Clark §3, here between words);
  special: the mass on special tokens; punct: Σ_v attn[w, v]·punct[v] (Clark §3);
  entropy: -Σ p log p over the words and the special tokens (nats; Clark §3).
  `causal`: a decoder's word sees only words v <= w.
  """
  W = attn_LBHWW.shape[-1]
  q_W1, k_1W = jnp.arange(W)[:, None], jnp.arange(W)[None, :]
  visible_BWW = word_valid_BW[:, :, None] & word_valid_BW[:, None, :]
  if causal:
    visible_BWW = visible_BWW & (k_1W <= q_W1)[None]
  other_BWW = visible_BWW & (k_1W != q_W1)[None]
  masked = jnp.where(other_BWW[None, :, None], attn_LBHWW, -1.0)
  argmax_other = jnp.where(masked.max(-1) > 0, masked.argmax(-1), -1)
  column = jnp.where((other_BWW & row_owner_BW[:, :, None])[None, :, None], attn_LBHWW, -1.0)
  col_max_other = column.max(-2)
  argmax_col_other = jnp.where(col_max_other > 0, column.argmax(-2), -1)
  seen = jnp.where(visible_BWW[None, :, None], attn_LBHWW, -1.0)
  argmax_any = jnp.where(seen.max(-1) >= special_max_LBHW, seen.argmax(-1), -1)
  zero = jnp.zeros(attn_LBHWW.shape[:-1][:-1] + (1,), attn_LBHWW.dtype)
  prev = jnp.concatenate([zero, jnp.diagonal(attn_LBHWW, offset=-1, axis1=-2, axis2=-1)], -1)
  nxt = jnp.concatenate([jnp.diagonal(attn_LBHWW, offset=1, axis1=-2, axis2=-1), zero], -1)
  entropy = -(jax.scipy.special.xlogy(attn_LBHWW, attn_LBHWW).sum(-1) + special_plogp_LBHW)
  return dict(
    argmax_other=argmax_other.astype(jnp.int32),
    argmax_any=argmax_any.astype(jnp.int32),
    argmax_col_other=argmax_col_other.astype(jnp.int32),
    col_max_other=col_max_other,
    prev=prev,
    self=jnp.diagonal(attn_LBHWW, axis1=-2, axis2=-1),
    next=nxt,
    special=special_LBHW,
    punct=jnp.einsum("lbhwv,bv->lbhw", attn_LBHWW, punct_BW.astype(attn_LBHWW.dtype)),
    entropy=entropy,
  )


def token_positional(probs_LBHTS, valid_BT, owned_BWT, causal: bool) -> dict:
  """Voita et al. 2019's positional test on TOKENS, summed per query word: token_prev[w] = how many of word w's
  pieces put their largest weight on the token just before them (any token: a piece, a special),
  token_prev_n[w] = how many of its pieces have a token there; likewise token_next (never for a decoder).
  `owned_BWT`: 1 where token t is a piece of word w and w's row comes from this window. A word-level map
  cannot hold this rule: a word's mean row over several pieces rarely peaks at the previous WORD."""
  T = probs_LBHTS.shape[-1]
  argmax_LBHT = probs_LBHTS.argmax(-1)
  t_T = jnp.arange(T)
  out = {}
  for name, k in (("token_prev", -1), ("token_next", 1)):
    there_BT = jnp.roll(valid_BT, -k, axis=1) & (t_T + k >= 0) & (t_T + k < T) & valid_BT
    if causal and k > 0:
      there_BT = jnp.zeros_like(there_BT)
    hit_LBHT = (argmax_LBHT == (t_T + k)) & there_BT[None, :, None]
    owned = owned_BWT.astype(jnp.float32)
    out[name] = jnp.einsum("bwt,lbht->lbhw", owned, hit_LBHT.astype(jnp.float32))
    n_BW = jnp.einsum("bwt,bt->bw", owned, there_BT.astype(jnp.float32))
    out[f"{name}_n"] = jnp.broadcast_to(n_BW[None, :, None], out[name].shape)
  return out


@program_cache(8)
def _forward(graphdef, causal: bool, maps: bool):
  """jit(state, batch...) -> query_stats (maps=False) or (attn_LBHWW, special_LBHW) (maps=True)."""

  @mesh_lib.jit
  def forward(state, tokens_BT, valid_BT, to_BWT, special_BT, punct_BW, word_valid_BW, row_owner_BW):
    _, inter = nnx.merge(graphdef, state)(tokens_BT, valid_BT=valid_BT, capture=("pattern",))
    pooled = pool_words(inter.pattern_LBHTS, to_BWT, special_BT)
    if maps:
      return pooled[0], pooled[1]
    owned_BWT = to_BWT * row_owner_BW[:, :, None]
    return {
      **query_stats(*pooled, punct_BW, word_valid_BW, row_owner_BW, causal),
      **token_positional(inter.pattern_LBHTS, valid_BT, owned_BWT, causal),
    }

  return forward


@dataclasses.dataclass(frozen=True)
class WordStats:
  """`query_stats` of every word of a split, in word order (N words), as sentence-global word indices.

  argmax_other_LHN / argmax_any_LHN: the index n of the chosen word in the split (-1: none / a special
  token); argmax_col_other_LHN: per word, the index n of the other word that attends to it most (-1: none);
  the other fields [L, H, N] float32 (STAT_FIELDS). window_first_N / window_end_N: the words
  [first, end) of the window the word's row comes from; word_sentence_N: its sentence;
  sentence_first_U: the index of each sentence's first word; visible_specials_N: special tokens the
  word can attend to (all of them for encoders, the prefix for decoders).
  """

  argmax_other_LHN: np.ndarray
  argmax_any_LHN: np.ndarray
  argmax_col_other_LHN: np.ndarray
  values: dict
  window_first_N: np.ndarray
  window_end_N: np.ndarray
  word_sentence_N: np.ndarray
  sentence_first_U: np.ndarray
  visible_specials_N: np.ndarray
  causal: bool
  num_split_sentences: int

  @property
  def num_words(self) -> int:
    return len(self.word_sentence_N)

  def visible_words_N(self) -> np.ndarray:
    """How many words each query word can attend to (itself included)."""
    n_N = np.arange(self.num_words)
    return (n_N + 1 - self.window_first_N) if self.causal else (self.window_end_N - self.window_first_N)


@dataclasses.dataclass(frozen=True)
class _Windows:
  """align.Alignment plus, per window, its words' global indices and piece counts."""

  al: align_lib.Alignment
  first_word_of_window: np.ndarray  # global index of the window's first word
  counts_N: np.ndarray  # pieces per word
  sentence_first_U: np.ndarray


def _align(sentences: Sequence[Sequence[str]], tokenizer, max_len: int, causal: bool, names=None) -> _Windows:
  al = align_lib.align(sentences, tokenizer, max_len, causal=causal)
  counts_N = (al.word_end_N - al.word_start_N).astype(np.int64)
  if not al.representable_U.all():  # callers keep align.representable(...).select(sentences)
    u = int(np.flatnonzero(~al.representable_U)[0])
    raise UserError(
      f"{int((~al.representable_U).sum())} sentence(s) cannot be represented: a word with more sub-word pieces "
      f"than the model's context holds, so no window can hold it (first: sentence "
      f"{names[u] if names is not None else f'#{u}'}); keep align.representable(...).select(sentences)"
    )
  sentence_first_U = np.searchsorted(al.word_sentence_N, np.arange(len(sentences))).astype(np.int64)
  first_word = sentence_first_U[al.window_sentence] + al.window_words[:, 0]
  return _Windows(al, first_word.astype(np.int64), counts_N, sentence_first_U)


def _batch_inputs(win: _Windows, windows, T: int, B: int, tokenizer, punct_N):
  """Padded model inputs and word matrices of `windows` (indices into al.windows): the rows, the
  piece-summing word matrix and the special tokens of headspec/words/batches.py, and per word slot its
  punctuation flag, whether it holds a word and whether its row comes from this window."""
  al = win.al
  prefix = len(tokenizer.prefix_ids)
  sequences = []
  punct_BW = np.zeros((B, T), bool)
  word_valid_BW = np.zeros((B, T), bool)
  row_owner_BW = np.zeros((B, T), bool)
  for b, w in enumerate(windows):
    s, e = al.window_words[w]
    first = win.first_word_of_window[w]
    counts = win.counts_N[first : first + (e - s)]
    starts = prefix + np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
    sequences.append((al.windows[w], starts, starts + counts))
    word_valid_BW[b, : e - s] = True
    row_owner_BW[b, : e - s] = al.word_window_N[first : first + (e - s)] == w
    punct_BW[b, : e - s] = punct_N[first : first + (e - s)]
  tokens_BT, _, segment_BT, start_BW, end_BW = words_lib.sequence_rows(sequences, T, B, tokenizer.pad_id)
  to_BWT = words_lib.word_matrix(start_BW, end_BW, T, "sum")
  special_BT = words_lib.special_tokens([len(ids) for ids, _, _ in sequences], T, B, prefix, len(tokenizer.suffix_ids))
  return tokens_BT, segment_BT > 0, to_BWT, special_BT, punct_BW, word_valid_BW, row_owner_BW


def word_stats(
  model,
  tokenizer,
  sentences: Sequence[Sequence[str]],
  punct_N: np.ndarray,
  *,
  batch_tokens: int = 2048,
  names: Sequence[str] | None = None,
  log: Callable[[str], None] | None = None,
) -> WordStats:
  """`query_stats` of every word of `sentences` (each a sequence of word strings).

  punct_N: True for the punctuation words (UPOS PUNCT), in word order. names: sentence ids for errors.
  """
  if not sentences:
    raise UserError("no sentences to read attention from")
  cfg = model.cfg
  causal = cfg.kind == "decoder"
  win = _align(sentences, tokenizer, cfg.max_len, causal, names)
  al = win.al
  N, L, H = al.num_words, cfg.num_layers, cfg.num_heads
  punct_N = np.asarray(punct_N, bool)
  if len(punct_N) != N:
    raise ValueError(f"punct_N has {len(punct_N)} entries for {N} words")
  graphdef, state = nnx.split(model)
  forward = _forward(graphdef, causal, False)
  argmax_other = np.full((L, H, N), -1, np.int32)
  argmax_any = np.full((L, H, N), -1, np.int32)
  argmax_col, col_max = np.full((L, H, N), -1, np.int32), np.full((L, H, N), -1.0, np.float32)
  values = {f: np.zeros((L, H, N), np.float32) for f in STAT_FIELDS}
  of_window = words_lib.words_of_windows(al)

  def dispatch(T, B, windows):
    return forward(state, *_batch_inputs(win, windows, T, B, tokenizer, punct_N)), windows

  def collect(out, windows):
    out = jax.device_get(out)
    b_idx, w_idx, n_idx = [], [], []
    for b, w in enumerate(windows):
      mine = of_window[w]  # words whose row comes from window w
      b_idx.append(np.full(len(mine), b))
      w_idx.append(mine - win.first_word_of_window[w])
      n_idx.append(mine)
    b_idx, w_idx, n_idx = (np.concatenate(x).astype(np.int64) for x in (b_idx, w_idx, n_idx))
    first = win.first_word_of_window[al.word_window_N[n_idx]]
    for name, target in (("argmax_other", argmax_other), ("argmax_any", argmax_any)):
      local = np.moveaxis(out[name][:, b_idx, :, w_idx], 0, -1)  # [L, H, K]
      target[:, :, n_idx] = np.where(local >= 0, local + first, -1)
    for f in STAT_FIELDS:
      values[f][:, :, n_idx] = np.moveaxis(out[f][:, b_idx, :, w_idx], 0, -1)
    for b, w in enumerate(windows):  # columns: every word of the window; keep the window with the largest weight
      w0, count = win.first_word_of_window[w], al.window_words[w, 1] - al.window_words[w, 0]
      keys = slice(w0, w0 + count)
      value, arg = out["col_max_other"][:, b, :, :count], out["argmax_col_other"][:, b, :, :count]
      better = value > col_max[:, :, keys]
      col_max[:, :, keys] = np.where(better, value, col_max[:, :, keys])
      argmax_col[:, :, keys] = np.where(better, np.where(arg >= 0, arg + w0, -1), argmax_col[:, :, keys])

  pending = None
  lengths = np.array([len(w) for w in al.windows])
  for T, B, windows in words_lib.window_batches(lengths, cfg.max_len, batch_tokens):  # dispatch, then read back
    current = dispatch(T, B, windows)
    if pending is not None:
      collect(*pending)
    pending = current
  if pending is not None:
    collect(*pending)
  window_first_N = win.first_word_of_window[al.word_window_N]
  window_end_N = window_first_N + (al.window_words[al.word_window_N, 1] - al.window_words[al.word_window_N, 0])
  visible = len(tokenizer.prefix_ids) + (0 if causal else len(tokenizer.suffix_ids))
  if log:
    log(f"  attention of {len(sentences)} sentences, {N} words ({al.num_split_sentences} split into windows)")
  return WordStats(
    argmax_other_LHN=argmax_other,
    argmax_any_LHN=argmax_any,
    argmax_col_other_LHN=argmax_col,
    values=values,
    window_first_N=window_first_N,
    window_end_N=window_end_N,
    word_sentence_N=al.word_sentence_N.astype(np.int64),
    sentence_first_U=win.sentence_first_U,
    visible_specials_N=np.full(N, visible, np.int64),
    causal=causal,
    num_split_sentences=al.num_split_sentences,
  )


def stats_from_maps(maps, punct_N, *, causal: bool = False, num_specials: int = 2) -> WordStats:
  """`WordStats` of given word maps [(attn_LHNN, special_LHN)], one window per sentence, as `word_stats`
  computes them on device (`query_stats`); the special mass counts as one special token. For
  hand-built maps (tests) and for `sentence_maps` output."""
  argmax_other, argmax_any, argmax_col, values, first = [], [], [], {f: [] for f in STAT_FIELDS}, 0
  sentence_first, window_first, window_end, sentence = [], [], [], []
  for u, (attn_LHNN, special_LHN) in enumerate(maps):
    N = attn_LHNN.shape[-1]
    s = jnp.asarray(special_LHN, jnp.float32)[:, None]
    out = jax.device_get(
      query_stats(
        jnp.asarray(attn_LHNN, jnp.float32)[:, None],
        s,
        jax.scipy.special.xlogy(s, s),
        s,
        jnp.asarray(punct_N[first : first + N])[None],
        jnp.ones((1, N), bool),
        jnp.ones((1, N), bool),
        causal,
      )
    )
    argmax_other.append(np.where(out["argmax_other"][:, 0] >= 0, out["argmax_other"][:, 0] + first, -1))
    argmax_any.append(np.where(out["argmax_any"][:, 0] >= 0, out["argmax_any"][:, 0] + first, -1))
    argmax_col.append(np.where(out["argmax_col_other"][:, 0] >= 0, out["argmax_col_other"][:, 0] + first, -1))
    # Token-level rules read the word map as tokens: one piece per word after one special token (its mass).
    probs_LHTT = np.zeros(attn_LHNN.shape[:2] + (N + 1, N + 1), np.float32)
    probs_LHTT[:, :, 0, 0] = 1.0
    probs_LHTT[:, :, 1:, 0], probs_LHTT[:, :, 1:, 1:] = special_LHN, attn_LHNN
    owned_WT = np.eye(N, N + 1, 1, dtype=np.float32)
    out.update(jax.device_get(token_positional(probs_LHTT[:, None], np.ones((1, N + 1), bool), owned_WT[None], causal)))
    for f in STAT_FIELDS:
      values[f].append(out[f][:, 0])
    sentence_first.append(first)
    window_first += [first] * N
    window_end += [first + N] * N
    sentence += [u] * N
    first += N
  return WordStats(
    argmax_other_LHN=np.concatenate(argmax_other, -1).astype(np.int32),
    argmax_any_LHN=np.concatenate(argmax_any, -1).astype(np.int32),
    argmax_col_other_LHN=np.concatenate(argmax_col, -1).astype(np.int32),
    values={f: np.concatenate(v, -1) for f, v in values.items()},
    window_first_N=np.asarray(window_first, np.int64),
    window_end_N=np.asarray(window_end, np.int64),
    word_sentence_N=np.asarray(sentence, np.int64),
    sentence_first_U=np.asarray(sentence_first, np.int64),
    visible_specials_N=np.full(first, 0 if causal else num_specials, np.int64),
    causal=causal,
    num_split_sentences=0,
  )


def sentence_maps(model, tokenizer, sentences: Sequence[Sequence[str]]) -> list[tuple[np.ndarray, np.ndarray]]:
  """Word-level maps of a few sentences: [(attn_LHNN, special_LHN)] with N the sentence's words.

  Row n comes from the window alignment.py assigns word n (columns outside that window are 0), as in
  `word_stats`. For pictures and examples; a split's scores use `word_stats`.
  """
  cfg = model.cfg
  win = _align(sentences, tokenizer, cfg.max_len, cfg.kind == "decoder")
  al = win.al
  graphdef, state = nnx.split(model)
  forward = _forward(graphdef, cfg.kind == "decoder", True)
  L, H = cfg.num_layers, cfg.num_heads
  out = []
  for u, words in enumerate(sentences):
    N, first_u = len(words), int(win.sentence_first_U[u])
    attn_LHNN = np.zeros((L, H, N, N), np.float32)
    special_LHN = np.zeros((L, H, N), np.float32)
    mine = np.flatnonzero(al.window_sentence == u)
    for T, B, (i,) in words_lib.window_batches([len(al.windows[w]) for w in mine], cfg.max_len, 1):
      w = int(mine[i])
      attn, special = jax.device_get(forward(state, *_batch_inputs(win, [w], T, B, tokenizer, np.zeros(al.num_words))))
      s, e = al.window_words[w]
      rows = np.flatnonzero(al.word_window_N[first_u : first_u + N] == w)  # this window's rows
      attn_LHNN[:, :, rows, s:e] = attn[:, 0][:, :, rows - s, : e - s]
      special_LHN[:, :, rows] = special[:, 0][:, :, rows - s]
    out.append((attn_LHNN, special_LHN))
  return out


@program_cache(8)
def _patterns(graphdef):
  """jit(state, tokens_BT) -> (logits, Intermediates with the attention pattern) of unpadded rows."""

  @mesh_lib.jit
  def forward(state, tokens_BT):
    return nnx.merge(graphdef, state)(tokens_BT, capture=("pattern",))

  return forward


def token_maps(model, tokenizer, words: Sequence[str]) -> tuple[np.ndarray, list[str]]:
  """(probs_LHTT, token labels) of one sentence's first window, special tokens included: the input of
  attention rollout and flow (headspec/attention/flow.py)."""
  cfg = model.cfg
  al = align_lib.align([list(words)], tokenizer, cfg.max_len, causal=cfg.kind == "decoder")
  ids = al.windows[0]
  graphdef, state = nnx.split(model)
  _, inter = _patterns(graphdef)(state, ids[None])
  probs_LHTT = np.asarray(jax.device_get(inter.pattern_LBHTS))[:, 0]
  return probs_LHTT, [token_label(tokenizer, int(i)) for i in ids]


def token_label(tokenizer, token_id: int) -> str:
  """A token's text for figure labels (Hugging Face: its vocabulary entry, e.g. [CLS]; else decoded)."""
  backend = getattr(tokenizer, "backend", None)
  if backend is not None and backend.id_to_token(token_id) is not None:
    return backend.id_to_token(token_id)
  return tokenizer.decode([token_id]).strip() or f"<{token_id}>"
