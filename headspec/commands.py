"""The CLI's commands: each turns (config, workdir, positional args) into one library call (an analysis's
`<package>.run.run`, the job loop of headspec/jobloop.py)."""

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
  if "step" not in final:  # resumed at train.steps: nothing left to do
    print(f"already trained to step {config.train.steps}; run directory {workdir}")
    return
  print(f"trained to step {final.get('step')}: loss {final.get('loss', float('nan')):.4f}; run directory {workdir}")


def probe(config, workdir, args) -> None:
  from etils import epath

  from headspec.probing.run import run

  if args:
    raise UserError(f"probe takes no arguments, got {' '.join(args)}")
  results = run(config, workdir)
  print((epath.Path(results).parent / "summary.md").read_text())


def diversity(config, workdir, args) -> None:
  from headspec.diversity.run import run

  if args:
    raise UserError(f"diversity takes no arguments, got {' '.join(args)}")
  results = run(config, workdir)
  print(f"diversity metrics: {results}; figures in {results.parent}")


def atlas(config, workdir, args) -> None:
  """`headspec atlas --workdir=RUN [--compare=RUN_B ...]`: writes RUN/atlas.html (no JAX, no --config)."""
  from headspec.atlas import build_atlas

  if not workdir:
    raise UserError("atlas needs --workdir=RUN (a run directory with results tables)")
  compare, rest = [], list(args)
  while rest:
    arg = rest.pop(0)
    if arg.startswith("--compare="):
      compare.append(arg.split("=", 1)[1])
    elif arg == "--compare" and rest:
      compare.append(rest.pop(0))
    else:
      raise UserError(f"atlas takes only --compare=RUN_B, got {arg}")
  print(build_atlas(workdir, compare=compare))


def ablate(config, workdir, args) -> None:
  from headspec.ablation.run import run

  if args:
    raise UserError(f"ablate takes no arguments, got {' '.join(args)}")
  out_dir = run(config, workdir)
  print(f"ablation tables and figures: {out_dir}")


def patch(config, workdir, args) -> None:
  from headspec.patching.run import run

  if args:
    raise UserError(f"patch takes no arguments, got {' '.join(args)}")
  print(f"patching tables and heatmaps: {run(config, workdir).parent}")


def circuit(config, workdir, args) -> None:
  from headspec.patching.circuit import run

  if args:
    raise UserError(f"circuit takes no arguments, got {' '.join(args)}")
  print(f"circuit tables: {run(config, workdir).parent}")


def attention(config, workdir, args) -> None:
  from headspec.attention.run import run

  if args:
    raise UserError(f"attention takes no arguments, got {' '.join(args)}")
  print(run(config, workdir).read_text())


def sae(config, workdir, args) -> None:
  from headspec.sae.run import run

  if args:
    raise UserError(f"sae takes no arguments, got {' '.join(args)}")
  print(f"SAE tables: {run(config, workdir).parent}")


def study(config, workdir, args) -> None:
  """`headspec study --workdir=ROOT`: ROOT/study/ from an experiment's runs (headspec/study.py; no --config)."""
  from headspec import remote, tables
  from headspec.study import OUT, write_study

  if not workdir:
    raise UserError("study needs --workdir=ROOT (an experiment folder: headspec launch ... --experiment=...)")
  if args:
    raise UserError(f"study takes no arguments, got {' '.join(args)}")
  tables.check_writable(remote.run_path(workdir) / OUT)  # a ROOT/study/ that cannot be written: before reading
  print(write_study(workdir).read_text())


def data(config, workdir, args) -> None:
  """`headspec data download ud TREEBANK [--repo R] [--release R] [--splits S] [--base-url U] [--force]`
  or `headspec data download text CORPUS [--sha256 FILE=HEX] [--base-url U] [--force]`
  or `headspec data synthetic --out=DIR [--seed N] [--text-sentences N] [--repeats F]`. `--help` anywhere
  prints help, whether or not a data directory is set."""
  usage = (
    "usage: headspec data download ud TREEBANK [--release r2.16] [--splits dev,test] [--force] | "
    "headspec data download text CORPUS [--force] (CORPUS: english_mix, wikitext_103, wikitext_2) | "
    "headspec data synthetic --out=DIR [--seed=0] [--text-sentences=N] [--repeats=F]"
  )
  wants_help = any(a in ("-h", "--help", "help") for a in args)
  if args[:1] == ["synthetic"]:  # writes its own --out folder: no data directory needed
    from headspec.data import synthetic

    if wants_help:
      synthetic.parser().print_help()
    else:
      print(synthetic.main_synthetic(args[1:]))
    return
  if wants_help and args[:1] == ["download"] and args[1:2] in (["ud"], ["text"]):
    from headspec.data import download, text_download

    (download if args[1] == "ud" else text_download).parser().print_help()
    return
  if wants_help:
    print(usage)
    return
  if len(args) < 3 or args[0] != "download" or args[1] not in ("ud", "text"):
    raise UserError(usage)
  kind = args[1]
  where = "DATA_DIR/ud/TREEBANK/" if kind == "ud" else "DATA_DIR/text/CORPUS/"
  data_dir = os.fspath(targets.data_dir(config, purpose=f"files go to {where}", must_exist=False))
  if kind == "text":
    from headspec.data.text_download import main_download_text

    print(main_download_text(args[2:], data_dir))
    return
  from headspec.data.download import main_download

  for path in main_download(args[2:], data_dir):
    print(path)
