"""Probing suite on the quickstart's synthetic treebank (no download).

  headspec quickstart --workdir=runs/quickstart          # writes runs/quickstart/data and trains
  headspec probe --config=configs/probe_synthetic.py --workdir=runs/quickstart/encoder \\
      --config.data_dir=runs/quickstart/data

Argument: the data folder (default runs/quickstart/data), e.g. configs/probe_synthetic.py:/tmp/qs/data.
The full suite: the last step and a random-weights copy of the same architecture (model name + '-random'),
fitted on all 47.6k training words with three L2 penalties; on a 2-core CPU about 2.5 minutes for the
trained quickstart decoder and its random copy (idle; BENCHMARKS.md). `headspec quickstart` itself probes
with its trimmed copy, `quickstart_probe_config` (docs/results.md#the-quickstart).
Expect UPOS and deprel heads far above the majority baseline with positive selectivity, and the random
model less selective.
"""

from headspec.probing.config import synthetic_probe_config


def get_config(arg: str | None = None):
  return synthetic_probe_config(arg or "runs/quickstart/data")
