"""The quickstart model: a small model on the embedded synthetic treebank's text (no download).

  headspec quickstart --workdir=runs/quickstart      # generates the data, trains both, probes
  headspec train --config=configs/quickstart.py:decoder --workdir=runs/qs_decoder \\
      --config.data_dir=runs/quickstart/data
Argument: 'decoder' (default) or 'encoder'. About 2 minutes each on a 2-core CPU; the loss falls well
below the unigram entropy of the synthetic text.
"""

from headspec.cli.quickstart import quickstart_config


def get_config(arg: str | None = None):
  return quickstart_config(arg or "decoder")
