"""The launcher's command line: its targets, a pipeline's analyses with their default configs, its options."""

from __future__ import annotations

import argparse
import os

from headspec.errors import UserError

PROG = "python -m headspec.launch"
DESCRIPTION = (
  "Launchers: run any headspec command, a pipeline, a sweep or an experiment on this machine, a multi-GPU host,"
  " SLURM or Cloud TPU."
)
TARGETS = ("local", "multi-gpu", "slurm", "tpu")
ANALYSES = {  # analysis -> (default config, override that picks the steps to analyse)
  "probe": ("configs/probe_ewt.py", "--config.probe.steps=all"),
  "diversity": ("configs/diversity.py", "--config.steps=all"),
  "attention": ("configs/attention_ewt.py", "--config.steps=all"),
  "ablate": ("configs/ablate.py", "--config.steps=all"),
}
DEPRECATED = {"study": "pipeline"}  # old flag -> the flag it now is (the launcher warns once)


class _Parser(argparse.ArgumentParser):
  def error(self, message):  # one line, not argparse's usage block
    raise UserError(message)


def parser(prog: str = PROG) -> argparse.ArgumentParser:
  p = _Parser(prog=prog, description=DESCRIPTION)
  p.add_argument("target", choices=TARGETS)
  p.add_argument("--dry-run", action="store_true", help="print the commands per host, start nothing")
  p.add_argument("--pipeline", action="store_true", help="train, then every analysis at the kept checkpoints")
  p.add_argument("--study", action="store_true", help="deprecated name of --pipeline")
  p.add_argument("--experiment", default="", help="configs/experiments/NAME.py[:ARG]: its runs, analyses, report")
  p.add_argument("--analyses", default="probe,diversity,attention,ablate", help="a pipeline's analyses, in order")
  for name, (default, _) in ANALYSES.items():
    p.add_argument(f"--{name}-config", default=default, help=f"config of a pipeline's {name} stage")
  p.add_argument("--grid", action="append", default=[], help="sweep: KEY=V1,V2 (repeat for a grid)")
  p.add_argument("--seeds", default="", help="sweep: comma-separated seeds")
  p.add_argument(
    "--fixed-analysis-seed",
    action="store_true",
    help="a pipeline's or sweep's probe/ablate/sae keep their configs' seed (default: each run's training seed)",
  )
  p.add_argument("--config", help="train config of a pipeline or sweep (configs/NAME.py[:ARG])")
  p.add_argument("--workdir", help="run directory of a pipeline; root of a sweep's run directories")
  p.add_argument("--data", default=os.environ.get("HEADSPEC_DATA_DIR", ""), help="data dir (default HEADSPEC_DATA_DIR)")
  g = p.add_argument_group("local")
  g.add_argument("--processes", type=int, default=1, help="jax.distributed processes on this machine")
  g = p.add_argument_group("slurm")
  g.add_argument("--nodes", type=int, default=1)
  g.add_argument("--gpus-per-node", type=int, default=0)
  g.add_argument("--time", default="24:00:00")
  g.add_argument("--partition", default="")
  g.add_argument("--account", default="")
  g.add_argument("--job-name", default="headspec")
  g.add_argument("--script", default="", help="where to write the sbatch script (default slurm/JOB_NAME.sbatch)")
  g = p.add_argument_group("tpu")
  g.add_argument("--tpu-name", default=os.environ.get("TPU_NAME", ""))
  g.add_argument("--zone", default=os.environ.get("ZONE", ""))
  g.add_argument("--project", default=os.environ.get("PROJECT", ""))
  g.add_argument("--create", action="store_true", help="create the TPU VM first")
  g.add_argument("--accelerator-type", default=os.environ.get("ACCELERATOR_TYPE", ""), help="e.g. v4-8, v5litepod-16")
  g.add_argument("--runtime-version", default=os.environ.get("RUNTIME_VERSION", ""), help="e.g. tpu-ubuntu2204-base")
  g.add_argument("--spot", action="store_true")
  return p


def parse(argv: list[str], prog: str = PROG) -> tuple[argparse.Namespace, list[str]]:
  """(options, the arguments after `--`): a command to run, or a pipeline's or sweep's train overrides."""
  rest = []
  if "--" in argv:
    i = argv.index("--")
    argv, rest = argv[:i], argv[i + 1 :]
  return parser(prog).parse_args(argv), rest


def deprecated_given(opts) -> list[str]:
  """A warning per deprecated flag in `opts`, naming the flag that replaces it."""
  return [f"--{old} is deprecated: use --{new}" for old, new in DEPRECATED.items() if getattr(opts, old)]
