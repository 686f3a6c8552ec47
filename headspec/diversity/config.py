"""Every `headspec diversity` config key with its default. configs/diversity.py starts from
`diversity_config()` and overrides what it changes, so each key is declared (and documented) once."""

from __future__ import annotations

import ml_collections

SAMPLES = ("first", "random")


def diversity_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.mesh = ""  # data=N,fsdp=N,tensor=N (docs/scale.md); '': training data-parallel, analyses on one device
  c.multihost = False  # one program over all processes (pod workers, SLURM tasks; mesh '': all on data)
  c.steps = "all"  # 'all' | 'last' | comma-separated saved steps; a pretrained model has step 0 only
  c.num_tokens = 10000  # evaluation tokens (queries); the last row is cut to make it exact
  c.batch_size = 8  # rows per jit-compiled update; memory grows with batch_size · seq_len², not num_tokens
  c.sample = "first"  # one of SAMPLES: the 'first' rows of the validation split, or 'random' rows drawn with `seed`
  c.seed = 0  # only for sample='random'
  c.data_dir = ""  # '' = the run's own data_dir (its config.json), then HEADSPEC_DATA_DIR; only read
  #                  when the run has no WORKDIR/cache/valid_tokens.npy, or for a pretrained model
  c.corpus = "wikitext_103"  # pretrained models only: data_dir/text/<corpus>, valid split
  c.seq_len = 128  # pretrained models only: tokens per row, special tokens ([CLS], [SEP]) included
  c.model = ml_collections.ConfigDict()
  c.model.pretrained = ""  # 'minilm' or a Hugging Face directory: its step 0 instead of WORKDIR's checkpoints
  c.model.dtype = "float32"  # parameters and compute: 'float32' or 'bfloat16' (half the memory; docs/scale.md)
  return c
