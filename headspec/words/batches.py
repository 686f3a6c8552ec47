"""Words through a model, the one way every word-level analysis takes: the probing features, the attention
analyses, the SAE labels, the causal test and the API (`headspec.run`) share these steps instead of each
writing its own.

  representable_sentences   the sentences a model can represent (alignment.representable), counted and logged
  words_of_windows          each window's words, in word order (alignment.align's windows)
  bucketed                  the power-of-two bucket batcher: items grouped by width T, batch_tokens // T a batch
  window_batches            one window per row, rows grouped by power-of-two width: one compile per width
  packed_batches            windows packed side by side into rows of ROW_TOKENS (headspec/words/packing.py), each
                            keeping its own positions and segment, so far less is spent on padding
  sequence_rows, word_matrix, special_tokens   a batch's rows, its word-pooling (or piece-summing) matrix and
                            its special tokens
  sequence_inputs, window_inputs, packed_inputs   a batch's model inputs and its word-pooling matrix
  pool_rows                 per-word vectors of a batch's token activations read back to the host
  pooled_forward            one jitted forward of packed rows that returns the `capture`d sites (and the
                            final hidden state) pooled per word, under `interventions` (model.py's edits)
  forward_rows, pool_sites  its two halves, for a forward that also keeps the token-level sites (api.run)

Every jitted program here and in the analyses comes from a `program_cache`d factory
(headspec/parallel/compilations.py): one program per (graphdef, static key), kept across calls.

Shared layer: it imports no analysis (tests/test_layering.py).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from headspec.model.capture import bucket_length
from headspec.parallel import mesh as mesh_lib
from headspec.parallel.compilations import program_cache
from headspec.words import alignment as align_lib
from headspec.words import packing

ROW_TOKENS = 128  # tokens per packed row (windows longer than this get rows of their own)
# How a captured site is pooled from [L, B, T, *rest] to [L, B, W, *rest] (embeddings and the final hidden
# state have no layer axis).
_POOL = {
  "z": "bwt,lbthk->lbwhk",
  "resid_post": "bwt,lbtd->lbwd",
  "embeddings": "bwt,btd->bwd",
  "hidden": "bwt,btd->bwd",
}


def representable_sentences(
  sentences, tokenizer, max_len: int, *, where: str, log: Callable[[str], None] | None = logging.info, required=True
):
  """(the treebank `sentences` the model can represent, the alignment.Representable that says which and why):
  a sentence with a word of more pieces than the context holds is left out and counted, not fatal; a split
  that keeps none is a UserError naming `where` (unless not `required`)."""
  words = [s.words for s in sentences]
  kept = align_lib.representable(
    words, tokenizer, max_len, where=where, names=[s.sent_id for s in sentences], log=log, required=required
  )
  return kept.select(sentences), kept


def words_of_windows(al: align_lib.Alignment) -> list[np.ndarray]:
  """Per window of `al`, the global indices of the words whose row it is, in word order."""
  by_window = np.argsort(al.word_window_N, kind="stable")
  bounds = np.searchsorted(al.word_window_N[by_window], np.arange(len(al.windows) + 1))
  return [by_window[bounds[w] : bounds[w + 1]] for w in range(len(al.windows))]


def bucketed(widths: np.ndarray, batch_tokens: int) -> list[tuple[int, int, np.ndarray]]:
  """The one power-of-two bucket batcher: (T, B, items) batches of the items (indices into `widths`, each
  item's padded width, a `bucket_length`) of one width T, B = batch_tokens // T (at least 1) a batch, widths
  ascending and items in order: each width compiles one program."""
  widths = np.asarray(widths, np.int64)
  batches = []
  for T in np.unique(widths):
    inside = np.flatnonzero(widths == T)
    B = max(1, batch_tokens // int(T))
    batches += [(int(T), B, inside[i : i + B]) for i in range(0, len(inside), B)]
  return batches


def window_batches(lengths: np.ndarray, max_len: int, batch_tokens: int) -> list[tuple[int, int, np.ndarray]]:
  """(T, B, windows) batches of one window (or sentence) per row: `bucketed` by the power-of-two length
  bucket of each (one compile per bucket), batch_tokens // T rows a batch (batch_tokens 1: one a batch)."""
  return bucketed(np.array([bucket_length(n, max_len) for n in lengths], np.int64), batch_tokens)


def sequence_rows(sequences, T: int, B: int, pad_id: int):
  """(tokens_BT, positions_BT, segment_BT, start_BW, end_BW) of one sequence per row.

  sequences: up to B (token ids, start_N, end_N), word n being pieces [start_N[n], end_N[n]) of its row;
  each row is segment 1 at positions 0.., padding segment 0 (valid_BT = segment_BT > 0); word slots past a
  row's words are empty (start = end = 0). At most T words a row."""
  tokens_BT = np.full((B, T), pad_id, np.int32)
  segment_BT = np.zeros((B, T), np.int32)
  start_BW, end_BW = np.zeros((B, T), np.int64), np.zeros((B, T), np.int64)
  for b, (ids, start_N, end_N) in enumerate(sequences):
    tokens_BT[b, : len(ids)], segment_BT[b, : len(ids)] = ids, 1
    start_BW[b, : len(start_N)], end_BW[b, : len(end_N)] = start_N, end_N
  positions_BT = np.broadcast_to(np.arange(T, dtype=np.int32), (B, T)).copy()
  return tokens_BT, positions_BT, segment_BT, start_BW, end_BW


def word_matrix(start_BW: np.ndarray, end_BW: np.ndarray, T: int, pooling: str) -> np.ndarray:
  """[B, W, T] float32 word matrix of pieces [start, end): `pooling` 'first', 'last' or 'mean' pools a word's
  vector (alignment.pooling_matrix); 'sum' is 1 on each of its pieces, the columns a word-level attention
  map sums (Clark et al. 2019 §4.1). Empty word slots get zero rows."""
  if pooling != "sum":
    return align_lib.pooling_matrix(start_BW, end_BW, T, pooling)
  t_T = np.arange(T)
  return ((t_T >= start_BW[..., None]) & (t_T < end_BW[..., None])).astype(np.float32)


def special_tokens(lengths, T: int, B: int, prefix: int, suffix: int) -> np.ndarray:
  """[B, T] bool: the `prefix` first and `suffix` last tokens of each row of `lengths` tokens (the
  tokenizer's specials, BERT's [CLS] and [SEP]); rows past len(lengths) have none."""
  special_BT = np.zeros((B, T), bool)
  for b, n in enumerate(lengths):
    special_BT[b, :prefix] = True
    special_BT[b, n - suffix : n] = True
  return special_BT


def sequence_inputs(sequences, T: int, B: int, pad_id: int, pooling: str | None):
  """(tokens_BT, positions_BT, segment_BT, pool_BWT): `pooled_forward`'s inputs of one sequence per row
  (`sequence_rows` and their `word_matrix`; pool_BWT None for pooling None: a caller that pools on the host)."""
  *rows, start_BW, end_BW = sequence_rows(sequences, T, B, pad_id)
  return *rows, None if pooling is None else word_matrix(start_BW, end_BW, T, pooling)


def window_inputs(T: int, B: int, windows, al, words_of_window, pad_id: int, pooling: str | None):
  """((tokens_BT, positions_BT, segment_BT, pool_BWT), word_BW: the global word of each pooled slot or −1) of
  a `window_batches` batch (`sequence_inputs` of its windows)."""
  word_BW = np.full((B, T), -1, np.int64)
  sequences = []
  for b, w in enumerate(windows):
    mine = words_of_window[w]
    sequences.append((al.windows[w], al.word_start_N[mine], al.word_end_N[mine]))
    word_BW[b, : len(mine)] = mine
  return sequence_inputs(sequences, T, B, pad_id, pooling), word_BW


def packed_batches(lengths: np.ndarray, max_len: int, batch_tokens: int):
  """(widths per window, [(row width T, rows: [[(window, first column), ...] per row])] per batch).

  Windows packed side by side into rows of ROW_TOKENS tokens (longer windows: rows of the next power of
  two, up to max_len), so a split compiles once per row width and little is spent on padding; the rows are
  `bucketed` by width."""
  widths = np.array([bucket_length(n, max_len, minimum=min(ROW_TOKENS, max_len)) for n in lengths])
  all_rows, row_widths = [], []
  for T in np.unique(widths):
    members = np.flatnonzero(widths == T)
    placed = packing.first_fit(lengths[members], int(T))
    first = np.concatenate([[0], np.cumsum(lengths[members])[:-1]])
    row_U, start_U = placed.row_N[first], placed.start_N[first]
    rows = [[] for _ in range(placed.num_rows)]
    for u in np.lexsort((start_U, row_U)):
      rows[row_U[u]].append((int(members[u]), int(start_U[u])))
    all_rows += rows
    row_widths += [int(T)] * len(rows)
  return widths, [(T, [all_rows[r] for r in inside]) for T, _, inside in bucketed(row_widths, batch_tokens)]


def packed_inputs(T: int, rows, al, lengths, words_of_window, pad_id: int, batch_tokens: int, pooling: str):
  """((tokens_BT, positions_BT, segment_BT, pool_BWT), the words of each row in pooled order) of one
  `packed_batches` batch."""
  B = max(1, batch_tokens // T)
  tokens_BT = np.full((B, T), pad_id, np.int32)
  positions_BT, segment_BT = np.zeros((B, T), np.int32), np.zeros((B, T), np.int32)
  start_BW, end_BW = np.zeros((B, T), np.int64), np.zeros((B, T), np.int64)  # at most T words per row
  words = []
  for b, row in enumerate(rows):
    mine_row, k = [], 0
    for w, col in row:
      n = lengths[w]
      tokens_BT[b, col : col + n] = al.windows[w]
      positions_BT[b, col : col + n], segment_BT[b, col : col + n] = np.arange(n), col + 1
      mine = words_of_window[w]
      start_BW[b, k : k + len(mine)] = col + al.word_start_N[mine]
      end_BW[b, k : k + len(mine)] = col + al.word_end_N[mine]
      mine_row.append(mine)
      k += len(mine)
    words.append(np.concatenate(mine_row))
  pool_BWT = align_lib.pooling_matrix(start_BW, end_BW, T, pooling)
  return (tokens_BT, positions_BT, segment_BT, pool_BWT), words


def pool_rows(x_BTE: np.ndarray, word_BW: np.ndarray, al, pooling: str) -> tuple[np.ndarray, np.ndarray]:
  """(x_WE, word_W) of a `window_inputs` batch on the host: per word slot (word_BW ≥ 0, row by row) its
  word and its pieces' activations x_BTE pooled by `pooling` ('first', 'last', or 'mean' as the difference
  of the row's cumulative sums), for a program that returns token activations (sae/labels.py)."""
  b_W, k_W = np.nonzero(word_BW >= 0)
  word_W = word_BW[b_W, k_W]
  start_W, end_W = al.word_start_N[word_W], al.word_end_N[word_W]
  if pooling == "first":
    return x_BTE[b_W, start_W], word_W
  if pooling == "last":
    return x_BTE[b_W, end_W - 1], word_W
  cum_BTE = np.concatenate([np.zeros_like(x_BTE[:, :1]), np.cumsum(x_BTE, 1)], 1)
  return (cum_BTE[b_W, end_W] - cum_BTE[b_W, start_W]) / (end_W - start_W)[:, None], word_W


@program_cache(16)
def pooled_forward(graphdef, capture: tuple[str, ...], hidden: bool = False):
  """jit(state, tokens_BT, positions_BT, segment_BT, pool_BWT, interventions) -> {name: word-pooled array}.

  Rows are packed sequences (segment 0 = padding); `capture`: sites of `_POOL` (z [L,B,W,H,K], resid_post
  [L,B,W,D], embeddings [B,W,D]), pooled in float32 by pool_BWT; `hidden`: also the final hidden state
  [B,W,D] (after a pre-LN model's final norm, what its LM head reads). interventions: model.py's
  {site: edit} (None for none), traced, so new values never recompile."""

  @mesh_lib.jit
  def forward(state, tokens_BT, positions_BT, segment_BT, pool_BWT, interventions):
    model = nnx.merge(graphdef, state)
    rows = (tokens_BT, positions_BT, segment_BT)
    out_BT, inter = forward_rows(model, rows, interventions, capture, "hidden" if hidden else "logits")
    pooled = pool_sites(pool_BWT, inter, capture)
    if hidden:
      pooled["hidden"] = jnp.einsum(_POOL["hidden"], pool_BWT, out_BT.astype(jnp.float32))
    return pooled

  return forward


def forward_rows(model, rows, interventions, capture: tuple[str, ...], output: str = "logits"):
  """The model on rows (tokens_BT, positions_BT, segment_BT) of packed sequences (segment 0 = padding), under
  `interventions`, capturing `capture`: (logits or final hidden state, Intermediates)."""
  tokens_BT, positions_BT, segment_BT = rows
  return model(
    tokens_BT,
    valid_BT=segment_BT > 0,
    positions_BT=positions_BT,
    segment_BT=segment_BT,
    interventions=interventions,
    capture=capture,
    output=output,
  )


def pool_sites(pool_BWT, inter, capture: tuple[str, ...]) -> dict:
  """{site: its captured activations pooled per word} (traced; float32): z [L,B,W,H,K], resid_post [L,B,W,D],
  embeddings [B,W,D] of the model's `Intermediates` `inter`, pooled by pool_BWT."""
  return {name: jnp.einsum(_POOL[name], pool_BWT, inter.site(name).astype(jnp.float32)) for name in capture}


def hidden_words(model, batches: Sequence, num_words: int, interventions=None) -> np.ndarray:
  """The final hidden state [num_words, D] per word (in word order) of `window_inputs` batches
  (inputs, word_BW), through `pooled_forward(capture=(), hidden=True)` under `interventions`."""
  graphdef, state = nnx.split(model)
  fn = pooled_forward(graphdef, (), True)
  out = np.zeros((num_words, model.cfg.d_model), np.float32)
  for inputs, word_BW in batches:
    x = np.asarray(fn(state, *inputs, interventions)["hidden"])
    real = word_BW >= 0
    out[word_BW[real]] = x[real]
  return out


def interventions_fingerprint(interventions: dict) -> str:
  """SHA-256 of `interventions` ({site: edit or edits}): sites, edit kinds, Apply functions and layers, and
  every array's dtype, shape and bytes; equal edits give equal keys (feature caches are keyed by it)."""
  digest = hashlib.sha256()
  for site in sorted(interventions):
    given = interventions[site]
    for edit in given if isinstance(given, list | tuple) else (given,):
      fn = getattr(edit, "fn", None)
      name = getattr(fn, "__qualname__", repr(fn)) if fn is not None else ""
      digest.update(f"{site}|{type(edit).__name__}|{name}|{getattr(edit, 'layers', None)}".encode())
      for leaf in jax.tree.leaves(edit):
        array = np.asarray(leaf)
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(np.ascontiguousarray(array).tobytes())
  return digest.hexdigest()
