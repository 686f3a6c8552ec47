"""The CLI's commands, in one table (COMMANDS): each name's entry says what it runs, its line of
`headspec --help`, and its default config (a command with one needs --config and --workdir). An analysis
is its `<package>/run.py` run(config, workdir) (the job loop of headspec/words/jobloop.py) and the line printed
from what it returns; the other commands' handlers (headspec/cli/handlers.py) turn (config, workdir,
positional args) into one library call. The table imports nothing of headspec but errors: it names every
handler by "module:function", imported only when the command runs (the launcher reads it too, to know which
commands run on every process). Adding a command is one entry here."""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Command:
  """One `headspec` command.

  usage: its lines of `headspec --help`: (synopsis, meaning), the synopsis starting with the name.
  run: "module:function", imported only when the command runs (`headspec --help` loads no analysis, no JAX):
    an analysis's run(config, workdir) where `report` is given, else a function of (config, workdir, args).
  report: for an analysis, the text printed from what its run returned (a function, or "module:function");
    it takes no positional arguments.
  defaults: "module:function" of its default config; a command with one needs --config and --workdir, and
    a --config lacking one of its keys is refused (cli._check_keys), naming the key.
  own_help: `COMMAND --help` is passed on to the command (its own help), not the config keys' listing.
  own_parser: takes the whole command line after its name, before any flag of ours is parsed (its own
    parser: run is a function of that list returning the exit status); it must come first.
  flags: a command without a config: its flags, (flag, meaning), which `COMMAND --help` lists.
  """

  usage: tuple[tuple[str, str], ...]
  run: str
  report: Callable[[object], str] | str | None = None
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
    training, and the analyses (every process computes, process 0 writes; headspec/words/jobloop.py)."""
    return self.report is not None or self.run == "headspec.cli.handlers:train"

  def function(self) -> Callable:
    return _named(self.run)

  def report_text(self, result) -> str:
    return (_named(self.report) if isinstance(self.report, str) else self.report)(result)


def _named(text: str) -> Callable:
  """The function a "module:function" names, imported now."""
  module, name = text.split(":")
  return getattr(importlib.import_module(module), name)


COMMANDS: dict[str, Command] = {
  "quickstart": Command(
    (
      (
        "quickstart [--workdir=DIR]",
        "synthetic treebank -> train a small decoder and encoder -> probe (--config.train.steps=N: fewer steps)",
      ),
    ),
    "headspec.cli.handlers:quickstart",
    flags=(
      ("--workdir=DIR", "where the synthetic data and the runs decoder/ and encoder/ go (default runs/quickstart)"),
      ("--config.train.steps=N", "training steps of each run (default 300; fewer: faster, rougher results)"),
    ),
  ),
  "train": Command(
    (("train", "train a model (--config=base_decoder, base_encoder, quickstart:decoder)"),),
    "headspec.cli.handlers:train",
    defaults="headspec.train.config:train_config",
  ),
  "probe": Command(
    (("probe", "per-head probing suite over checkpoints (--config=probe_ewt, probe_minilm_ewt)"),),
    "headspec.probing.run:run",
    "headspec.cli.handlers:probe_summary",
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
    "headspec.cli.handlers:atlas",
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
    "headspec.cli.handlers:study",
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
    "headspec.cli.handlers:data",
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
