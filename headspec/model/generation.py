"""Text generation from a decoder: a prefill of the prompt, then one jitted step per new token (docs/api.md).

`generate(model, prompt, max_new_tokens)` decodes greedily (temperature 0) or samples (temperature > 0, top-k),
with a key-value cache (headspec/model/layers.py `KVCache`: the prompt's keys and values are computed once, each step
runs the one new token against them) or without (`use_cache=False`: every step reruns the full forward over a
fixed-size buffer, the reference the cache is checked against). Both go through the model's own forward, so
`interventions` (any site's `Edit` or `Apply`, docs/patching.md) act at every position of the prompt and of the
generated tokens. A text prompt gives text back (the new tokens decoded), token ids give token ids. Greedy
output equals `transformers`' `generate(do_sample=False)` token for token on every decoder family headspec
imports (tests/test_generate.py).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from headspec import arguments as check
from headspec.errors import UserError
from headspec.model.layers import KVCache
from headspec.model.sites import SITES, Edit, check_interventions
from headspec.model.tokens import check_ids
from headspec.model.transformer import Transformer
from headspec.parallel import mesh as mesh_lib

SLOTS = 32  # the cache (and the no-cache buffer) has a multiple of this many slots, so that the decoding step
# compiles once for prompts and lengths that fall in one bucket


def _model_and_tokenizer(model):
  if isinstance(model, Transformer):
    return model, None
  inner = getattr(model, "model", None)
  if isinstance(inner, Transformer):  # headspec.load's Loaded
    return inner, getattr(model, "tokenizer", None)
  if isinstance(model, tuple) and len(model) == 2 and isinstance(model[0], Transformer):
    return model
  raise UserError(f"generate: model is a {type(model).__name__}; give headspec.load(...) or a Transformer")


def _is_ids(row) -> bool:
  return isinstance(row, list | tuple | np.ndarray) and all(isinstance(t, int | np.integer) for t in row)


def _rows(prompt, tokenizer, V: int) -> tuple[list[list[int]], bool, list[bool]]:
  """(token rows, whether one prompt was given, whether each row was given as a text): a text (tokenized with
  the BOS the tokenizer adds), a list of token ids, or a list of either."""
  if isinstance(prompt, np.ndarray) and prompt.ndim == 2:
    prompt = [list(row) for row in prompt]
  single = isinstance(prompt, str) or _is_ids(prompt)
  prompts = [prompt] if single else prompt
  if not isinstance(prompts, list | tuple) or not prompts:
    raise UserError(f"generate: prompt is a {type(prompt).__name__}; give a text, token ids or a list of either")
  rows, texts = [], []
  for i, one in enumerate(prompts):
    where = "prompt" if single else f"prompt[{i}]"
    if isinstance(one, str):
      if tokenizer is None:
        raise UserError(f"generate: {where} is a text but the model has no tokenizer; give token ids")
      try:
        check.text(one)  # the API's one check of a text (a lone surrogate crashed sentencepiece)
      except check.Wrong as e:
        raise UserError(f"generate: {where}{e.text}") from None
      row = list(tokenizer.prefix_ids) + list(tokenizer.encode(one))
    elif _is_ids(one):
      row = check_ids(one, V, f"generate: {where}")  # the API's one check of token ids (no bools)
    else:
      raise UserError(f"generate: {where} is a {type(one).__name__}; give a text or a list of token ids")
    if not row:
      raise UserError(f"generate: {where} is empty")
    rows.append(row)
    texts.append(isinstance(one, str))
  return rows, single, texts


def _check_edits(cfg, interventions, B: int, S: int) -> dict:
  """The edits, checked: an Edit's arrays must be of size 1 on T and S (they act at every position)."""
  for name, given in (interventions or {}).items() if isinstance(interventions, dict) else ():
    for edit in given if isinstance(given, list | tuple) else (given,):
      if not isinstance(edit, Edit) or name not in SITES:
        continue
      for part in ("keep", "add"):
        shape = np.shape(getattr(edit, part)) if getattr(edit, part) is not None else ()
        lead = 0 if edit.at is not None else 1  # the L axis, absent from an edit at one layer
        at = [lead + i for i, axis in enumerate(SITES[name]) if axis in "TS"]
        if len(shape) == lead + len(SITES[name]) and any(shape[i] != 1 for i in at):
          raise UserError(
            f"generate: interventions[{name!r}].{part} of shape {tuple(shape)} has a position axis; in generation "
            "an Edit acts at every position (size 1 on T and S), or use an Apply"
          )
  return check_interventions(cfg, interventions, B, S, S)


def _pick(logits_BV, key, temperature, greedy: bool, top_k: int | None):
  if greedy:
    return jnp.argmax(logits_BV, axis=-1).astype(jnp.int32)
  logits_BV = logits_BV / temperature
  if top_k:
    kth_B1 = jax.lax.top_k(logits_BV, top_k)[0][:, -1:]
    logits_BV = jnp.where(logits_BV < kth_B1, -jnp.inf, logits_BV)
  return jax.random.categorical(key, logits_BV, axis=-1).astype(jnp.int32)


@functools.partial(mesh_lib.jit, static_argnums=(0, 8, 9))
def _cached_step(graphdef, state, tokens_BT, valid_BT, positions_BT, cache, edits, key_temperature, greedy, top_k):
  """One forward of T new tokens against the cache: (the next token [B], the updated cache)."""
  key, temperature = key_temperature
  logits_BTV, _, cache = nnx.merge(graphdef, state)(
    tokens_BT, valid_BT=valid_BT, positions_BT=positions_BT, interventions=edits, kv_cache=cache
  )
  return _pick(logits_BTV[:, -1], key, temperature, greedy, top_k), cache


@functools.partial(mesh_lib.jit, static_argnums=(0, 7, 8))
def _full_step(graphdef, state, tokens_BS, valid_BS, positions_BS, last, edits, greedy, top_k, key_temperature):
  """The full forward over the buffer (slots after `last` hidden): the token after slot `last` [B]."""
  key, temperature = key_temperature
  logits_BSV, _ = nnx.merge(graphdef, state)(
    tokens_BS, valid_BT=valid_BS, positions_BT=positions_BS, interventions=edits
  )
  return _pick(logits_BSV[:, last], key, temperature, greedy, top_k)


def _check_sampling(cfg, temperature, top_k, eos_id) -> None:
  """generate's sampling arguments, each refused in one line naming its range."""
  if isinstance(temperature, bool) or not isinstance(temperature, int | float) or not temperature >= 0:
    raise UserError(f"generate: temperature={temperature!r} must be a number ≥ 0")
  if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= cfg.vocab_size):
    raise UserError(f"generate: top_k={top_k!r} must be None or an int in 1..{cfg.vocab_size}")
  if eos_id is not None and (not check.is_token_id(eos_id) or not 0 <= eos_id < cfg.vocab_size):
    raise UserError(f"generate: eos_id={eos_id!r} must be None or a token id in 0..{cfg.vocab_size - 1}")


@check.arguments(max_new_tokens=check.integer(0), use_cache=check.boolean, seed=check.seed)
def generate(
  model,
  prompt,
  max_new_tokens: int,
  temperature: float = 0.0,
  top_k: int | None = None,
  *,
  interventions: dict | None = None,
  use_cache: bool = True,
  eos_id: int | None = None,
  seed: int = 0,
):
  """What follows `prompt`, in the prompt's own kind: for a text the new text (`tokenizer.decode` of the new
  tokens, special tokens dropped), for token ids the new ids (a list of ints); for a list of prompts a list,
  each entry as its prompt (texts give texts, id lists give id lists).

  model: `headspec.load(...)` (text prompts need its tokenizer), a (Transformer, tokenizer) pair or a decoder
  Transformer. prompt: a text (tokenized as the tokenizer does, with its BOS if it adds one), a list of token
  ids, or a list of either; prompts of different lengths are left-padded. temperature 0 is greedy (argmax);
  above 0 samples from softmax(logits / temperature), over the `top_k` likeliest tokens if given, with
  `jax.random.key(seed)`. interventions: {site: edit} as for the model's forward, acting at every position
  (an `Edit`'s arrays of size 1 on the position axes T and S; an `Apply` sees each forward's activation: the
  prompt's, then one token's with the cache, so a function that mixes positions sees only those).
  use_cache: True decodes with a KVCache (a prefill, then one jitted step per token); False reruns the whole
  forward each step (same tokens, slower). eos_id: a row stops after emitting it (that token included);
  None generates max_new_tokens for every row. For a text prompt's new token ids, give its ids
  (`headspec.to_tokens(model, text)[0]`).
  """
  model, tokenizer = _model_and_tokenizer(model)
  cfg = model.cfg
  if cfg.kind != "decoder":
    raise UserError("generate: the model is an encoder (masked LM); generation needs a decoder")
  _check_sampling(cfg, temperature, top_k, eos_id)  # max_new_tokens and seed: the API check above
  rows, single, texts = _rows(prompt, tokenizer, cfg.vocab_size)
  B, P = len(rows), max(map(len, rows))
  if P + max_new_tokens > cfg.max_len:
    raise UserError(
      f"generate: prompt ({P} tokens) + max_new_tokens={max_new_tokens} exceeds model.max_len={cfg.max_len}"
    )
  S = min(cfg.max_len, -(-(P + int(max_new_tokens)) // SLOTS) * SLOTS)  # slots in buckets: fewer compiles
  edits = _check_edits(cfg, interventions, B, S)
  if not max_new_tokens:
    empty = ["" if text else [] for text in texts]
    return empty[0] if single else empty

  pad_B = np.asarray([P - len(row) for row in rows], np.int32)
  tokens_BS = np.zeros((B, S), np.int32)
  for b, row in enumerate(rows):
    tokens_BS[b, pad_B[b] : P] = row
  positions_BS = np.maximum(np.arange(S)[None] - pad_B[:, None], 0).astype(np.int32)
  real_BS = np.arange(S)[None] >= pad_B[:, None]  # left padding is no token
  graphdef, state = nnx.split(model)
  greedy = temperature == 0
  keys = jax.random.split(jax.random.key(seed), int(max_new_tokens))
  temp = jnp.float32(temperature if not greedy else 1.0)
  out_BN = np.zeros((B, int(max_new_tokens)), np.int32)
  done_B = np.zeros(B, bool)

  def record(i, next_B):
    out_BN[:, i] = next_B
    if eos_id is not None:
      done_B[:] |= next_B == eos_id

  if use_cache:
    cache = KVCache.empty(cfg, B, S)
    next_B, cache = _cached_step(
      graphdef, state, jnp.asarray(tokens_BS[:, :P]), jnp.asarray(real_BS[:, :P]),
      jnp.asarray(positions_BS[:, :P]), cache, edits, (keys[0], temp), greedy, top_k,
    )  # fmt: skip
    record(0, np.asarray(next_B))
    for i in range(1, int(max_new_tokens)):
      if done_B.all():
        break
      slot = P + i - 1
      next_B, cache = _cached_step(
        graphdef, state, jnp.asarray(out_BN[:, i - 1 : i]), jnp.ones((B, 1), bool),
        jnp.asarray(positions_BS[:, slot : slot + 1]), cache, edits, (keys[i], temp), greedy, top_k,
      )  # fmt: skip
      record(i, np.asarray(next_B))
  else:
    for i in range(int(max_new_tokens)):
      if done_B.all():
        break
      last = P + i - 1
      valid_BS = real_BS & (np.arange(S)[None] <= last)
      next_B = _full_step(
        graphdef, state, jnp.asarray(tokens_BS), jnp.asarray(valid_BS), jnp.asarray(positions_BS),
        jnp.int32(last), edits, greedy, top_k, (keys[i], temp),
      )  # fmt: skip
      record(i, np.asarray(next_B))
      tokens_BS[:, last + 1] = out_BN[:, i]

  result = []
  for b in range(B):
    new = [int(t) for t in out_BN[b]]
    if eos_id is not None and eos_id in new:
      new = new[: new.index(eos_id) + 1]
    result.append(tokenizer.decode(new) if texts[b] else new)
  return result[0] if single else result
