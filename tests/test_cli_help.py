"""The command line's face: --version, `<command> --help` with every config key, configs by name from
any directory (and the old `configs/NAME.py` paths), the packaging metadata."""

import importlib
import inspect
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import headspec
from headspec import configs
from headspec.cli import commands, config_help
from headspec.cli import main as cli

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_version(capsys):
  assert cli.main(["headspec", "--version"]) == 0
  assert capsys.readouterr().out.strip() == f"headspec {cli.version()}"
  assert cli.version() == headspec.__version__  # the editable install's metadata is the source's version


@pytest.mark.parametrize("switch", ["", "0"])
def test_commands_keep_compiled_programs_in_the_user_cache(switch, tmp_path):
  """`headspec` commands turn on JAX's persistent compilation cache in $XDG_CACHE_HOME/headspec/jax
  (a program compiled once is written there); HEADSPEC_COMPILATION_CACHE=0 turns it off; a user's
  JAX_COMPILATION_CACHE_DIR wins (the suite sets its own, so this runs without it)."""
  env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION", "JAX_PERSISTENT"))}
  env.update(XDG_CACHE_HOME=str(tmp_path), HEADSPEC_COMPILATION_CACHE=switch or "1")
  code = "from headspec.cli import main as cli; cli.use_compilation_cache(); import jax; print(jax.jit(lambda x: x * 3)(2.0))"
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "6.0"
  written = list((tmp_path / "headspec" / "jax").glob("*"))
  assert bool(written) == (switch == ""), written
  shutil.rmtree(tmp_path / "headspec", ignore_errors=True)
  env.update(JAX_COMPILATION_CACHE_DIR=str(tmp_path / "mine"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  subprocess.run([sys.executable, "-c", code], env=env, check=True)
  assert not (tmp_path / "headspec").exists() and any((tmp_path / "mine").glob("*"))


@pytest.mark.parametrize("command", sorted(n for n, c in cli.COMMANDS.items() if c.needs_config))
def test_command_help_lists_every_key_with_its_default(command, capsys, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  assert cli.main(["headspec", command, "--help"]) == 0
  out = capsys.readouterr().out
  module, function = cli.COMMANDS[command].defaults.split(":")
  defaults = getattr(__import__(module, fromlist=[function]), function)()
  for key, value in config_help.flat_items(defaults):
    assert f"  {key} = {value!r}" in out, key
  assert out.startswith(f"usage: headspec {command} --config=NAME")


def test_help_meanings_come_from_the_defaults_comments(capsys):
  assert cli.main(["headspec", "probe", "-h", "--config=nonexistent"]) == 0  # help first, the config unread
  lines = {line.split(" = ")[0].strip(): line for line in capsys.readouterr().out.splitlines() if " = " in line}
  assert "L-BFGS stops a softmax probe" in lines["probe.tol"]  # inline comment
  assert "'first' | 'last' | 'mean'" in lines["probe.pooling"]  # inside a parenthesised value
  assert "MDL's portions of the training sentences" in lines["probe.mdl_fractions"]  # the comment line above
  meanings = config_help.meanings(__import__("headspec.attention.config", fromlist=["x"]).attention_config)
  assert meanings["induction.causal.ks"].startswith("how many of the best induction heads")  # another module's factory
  assert "only the induction scores below" in meanings["treebank"]  # an indented continuation line


@pytest.mark.parametrize("command", sorted(n for n, c in cli.COMMANDS.items() if c.needs_config))
def test_every_config_key_has_a_help_line(command):
  """Each key of each command's default config has a meaning in `headspec COMMAND --help`: a comment beside
  it in its defaults file."""
  rows = config_help.describe(cli.COMMANDS[command].defaults)
  missing = [key for key, _, meaning in rows if not meaning.strip()]
  assert not missing, f"{command}: keys without a help line: {missing}"


def test_the_analyses_target_keys_are_declared_once():
  """mesh, multihost, steps, model_name, model.pretrained and model.dtype come from one function
  (headspec/runs/target_config.py) into every analysis config, with one meaning each in --help."""
  from headspec.runs import target_config

  shared = config_help.meanings(target_config.add_target_keys)
  assert set(shared) == {"mesh", "multihost", "steps", "model_name", "model.pretrained", "model.dtype"}
  analyses = ["probe", "diversity", "ablate", "attention", "patch", "circuit", "sae"]
  for command in analyses:
    spec = commands.COMMANDS[command].defaults
    rows = {key: meaning for key, _, meaning in config_help.describe(spec)}
    for key in set(rows) & set(shared):
      assert rows[key] == shared[key], (command, key)
    assert {"mesh", "multihost", "model.pretrained", "model.dtype"} <= set(rows), command
    source = inspect.getsource(importlib.import_module(spec.split(":")[0]))
    assert "c.mesh =" not in source and "c.model.pretrained =" not in source, command


@pytest.mark.parametrize(
  "command,flags",
  [
    ("quickstart", ["--workdir=DIR", "--config.train.steps=N", "--verbose"]),
    ("atlas", ["--workdir=RUN", "--compare=RUN_B"]),
    ("study", ["--workdir=ROOT"]),
  ],
)
def test_help_of_commands_without_config(command, flags, capsys):
  """A command without a config lists its flags, each with its meaning."""
  assert cli.main(["headspec", command, "--help"]) == 0
  out = capsys.readouterr().out
  assert out.startswith(f"usage: headspec {command}")
  lines = out.splitlines()
  for flag in flags:
    (line,) = [line for line in lines if line.strip().startswith(flag)]
    assert len(line.split(flag, 1)[1].strip()) > 10, line  # a meaning follows the flag


def test_data_help_lists_every_subcommands_flags(capsys):
  """`headspec data --help` lists the flags of its three forms (from their own parsers)."""
  from headspec.data import download, synthetic, text_download

  assert cli.main(["headspec", "data", "--help"]) == 0
  out = capsys.readouterr().out
  assert out.startswith("usage: headspec data")
  for parser in (download.parser(), text_download.parser(), synthetic.parser()):
    for action in parser._actions:
      for flag in action.option_strings:
        if flag.startswith("--") and flag != "--help":
          assert flag in out, (parser.prog, flag)
  for flag in ("--release", "--sha256", "--out", "--text-sentences", "--force"):
    assert flag in out


def test_configs_resolve_by_name_and_by_old_path(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)  # no configs/ here
  packaged = configs.DIR / "ablate.py"
  assert configs.resolve("ablate") == str(packaged)
  assert configs.resolve("ablate:minilm") == f"{packaged}:minilm"
  assert configs.resolve("configs/ablate.py:minilm") == f"{packaged}:minilm"
  assert configs.resolve(f"{REPO}/configs/probe_synthetic.py:/tmp/qs/data") == (
    f"{configs.DIR / 'probe_synthetic.py'}:/tmp/qs/data"  # an ARG with its own ':' and '/' kept
  )
  spec = configs.DIR / "experiments" / "specialization.py"
  assert configs.resolve("configs/experiments/specialization.py:small") == f"{spec}:small"
  assert configs.resolve("experiments/specialization") == str(spec)
  own = tmp_path / "configs" / "ablate.py"  # a user's own file of that path wins
  own.parent.mkdir()
  own.write_text("def get_config(arg=None): ...\n")
  assert configs.resolve("configs/ablate.py") == "configs/ablate.py"
  for other in ("nope", "other/ablate.py", "__init__"):
    assert configs.resolve(other) == other
  assert {"ablate", "probe_minilm_ewt", "experiments/specialization"} <= set(configs.names())


def test_config_by_name_is_loaded_from_any_directory(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  # attention_ewt loads by name, then is refused for probe: it lacks the probe keys (nothing is run).
  assert cli.main(["headspec", "probe", "--config=attention_ewt:minilm", f"--workdir={tmp_path}"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("headspec: error:") and "attention_ewt.py: no config key" in err and "\n" not in err
  assert cli.main(["headspec", "probe", "--config=nope", f"--workdir={tmp_path}"]) == 2
  err = capsys.readouterr().err.strip()
  assert "no such config file nope" in err and "probe_minilm_ewt" in err and "\n" not in err


def test_pyproject_metadata():
  tomllib = pytest.importorskip("tomllib")
  project = tomllib.loads((REPO / "pyproject.toml").read_text())
  assert project["project"]["scripts"] == {"headspec": "headspec.cli.main:run"}
  assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "headspec.__version__"}
  assert {"test", "analysis", "tf"} <= set(project["project"]["optional-dependencies"])
  assert (REPO / "setup.py").is_file() and (REPO / "configs" / "__init__.py").is_file()


def test_test_only_libraries_are_test_dependencies():
  """chex serves the tests alone: no module of headspec imports it (read with ast, no import runs), and it is
  in the `test` extra, not in the dependencies every install gets."""
  import ast

  tomllib = pytest.importorskip("tomllib")
  project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
  name = lambda requirement: requirement.split(";")[0].split("[")[0].split("=")[0].split(">")[0].split("<")[0].strip()
  assert "chex" not in map(name, project["dependencies"])
  assert "chex" in map(name, project["optional-dependencies"]["test"])
  importers = []
  for path in sorted((REPO / "headspec").rglob("*.py")):
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
      names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""] if isinstance(
        node, ast.ImportFrom) else []  # fmt: skip
      if any(n == "chex" or n.startswith("chex.") for n in names):
        importers.append(str(path.relative_to(REPO)))
  assert not importers, importers


def test_the_wheel_ships_the_top_level_configs_as_headspec_configs(tmp_path):
  """The card's layout: configs/ at the top level, in the wheel as headspec.configs (setup.py maps it), so
  `--config=NAME` works from any directory after a plain (non-editable) install too."""
  import subprocess
  import sys
  import zipfile

  from headspec import configs

  assert configs.DIR == REPO / "configs"
  subprocess.run(
    [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(REPO), "-w", str(tmp_path)],
    check=True, capture_output=True, cwd=tmp_path,
  )  # fmt: skip
  (wheel,) = tmp_path.glob("headspec-*.whl")
  names = set(zipfile.ZipFile(wheel).namelist())
  shipped = {f"headspec/configs/{p.relative_to(REPO / 'configs').as_posix()}" for p in (REPO / "configs").rglob("*.py")}
  assert shipped and shipped <= names
  assert not any(n.startswith("configs/") for n in names)


def test_an_earlier_in_process_call_leaves_no_flag_behind(tmp_path):
  """absl keeps a flag's value between parses: `headspec data download ...` called in-process after a
  command given --config and --workdir wrote into that config's data_dir instead of HEADSPEC_DATA_DIR."""
  from headspec.cli import main as cli

  cli._parse(cli.resolve_config(["headspec", "--config=probe_synthetic", f"--workdir={tmp_path / 'run'}", "probe"]))
  assert cli._CONFIG.value is not None and cli._WORKDIR.value == str(tmp_path / "run")
  cli._parse(["headspec", "data"])
  assert cli._CONFIG.value is None and not cli._WORKDIR.value


def _toy_run(config, workdir):
  """A toy analysis for the registry test: its run(config, workdir), returning what the command prints."""
  return f"toy ran: lr={config.toy.lr} workdir={workdir}"


def _toy_config():
  import ml_collections

  c = ml_collections.ConfigDict()
  c.toy = ml_collections.ConfigDict()
  c.toy.lr = 0.5  # the toy's learning rate
  return c


def test_a_command_is_one_entry_of_the_table(tmp_path, monkeypatch, capsys):
  """One entry of commands.COMMANDS gives a command everything: dispatch to its run(config, workdir), its
  line of `headspec --help`, its `--help` keys, the --config and --workdir it needs and its key check."""
  from headspec.cli import commands

  toy = commands.Command(
    (("toy", "a toy analysis"),), f"{__name__}:_toy_run", str, f"{__name__}:_toy_config"
  )  # fmt: skip
  monkeypatch.setitem(commands.COMMANDS, "toy", toy)
  monkeypatch.setattr(cli, "USAGE", commands.usage())
  config = tmp_path / "toy.py"
  config.write_text(f"from {__name__} import _toy_config\n\ndef get_config(arg=None):\n  return _toy_config()\n")
  monkeypatch.syspath_prepend(str(pathlib.Path(__file__).parent))
  run = ["headspec", "toy", f"--config={config}", f"--workdir={tmp_path / 'run'}", "--config.toy.lr=2"]
  assert cli.main(run) == 0
  assert capsys.readouterr().out == f"toy ran: lr=2.0 workdir={tmp_path / 'run'}\n"
  assert cli.main(["headspec"]) == 2 and "  toy   " in capsys.readouterr().out
  assert cli.main(["headspec", "toy", "--help"]) == 0
  out = capsys.readouterr().out
  assert out.startswith("usage: headspec toy --config=NAME") and "a toy analysis" in out
  assert "toy.lr = 0.5" in out and "the toy's learning rate" in out
  assert cli.main(["headspec", "toy", f"--workdir={tmp_path}"]) == 2
  assert "toy needs --config=NAME" in capsys.readouterr().err
  assert cli.main(["headspec", "toy", f"--config={config}"]) == 2
  assert "toy needs --workdir=DIR" in capsys.readouterr().err
  assert cli.main([*run, "extra"]) == 2  # the same --config.toy.lr override again, in-process
  assert capsys.readouterr().err.strip() == "headspec: error: toy takes no arguments, got extra"
  assert cli.main(["headspec", "toy", f"--config={configs.DIR / 'ablate.py'}", f"--workdir={tmp_path}"]) == 2
  assert "no config key toy, which `headspec toy` needs" in capsys.readouterr().err
  assert cli.main(["headspec", "nope"]) == 2
  assert capsys.readouterr().err.strip().endswith("sae, study, data, toy, launch")


def test_every_analysis_command_runs_its_packages_run():
  """The analyses' commands are their run(config, workdir), with the default config of the package."""
  analyses = {n: c for n, c in cli.COMMANDS.items() if c.report is not None}
  assert set(analyses) == {"probe", "diversity", "ablate", "attention", "patch", "circuit", "sae"}
  for command in analyses.values():
    run = command.function()
    assert list(inspect.signature(run).parameters) == ["config", "workdir"]
    assert command.defaults.split(".")[:2] == command.run.split(".")[:2]  # headspec.<package>


def test_the_same_override_twice_in_process(tmp_path, capsys):
  """config_flags defines a --config.KEY flag per parse: a second in-process call with the same override
  failed ("The flag 'config.probe.steps' is defined twice"); a third without it keeps the default."""
  argv = ["headspec", "probe", "--config=probe_synthetic", f"--workdir={tmp_path}", "--config.probe.steps=3", "x"]
  for _ in range(2):
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.strip() == "headspec: error: probe takes no arguments, got x"
    assert cli._CONFIG.value.probe.steps == "3"
  assert cli.main([a for a in argv if "probe.steps" not in a]) == 2
  assert cli._CONFIG.value.probe.steps == "last"
