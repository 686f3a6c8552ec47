"""A GPT-style decoder (6 layers, 8 heads, d_model 256) on the english_mix corpus.

  headspec train --config=configs/base_decoder.py --workdir=runs/decoder

Needs HEADSPEC_DATA_DIR with text/english_mix/. 10k steps of 64x128 tokens: several hours on a 2-core
CPU, minutes on a GPU. Expect validation perplexity well below the unigram perplexity within 1k steps.
Keeps steps 0, 100, 300, 1000, 3000 for studies of specialization over training.
"""

from headspec.defaults import train_config


def get_config(arg: str | None = None):
  c = train_config()
  c.train.keep_steps = (0, 100, 300, 1000, 3000)
  return c
