"""The handlers of the commands that are not an analysis (quickstart, train, atlas, study, data: each a
function of (config, workdir, positional args)), and `run`, which runs any entry of the command table
(headspec/cli/commands.py) — an analysis inside the device mesh its config names, on every process of a
multi-process launch.
"""

from __future__ import annotations

import os

from headspec.errors import UserError


def run(entry, name: str, config, workdir, args: list[str]) -> None:
  """Runs `entry` (a commands.Command) as the command `name`."""
  function = entry.function()
  if entry.report is None:
    function(config, workdir, args)
    return
  if args:
    raise UserError(f"{name} takes no arguments, got {' '.join(args)}")
  import jax

  from headspec.parallel import distributed as parallel
  from headspec.parallel import mesh

  parallel.initialize_distributed(config.get("multihost", False))  # every process runs the same analysis
  spec = config.get("mesh", "")  # a command whose defaults have no mesh runs as on one device
  grid = mesh.parse(spec, key="config.mesh")  # a bad mesh is refused before any work
  # A mesh given shards models, batches and activations; '' leaves the analyses as they run on one
  # device (feature extraction round-robin over the local devices), except in a multi-process command,
  # where '' is every process's devices on `data`: one program over all of them, not a copy per process.
  spread = bool(spec) or jax.process_count() > 1
  with mesh.using(grid if spread and grid.size > 1 else None):
    result = function(config, workdir)
  if result is not None:  # None: a process of a multi-process command other than the writer (process 0)
    print(entry.report_text(result))


def quickstart(config, workdir, args) -> None:
  from headspec.cli import quickstart as quickstart_lib

  options = quickstart_lib.options(args)  # --config.train.steps=N: run_quickstart's keywords
  quickstart_lib.run_quickstart(workdir or "runs/quickstart", **options)


def train(config, workdir, args) -> None:
  from headspec.runs import targets
  from headspec.train.loop import train_and_evaluate

  if args:
    raise UserError(f"train takes no arguments, got {' '.join(args)}")
  if not config.model.pretrained:
    targets.data_dir(config, purpose="the training corpus")
  final = train_and_evaluate(config, workdir)
  if "step" not in final:  # resumed at train.steps: nothing left to do
    print(f"already trained to step {config.train.steps}; run directory {workdir}")
    return
  print(f"trained to step {final.get('step')}: loss {final.get('loss', float('nan')):.4f}; run directory {workdir}")


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


def study(config, workdir, args) -> None:
  """`headspec study --workdir=ROOT`: ROOT/study/ from an experiment's runs (headspec/study/; no --config)."""
  from headspec.io import remote, tables
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
    from headspec.data import download, synthetic, text_download

    forms = (
      ("download ud TREEBANK", download.parser()),
      ("download text CORPUS", text_download.parser()),
      ("synthetic --out=DIR", synthetic.parser()),
    )
    print("\n\n".join([usage, *(_flag_lines(form, parser) for form, parser in forms)]))
    return
  if len(args) < 3 or args[0] != "download" or args[1] not in ("ud", "text"):
    raise UserError(usage)
  from headspec.runs import targets

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


def _flag_lines(form: str, parser) -> str:
  """`headspec data --help`'s block for one form: its flags and their meanings, read from its own parser."""
  rows = []
  for action in parser._actions:
    if not action.option_strings or "--help" in action.option_strings:
      continue
    flag = action.option_strings[-1] + ("" if action.nargs == 0 else f"={action.metavar or action.dest.upper()}")
    shown = action.default is not None and action.default is not False and action.default != ""
    rows.append((flag, action.help or (f"default {action.default}" if shown else "")))
  width = max(len(flag) for flag, _ in rows) + 2
  lines = [f"headspec data {form}: {parser.description or ''}".rstrip()]
  return "\n".join(lines + [f"  {flag:<{width}}{text}".rstrip() for flag, text in rows])


def probe_summary(results) -> str:
  """What `headspec probe` prints: the suite's summary.md beside its results table."""
  from etils import epath

  return (epath.Path(results).parent / "summary.md").read_text()
