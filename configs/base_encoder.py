"""A BERT-style encoder (post-LayerNorm, masked LM; 6 layers, 8 heads, d_model 256) on english_mix.

  headspec train --config=configs/base_encoder.py --workdir=runs/encoder

Needs HEADSPEC_DATA_DIR with text/english_mix/. Same budget as base_decoder.py.
"""

from headspec.defaults import train_config


def get_config(arg: str | None = None):
  c = train_config()
  c.model.kind = "encoder"
  c.model.pre_layernorm = False
  c.model.activation = "gelu_exact"
  c.train.keep_steps = (0, 100, 300, 1000, 3000)
  return c
