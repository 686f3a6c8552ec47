"""The CLI's commands: each turns (config, workdir, positional args) into one library call."""

from __future__ import annotations

import os

from headspec import targets
from headspec.errors import UserError


def quickstart(config, workdir, args) -> None:
  from headspec.quickstart import run_quickstart

  if args:
    raise UserError(f"quickstart takes no arguments, got {' '.join(args)}")
  run_quickstart(workdir or "runs/quickstart")


def train(config, workdir, args) -> None:
  from headspec.train import train_and_evaluate

  if args:
    raise UserError(f"train takes no arguments, got {' '.join(args)}")
  if not config.model.pretrained:
    targets.data_dir(config, purpose="the training corpus")
  final = train_and_evaluate(config, workdir)
  print(f"trained to step {final.get('step')}: loss {final.get('loss', float('nan')):.4f}; run directory {workdir}")


def probe(config, workdir, args) -> None:
  from headspec.probing.suite import main

  if args:
    raise UserError(f"probe takes no arguments, got {' '.join(args)}")
  main(config, workdir)


def diversity(config, workdir, args) -> None:
  from headspec.diversity_run import run_diversity

  if args:
    raise UserError(f"diversity takes no arguments, got {' '.join(args)}")
  results = run_diversity(config, workdir)
  print(f"diversity metrics: {results}; figures in {results.parent}")


def data(config, workdir, args) -> None:
  """`headspec data download ud TREEBANK [--repo R] [--release R] [--base-url U] [--force]`."""
  if len(args) < 3 or args[:2] != ["download", "ud"]:
    raise UserError("usage: headspec data download ud TREEBANK [--repo UD_X-Y] [--release r2.14] [--force]")
  from headspec.data.download import main_download

  data_dir = targets.data_dir(config, purpose="files go to DATA_DIR/ud/TREEBANK/", must_exist=False)
  for path in main_download(args[2:], os.fspath(data_dir)):
    print(path)
