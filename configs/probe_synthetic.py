"""Probing suite on the quickstart's synthetic treebank (no download).

  headspec quickstart --workdir=runs/quickstart          # writes runs/quickstart/data and trains
  headspec probe --config=configs/probe_synthetic.py --workdir=runs/quickstart/encoder \\
      --config.data_dir=runs/quickstart/data

Argument: the data folder (default runs/quickstart/data), e.g. configs/probe_synthetic.py:/tmp/qs/data.
Probes the last step and a random-weights copy of the same architecture (model name + '-random'): on a
2-core CPU about 4.5 minutes for the trained quickstart decoder and 2.5 for its random copy
(docs/results.md#the-quickstart; most of it the weak-λ softmax probes of the embeddings and residual
streams and the structural probes).
Expect UPOS and deprel heads far above the majority baseline with positive selectivity, and the random
model less selective.
"""

from headspec.probing.config import synthetic_probe_config


def get_config(arg: str | None = None):
  return synthetic_probe_config(arg or "runs/quickstart/data")
