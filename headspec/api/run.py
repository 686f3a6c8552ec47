"""`headspec.run`: sentences through the model, each word's vectors and attention (Clark et al. 2019's word level).

Part of the notebook API (docs/api.md); `import headspec` reaches it lazily (headspec/__init__.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from headspec import arguments as check
from headspec.api.load import as_loaded, check_heads, head_mask_array
from headspec.attention import words as attention_words
from headspec.errors import UserError
from headspec.model import edits
from headspec.model import tokens as tokens_lib
from headspec.parallel import mesh as mesh_lib
from headspec.parallel.compilations import program_cache
from headspec.words import alignment as align_lib
from headspec.words import batches as words_layer
from headspec.words.alignment import resolve_pooling

_WORD = tokens_lib.WORD  # words and punctuation marks


@check.arguments(text=check.text)
def split_words(text: str) -> list[str]:
  """Words of a text as `run` splits it: runs of letters/digits (with inner ' or -), and each punctuation mark."""
  return _WORD.findall(text)


def _sentences(sentences) -> list[str | list[str]]:
  """The `sentences` rule of `run`: a text, a list of texts, or a list of word lists -> texts (kept as
  written: `run` tokenizes them whole) and word lists; Wrong naming a wrong type, an empty word or
  sentence, or a lone surrogate (sentences[u], sentences[u][n])."""
  if isinstance(sentences, str):
    sentences = [sentences]
  elif not isinstance(sentences, Sequence | np.ndarray):
    raise check.Wrong(
      f"={check.short(sentences)} must be a text (str), a list of texts or a list of word lists, "
      f"not {type(sentences).__name__}"
    )
  if not len(sentences):
    raise check.Wrong("=[] is empty: give a text (str), a list of texts or a list of word lists")
  out = []
  for u, sentence in enumerate(sentences):
    if isinstance(sentence, str):
      words = _WORD.findall(sentence)
      problem = check.unicode_problem(sentence)
    elif isinstance(sentence, Sequence | np.ndarray):
      words = list(sentence)
      for n, word in enumerate(words):
        if not isinstance(word, str) or not word.strip():
          raise check.Wrong(f"[{u}][{n}]={check.short(word)}: every word must be a non-empty text (str)")
      problem = next(filter(None, map(check.unicode_problem, words)), None)
    else:
      raise check.Wrong(
        f"[{u}]={check.short(sentence)} is neither a text nor a list of words but a {type(sentence).__name__}"
      )
    if problem:
      raise check.Wrong(f"[{u}]: {problem}; give valid Unicode text")
    if not words:
      raise check.Wrong(f"[{u}]={check.short(sentence)} has no words")
    out.append(str(sentence) if isinstance(sentence, str) else [str(w) for w in words])
  return out


@dataclasses.dataclass(frozen=True)
class Captured:
  """One sentence through the model (numpy arrays, float32).

  Pieces (the model's tokens, the tokenizer's special tokens included; T of them):
    pieces: each piece's text; tokens_T: their ids; logits_TV: the LM head's logits (meaningless where
    the LM head is untrained, `Loaded.lm_head` False, e.g. all-MiniLM-L6-v2);
    pattern_LHTS: each head's attention map A_h; z_LTHK: each head's context vector Z_h = A_h V_h (before
    the head mask and W_O); resid_post_LTD: the residual stream after each block; embeddings_TD: block 0's input.
  Words (N of them; word n is pieces [piece_start_N[n], piece_end_N[n])):
    words; z_NLHK, resid_post_NLD, embeddings_ND: pooled from each word's pieces per `pooling` (as probing's
    features: 'first', 'last' or 'mean', as resolved from 'auto'); attention_LHNN[l, h, n, m]: how much word n attends to word m
    (mean over n's pieces of the sum over m's pieces: the attention analyses' pooling, Clark et al. 2019
    §4.1); special_LHN: each word's attention on the special tokens (each row of attention plus special sums to 1).
  """

  words: list[str]
  pieces: list[str]
  tokens_T: np.ndarray
  piece_start_N: np.ndarray
  piece_end_N: np.ndarray
  logits_TV: np.ndarray
  pattern_LHTS: np.ndarray
  z_LTHK: np.ndarray
  resid_post_LTD: np.ndarray
  embeddings_TD: np.ndarray
  z_NLHK: np.ndarray
  resid_post_NLD: np.ndarray
  embeddings_ND: np.ndarray
  attention_LHNN: np.ndarray
  special_LHN: np.ndarray
  pooling: str

  @check.arguments(layer=check.integer(), head=check.integer())
  def head_attention(self, layer: int, head: int) -> np.ndarray:
    """[N, N] word-level attention of one head (UserError when out of range)."""
    L, H = self.attention_LHNN.shape[:2]
    check_heads(_Shape(L, H), [(layer, head)], "head_attention")
    return self.attention_LHNN[layer, head]


@dataclasses.dataclass(frozen=True)
class _Shape:
  num_layers: int
  num_heads: int


_RUN_SITES = ("pattern", "z", "resid_post", "embeddings")


@program_cache(8)
def _capture_forward(graphdef):
  """jit(state, (tokens_BT, positions_BT, segment_BT, pool_BWT), head_mask_LH, to_BWT, special_BT) ->
  (logits, Intermediates, the sites pooled per word by headspec/words/batches.py, word attention, special attention)."""

  @mesh_lib.jit
  def forward(state, inputs, head_mask_LH, to_BWT, special_BT):
    *rows, pool_BWT = inputs
    model = nnx.merge(graphdef, state)
    logits_BTV, inter = words_layer.forward_rows(model, rows, {"z": edits.head_mask(head_mask_LH)}, _RUN_SITES)
    pooled = words_layer.pool_sites(pool_BWT, inter, ("z", "resid_post", "embeddings"))
    attn_LBHWW, special_LBHW, _, _ = attention_words.pool_words(inter.pattern_LBHTS, to_BWT, special_BT)
    return logits_BTV, inter, pooled, attn_LBHWW, special_LBHW

  return forward


@check.arguments(model=as_loaded, sentences=_sentences, pooling=check.text)
def run(model, sentences, head_mask=None, *, pooling: str = "auto") -> list[Captured]:
  """Runs sentences through a model and returns, per sentence, its captured activations (`Captured`).

  model: `load(...)`'s result or a (model, tokenizer) pair. sentences: a text, a list of texts or a list
  of word lists (e.g. a treebank's words). A text is tokenized exactly as written (its tokens are
  `to_tokens(model, text)`'s, as `patch` and `capture` read it); its words are `split_words`'s, cut at
  token boundaries (a token spanning two words, such as a SentencePiece '▁dog.', joins them). A word list
  is tokenized word by word as the probes and the attention analyses read treebank words. head_mask: None, an
  [L,H] array (1 keeps a head, 0 removes it, between scales its Z_h), or a list of (layer, head) to
  remove. pooling: how word vectors come from their pieces: 'first', 'last', 'mean', or 'auto' (probing's
  default: 'last' for decoders, 'first' for encoders; alignment.resolve_pooling). A sentence must fit the
  model's context in one window; a wrong type, an empty word or sentence, a lone surrogate, a layer/head out
  of range or a longer sentence is a UserError naming it.
  """

  loaded = as_loaded(model)
  net, tokenizer = loaded.model, loaded.tokenizer
  cfg = net.cfg
  pooling = resolve_pooling(pooling, cfg.kind)
  align_lib.check_pooling(pooling)
  mask_LH = head_mask_array(cfg, head_mask)
  prefix, suffix = len(tokenizer.prefix_ids), len(tokenizer.suffix_ids)
  listed = [u for u, s in enumerate(sentences) if not isinstance(s, str)]  # word lists: pieces per word
  al = align_lib.align([sentences[u] for u in listed], tokenizer, cfg.max_len, causal=cfg.kind == "decoder")
  rows = []  # per sentence: words, token ids (specials included), word n's pieces [start_N[n], end_N[n])
  for u, sentence in enumerate(sentences):
    if isinstance(sentence, str):  # tokenized as written, its words cut at token boundaries
      words, content, start_N, end_N = tokens_lib.text_words(tokenizer, sentence)
      if not words:
        raise UserError(f"run: sentences[{u}]={check.short(sentence)}: the tokenizer gives it no tokens")
      ids = np.asarray([*tokenizer.prefix_ids, *content, *tokenizer.suffix_ids], np.int32)
      fits = len(ids) <= cfg.max_len
      rows.append((words, ids, start_N + prefix, end_N + prefix))
    else:
      words, i = sentence, listed.index(u)
      content = ()  # counted only for the message
      fits = len(np.flatnonzero(al.window_sentence == i)) == 1 and not al.num_truncated_words
      first = int(np.searchsorted(al.word_sentence_N, i))
      rows.append((words, al.windows[i], al.word_start_N[first : first + len(words)],
                   al.word_end_N[first : first + len(words)]))  # fmt: skip
    if not fits:
      pieces = len(content) or sum(len(p) for p in tokenizer.word_pieces(words))
      raise UserError(
        f"run: sentences[{u}]: {len(words)} words, {pieces} pieces do not fit the model's context of "
        f"{cfg.max_len} tokens ({prefix + suffix} of them special); split it (probe() and the commands use windows)"
      )
  graphdef, state = nnx.split(net)
  forward = _capture_forward(graphdef)
  out = [None] * len(rows)
  lengths = [len(ids) for _, ids, _, _ in rows]
  for P, B, (u,) in words_layer.window_batches(lengths, cfg.max_len, 1):  # one sentence a call, P its bucket
    words, ids, start_N, end_N = rows[u]
    T, N = len(ids), len(words)
    *batch, start_BW, end_BW = words_layer.sequence_rows([(ids, start_N, end_N)], P, B, tokenizer.pad_id)
    inputs = (*batch, words_layer.word_matrix(start_BW, end_BW, P, pooling))
    to_BWT = words_layer.word_matrix(start_BW, end_BW, P, "sum")  # word n's pieces, for the word attention's sums
    special_BT = words_layer.special_tokens([T], P, B, prefix, suffix)
    logits, inter, pooled, attn, special = jax.device_get(forward(state, inputs, mask_LH, to_BWT, special_BT))
    out[u] = Captured(
      words=list(words),
      pieces=[attention_words.token_label(tokenizer, int(i)) for i in ids],
      tokens_T=np.asarray(ids),
      piece_start_N=np.asarray(start_N, np.int64),
      piece_end_N=np.asarray(end_N, np.int64),
      logits_TV=np.asarray(logits[0, :T], np.float32),
      pattern_LHTS=np.asarray(inter.pattern_LBHTS[:, 0, :, :T, :T], np.float32),
      z_LTHK=np.asarray(inter.z_LBTHK[:, 0, :T], np.float32),
      resid_post_LTD=np.asarray(inter.resid_post_LBTD[:, 0, :T], np.float32),
      embeddings_TD=np.asarray(inter.embeddings_BTD[0, :T], np.float32),
      z_NLHK=np.asarray(pooled["z"][:, 0, :N]).transpose(1, 0, 2, 3),
      resid_post_NLD=np.asarray(pooled["resid_post"][:, 0, :N]).transpose(1, 0, 2),
      embeddings_ND=np.asarray(pooled["embeddings"][0, :N]),
      attention_LHNN=np.asarray(attn[:, 0, :, :N, :N], np.float32),
      special_LHN=np.asarray(special[:, 0, :, :N], np.float32),
      pooling=pooling,
    )
  return out
