"""The config keys every analysis command shares: which model it reads, at which steps, on which devices.

Declared once here (keys, defaults, meanings: the comments, which `headspec <command> --help` reads) and added
to each analysis config by `add_target_keys`; headspec/runs/targets.py turns them into the targets an analysis
runs over (a run's saved steps, or a pretrained model's step 0 or published revisions).
"""

from __future__ import annotations

import ml_collections


def add_target_keys(c: ml_collections.ConfigDict, *, steps: str | None = "last", model_name: bool = True) -> None:
  """Adds the target keys to the config `c`; `steps`: the default of `c.steps` (None: the command has its own
  step key and no `model_name`, as the probe suite's `probe.steps`); `model_name`: whether its tables take a
  `model_name` key."""
  c.mesh = ""  # data=N,fsdp=N,tensor=N (docs/scale.md); '': training data-parallel, analyses on one device
  c.multihost = False  # one program over all processes (pod workers, SLURM tasks; mesh '': all on data)
  if steps is not None:
    c.steps = steps  # 'all' | 'last' | comma-separated saved steps ('100,1000'); a pretrained model has step 0 only
  if steps is not None and model_name:
    c.model_name = ""  # the tables' `model` column; '' = the run folder's name or the pretrained name
  c.model = ml_collections.ConfigDict()
  # 'minilm', hf:org/name[@revision] (Hub) or a Hugging Face directory: its step 0 (or its revisions as steps)
  # instead of WORKDIR's checkpoints; '' = WORKDIR's checkpoints
  c.model.pretrained = ""
  c.model.dtype = "float32"  # parameters and compute: 'float32' or 'bfloat16' (half the memory; docs/scale.md)
