"""Edge attribution patching and circuit faithfulness of a decoder on a built-in task (docs/circuits.md).

  headspec circuit --config=configs/circuit.py --workdir=RUN          # repeated-sequence induction
  headspec circuit --config=configs/circuit.py:ioi --workdir=RUN      # IOI-style name templates
  headspec circuit --config=configs/circuit.py --workdir=RUN --config.task=pairs --config.pairs=FILE.jsonl

Every key, with its default and meaning, is declared once in headspec/patching/circuit.py (circuit_config):
steps ('last'), model_name, task, pairs (a JSON Lines file of {clean, corrupt, answer, wrong}), metric, corruption,
count (32), induction_n (6), methods (eap, eap_ig, exact), ig_steps (5), sizes (5,10,20,40), random_sets (3),
batch_size, figure_edges (20), seed, model.pretrained.
Writes RUN/circuit/edges.csv, RUN/circuit/faithfulness.csv (docs/outputs.md) and a figure per method,
RUN/circuit/<task>_<method>_<model>_step<step>.png.
"""

from headspec.patching.circuit import circuit_config


def get_config(arg: str | None = None):
  c = circuit_config()
  if arg == "ioi":
    c.task = "ioi"
  elif arg:
    raise ValueError(f"configs/circuit.py: unknown argument {arg!r} (use 'ioi' or none)")
  return c
