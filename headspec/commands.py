"""The CLI's commands, in one table (COMMANDS): each name's entry says what it runs, its line of
`headspec --help`, and its default config (a command with one needs --config and --workdir). An analysis
is its `<package>/run.py` run(config, workdir) (the job loop of headspec/jobloop.py) and the line printed
from what it returns; the other commands turn (config, workdir, positional args) into one library call.
Adding a command is one entry here."""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Callable

from headspec.errors import UserError


@dataclasses.dataclass(frozen=True)
class Command:
  """One `headspec` command.

  usage: its lines of `headspec --help`: (synopsis, meaning), the synopsis starting with the name.
  run: "module:function", imported only when the command runs (`headspec --help` loads no analysis, no JAX):
    an analysis's run(config, workdir) where `report` is given, else a function of (config, workdir, args).
  report: for an analysis, the text printed from what its run returned; it takes no positional arguments.
  defaults: "module:function" of its default config; a command with one needs --config and --workdir, and
    a --config lacking one of its keys is refused (cli._check_keys), naming the key.
  own_help: `COMMAND --help` is passed on to the command (its own help), not the config keys' listing.
  own_parser: takes the whole command line after its name, before any flag of ours is parsed (its own
    parser: run is a function of that list returning the exit status); it must come first.
  flags: a command without a config: its flags, (flag, meaning), which `COMMAND --help` lists.
  """

  usage: tuple[tuple[str, str], ...]
  run: str
  report: Callable[[object], str] | None = None
  defaults: str | None = None
  own_help: bool = False
  own_parser: bool = False
  flags: tuple[tuple[str, str], ...] = ()

  @property
  def needs_config(self) -> bool:
    return self.defaults is not None

  @property
  def multihost(self) -> bool:
    """Runs as one program over every process of a multi-process launch (`--config.multihost=True`):
    training, and the analyses (every process computes, process 0 writes; headspec/jobloop.py)."""
    return self.report is not None or self.run == "headspec.commands:train"

  def function(self) -> Callable:
    module, name = self.run.split(":")
    return getattr(importlib.import_module(module), name)

  def __call__(self, name: str, config, workdir, args: list[str]) -> None:
    """Run the command `name` of this entry."""
    function = self.function()
    if self.report is None:
      function(config, workdir, args)
      return
    if args:
      raise UserError(f"{name} takes no arguments, got {' '.join(args)}")
    import jax

    from headspec import mesh, parallel

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
      print(self.report(result))


def quickstart(config, workdir, args) -> None:
  from headspec import quickstart as quickstart_lib

  options = quickstart_lib.options(args)  # --config.train.steps=N: run_quickstart's keywords
  quickstart_lib.run_quickstart(workdir or "runs/quickstart", **options)


def train(config, workdir, args) -> None:
  from headspec import targets
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
  from headspec import targets

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


def _probe_summary(results) -> str:
  from etils import epath

  return (epath.Path(results).parent / "summary.md").read_text()


COMMANDS: dict[str, Command] = {
  "quickstart": Command(
    (
      (
        "quickstart [--workdir=DIR]",
        "synthetic treebank -> train a small decoder and encoder -> probe (--config.train.steps=N: fewer steps)",
      ),
    ),
    "headspec.commands:quickstart",
    flags=(
      ("--workdir=DIR", "where the synthetic data and the runs decoder/ and encoder/ go (default runs/quickstart)"),
      ("--config.train.steps=N", "training steps of each run (default 300; fewer: faster, rougher results)"),
    ),
  ),
  "train": Command(
    (("train", "train a model (--config=base_decoder, base_encoder, quickstart:decoder)"),),
    "headspec.commands:train",
    defaults="headspec.defaults:train_config",
  ),
  "probe": Command(
    (("probe", "per-head probing suite over checkpoints (--config=probe_ewt, probe_minilm_ewt)"),),
    "headspec.probing.run:run",
    _probe_summary,
    "headspec.probing.config:probe_config",
  ),
  "diversity": Command(
    (("diversity", "head-diversity metrics over checkpoints"),),
    "headspec.diversity.run:run",
    lambda results: f"diversity metrics: {results}; figures in {results.parent}",
    "headspec.diversity.config:diversity_config",
  ),
  "ablate": Command(
    (("ablate", "head ablations, importance, pruning, L0 gates, causal probe test"),),
    "headspec.ablation.run:run",
    lambda out_dir: f"ablation tables and figures: {out_dir}",
    "headspec.ablation.config:ablate_config",
  ),
  "atlas": Command(
    (("atlas [--compare=RUN_B]", "RUN/atlas.html: every head's numbers on one offline page (no --config)"),),
    "headspec.commands:atlas",
    flags=(
      ("--workdir=RUN", "the run directory whose results tables the page shows; atlas.html is written into it"),
      ("--compare=RUN_B", "another run directory shown side by side with RUN (repeat the flag for more)"),
    ),
  ),
  "attention": Command(
    (("attention", "Clark et al. syntax from attention, head roles, pictures"),),
    "headspec.attention.run:run",
    lambda summary: summary.read_text(),
    "headspec.attention.config:attention_config",
  ),
  "patch": Command(
    (("patch", "activation, attribution and path patching of a built-in task (--config=patch_induction)"),),
    "headspec.patching.run:run",
    lambda results: f"patching tables and heatmaps: {results.parent}",
    "headspec.patching.config:patch_config",
  ),
  "circuit": Command(
    (("circuit", "edges scored by EAP, EAP-IG and exact patching; faithfulness curves (--config=circuit)"),),
    "headspec.patching.circuit:run",
    lambda edges: f"circuit tables: {edges.parent}",
    "headspec.patching.circuit:circuit_config",
  ),
  "sae": Command(
    (("sae", "sparse autoencoders on a layer's z, attributed to heads and the treebank (--config=sae)"),),
    "headspec.sae.run:run",
    lambda results: f"SAE tables: {results.parent}",
    "headspec.sae.config:sae_config",
  ),
  "study": Command(
    (("study --workdir=ROOT", "an experiment's tables and figures across runs (ROOT/study/; no --config)"),),
    "headspec.commands:study",
    flags=(
      (
        "--workdir=ROOT",
        "the experiment folder (headspec launch ... --experiment=NAME): its runs are read, ROOT/study/ written",
      ),
    ),
  ),
  "launch": Command(
    (
      (
        "launch TARGET [...] -- CMD",
        "run a command, pipeline, sweep or experiment: local, multi-gpu, slurm, tpu (docs/scale.md)",
      ),
    ),
    "headspec.launch:command",
    own_help=True,
    own_parser=True,
  ),
  "data": Command(
    (
      ("data download ud TREEBANK", "fetch a Universal Dependencies treebank into the data directory"),
      (
        "data download text CORPUS",
        "fetch a language-model corpus (english_mix, wikitext_103, wikitext_2) into the data directory",
      ),
      ("data synthetic --out=DIR", "write the synthetic treebank and its text (experiments' own data) into DIR"),
    ),
    "headspec.commands:data",
    own_help=True,
  ),
}
"""Every `headspec` command, in the order `headspec --help` lists them."""


def usage() -> str:
  """`headspec --help`: the command line's forms, then each command's lines of COMMANDS."""
  lines = [
    "usage: headspec <command> --config=NAME[:ARG] --workdir=DIR [--config.key=value ...]",
    "       headspec <command> --help     the command's config keys, defaults and meanings",
    "       headspec --version",
    "commands:",
  ]
  width = max(len(synopsis) for command in COMMANDS.values() for synopsis, _ in command.usage) + 3
  lines += [f"  {synopsis:<{width}}{meaning}" for c in COMMANDS.values() for synopsis, meaning in c.usage]
  return "\n".join(lines)
