"""Language-model input: documents packed into fixed-length token rows, served by a grain iterator.

`pack_tokens` turns documents into `tokens_NT` (N rows of T tokens; every document followed by <eos>,
rows cut from the joined stream, ragged tail dropped). `make_lm_iterator` shuffles rows with grain,
forms global batches and gives each host only its slice of every global batch; its state is a small
JSON dict, so it goes into an orbax checkpoint and training resumes on exactly the next batch.
"""

from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterable

import grain
import numpy as np
from etils import epath

from headspec.data.repeats import RepeatRows
from headspec.data.tokenizer import Tokenizer
from headspec.errors import UserError
from headspec.io import remote


def tokenize_stream(documents: Iterable[str], tokenizer: Tokenizer) -> np.ndarray:
  """All documents' ids, each document followed by eos, as one int32 vector."""
  eos = np.array([tokenizer.eos_id], np.int32)
  parts = []
  for document in documents:
    parts += [np.asarray(tokenizer.encode(document), np.int32), eos]
  if not parts:
    raise UserError("LM data: the corpus has no documents")
  return np.concatenate(parts)


def pack_tokens(
  documents: Iterable[str], tokenizer: Tokenizer, seq_len: int, *, cache_path: str | os.PathLike | None = None
) -> np.ndarray:
  """int32 [N, seq_len]: the documents tokenized, joined with eos and cut into rows (tail dropped).

  With `cache_path`, the token stream is saved there as .npy and read back on later calls (for any
  seq_len); the cache belongs to one tokenizer, so keep it beside that tokenizer (e.g. in the run dir).
  `cache_path` may be a URL (gs://...): the cache is then one object, written whole.
  """
  cache = None if cache_path is None else epath.Path(cache_path)
  if cache is not None and cache.is_file():
    stream = np.load(io.BytesIO(cache.read_bytes()))
    if stream.ndim != 1 or stream.dtype != np.int32 or (stream.size and stream.max() >= tokenizer.vocab_size):
      raise UserError(
        f"{cache}: token cache does not fit this tokenizer (vocab_size {tokenizer.vocab_size}); "
        "delete it to tokenize again"
      )
  else:
    stream = tokenize_stream(documents, tokenizer)
    if cache is not None:
      cache.parent.mkdir(parents=True, exist_ok=True)
      buffer = io.BytesIO()
      np.save(buffer, stream)
      remote.write_bytes_atomic(cache, buffer.getvalue())  # an interrupted run never leaves a truncated cache
  num_rows = stream.size // seq_len
  if num_rows == 0:
    raise UserError(f"LM data: the corpus has {stream.size} tokens, fewer than one row of seq_len={seq_len}")
  return stream[: num_rows * seq_len].reshape(num_rows, seq_len)


def make_lm_iterator(
  tokens_NT: np.ndarray,
  *,
  global_batch_size: int,
  seed: int,
  process_index: int = 0,
  process_count: int = 1,
  shuffle: bool = True,
  num_epochs: int | None = None,
  repeats: RepeatRows | None = None,
) -> grain.DatasetIterator:
  """Iterator of {'tokens': int32 [global_batch_size // process_count, T]}: this host's rows of each batch.

  Global batch b is rows b*G .. (b+1)*G - 1 of the (per-epoch reshuffled) row stream; host p gets the
  p-th of its `process_count` equal slices, so hosts' rows are disjoint and together form the global
  batch. Deterministic given `seed`. Infinite when `num_epochs` is None; otherwise ends after the last
  full global batch (same count on every host). `get_state()` / `set_state()` resume exactly.
  `repeats`: replace a fraction of each batch's rows with repeated random sequences (RepeatRows.mix,
  drawn from the batch's index, so a resumed iterator draws the same rows).
  """
  if tokens_NT.ndim != 2 or len(tokens_NT) == 0:
    raise UserError(f"LM data: empty corpus (token rows of shape {tokens_NT.shape})")
  if global_batch_size <= 0 or global_batch_size % process_count:
    raise UserError(
      f"train.batch_size={global_batch_size}: must be a positive multiple of the {process_count} processes"
    )
  if not 0 <= process_index < process_count:
    raise ValueError(f"process_index {process_index} not in [0, {process_count})")
  per_host = global_batch_size // process_count
  rows = grain.MapDataset.source(tokens_NT.astype(np.int32, copy=False))
  if shuffle:
    rows = rows.shuffle(seed=seed)  # indices past the first epoch get a fresh permutation per epoch
  rows = rows.repeat(num_epochs)
  if num_epochs is not None:
    num_batches = len(rows) // global_batch_size
    if num_batches == 0:
      raise UserError(
        f"LM data: {len(tokens_NT)} rows x {num_epochs} epochs is less than one global batch of {global_batch_size}"
      )
    if num_batches * global_batch_size < len(rows):
      logging.info(
        "LM data: dropping %d rows after the last full global batch", len(rows) - num_batches * global_batch_size
      )
    rows = rows[: num_batches * global_batch_size]
  host_batches = rows.batch(per_host, drop_remainder=True)[process_index::process_count]
  batches = host_batches.map(lambda tokens_BT: {"tokens": tokens_BT})
  if repeats is not None and repeats.fraction > 0:
    batches = batches.map_with_index(repeats.mix)
  # A few threads and a short prefetch queue: rows are in memory, so reading is cheap.
  return iter(batches.to_iter_dataset(grain.ReadOptions(num_threads=2, prefetch_buffer_size=4)))
