"""The evaluation text every analysis reads: a fixed set of token rows of a run or a pretrained model.

Diversity, ablation and the induction analyses measure a model on the same rows (`evaluation_tokens`):
a run's own validation rows as training packed them, or for a pretrained model the valid split of a
text corpus in the data directory. config keys: num_tokens, sample ('first' | 'random'), seed, and for
pretrained models corpus and seq_len (headspec/diversity/config.py, headspec/ablation/config.py).
"""

from __future__ import annotations

import math

import ml_collections
import numpy as np

from headspec.data import lm_pipeline, text_tfds
from headspec.errors import UserError
from headspec.io import remote
from headspec.runs import directory as runs
from headspec.runs import targets


def _select_rows(rows_NT: np.ndarray, config) -> tuple[np.ndarray, np.ndarray]:
  """The first (or, with sample='random', seeded random) rows holding num_tokens tokens, and valid_NT.

  Exactly num_tokens tokens are valid (the last row's tail is padding), unless the split is smaller.
  """
  T = rows_NT.shape[1]
  n_rows = min(math.ceil(config.num_tokens / T), len(rows_NT))
  if config.sample == "random":
    idx = np.sort(np.random.default_rng(config.seed).choice(len(rows_NT), n_rows, replace=False))
    rows_NT = rows_NT[idx]
  tokens_NT = np.asarray(rows_NT[:n_rows], np.int32)
  valid_NT = (np.arange(n_rows * T) < config.num_tokens).reshape(n_rows, T)
  return tokens_NT, valid_NT


def evaluation_tokens(
  config: ml_collections.ConfigDict, workdir, tokenizer, documents=None
) -> tuple[np.ndarray, np.ndarray]:
  """(tokens_NT int32, valid_NT bool): the fixed evaluation set every analysis reads.

  A training run: its validation rows exactly as training packed them (WORKDIR/cache/valid_tokens.npy,
  else the valid split of its corpus tokenized again). A pretrained model (or `documents`, texts given in its
  place: `headspec.ablate` reads valid.txt itself so that nothing is written into the data directory): the
  valid split of data_dir/text/<config.corpus>, cut into rows of config.seq_len with the tokenizer's special
  tokens ([CLS] ... [SEP] for BERT) around each.
  """
  workdir = remote.run_path(workdir)
  if config.model.pretrained or documents is not None:
    docs = documents
    if docs is None:
      data_dir = targets.data_dir(config, purpose="the evaluation text")
      docs = text_tfds.load_documents(data_dir, config.corpus, "valid", tfds_dir=targets.tfds_dir(data_dir))
    prefix, suffix = list(tokenizer.prefix_ids), list(tokenizer.suffix_ids)
    width = config.seq_len - len(prefix) - len(suffix)
    if width <= 0:
      raise UserError(f"seq_len={config.seq_len} leaves no room for the tokenizer's special tokens")
    stream = lm_pipeline.tokenize_stream(docs, tokenizer)
    content = stream[: len(stream) // width * width].reshape(-1, width)
    if not len(content):
      raise UserError(f"corpus {config.corpus!r}: fewer valid-split tokens than one row of {width}")
    n = len(content)
    rows_NT = np.concatenate(
      [
        np.broadcast_to(np.asarray(prefix, np.int32), (n, len(prefix))),
        content,
        np.broadcast_to(np.asarray(suffix, np.int32), (n, len(suffix))),
      ],
      axis=1,
    )
    return _select_rows(rows_NT, config)
  run_config = runs.read_config(workdir)
  seq_len = run_config.train.seq_len
  cache = workdir / "cache" / "valid_tokens.npy"
  if cache.is_file():
    rows_NT = lm_pipeline.pack_tokens([], tokenizer, seq_len, cache_path=cache)  # reads (and checks) the cache
  else:
    data_dir = targets.data_dir(config, run_config, purpose="the run's validation text")
    tfds_dir = targets.tfds_dir(data_dir, run_config.data.tfds_dir)
    docs = text_tfds.load_documents(data_dir, run_config.data.corpus, "valid", tfds_dir=tfds_dir)
    rows_NT = lm_pipeline.pack_tokens(docs, tokenizer, seq_len)
  return _select_rows(rows_NT, config)
