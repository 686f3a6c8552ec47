"""Head-diversity metrics over a run's checkpoints (headspec/diversity_run.py).

  headspec diversity --config=configs/diversity.py --workdir=RUN [--config.steps=all]
  headspec diversity --config=configs/diversity.py:minilm --workdir=runs/minilm   # pretrained, step 0

For every saved step of RUN ('last' or '100,1000' for some), all eight metrics of headspec/diversity.py
over the first 10,000 tokens of the run's own validation rows (a pretrained model reads the valid split
of data_dir/text/<corpus> instead). Writes RUN/diversity/results.csv (`step,layer,head_i,head_j,metric,
value`; rerunning replaces the rows of the steps recomputed), curves.png, matrix_<metric>.png,
heads.png and output_dissimilarity.gif. Time on a 2-core CPU (10k tokens): ~10 s to compile and draw
the figures, then under 1 s per checkpoint for the quickstart model (2 layers, 4 heads, d_model 64),
~7 s per checkpoint for base_decoder (6 layers, 8 heads, d_model 256, rows of 128), about half a minute
for MiniLM (6 layers, 12 heads, d_model 384). Memory: one batch of activations plus ~1.5 MiB of sums.
"""

import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.steps = "all"  # 'all' | 'last' | comma-separated saved steps; a pretrained model has step 0 only
  c.num_tokens = 10000  # evaluation tokens (queries); the last row is cut to make it exact
  c.batch_size = 8  # rows per jit-compiled update; memory grows with batch_size · seq_len², not num_tokens
  c.sample = "first"  # 'first' rows of the validation split, or 'random' rows drawn with `seed`
  c.seed = 0  # only for sample='random'
  c.data_dir = ""  # '' = the run's own data_dir (its config.json), then HEADSPEC_DATA_DIR; only read
  #                  when the run has no WORKDIR/cache/valid_tokens.npy, or for a pretrained model
  c.corpus = "english_mix"  # pretrained models only: data_dir/text/<corpus>, valid split
  c.seq_len = 128  # pretrained models only: tokens per row, special tokens ([CLS], [SEP]) included
  c.model = ml_collections.ConfigDict()
  c.model.pretrained = ""  # 'minilm' or a Hugging Face directory: its step 0 instead of WORKDIR's checkpoints
  if arg == "minilm":
    c.model.pretrained = "minilm"
  elif arg:
    raise ValueError(f"configs/diversity.py: unknown argument {arg!r} (use 'minilm' or none)")
  return c
