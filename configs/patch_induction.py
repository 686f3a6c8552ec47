"""Activation, attribution and path patching of a decoder on a built-in task (docs/patching.md).

  headspec patch --config=configs/patch_induction.py --workdir=RUN            # repeated-sequence induction
  headspec patch --config=configs/patch_induction.py:ioi --workdir=RUN        # IOI-style name templates
  headspec patch --config=configs/patch_induction.py:ioi --config.corruption=s2 --workdir=RUN   # only S2 replaced

Every key, with its default and meaning, is declared once in headspec/patching/config.py: steps ('last'),
model_name, task, corruption ('abc': Wang et al.'s ABC set; or 's2'), metric ('logit_diff' | 'prob' | 'loss'), count (32), induction_n (6), sites (z, pattern, resid_pre, attn_out, mlp_out),
by_position, direction ('denoising'), attribution, path, seed, model.pretrained.
Writes RUN/patching/results.csv, RUN/patching/summary.csv and a heatmap per site and direction. Time on a 2-core CPU: the
quickstart decoder (2 layers × 4 heads, 32 pairs of 12 tokens) takes well under a minute, most of it compiling.
"""

from headspec.patching.config import patch_config


def get_config(arg: str | None = None):
  c = patch_config()
  if arg == "ioi":
    c.task = "ioi"
  elif arg:
    raise ValueError(f"configs/patch_induction.py: unknown argument {arg!r} (use 'ioi' or none)")
  return c
