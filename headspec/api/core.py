"""The Python API for notebooks: load a model, run sentences through it, probe and ablate its heads.

Each function is a thin, typed face over what the commands themselves call, so that a notebook and
`headspec probe` / `headspec ablate` / `headspec attention` give the same numbers (docs/api.md):

  load(source, step=None)        targets.pretrained_target / targets.run_targets (the commands' planner)
  run(model, sentences, ...)     Transformer.__call__ with capture; words ↔ pieces by alignment.py (word
                                 lists) or tokens.text_words (a text, tokenized as written); inputs and
                                 word vectors by headspec/words/batches.py (the probes' own pooling); word-level
                                 attention by attention/words.pool_words (Clark et al. 2019)
  to_tokens / to_str_tokens / to_single_token   headspec/model/tokens.py (the tokenizer on the text as written)
  capture(model, tokens_or_text, sites=...)     headspec/model/capture.py: one jitted forward, a Cache with helpers
  probe(model, task, ...)        probing: labels.load_data, then suite.probe_job (the command's job for one
                                 model step), keeping the rows asked for (as in probes/results.csv)
  ablate(model, heads, texts)    ablation: run.evaluation_set (or your texts), core.run_one, core.head_statistics, metrics
  circuit(model, clean, ...)     patching/edges.py: EAP, EAP-IG, exact edge scores and faithfulness curves
  read_table / read_tables       headspec/__init__.py (no JAX)

Shape letters are headspec/model/transformer.py's glossary: L layers, H heads, K head width, D model width, T/S tokens
(pieces, special tokens included), N words, V vocabulary.
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import json
import os
import pathlib
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from headspec import arguments as check
from headspec.errors import UserError
from headspec.model import edits
from headspec.model import tokens as tokens_lib
from headspec.parallel import mesh as mesh_lib
from headspec.runs import targets

Head = tuple[int, int]  # (layer, head)


# --------------------------------------------------------------------------------------------- load


@dataclasses.dataclass(frozen=True)
class Loaded:
  """A model, its tokenizer and the target it was loaded from (name, step, cache identity, LM head).

  Unpacks as `model, tokenizer = headspec.load(...)`.
  """

  model: object
  tokenizer: object
  target: targets.Target | None = None
  _cache: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

  @property
  def name(self) -> str:
    """The tables' `model` column: 'minilm', the directory's or the run folder's name."""
    return self.target.name if self.target else "model"

  @property
  def step(self) -> int:
    return self.target.step if self.target else 0

  @property
  def lm_head(self) -> bool:
    """Whether the LM head is trained (False for all-MiniLM-L6-v2: its logits and LM losses mean nothing)."""
    return self.target.lm_head if self.target else True

  @property
  def cfg(self):
    return self.model.cfg

  def __iter__(self) -> Iterator:
    return iter((self.model, self.tokenizer))


def _is_run_dir(path: pathlib.Path) -> bool:
  """A `headspec train` run directory: its config.json is a headspec training config (model and train)."""
  config = path / "config.json"
  if not config.is_file():
    return False
  try:
    data = json.loads(config.read_text())
  except (OSError, ValueError):
    return False
  return isinstance(data, dict) and "train" in data and "kind" in data.get("model", {})


@check.arguments(source=check.name_or_path, step=check.optional(check.integer(0)), revision=check.optional(check.text))
def load(
  source: str | os.PathLike, step: int | None = None, revision: str | None = None, *, mesh=None, dtype=None
) -> Loaded:
  """A model and its tokenizer: 'minilm', a Hugging Face-format directory (step 0), a Hugging Face Hub name
  ('gpt2', 'org/name', 'hf:org/name@revision'; `revision` a branch, tag or commit, through the local
  cache; docs/pretrained.md), or a `headspec train` run directory at `step` (its last saved step by default).

  Goes through the commands' planner (headspec/runs/targets.py), so the name, step and cache identity are
  the ones the commands write. mesh: where the parameters live, a `jax.sharding.Mesh` or the config key's
  text ('fsdp=4,tensor=2'; headspec/parallel/mesh.py's rules shard them; None: as loaded, on one device). dtype:
  'float32' (the default: exact parity with the reference implementations) or 'bfloat16' (parameters and
  compute; half the bytes). Anything else (no such directory, a step the run does not have, a step other
  than 0 for a pretrained model, a wrong type, a bad mesh) is one headspec.errors.UserError (a ValueError).
  """
  from headspec.parallel import mesh as mesh_lib

  grid = mesh if mesh is None or isinstance(mesh, jax.sharding.Mesh) else mesh_lib.parse(mesh, key="load(mesh=...)")
  if dtype not in (None, "float32", "bfloat16"):
    raise UserError(f"load(dtype={dtype!r}): use 'float32' or 'bfloat16'")
  text = os.fspath(source)
  path = pathlib.Path(os.path.expanduser(text))
  if text != "minilm" and not path.is_dir():
    if not re.fullmatch(r"(hf:)?[\w.-]+(/[\w.-]+)?(@[\w./-]+)?", text):
      raise UserError(
        f"load({text!r}): no such directory; give 'minilm', a Hugging Face model directory or Hub name, or a "
        "headspec run directory"
      )
    from headspec import pretrained as pretrained_lib

    repo, named = pretrained_lib.parse_hub_name(text)  # not a folder: a Hub name
    if named and revision is not None and revision != named:
      raise UserError(f"load({text!r}, revision={revision!r}): two revisions; give it in the name or as revision=")
    text = pretrained_lib.HUB_PREFIX + repo + (f"@{revision or named}" if revision or named else "")
  elif revision is not None:
    raise UserError(f"load({text!r}, revision={revision!r}): revisions are of Hub names, not of local folders")
  if text != "minilm" and _is_run_dir(path):
    (target,) = targets.run_targets(path, "last" if step is None else int(step))
  else:
    if step not in (None, 0):
      raise UserError(f"load({text!r}, step={step}): a pretrained model has only step 0")
    target = targets.pretrained_target(text, mesh=grid, dtype=dtype or "float32")
  model, tokenizer = target.load()
  if dtype is not None:
    from headspec.model.transformer import cast

    model = cast(model, dtype)
    if dtype != "float32":  # another computation: feature caches must not mix them
      target = dataclasses.replace(target, identity={**target.identity, "dtype": dtype})
  return Loaded(mesh_lib.place_model(model, grid) if grid is not None else model, tokenizer, target)


def _loaded(model_or_loaded) -> Loaded:
  """A Loaded from `load(...)`'s result or a (model, tokenizer) pair: the `model` rule of run, probe, ablate."""
  if isinstance(model_or_loaded, Loaded):
    return model_or_loaded
  if isinstance(model_or_loaded, tuple) and len(model_or_loaded) == 2 and hasattr(model_or_loaded[0], "cfg"):
    return Loaded(*model_or_loaded)
  raise check.Wrong(
    f": expected headspec.load(...)'s result or a (model, tokenizer) pair, got {type(model_or_loaded).__name__}"
  )


def _model_rule(value):
  """The `model` rule of the patching functions: what `_loaded` takes, or a bare Transformer."""
  return value if hasattr(value, "cfg") and not isinstance(value, Loaded | tuple) else _loaded(value)


# ---------------------------------------------------------------------------------------- heads


def _check_heads(cfg, heads, what: str = "heads") -> list[Head]:
  """`heads` as a list of (layer, head) in range; UserError naming the first bad one."""
  L, H = cfg.num_layers, cfg.num_heads
  out = []
  for item in heads:
    if not (isinstance(item, Sequence) and len(item) == 2 and all(isinstance(v, int | np.integer) for v in item)):
      raise UserError(f"{what}: {item!r} is not a (layer, head) pair of ints")
    layer, head = int(item[0]), int(item[1])
    if not 0 <= layer < L:
      raise UserError(f"{what}: layer {layer} of {item!r} is out of range; the model has layers 0..{L - 1}")
    if not 0 <= head < H:
      raise UserError(f"{what}: head {head} of {item!r} is out of range; the model has heads 0..{H - 1}")
    out.append((layer, head))
  return out


def _head_mask(cfg, head_mask) -> np.ndarray:
  """[L,H] float32 mask: None (all ones), an [L,H] array, or (layer, head) tuples to remove. A nested
  list is refused: [[1, 0], [1, 1]] could be either, and read as pairs it would remove heads silently."""
  L, H = cfg.num_layers, cfg.num_heads
  if head_mask is None:
    return np.ones((L, H), np.float32)
  if isinstance(head_mask, np.ndarray | jax.Array):
    if np.shape(head_mask) != (L, H):
      raise UserError(f"head_mask of shape {np.shape(head_mask)}: expected [L, H] = [{L}, {H}]")
    mask = np.asarray(head_mask, np.float32)
    if not np.all(np.isfinite(mask)):
      raise UserError("head_mask: NaN or infinite values; 1 keeps a head, 0 removes it, between scales it")
    return mask
  try:
    head_mask = list(head_mask)
  except TypeError:
    raise UserError(
      f"head_mask: a {type(head_mask).__name__} is neither an [L, H] array nor (layer, head) pairs"
    ) from None
  if any(isinstance(item, list) for item in head_mask):  # [[1, 0], [1, 1]] reads as pairs (1, 0), (1, 1)
    raise UserError(
      f"head_mask: a nested list is ambiguous (an [L, H] mask or pairs?); give np.asarray(...) of shape "
      f"[{L}, {H}] for a mask or (layer, head) tuples for the heads to remove"
    )
  mask = np.ones((L, H), np.float32)
  for layer, head in _check_heads(cfg, head_mask, "head_mask"):
    mask[layer, head] = 0.0
  return mask


# ------------------------------------------------------------------------------------------ run

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
    _check_heads(_Shape(L, H), [(layer, head)], "head_attention")
    return self.attention_LHNN[layer, head]


@dataclasses.dataclass(frozen=True)
class _Shape:
  num_layers: int
  num_heads: int


_RUN_SITES = ("pattern", "z", "resid_post", "embeddings")


@functools.lru_cache(maxsize=8)
def _capture_forward(graphdef):
  """jit(state, (tokens_BT, positions_BT, segment_BT, pool_BWT), head_mask_LH, to_BWT, special_BT) ->
  (logits, Intermediates, the sites pooled per word by headspec/words/batches.py, word attention, special attention)."""
  from headspec.attention import words as attention_words
  from headspec.words import batches as words_layer

  @mesh_lib.jit
  def forward(state, inputs, head_mask_LH, to_BWT, special_BT):
    *rows, pool_BWT = inputs
    model = nnx.merge(graphdef, state)
    logits_BTV, inter = words_layer.forward_rows(model, rows, {"z": edits.head_mask(head_mask_LH)}, _RUN_SITES)
    pooled = words_layer.pool_sites(pool_BWT, inter, ("z", "resid_post", "embeddings"))
    attn_LBHWW, special_LBHW, _, _ = attention_words.pool_words(inter.pattern_LBHTS, to_BWT, special_BT)
    return logits_BTV, inter, pooled, attn_LBHWW, special_LBHW

  return forward


@check.arguments(model=_loaded, sentences=_sentences, pooling=check.text)
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
  from headspec.attention import words as attention_words
  from headspec.model.capture import bucket_length
  from headspec.words import alignment as align_lib
  from headspec.words import batches as words_layer
  from headspec.words.alignment import resolve_pooling

  loaded = _loaded(model)
  net, tokenizer = loaded.model, loaded.tokenizer
  cfg = net.cfg
  pooling = resolve_pooling(pooling, cfg.kind)
  align_lib.check_pooling(pooling)
  mask_LH = _head_mask(cfg, head_mask)
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
  out = []
  for words, ids, start_N, end_N in rows:
    T, N = len(ids), len(words)
    P = bucket_length(T, cfg.max_len)  # padded length: one compile per power of two
    inputs = words_layer.sequence_inputs([(ids, start_N, end_N)], P, 1, tokenizer.pad_id, pooling)
    to_BWT = np.zeros((1, P, P), np.float32)  # word n's pieces, for the word attention's sums
    for n, (a, b) in enumerate(zip(start_N, end_N)):
      to_BWT[0, n, a:b] = 1.0
    special_BT = np.zeros((1, P), bool)
    special_BT[0, :prefix] = True
    special_BT[0, T - suffix : T] = True
    logits, inter, pooled, attn, special = jax.device_get(forward(state, inputs, mask_LH, to_BWT, special_BT))
    out.append(
      Captured(
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
    )
  return out


# ------------------------------------------------------------------------------- tokens, capture


def _text_or_texts(value):
  """The `text` rule of to_tokens: one text or a list of texts."""
  return check.text(value) if isinstance(value, str) else list(check.texts(value))


def _text_or_ids(value):
  """The `text` rule of to_str_tokens: one text, a list of texts, or token ids ([T] or [B, T])."""
  if isinstance(value, str):
    return check.text(value)
  if isinstance(value, Sequence) and value and all(isinstance(v, str) for v in value):
    return list(check.texts(value))
  if isinstance(value, Sequence | np.ndarray | jax.Array):
    return value
  raise check.Wrong(f"={check.short(value)} must be a text, a list of texts or token ids, not {type(value).__name__}")


def _names(value):
  """The `sites` rule of capture: one name or a list of names."""
  return (check.text(value),) if isinstance(value, str) else check.texts(value)


def _tokens_of(tokenizer, text, prepend_bos, what: str) -> list[int]:
  if tokenizer is None:
    raise UserError(
      f"{what}: a text needs a tokenizer; pass headspec.load(...)'s result, a (model, tokenizer) pair or tokenizer="
    )
  return tokens_lib.token_ids(tokenizer, text, prepend_bos)


def _padded(rows: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """[B, T] right-padded rows and valid_BT."""
  T = max(map(len, rows))
  tokens_BT, valid_BT = np.full((len(rows), T), pad_id, np.int32), np.zeros((len(rows), T), bool)
  for b, row in enumerate(rows):
    tokens_BT[b, : len(row)], valid_BT[b, : len(row)] = row, True
  return tokens_BT, valid_BT


@check.arguments(model=_loaded, text=_text_or_texts, prepend_bos=check.optional(check.boolean))
def to_tokens(model, text, *, prepend_bos: bool | None = None) -> np.ndarray:
  """Token ids of `text` as written (TransformerLens's to_tokens): [1, T] int32 for one text, [B, T] for a
  list (right-padded with the tokenizer's pad id; `capture` of the texts themselves knows their lengths).
  prepend_bos: None (default) puts the tokenizer's own special tokens around the text, as the model was
  trained and as `run`, `patch` and `capture` read text (BERT's [CLS] … [SEP]; nothing for GPT-2, where
  TransformerLens prepends <|endoftext|> by default); True opens with the BOS token (the prefix specials,
  else EOS: GPT-2's <|endoftext|>); False drops the prefix specials (headspec/model/tokens.py)."""
  loaded = _loaded(model)
  texts = [text] if isinstance(text, str) else text
  if not texts:
    raise UserError("to_tokens: text=[] is empty; give a text or a list of texts")
  rows = [tokens_lib.token_ids(loaded.tokenizer, t, prepend_bos) for t in texts]
  return _padded(rows, getattr(loaded.tokenizer, "pad_id", 0))[0]


@check.arguments(model=_loaded, text=_text_or_ids, prepend_bos=check.optional(check.boolean))
def to_str_tokens(model, text, *, prepend_bos: bool | None = None):
  """Each token's text (TransformerLens's to_str_tokens): for a text, its `to_tokens` tokens; for token ids
  ([T]), those; a list of texts or [B, T] ids gives a list per row. A token's text is the tokenizer's
  decoding of it alone, special tokens kept (GPT-2: ' store', '<|endoftext|>'; BERT: '[CLS]', '##ing')."""
  loaded = _loaded(model)
  tokenizer, V = loaded.tokenizer, loaded.model.cfg.vocab_size
  if isinstance(text, str):
    return [tokens_lib.str_token(tokenizer, i) for i in tokens_lib.token_ids(tokenizer, text, prepend_bos)]
  if isinstance(text, list) and text and all(isinstance(t, str) for t in text):
    return [to_str_tokens(loaded, t, prepend_bos=prepend_bos) for t in text]
  array = np.asarray(text)
  if array.ndim == 2:
    return [to_str_tokens(loaded, row) for row in array]
  ids = tokens_lib.check_ids(text if isinstance(text, Sequence) else array, V, "to_str_tokens: text")  # no bools
  return [tokens_lib.str_token(tokenizer, i) for i in ids]


@check.arguments(model=_loaded, text=check.text)
def to_single_token(model, text: str) -> int:
  """The id of the one token `text` is (TransformerLens's to_single_token; mind the space GPT-2 joins to a
  word: ' Mary' is one token where 'Mary' may be another or two); UserError if it is not exactly one."""
  ids = _loaded(model).tokenizer.encode(text)
  if len(ids) != 1:
    raise UserError(f"to_single_token: {text!r} is {len(ids)} tokens {list(ids)}, not one")
  return int(ids[0])


@check.arguments(
  model=_model_rule,
  sites=check.optional(_names),
  prepend_bos=check.optional(check.boolean),
  tokenizer=check.optional(check.tokenizer),
)
def capture(model, tokens_or_text, *, sites=None, prepend_bos=None, head_mask=None, interventions=None,
            tokenizer=None):  # fmt: skip
  """One jitted forward pass returning the activations of `sites` (TransformerLens's run_with_cache):
  a `headspec.model.capture.Cache` (`cache["z"]` [L, B, T, H, K], `cache["z", 0]`, `cache.logits_BTV`, and the
  helpers logit_lens, accumulated_resid, decompose_resid, stack_head_results, apply_ln_to_stack,
  stack_to_logit_diff, head_dla; docs/api.md).

  tokens_or_text: a text, a list of texts (each tokenized as written, `to_tokens`; different lengths are
  right-padded and masked), token ids [T] or [B, T], or a list of id lists. sites: names of
  docs/patching.md's table (q, k, v, pattern, z, head_out, resid_pre, ...), 'embeddings' (token + position
  embeddings), 'embed' and 'pos_embed' (each alone, TransformerLens's hook_embed and hook_pos_embed; read from
  any cache), or TransformerLens hook names; default every site but the per-head stream copies q_in, k_in, v_in. head_mask as in `run`;
  interventions: {site: headspec.model.transformer.Edit} applied in the same pass (run_with_hooks), after the head mask's
  edit of z (`edits.head_mask`). Compiled once per
  model structure, site set and [B, bucket]: rows are padded to the next power of two of their length
  (masked) and the arrays (numpy) cut back to T, so a loop over batches of varied lengths compiles once per
  bucket: the first call of a bucket takes seconds, later ones milliseconds. Values equal the eager
  `model(tokens, capture=sites)`'s. For many texts, `headspec.activations` (headspec/api/store.py)."""
  from headspec.model import capture as cache_lib

  net, tokenizer = _model_and_tokenizer(model, tokenizer)
  cfg = net.cfg
  names = cache_lib.default_sites() if sites is None else cache_lib.check_sites(sites, embed_parts=True)
  rows = []
  for b, prompt in enumerate(tokens_lib.texts_or_ids(tokens_or_text, "capture: tokens_or_text")):
    what = f"capture: tokens_or_text[{b}]"
    if isinstance(prompt, str):
      problem = check.unicode_problem(prompt)
      if problem:
        raise UserError(f"{what}: {problem}; give valid Unicode text")
      row = _tokens_of(tokenizer, prompt, prepend_bos, "capture")
    else:
      row = tokens_lib.check_ids(prompt, cfg.vocab_size, what)
    if not row:
      raise UserError(f"{what} is empty (no tokens)")
    if len(row) > cfg.max_len:
      raise UserError(f"{what}: {len(row)} tokens exceed the model's context of {cfg.max_len}")
    rows.append(row)
  tokens_BT, valid_BT = _padded(rows, getattr(tokenizer, "pad_id", 0))
  if head_mask is not None:
    interventions = edits.with_head_mask(interventions, edits.head_mask(_head_mask(cfg, head_mask)))
  return cache_lib.run_capture(net, tokens_BT, valid_BT, names, interventions=interventions)


# ---------------------------------------------------------------------------------------- probe


def _probe_config(loaded: Loaded, task: str, config, options: dict):
  from headspec.probing import plan
  from headspec.probing.config import probe_config

  c = probe_config() if config is None else config.copy_and_resolve_references()
  if task in ("distance", "depth"):  # their rows are tree metrics (probes/structural.csv), not accuracies
    raise UserError(
      f"probe: {task!r} is a structural probe; fit it with `headspec probe --config=... "
      f"--config.probe.tasks={task}` (probes/structural.csv) or headspec.probing.structural"
    )
  c.probe.tasks = (task,)
  for key, value in options.items():
    if value is None:
      continue
    if key in ("seed", "data_dir"):
      c[key] = os.fspath(value) if key == "data_dir" else value
    elif key in c.probe:
      _set_option(c.probe, key, tuple(value) if isinstance(value, list) else value, "probe")
    else:
      raise UserError(f"probe: unknown option {key!r}; options are the probe.* keys of probing/config.py")
  plan.check_config(c)
  return c


def _set_option(c, key: str, value, function: str) -> None:
  """c[key] = value, a keyword option of `function`; a value of another type than the config's (a count
  given as '2000', a text where a tuple goes) is a UserError naming the option."""
  if isinstance(value, str) and check.unicode_problem(value):
    raise UserError(f"{function}: {key}={check.short(value)}: {check.unicode_problem(value)}; give valid Unicode text")
  try:
    c[key] = value
  except TypeError:
    raise UserError(
      f"{function}: {key}={check.short(value)} must be of type {type(c[key]).__name__} (it is "
      f"{check.short(c[key])} now), not {type(value).__name__}"
    ) from None


def _cache_dir(loaded: Loaded, cache_dir) -> pathlib.Path:
  """The feature cache: `cache_dir`, else a run's own RUN/probes/cache (shared with `headspec probe`),
  else a temporary folder of this process."""
  if cache_dir is not None:
    return pathlib.Path(cache_dir)
  if loaded.target is not None and "run" in loaded.target.identity:
    from headspec.probing.features import run_cache_dir

    return run_cache_dir(loaded.target.identity["run"])  # local scratch for a gs:// run
  return _temporary_cache()


@functools.cache
def _temporary_cache() -> pathlib.Path:
  """One feature cache per process (a pretrained model's features of a treebank are ~250 MB), removed
  when the process exits."""
  path = pathlib.Path(tempfile.mkdtemp(prefix="headspec-features-"))
  atexit.register(shutil.rmtree, path, ignore_errors=True)
  return path


@check.arguments(
  model=_loaded,
  task=check.text,
  heads=check.optional(check.pairs),
  layer=check.optional(check.integer(-1)),
  treebank=check.optional(check.text),
  eval_splits=check.optional(check.texts),
  max_train_words=check.optional(check.integer(0)),
  data_dir=check.optional(check.path),
  seed=check.optional(check.seed),
  config=check.optional(check.config),
  cache_dir=check.optional(check.path),
)
def probe(
  model,
  task: str,
  heads: Sequence[Head] | None = None,
  *,
  layer: int | None = None,
  treebank: str | None = None,
  eval_splits: Sequence[str] | None = None,
  max_train_words: int | None = None,
  data_dir: str | os.PathLike | None = None,
  seed: int | None = None,
  config=None,
  cache_dir: str | os.PathLike | None = None,
  **options,
):
  """Fits and scores one task's probes on chosen heads and/or one layer's residual stream, with the
  Hewitt & Liang control task and 95% bootstrap CIs: a pandas DataFrame with probes/results.csv's
  columns and dtypes, one row per (head or residual stream, evaluation split).

  It runs the command's own job (labels.load_data, then probing/suite.probe_job: feature extraction and
  cache, every layer's fit and score, bootstrap CIs) and keeps the rows asked for, so a head's row
  EQUALS its row of probes/results.csv written with the same config. Only the layers asked for are
  fitted (a head with its layer's other heads, as the command fits it); subsample train
  (max_train_words) for quick looks. model: `load(...)`'s result or a (model, tokenizer) pair. task: 'upos', 'xpos',
  'deprel' or 'arc'. heads: (layer, head) pairs; layer: a residual stream (-1: the embeddings); at least
  one of the two. config: a probe config (probing/config.py, configs/probe_*.py) to start from;
  treebank, eval_splits, max_train_words (a seeded subsample of whole train sentences of about that
  many words: faster, and says so in no other way, so report it), data_dir, seed and any probe.* key
  given as a keyword (l2_grid=..., refine_samples=..., pooling=..., bootstrap_resamples=...) override it.
  cache_dir: the feature cache (default: a run's RUN/probes/cache, else a temporary folder removed when
  the process exits).
  A progress bar (tqdm, on stderr) counts the feature groups fitted; the stages' lines are absl INFO logs.
  """
  import pandas as pd

  from headspec.io import tables
  from headspec.probing import labels, suite

  loaded = _loaded(model)
  cfg = loaded.model.cfg
  if not heads and layer is None:  # heads=[] too: nothing would be fitted
    raise UserError("probe: give heads=[(layer, head), ...] and/or layer=L (a residual stream; -1: embeddings)")
  chosen = _check_heads(cfg, heads or [])
  if layer is not None and not -1 <= layer < cfg.num_layers:
    raise UserError(
      f"probe: layer {layer!r} is out of range; the model has layers -1 (embeddings)..{cfg.num_layers - 1}"
    )
  options.update(
    treebank=treebank, eval_splits=eval_splits, max_train_words=max_train_words, data_dir=data_dir, seed=seed
  )
  c = _probe_config(loaded, task, config, options)
  data = labels.load_data(c)
  if loaded.target is not None:  # the already loaded model, under the target's name and cache identity
    job = dataclasses.replace(loaded.target, load=lambda: (loaded.model, loaded.tokenizer))
    cache = _cache_dir(loaded, cache_dir)
  else:
    identity = {"unsaved_model": uuid.uuid4().hex}
    job = targets.Target("model", 0, identity, lambda: (loaded.model, loaded.tokenizer), kind=cfg.kind)
    cache = pathlib.Path(cache_dir) if cache_dir is not None else _temporary_cache()
  cache.mkdir(parents=True, exist_ok=True)
  head_layers = {l for l, _ in chosen}

  def keep(l, heads):  # the layers asked for; each fitted exactly as in a full run (a head with its layer's heads)
    return l in head_layers if heads[0] >= 0 else l == layer

  parts = suite.probe_job(job, data, c, cache, want=(tables.PROBES,), keep_source=keep)  # the command's job
  rows = parts[tables.PROBES]
  wanted = set(chosen) | ({(int(layer), -1)} if layer is not None else set())
  rows = [r for r in rows if (r["layer"], r["head"]) in wanted]
  table = tables.PROBES
  frame = pd.DataFrame(rows, columns=list(table.columns))
  frame = frame.astype({col: "int64" for col in table.int_columns} | {col: "float64" for col in table.float_columns})
  for column in set(table.columns) - set(table.int_columns) - set(table.float_columns):
    frame[column] = frame[column].astype("string")
  frame.attrs["baselines"] = [b for b in data.baselines if b["task"] == c.probe.tasks[0]]
  frame.attrs["train_words"] = int(data.train.num_words)
  return frame


# --------------------------------------------------------------------------------------- ablate


@dataclasses.dataclass(frozen=True)
class Ablation:
  """One ablation of a set of heads, scored as `headspec ablate` scores it (docs/ablation.md).

  metric: 'loss_delta' (a model with a trained LM head: ablated − unablated LM loss on the same tokens)
  or 'embedding_shift' (without one: mean 1 − cos between ablated and unablated sentence embeddings);
  value, ci_low, ci_high: it with its 95% bootstrap CI over evaluation sequences. before / after: the
  unablated and ablated LM loss and accuracy (or embedding_shift 0 and value); deltas: every delta metric
  as (value, ci_low, ci_high); evaluation: what was scored.
  """

  heads: tuple[Head, ...]
  method: str
  metric: str
  value: float
  ci_low: float
  ci_high: float
  before: dict
  after: dict
  deltas: dict
  evaluation: str


def _ablate_config(loaded: Loaded, config, options: dict):
  from headspec.ablation.config import ablate_config
  from headspec.ablation.run import check_config

  c = ablate_config() if config is None else config.copy_and_resolve_references()
  for key, value in options.items():
    if value is None:
      continue
    if key not in c:
      raise UserError(f"ablate: unknown option {key!r}; options are the keys of ablation/config.py")
    _set_option(c, key, os.fspath(value) if key == "data_dir" else value, "ablate")
  if loaded.target is not None and "pretrained" in loaded.target.identity:
    c.model.pretrained = loaded.target.identity["pretrained"]
  check_config(c)
  return c


def _text_set(loaded: Loaded, texts: Sequence[str], c):
  """The evaluation set of your own texts: each one row, tokenized as written with the tokenizer's
  specials (`to_tokens`), scored as `headspec ablate` scores its rows (LM loss, or embedding_shift)."""
  from headspec.words import evalset as evalset_lib

  tokenizer, cfg = loaded.tokenizer, loaded.model.cfg
  rows = []
  for i, text in enumerate(texts):
    ids = tokens_lib.token_ids(tokenizer, text)
    if not tokenizer.encode(text):
      raise UserError(f"ablate: texts[{i}]={check.short(text)} has no tokens")
    if len(ids) > cfg.max_len:
      raise UserError(f"ablate: texts[{i}]: {len(ids)} tokens exceed the model's context of {cfg.max_len}; split it")
    rows.append(ids)
  if loaded.lm_head:
    tokens_NT, valid_NT = _padded(rows, getattr(tokenizer, "pad_id", 0))
    es = evalset_lib.lm_eval_set(tokens_NT, valid_NT, model_kind=cfg.kind, tokenizer=tokenizer,
                                 batch_size=c.batch_size, seed=c.seed)  # fmt: skip
    if not sum(b.weights_BT.sum() for b in es.batches):
      raise UserError(
        f"ablate: the {len(texts)} text(s) give no token to score (a decoder scores each next token, a masked "
        "LM its masked ones: give longer texts)"
      )
  else:
    windows = [np.asarray(r, np.int32) for r in rows]
    es = evalset_lib.sentence_embedding_set(windows, pad_id=tokenizer.pad_id, max_len=cfg.max_len,
                                            batch_tokens=c.batch_tokens)  # fmt: skip
  return dataclasses.replace(es, description=f"your {len(texts)} text(s): {es.description}")


ABLATE_CORPORA = ("wikitext_103", "english_mix")  # a pretrained LM's default evaluation text: the first present


def _corpus_set(loaded: Loaded, c, corpus_given: bool):
  """A pretrained LM's evaluation set: the valid split of `corpus`, rows as evaltext.evaluation_tokens
  cuts them, read from DATA_DIR/text/<corpus>/valid.txt directly (the documents TFDS's TextCorpus would
  prepare from it), so nothing is written into the data directory. Without corpus= (or a config) the
  first of ABLATE_CORPORA that the data directory holds."""
  from headspec.data import lm_pipeline, text_tfds
  from headspec.runs import evaltext
  from headspec.words import evalset as evalset_lib

  data_dir = targets.data_dir(c, purpose="the evaluation text of a pretrained LM; or give ablate(..., texts=[...])")
  if not corpus_given:
    c.corpus = next((n for n in ABLATE_CORPORA if (data_dir / "text" / n / "valid.txt").is_file()), c.corpus)
  if c.corpus.startswith(text_tfds.CATALOG_PREFIX):  # a TFDS catalog dataset: as the command reads it
    tokens_NT, valid_NT = evaltext.evaluation_tokens(c, "", loaded.tokenizer)
  else:
    path = data_dir / "text" / c.corpus / "valid.txt"
    if not path.is_file():
      raise UserError(
        f"ablate: {path}: no such file; give your own text (ablate(model, heads, texts=[...])) or get the corpus "
        f"(`headspec data download text {c.corpus}`, or corpus='english_mix')"
      )
    tokenizer = loaded.tokenizer
    prefix, suffix = list(tokenizer.prefix_ids), list(tokenizer.suffix_ids)
    width = c.seq_len - len(prefix) - len(suffix)
    if width <= 0:
      raise UserError(f"ablate: seq_len={c.seq_len} leaves no room for the tokenizer's special tokens")
    stream = lm_pipeline.tokenize_stream(text_tfds.read_text_documents(path), tokenizer)
    content = stream[: len(stream) // width * width].reshape(-1, width)
    if not len(content):
      raise UserError(f"ablate: corpus {c.corpus!r}: fewer valid-split tokens than one row of {width}")
    n = len(content)
    rows_NT = np.concatenate([np.tile(np.asarray(prefix, np.int32), (n, 1)), content,
                              np.tile(np.asarray(suffix, np.int32), (n, 1))], axis=1)  # fmt: skip
    tokens_NT, valid_NT = evaltext._select_rows(rows_NT, c)  # the rows evaluation_tokens keeps
  cfg = loaded.model.cfg
  es = evalset_lib.lm_eval_set(tokens_NT, valid_NT, model_kind=cfg.kind, tokenizer=loaded.tokenizer,
                               batch_size=c.batch_size, seed=c.seed)  # fmt: skip
  return dataclasses.replace(es, description=f"{c.corpus} valid split: {es.description}")


@check.arguments(
  model=_loaded,
  heads=check.pairs,
  texts=check.optional(_text_or_texts),
  method=check.text,
  num_tokens=check.optional(check.integer(1)),
  data_dir=check.optional(check.path),
  seed=check.optional(check.seed),
  config=check.optional(check.config),
)
def ablate(
  model,
  heads: Sequence[Head],
  texts: str | Sequence[str] | None = None,
  *,
  method: str = "zero",
  num_tokens: int | None = None,
  data_dir: str | os.PathLike | None = None,
  seed: int | None = None,
  config=None,
  **options,
) -> Ablation:
  """Removes `heads` (a list of (layer, head), together) and measures the change on your `texts` or on
  `headspec ablate`'s evaluation set: LM loss change for a model with a trained LM head, embedding_shift
  otherwise (MiniLM).

  texts: a text or a list of texts, each one evaluation row tokenized as written (`to_tokens`): no data
  directory needed, and `model` may then be a (model, tokenizer) pair. Without texts, model is
  `load(...)`'s result and the evaluation set is the command's: the run's validation rows, the treebank
  sentences for a model without LM head, or for a pretrained LM the valid split of `corpus` (default the
  first of wikitext_103, english_mix in the data directory; read from its valid.txt, nothing written).
  method: 'zero' (Z_h = 0) or 'mean' (Z_h = its mean over the evaluation tokens). config: an ablate
  config to start from (ablation/config.py); num_tokens, data_dir, seed and any other of its keys given
  as keywords (num_sentences=, bootstrap_resamples=, batch_size=, ...) override it. The result for one
  head equals that head's `zero`/`mean` row of ablation/heads.csv up to float32 rounding (the command's
  sweep runs the layers above the head from a cached residual stream; see tests/test_api.py).
  """
  from headspec.ablation import core, metrics
  from headspec.ablation.run import evaluation_set

  loaded = _loaded(model)
  if loaded.target is None and texts is None:
    raise UserError(
      "ablate: without texts=[...] it needs headspec.load(...)'s result (its evaluation set depends on where the "
      "model is from); give your own text as texts= to ablate a (model, tokenizer) pair"
    )
  texts = [texts] if isinstance(texts, str) else texts
  if texts is not None and not texts:
    raise UserError("ablate: texts=[] is empty; give a text or a list of texts (or leave texts out)")
  if method not in ("zero", "mean"):
    raise UserError(f"ablate: method={method!r}; use 'zero' or 'mean'")
  net, cfg = loaded.model, loaded.model.cfg
  chosen = _check_heads(cfg, heads)
  if not chosen:
    raise UserError("ablate: no heads given; heads=[(layer, head), ...]")
  corpus_given = config is not None or options.get("corpus") is not None
  options.update(num_tokens=num_tokens, data_dir=data_dir, seed=seed)
  c = _ablate_config(loaded, config, options)
  key = ("texts", tuple(texts)) if texts is not None else ("evalset", corpus_given)
  key += (c.to_json(sort_keys=True),)
  if key not in loaded._cache:
    if texts is not None:
      es = _text_set(loaded, texts, c)
    elif c.model.pretrained and loaded.lm_head:
      es = _corpus_set(loaded, c, corpus_given)
    else:
      es = evaluation_set(c, loaded.target.identity.get("run", ""), loaded.target, loaded.tokenizer, cfg)
    loaded._cache[key] = (es, core.head_statistics(net, es)[0])
  es, mean_z = loaded._cache[key]
  zero = core.zero_replacement(net)
  ones = np.ones((cfg.num_layers, cfg.num_heads), np.float32)
  mask = ones.copy()
  for l, h in chosen:
    mask[l, h] = 0.0
  full = core.run_one(net, es, ones, zero)
  ablated = core.run_one(net, es, mask, zero if method == "zero" else jnp.asarray(mean_z))
  d = metrics.deltas(es.kind, full, ablated[None], resamples=c.bootstrap_resamples, seed=c.seed)
  deltas = {name: tuple(float(v[0]) for v in values) for name, values in d.items()}
  metric = "loss_delta" if es.kind == "lm" else "embedding_shift"
  before = metrics.values(es.kind, full, full)
  after = metrics.values(es.kind, ablated, full)
  return Ablation(
    heads=tuple(chosen),
    method=method,
    metric=metric,
    value=deltas[metric][0],
    ci_low=deltas[metric][1],
    ci_high=deltas[metric][2],
    before={k: float(v) for k, v in before.items()},
    after={k: float(v) for k, v in after.items()},
    deltas=deltas,
    evaluation=es.description,
  )


# ---------------------------------------------------------------------------------------- patch


def _is_id_row(value) -> bool:
  """Whether `value` is one prompt's token ids (a non-empty 1-D list, tuple or array of ints), not a list of prompts."""
  if isinstance(value, np.ndarray):
    return value.ndim == 1 and value.size > 0 and value.dtype.kind in "iu"
  return isinstance(value, list | tuple) and bool(value) and all(check.is_token_id(t) for t in value)


def _prompt_or_prompts(value) -> list:
  """The `clean`/`corrupt` rule of patch, attribution_patch, path_patch and circuit: one prompt (a text, or
  one list of token ids) is a list of one; else a list of prompts (check.prompts)."""
  if isinstance(value, str):
    return [check.text(value)]
  if _is_id_row(value):
    return [value]
  return check.prompts(value)


_PATCH_RULES = dict(
  model=_model_rule,
  clean=_prompt_or_prompts,
  corrupt=_prompt_or_prompts,
  site=check.text,
  metric=check.metric,
  by_position=check.boolean,
  direction=check.text,
  tokenizer=check.optional(check.tokenizer),
)


def _model_and_tokenizer(model, tokenizer):
  """(Transformer, tokenizer) from `load(...)`'s result, a (model, tokenizer) pair or a bare Transformer."""
  if hasattr(model, "cfg") and not isinstance(model, Loaded | tuple):
    return model, tokenizer
  loaded = _loaded(model)
  return loaded.model, tokenizer if tokenizer is not None else loaded.tokenizer


def _answer_id(tokenizer, prompt, answer: str, where: str) -> int:
  """A text answer's token id (patching/patch.py answer_id), after the API's checks of the text."""
  from headspec.patching import patch as patch_lib

  if tokenizer is None:
    raise UserError(f"{where}={answer!r} is a text but no tokenizer was given; pass a token id or tokenizer=")
  try:
    check.text(answer)
  except check.Wrong as e:
    raise UserError(f"{where}{e.text}") from None
  return patch_lib.answer_id(tokenizer, prompt, answer, where)


def _answers(tokenizer, clean: list, answers):
  """answers with each text made its token id (`_answer_id`); one prompt's pair may be given bare,
  `(" Mary", " John")`. Anything else is left to patching/patch.prompts' checks."""
  bare = lambda a: isinstance(a, str) or check.is_token_id(a)
  if isinstance(answers, list | tuple) and len(clean) == 1 and len(answers) == 2 and all(map(bare, answers)):
    answers = [answers]
  if not isinstance(answers, list | tuple):
    return answers
  out = []
  for i, pair in enumerate(answers):
    if isinstance(pair, list | tuple) and any(isinstance(a, str) for a in pair):
      prompt = clean[i] if i < len(clean) else None
      pair = tuple(
        _answer_id(tokenizer, prompt, a, f"answers[{i}][{j}]") if isinstance(a, str) else a for j, a in enumerate(pair)
      )
    out.append(pair)
  return out


def _prompts(net, tokenizer, clean, corrupt, answers, metric):
  from headspec.patching import patch as patch_lib

  answers = _answers(tokenizer, clean, answers)
  return patch_lib.prompts(net.cfg, clean, corrupt, answers, metric, tokenizer, getattr(tokenizer, "pad_id", 0))


@check.arguments(
  **_PATCH_RULES,
  layers=check.optional(check.ints),
  heads=check.optional(check.ints),
  positions=check.optional(check.ints),
)
def patch(
  model,
  clean,
  corrupt,
  *,
  site: str,
  metric="logit_diff",
  answers=None,
  by_position: bool = True,
  direction: str = "denoising",
  layers=None,
  heads=None,
  positions=None,
  tokenizer=None,
):
  """Activation patching (docs/patching.md): a pandas DataFrame `layer, head, position, value`, value the
  metric when the corrupted run gets that site's clean activation there (direction='denoising', as
  TransformerLens; 'noising': the clean run gets the corrupted one). head −1 for per-layer sites, position
  −1 when by_position=False. `frame.attrs`: 'base' and 'source', the metric of the unpatched runs.

  model: `load(...)`'s result, a (model, tokenizer) pair or a Transformer. clean, corrupt: equal-length
  lists of texts (with a tokenizer) or of token-id lists, pairwise of equal token count; or one prompt each
  (a text or one token-id list). site: a name of headspec.model.transformer.SITES. metric: a name of the patching
  registry (headspec/patching/core.py METRICS: 'logit_diff', the logit difference at each prompt's last
  token with answers one (correct, wrong) pair per prompt, each a token id or a text of one token (" Mary":
  the token it adds after the clean prompt, as `headspec circuit`'s pairs file; a bare pair for one
  prompt); 'prob', 'loss'; mean over prompts) or a callable on the float32 logits [B,T,V]
  (rows right-padded). layers, heads, positions: restrict the grid (default all). One compiled sweep does
  every patch. Bad input is one headspec.errors.UserError naming the value.
  """
  from headspec.patching import patch as patch_lib

  net, tokenizer = _model_and_tokenizer(model, tokenizer)
  p = _prompts(net, tokenizer, clean, corrupt, answers, metric)
  return patch_lib.patch(net, p, site=site, metric=metric, by_position=by_position, direction=direction,
                         layers=layers, heads=heads, positions=positions)  # fmt: skip


@check.arguments(**_PATCH_RULES)
def attribution_patch(
  model, clean, corrupt, *, site: str, metric="logit_diff", answers=None, by_position=True, direction="denoising",
  tokenizer=None,
):  # fmt: skip
  """Attribution patching (Nanda 2023; Syed et al. 2023): `patch`'s table with value the first-order estimate
  of the metric's change, (a_source − a_base)·∂metric/∂a, for every head and position from one forward and
  one backward pass. `headspec.patching.patch.agreement(exact, estimate)` is its correlation with `patch`."""
  from headspec.patching import patch as patch_lib

  net, tokenizer = _model_and_tokenizer(model, tokenizer)
  p = _prompts(net, tokenizer, clean, corrupt, answers, metric)
  return patch_lib.attribution(net, p, site=site, metric=metric, by_position=by_position, direction=direction)


@check.arguments(
  **{k: v for k, v in _PATCH_RULES.items() if k not in ("site", "by_position")},
  receivers=check.optional(check.pairs),
  receiver_site=check.text,
  senders=check.optional(check.pairs),
)
def path_patch(
  model, clean, corrupt, *, receivers=None, receiver_site="q", metric="logit_diff", answers=None, senders=None,
  direction="denoising", tokenizer=None,
):  # fmt: skip
  """Path patching (Wang et al. 2022): per sender head, the metric when only its path into the receivers'
  `receiver_site` ('q', 'k', 'v'; receivers (layer, head) pairs) or, with 'logits', its paths to the logits
  through no other head (directly and through the downstream MLPs, which recompute) carry the source
  activation. Columns `layer, head` (the sender), `position` −1, `value`."""
  from headspec.patching import patch as patch_lib

  net, tokenizer = _model_and_tokenizer(model, tokenizer)
  p = _prompts(net, tokenizer, clean, corrupt, answers, metric)
  return patch_lib.path(net, p, metric=metric, receivers=receivers, receiver_site=receiver_site,
                        direction=direction, senders=senders)  # fmt: skip


# -------------------------------------------------------------------------------------- circuit


@dataclasses.dataclass(frozen=True)
class Circuit:
  """What `circuit` returns. edges: one row per edge of the graph (docs/circuits.md), columns `upstream,
  downstream, input, upstream_layer, upstream_head, downstream_layer, downstream_head` and one score column
  per method. faithfulness: `method, edges, set, faithfulness`, the curve of the top-n circuits of each method
  and of random sets (method 'random'). clean_metric, corrupt_metric: the unpatched runs' metric."""

  edges: object  # pandas DataFrame
  faithfulness: object  # pandas DataFrame
  clean_metric: float
  corrupt_metric: float
  graph: object  # headspec.patching.edges.Graph

  def figure(self, method: str | None = None, top_n: int = 20):
    """The matplotlib Figure of the top_n edges by |score| of `method` (default the last one scored),
    drawn by layer as `headspec circuit` draws circuit/<task>_<method>_<model>_step<step>.png."""
    from headspec.patching import circuit as circuit_run

    methods = [c for c in self.edges.columns if c in CIRCUIT_METHODS]
    method = methods[-1] if method is None else method
    if method not in methods:
      raise UserError(f"Circuit.figure: method={method!r}; this circuit has {', '.join(methods)}")
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
      raise UserError(f"Circuit.figure: top_n={top_n!r} must be an int >= 1")
    return circuit_run.figure(self.graph, self.edges[method].to_numpy(), top_n=top_n, title=f"top {top_n} by {method}")


CIRCUIT_METHODS = ("eap", "eap_ig", "exact", "eap_denoising", "eap_ig_denoising", "exact_denoising")


@check.arguments(
  **{k: v for k, v in _PATCH_RULES.items() if k not in ("site", "by_position", "direction")},
  methods=check.texts,
  steps=check.integer(1),
  sizes=check.ints,
  random_sets=check.integer(0),
  seed=check.seed,
  batch_size=check.optional(check.integer(1)),
)
def circuit(
  model, clean, corrupt, *, answers=None, methods=("eap", "eap_ig"), steps: int = 5, metric="logit_diff",
  sizes=(5, 10, 20, 40), random_sets: int = 3, seed: int = 0, batch_size=None, tokenizer=None,
):  # fmt: skip
  """Edge attribution patching and circuit faithfulness (docs/circuits.md): every edge's score by each of
  `methods` ('eap', Syed et al. 2023; 'eap_ig' with `steps` interpolation points, Hanna et al. 2024; 'exact'
  edge patching, one forward per edge; all noising, the papers' convention: score ≈ m(clean, edge corrupted)
  − m(clean); 'eap_denoising', 'eap_ig_denoising', 'exact_denoising' the reverse), and the faithfulness
  curve of the top-n circuits for n in `sizes`, with `random_sets` random edge sets of each size. Returns a `Circuit` (its `.figure()` draws the graph).
  model, clean, corrupt, answers, metric, tokenizer as in `patch`. As `headspec circuit` computes
  circuit/edges.csv and circuit/faithfulness.csv; bad input is one headspec.errors.UserError."""
  from headspec.patching import edges as edges_lib

  methods = [m.replace("-", "_") for m in methods]  # 'eap-ig' as the paper spells it
  bad = [m for m in methods if m not in CIRCUIT_METHODS]
  if bad or not methods:
    raise UserError(f"circuit: methods={methods!r}; name one or more of {', '.join(CIRCUIT_METHODS)}")
  net, tokenizer = _model_and_tokenizer(model, tokenizer)
  g = edges_lib.graph(net.cfg)  # refuses a model whose stream is not a sum of its components' outputs
  if not sizes or min(sizes) < 1 or max(sizes) > g.E:
    raise UserError(f"circuit: sizes={sizes!r}; give edge counts in 1..{g.E} (an empty circuit has nothing)")
  p = _prompts(net, tokenizer, clean, corrupt, answers, metric)
  scores = {}
  for method in methods:
    if method.startswith("exact"):
      scores[method], clean_m, corrupt_m = edges_lib.exact(net, p, metric=metric, batch_size=batch_size,
                                                           direction=edges_lib.direction_of(method))  # fmt: skip
    else:
      scores[method], clean_m, corrupt_m = edges_lib.scores(net, p, method=method, steps=steps, metric=metric,
                                                            batch_size=batch_size)  # fmt: skip
  curve = edges_lib.curve(net, p, scores, sizes, random_sets=random_sets, seed=seed, metric=metric,
                          batch_size=batch_size)  # fmt: skip
  return Circuit(edges_lib.edge_frame(g, scores), curve, clean_m, corrupt_m, g)
