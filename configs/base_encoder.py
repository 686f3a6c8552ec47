"""A BERT-style encoder (post-LayerNorm, masked LM; 6 layers, 8 heads, d_model 256) on WikiText-103 (raw).

  headspec data download text wikitext_103          # once: 315 MB download, about 540 MB of text
  headspec train --config=configs/base_encoder.py --workdir=runs/encoder

Reads HEADSPEC_DATA_DIR/text/wikitext_103/ (another corpus: --config.data.corpus=NAME, docs/data.md).
Same budget and the same ESTIMATED time per 1k steps as base_decoder.py (about 1.5-2 hours on a 2-core
CPU, about a minute on a datacenter GPU; not measured for this config).
"""

from headspec.train.config import train_config


def get_config(arg: str | None = None):
  c = train_config()
  c.data.corpus = "wikitext_103"
  c.model.kind = "encoder"
  c.model.pre_layernorm = False
  c.model.activation = "gelu_exact"
  c.train.keep_steps = (0, 100, 300, 1000, 3000)
  return c
