"""Syntax from attention (Clark et al. 2019), head roles and attention pictures on UD English EWT.

  headspec attention --config=configs/attention_ewt.py --workdir=RUN              # a run's last step
  headspec attention --config=configs/attention_ewt.py --workdir=RUN --config.steps=all
  headspec attention --config=configs/attention_ewt.py:minilm --workdir=runs/minilm   # all-MiniLM-L6-v2

Every EWT dev sentence (2,001; best heads and baseline offsets chosen there, head roles scored there)
and every test sentence (2,077; accuracies reported there) through the model once, word-level
attention reduced on device. Writes RUN/attention/{clark,clark_baselines,roles,labels}.csv,
clark_summary.md and pictures/<model>-step<step>/ (docs/attention.md). Time on a shared 2-core CPU
for all-MiniLM-L6-v2: under a minute (53 s measured; dev alone 38 s, of which pictures ~17 s;
benchmarks/bench_attention.py). Every key, its default and its comment: headspec/attention/config.py.
"""

from headspec.attention.config import attention_config


def get_config(arg: str | None = None):
  c = attention_config()
  c.treebank = "en_ewt"  # the default already; stated because this config is the EWT study
  if arg == "minilm":
    c.model.pretrained = "minilm"
  elif arg:
    raise ValueError(f"configs/attention_ewt.py: unknown argument {arg!r} (use 'minilm' or none)")
  return c
