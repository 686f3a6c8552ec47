"""`headspec quickstart`: the whole pipeline on the embedded synthetic treebank, on a laptop CPU.

Generates the synthetic treebank and its text (headspec/data/synthetic.py), trains a small decoder and
a small encoder on the text, probes every head of both (and of a random-weights copy of the decoder) on
the treebank (`quickstart_probe_config`: a 12k-word subset, two L2 penalties), analyses the decoder's
attention maps, ablates every head of the decoder, writes the head atlas (decoder beside encoder), and prints
the summaries and what it wrote: README command 1 in about 4 minutes on a 2-core CPU (docs/results.md).

`headspec quickstart [--workdir=DIR] [--config.train.steps=N]`: the command line takes the keyword
arguments of `run_quickstart` (`OPTIONS`), spelt as the config keys they set.
"""

from __future__ import annotations

import pathlib

import ml_collections

from headspec.data.synthetic import write_synthetic
from headspec.errors import UserError
from headspec.train.config import train_config

OPTIONS = {"train.steps": "steps"}
"""`--config.KEY=VALUE` of `headspec quickstart` -> the `run_quickstart` keyword it sets (both models)."""


def quickstart_config(kind: str = "decoder") -> ml_collections.ConfigDict:
  """A 2-layer, 4-head model for a few minutes of CPU on the synthetic corpus."""
  c = train_config()
  c.data.corpus = "synthetic"
  c.data.vocab_size = 1000
  c.model.kind = kind
  c.model.num_layers = 2
  c.model.num_heads = 4
  c.model.d_model = 64
  c.model.d_head = 16
  c.model.d_ff = 256
  c.model.dropout = 0.0
  c.model.attention_dropout = 0.0
  if kind == "encoder":
    c.model.pre_layernorm = False
    c.model.activation = "gelu_exact"
  c.train.steps = 300
  c.train.batch_size = 32
  c.train.seq_len = 64
  c.train.learning_rate = 3e-3
  c.train.warmup_steps = 30
  c.train.log_every = 50
  c.train.eval_every = 100
  c.train.eval_batches = 5
  c.train.diversity_every = 100
  c.train.checkpoint_every = 100
  c.train.keep_steps = (20, 50)
  return c


def options(args: list[str]) -> dict:
  """`run_quickstart`'s keywords from the command line's `--config.KEY=VALUE` (or `--config.KEY VALUE`)
  of `OPTIONS`; anything else is a UserError naming it and what is accepted."""
  accepted = ", ".join(f"--config.{key}=N" for key in OPTIONS)
  out, rest = {}, list(args)
  while rest:
    arg = rest.pop(0)
    key, sep, value = arg.removeprefix("--config.").partition("=")
    if not arg.startswith("--config.") or key not in OPTIONS:
      raise UserError(f"quickstart: unknown argument {arg}; it takes --workdir=DIR and {accepted}")
    if not sep:
      if not rest:
        raise UserError(f"quickstart: {arg} needs a value ({arg}=N)")
      value = rest.pop(0)
    if not (value.isascii() and value.isdigit() and int(value) > 0):
      raise UserError(f"quickstart: {arg.split('=')[0]}={value} must be a whole number of steps >= 1")
    out[OPTIONS[key]] = int(value)
  return out


def run_quickstart(workdir, *, steps: int | None = None) -> dict[str, pathlib.Path]:
  """Writes WORKDIR/data (synthetic treebank + text) and the runs WORKDIR/{decoder,encoder}."""
  from headspec.ablation import run as ablation  # after flags: keeps `headspec --help` fast
  from headspec.atlas import build_atlas
  from headspec.attention import run as attention
  from headspec.probing import run as probing
  from headspec.train.loop import train_and_evaluate

  workdir = pathlib.Path(workdir)
  data_dir = write_synthetic(workdir / "data")
  print(f"synthetic treebank and text: {data_dir}", flush=True)
  written = {"data": data_dir}
  for kind in ("decoder", "encoder"):
    config = quickstart_config(kind)
    config.data_dir = str(data_dir)
    if steps:
      config.train.steps = steps
    print(f"training the {kind} ({config.train.steps} steps) in {workdir / kind}", flush=True)
    train_and_evaluate(config, workdir / kind)
    written[kind] = workdir / kind
  for kind in ("decoder", "encoder"):
    print(f"probing every head of the {kind} on the synthetic treebank", flush=True)
    # the random-weights control once, beside the decoder: the encoder at 300 steps still scores at its control
    print(probing.quickstart(workdir / kind, data_dir, random_baseline=kind == "decoder"), flush=True)
  print("what the decoder's heads attend to (Clark et al. 2019 syntax, head roles, pictures)", flush=True)
  print(attention.quickstart(workdir / "decoder", data_dir), flush=True)
  print("ablating every head of the decoder (loss change, importance, pruning)", flush=True)
  print(ablation.quickstart(workdir / "decoder", data_dir), flush=True)
  atlas = build_atlas(workdir / "decoder", compare=[workdir / "encoder"])
  written["atlas"] = atlas
  print("wrote:")
  for kind in ("decoder", "encoder"):
    for path in sorted((workdir / kind).glob("*")) + sorted((workdir / kind / "probes").glob("*")):
      if path.name not in ("cache", "probes"):
        print(f"  {path}")
  print(f"the head atlas (open it in a browser): {atlas}")
  return written
