"""A GPT-style decoder (6 layers, 8 heads, d_model 256) on WikiText-103 (raw).

  headspec data download text wikitext_103          # once: 315 MB download, about 540 MB of text
  headspec train --config=configs/base_decoder.py --workdir=runs/decoder

Reads HEADSPEC_DATA_DIR/text/wikitext_103/ (another corpus: --config.data.corpus=NAME, docs/data.md).
10k steps of 64x128 tokens (82M tokens, under one epoch). Expected time per 1k steps, an ESTIMATE
(not measured for this config; scaled from benchmarks/bench_train's 4-layer, d_model 256 model,
1,977 tokens/s on a 2-core CPU): about 1.5-2 hours on a 2-core CPU, about a minute on a datacenter
GPU. Before step 0, a first run on WikiText-103 also trains the 8k tokenizer and tokenizes the corpus
once (estimate: 10-20 minutes on a 2-core CPU, cached in the workdir). Expect validation perplexity well
below the unigram perplexity within 1k steps. Keeps steps 0, 100, 300, 1000, 3000 for studies of
specialization over training.
"""

from headspec.train.config import train_config


def get_config(arg: str | None = None):
  c = train_config()
  c.data.corpus = "wikitext_103"
  c.train.keep_steps = (0, 100, 300, 1000, 3000)
  return c
