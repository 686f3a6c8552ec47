"""Attention analysis: Clark et al. (2019) syntax from attention, head roles, rollout and flow, pictures.

  headspec attention --config=configs/attention_ewt.py:minilm --workdir=runs/minilm

Modules: words.py (word-level maps reduced on device), clark.py (head-attachment accuracy and offset
baselines), roles.py (role scores, CIs, labels), flow.py (Abnar & Zuidema 2020 rollout and flow),
pictures.py, report.py (clark_summary.md), run.py (the command), config.py (every config key).
See docs/attention.md.
"""


def attention_quickstart(run_dir, data_dir) -> str:
  """The attention study of a quickstart run on the synthetic treebank (headspec/attention/run.py)."""
  from headspec.attention.run import quickstart

  return quickstart(run_dir, data_dir)
