"""Every `headspec diversity` config key with its default. configs/diversity.py starts from
`diversity_config()` and overrides what it changes, so each key is declared (and documented) once."""

from __future__ import annotations

import ml_collections

from headspec.runs.target_config import add_target_keys

SAMPLES = ("first", "random")


def diversity_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  add_target_keys(c, steps="all", model_name=False)  # mesh, multihost, steps, model.pretrained, model.dtype
  c.num_tokens = 10000  # evaluation tokens (queries); the last row is cut to make it exact
  c.batch_size = 8  # rows per jit-compiled update; memory grows with batch_size · seq_len², not num_tokens
  c.sample = "first"  # one of SAMPLES: the 'first' rows of the validation split, or 'random' rows drawn with `seed`
  c.seed = 0  # only for sample='random'
  c.data_dir = ""  # '' = the run's own data_dir (its config.json), then HEADSPEC_DATA_DIR; only read
  #                  when the run has no WORKDIR/cache/valid_tokens.npy, or for a pretrained model
  c.corpus = "wikitext_103"  # pretrained models only: data_dir/text/<corpus>, valid split
  c.seq_len = 128  # pretrained models only: tokens per row, special tokens ([CLS], [SEP]) included
  return c
