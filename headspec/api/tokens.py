"""Tokens as TransformerLens writes them (to_tokens, to_str_tokens, to_single_token) and `headspec.capture`.

Part of the notebook API (docs/api.md); `import headspec` reaches it lazily (headspec/__init__.py).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import numpy as np

from headspec import arguments as check
from headspec.api.load import as_loaded, head_mask_array, model_and_tokenizer, model_rule
from headspec.errors import UserError
from headspec.model import capture as cache_lib
from headspec.model import edits
from headspec.model import tokens as tokens_lib


def text_or_texts(value):
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


def site_names(value):
  """The `sites` rule of capture: one name or a list of names."""
  return (check.text(value),) if isinstance(value, str) else check.texts(value)


def _tokens_of(tokenizer, text, prepend_bos, what: str) -> list[int]:
  if tokenizer is None:
    raise UserError(
      f"{what}: a text needs a tokenizer; pass headspec.load(...)'s result, a (model, tokenizer) pair or tokenizer="
    )
  return tokens_lib.token_ids(tokenizer, text, prepend_bos)


def padded(rows: list[list[int]], pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """[B, T] right-padded rows and valid_BT."""
  T = max(map(len, rows))
  tokens_BT, valid_BT = np.full((len(rows), T), pad_id, np.int32), np.zeros((len(rows), T), bool)
  for b, row in enumerate(rows):
    tokens_BT[b, : len(row)], valid_BT[b, : len(row)] = row, True
  return tokens_BT, valid_BT


@check.arguments(model=as_loaded, text=text_or_texts, prepend_bos=check.optional(check.boolean))
def to_tokens(model, text, *, prepend_bos: bool | None = None) -> np.ndarray:
  """Token ids of `text` as written (TransformerLens's to_tokens): [1, T] int32 for one text, [B, T] for a
  list (right-padded with the tokenizer's pad id; `capture` of the texts themselves knows their lengths).
  prepend_bos: None (default) puts the tokenizer's own special tokens around the text, as the model was
  trained and as `run`, `patch` and `capture` read text (BERT's [CLS] … [SEP]; nothing for GPT-2, where
  TransformerLens prepends <|endoftext|> by default); True opens with the BOS token (the prefix specials,
  else EOS: GPT-2's <|endoftext|>); False drops the prefix specials (headspec/model/tokens.py)."""
  loaded = as_loaded(model)
  texts = [text] if isinstance(text, str) else text
  if not texts:
    raise UserError("to_tokens: text=[] is empty; give a text or a list of texts")
  rows = [tokens_lib.token_ids(loaded.tokenizer, t, prepend_bos) for t in texts]
  return padded(rows, getattr(loaded.tokenizer, "pad_id", 0))[0]


@check.arguments(model=as_loaded, text=_text_or_ids, prepend_bos=check.optional(check.boolean))
def to_str_tokens(model, text, *, prepend_bos: bool | None = None):
  """Each token's text (TransformerLens's to_str_tokens): for a text, its `to_tokens` tokens; for token ids
  ([T]), those; a list of texts or [B, T] ids gives a list per row. A token's text is the tokenizer's
  decoding of it alone, special tokens kept (GPT-2: ' store', '<|endoftext|>'; BERT: '[CLS]', '##ing')."""
  loaded = as_loaded(model)
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


@check.arguments(model=as_loaded, text=check.text)
def to_single_token(model, text: str) -> int:
  """The id of the one token `text` is (TransformerLens's to_single_token; mind the space GPT-2 joins to a
  word: ' Mary' is one token where 'Mary' may be another or two); UserError if it is not exactly one."""
  ids = as_loaded(model).tokenizer.encode(text)
  if len(ids) != 1:
    raise UserError(f"to_single_token: {text!r} is {len(ids)} tokens {list(ids)}, not one")
  return int(ids[0])


@check.arguments(
  model=model_rule,
  sites=check.optional(site_names),
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
  interventions: {site: headspec.model.sites.Edit} applied in the same pass (run_with_hooks), after the head mask's
  edit of z (`edits.head_mask`). Compiled once per
  model structure, site set and [B, bucket]: rows are padded to the next power of two of their length
  (masked) and the arrays (numpy) cut back to T, so a loop over batches of varied lengths compiles once per
  bucket: the first call of a bucket takes seconds, later ones milliseconds. Values equal the eager
  `model(tokens, capture=sites)`'s. For many texts, `headspec.activations` (headspec/api/store.py)."""

  net, tokenizer = model_and_tokenizer(model, tokenizer)
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
  tokens_BT, valid_BT = padded(rows, getattr(tokenizer, "pad_id", 0))
  if head_mask is not None:
    interventions = edits.with_head_mask(interventions, edits.head_mask(head_mask_array(cfg, head_mask)))
  return cache_lib.run_capture(net, tokens_BT, valid_BT, names, interventions=interventions)
