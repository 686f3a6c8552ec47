"""`headspec <command> --config=NAME[:ARG] --workdir=DIR [--config.key=value ...]`.

`--config` is a packaged config by name (configs/NAME.py, from any directory) or a file
(configs/__init__.py resolves both); `headspec --version`; `headspec <command> --help` lists the
command's config keys with defaults and meanings (headspec/cli/config_help.py).

Thin: parses flags, loads the config, calls the command's library function. Errors a user can cause
(headspec.errors.UserError, bad flags or config keys, a --workdir URL of an unknown scheme) print one
line to stderr, its reason kept (`one_line`), and exit with status 2; so does a full disk, a quota or a
read-only mount met while writing (`disk_error`: an OSError ENOSPC, EDQUOT or EROFS, naming its file). `headspec launch TARGET ...` is headspec/launch/'s command line
(`python -m headspec.launch TARGET ...`), passed on as it is.
"""

from __future__ import annotations

import errno
import importlib
import logging as std_logging
import math
import os
import pathlib
import sys

from absl import flags, logging
from ml_collections import config_flags

from headspec.cli import commands, handlers
from headspec.cli.commands import COMMANDS
from headspec.errors import UserError
from headspec.io import library_logs

FLAGS = flags.FlagValues()
_CONFIG = config_flags.DEFINE_config_file(
  "config", None, "a packaged config NAME[:ARG] or a file FILE.py[:ARG]", flag_values=FLAGS
)
_WORKDIR = flags.DEFINE_string("workdir", None, "run directory", flag_values=FLAGS)
_VERBOSE = flags.DEFINE_bool("verbose", False, "log library details (orbax, tfds) too", flag_values=FLAGS)

USAGE = commands.usage()
"""`headspec --help`, from the one table of commands (headspec/cli/commands.py COMMANDS)."""


class _Exit(Exception):
  pass


def _fail(message: str) -> None:
  print(f"headspec: error: {one_line(message)}", file=sys.stderr)
  raise _Exit(2)


def one_line(message: str) -> str:
  """A message on one line with its reason kept: a library's multi-line text (absl flags, a config
  file's traceback that ml_collections embeds) becomes its first line and, after a traceback, the
  exception it ended in (`Error whilst parsing config file: ValueError: unknown argument 'x'`)."""
  lines = [line.strip() for line in str(message).splitlines() if line.strip()]
  if not lines:
    return ""
  if "Traceback (most recent call last):" in lines:
    head = lines[: lines.index("Traceback (most recent call last):")]
    return " ".join([*head, lines[-1]])
  return " ".join(lines)


def use_every_cpu_core() -> None:
  """One XLA CPU device per core (a power of two, at most 8), set before JAX starts.

  An XLA CPU device runs its programs on about one core, so data parallelism over these devices is
  what uses a multi-core CPU (2 cores: 1.75-2.5x the throughput of one device, benchmarks/bench_train.py).
  Only the CPU platform reads this flag; GPUs and TPUs are unaffected. A user's XLA_FLAGS wins.
  """
  flags_now = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" not in flags_now:
    n = 2 ** int(math.log2(max(1, min(os.cpu_count() or 1, 8))))
    os.environ["XLA_FLAGS"] = f"{flags_now} --xla_force_host_platform_device_count={n}".strip()


def compilation_cache_dir() -> pathlib.Path:
  """Where `headspec` commands keep JAX's persistent compilation cache: $XDG_CACHE_HOME/headspec/jax
  (default ~/.cache/headspec/jax)."""
  return pathlib.Path(os.environ.get("XDG_CACHE_HOME") or pathlib.Path.home() / ".cache") / "headspec" / "jax"


def use_compilation_cache() -> None:
  """JAX's persistent compilation cache (jax.readthedocs.io, "Persistent compilation cache"), set before
  JAX starts: a later command that compiles the same programs (the next `headspec probe` over a run's
  checkpoints, another analysis of the same model) loads them from disk instead of compiling them.
  On the 2-core CPU a small probe run spends about a quarter of its time compiling (docs/probing_core.md).
  A user's JAX_COMPILATION_CACHE_DIR wins; HEADSPEC_COMPILATION_CACHE=0 turns it off. The cache key
  holds the program, the jax/jaxlib versions and the devices, so a stale entry is never used. Every
  program is kept (JAX's default keeps only those that took a second to compile; the probe fitter's
  take about that each, and a hundred entries are a few MB). Unbounded, JAX's default: a bound
  (JAX_COMPILATION_CACHE_MAX_SIZE) must start from an empty folder, since JAX's eviction reads a
  timestamp file that entries written without a bound lack, and every write into such a folder fails."""
  if os.environ.get("HEADSPEC_COMPILATION_CACHE", "1") == "0" or "JAX_COMPILATION_CACHE_DIR" in os.environ:
    return
  os.environ["JAX_COMPILATION_CACHE_DIR"] = os.fspath(compilation_cache_dir())
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def main(argv: list[str]) -> int:
  own = COMMANDS.get(argv[1]) if len(argv) > 1 else None
  if own is not None and own.own_parser:  # launch: its own options (--config, --workdir mean a study's)
    return _own_parser(own, argv[2:])
  if argv[1:] == ["--version"]:
    print(f"headspec {version()}")
    return 0
  use_every_cpu_core()
  use_compilation_cache()
  try:
    argv = resolve_config(argv)
    command = _command_asking_help(argv)
    if command is not None:
      print(command_help(command))
      return 0
    _check_config_path(argv)
    _load_config_file(argv)
    try:
      rest = _parse(argv)  # unknown flags stay in `rest`: `data download` has its own
    except flags.Error as e:
      _fail(str(e))
    except (AttributeError, KeyError, TypeError, ValueError) as e:  # config_flags on a bad --config.key
      overrides = [a for a in argv if a.startswith("--config.")]
      _fail(
        _override_problem(argv, overrides)
        or f"bad config override among {', '.join(a.split('=')[0] for a in overrides)}: "
        f"{e.args[0] if isinstance(e, KeyError) and e.args else e} (not a config key, or a value of the wrong type)"
      )
    args = rest[1:]
    if not args or args[0] in ("help", "-h", "--help"):
      print(USAGE)
      return 0 if args else 2
    command, args = args[0], args[1:]
    entry = COMMANDS.get(command)
    if entry is not None and entry.own_parser:
      _fail(f"{command} comes first, before any option: headspec launch TARGET [options] [-- COMMAND ARGS]")
    if entry is None:
      first = [name for name, c in COMMANDS.items() if c.own_parser]  # listed last: they come first
      choices = [*(name for name in COMMANDS if name not in first), *first]
      _fail(f"unknown command {command!r}; choose from {', '.join(choices)}")
    try:
      config = _CONFIG.value
    except (flags.Error, FileNotFoundError, OSError) as e:
      _fail(f"--config: {e}")
    if entry.needs_config and config is None:
      _fail(f"{command} needs --config=NAME (`headspec {command} --help` lists the configs and keys)")
    if entry.needs_config and config is not None:
      _check_keys(command, config, _config_file(argv))
      from headspec.cli import config_help

      config_help.normalize_lists(config, entry.defaults, _config_file(argv))  # `a,b` or `(a, b)`, every list key
    if entry.needs_config and not _WORKDIR.value:
      _fail(f"{command} needs --workdir=DIR")
    if _WORKDIR.value:
      from headspec.io import remote

      remote.check_url(_WORKDIR.value)  # gs://, s3://, az:// or a local path; anything else before any work
    _quiet_libraries(_VERBOSE.value)
    handlers.run(entry, command, config, _WORKDIR.value, args)
    return 0
  except UserError as e:
    print(f"headspec: error: {one_line(e)}", file=sys.stderr)
    return 2
  except _Exit as e:
    return e.args[0]
  except KeyboardInterrupt:
    print("headspec: interrupted", file=sys.stderr)
    return 130
  except Exception as e:  # after _Exit (an Exception too)
    message = disk_error(e, _WORKDIR.value if FLAGS.is_parsed() else None)
    if message is None:
      raise
    print(f"headspec: error: {message}", file=sys.stderr)
    return 2


DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS)
"""A full disk, a quota or a read-only mount met while writing: the user's to fix, not a bug of ours."""


def disk_error(e: BaseException, workdir=None) -> str | None:
  """The one line for an error whose chain holds an OSError of `DISK_ERRNOS`, None for any other error.
  Its file where the OSError names one (headspec's writers name the file they were writing, having
  removed their temporary), else the workdir."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno in DISK_ERRNOS:
      where = e.filename or workdir or os.getcwd()
      return (
        f"{os.fspath(where)}: {os.strerror(e.errno)} (errno {errno.errorcode[e.errno]}) while writing; the command "
        "stopped. Free space (or make the folder writable) and run the same command again"
      )
    e = e.__cause__ or e.__context__
  return None


def _own_parser(entry, args: list[str]) -> int:
  """`headspec launch ARGS` = `python -m headspec.launch ARGS`: the command's own parser, its exit status."""
  try:
    return entry.function()(args)
  except KeyboardInterrupt:
    print("headspec: interrupted", file=sys.stderr)
    return 130


def _parse(argv: list[str]) -> list[str]:
  """FLAGS(argv), every flag from its default. config_flags finds the --config.key overrides in sys.argv,
  not in the list it parses, so sys.argv is `argv` while parsing: main() called in-process (tests,
  notebooks) applies them too; and absl keeps a flag's value between parses, so the flags are reset
  first (else a --config or --workdir of an earlier in-process call would reach a later command), and the
  --config.KEY flags config_flags defined for an earlier call are dropped (a second call with the same
  override failed: "The flag 'config.probe.steps' is defined twice")."""
  saved, sys.argv = sys.argv, list(argv)
  try:
    FLAGS.unparse_flags()
    for name in [name for name in FLAGS if name.startswith(f"{_CONFIG.name}.")]:
      delattr(FLAGS, name)
    return FLAGS(argv, known_only=True)
  finally:
    sys.argv = saved


def version() -> str:
  """The installed package's version (its metadata), else the source tree's headspec.__version__."""
  from importlib import metadata

  try:
    return metadata.version("headspec")
  except metadata.PackageNotFoundError:
    from headspec import __version__

    return __version__


def command_help(command: str) -> str:
  """`headspec COMMAND --help`: its line of USAGE, then for a command with a config its keys, defaults and
  meanings, for one without its flags (COMMANDS' `flags`) and their meanings."""
  entry = COMMANDS[command]
  synopsis, meaning = entry.usage[0]
  if not entry.needs_config:
    flags_ = [*entry.flags, ("--verbose", FLAGS[_VERBOSE.name].help)]
    width = max(len(flag) for flag, _ in flags_) + 2
    return "\n".join(
      [f"usage: headspec {synopsis}", meaning, "flags:", *(f"  {flag:<{width}}{text}" for flag, text in flags_)]
    )
  from headspec.cli import config_help

  return config_help.help_text(command, entry.defaults, meaning)


def _command_asking_help(argv: list[str]) -> str | None:
  """The command of `headspec COMMAND ... --help` (or -h), None otherwise (and for a command with its own
  help: `data`)."""
  words, skip = [], False
  for arg in argv[1:]:
    if skip:
      skip = False
    elif arg in ("--config", "--workdir"):
      skip = True  # its value follows
    elif not arg.startswith("-"):
      words.append(arg)
  asks = any(a in ("-h", "--help") for a in argv[1:])
  return words[0] if asks and words and words[0] in COMMANDS and not COMMANDS[words[0]].own_help else None


def resolve_config(argv: list[str]) -> list[str]:
  """argv with each --config value's file made a packaged config's path where it names one
  (`--config=probe_ewt`, or `configs/probe_ewt.py` where no such file exists: configs/)."""
  from headspec import configs

  out = list(argv)
  for i, arg in enumerate(out):
    if arg.startswith("--config="):
      out[i] = "--config=" + configs.resolve(arg.split("=", 1)[1])
    elif arg == "--config" and i + 1 < len(out):
      out[i + 1] = configs.resolve(out[i + 1])
  return out


def _config_file(argv: list[str]) -> pathlib.Path | None:
  """The file of --config=FILE[:ARG] (the last one given), None without one."""
  path = None
  for i, arg in enumerate(argv):
    value = (
      arg.split("=", 1)[1]
      if arg.startswith("--config=")
      else argv[i + 1]
      if arg == "--config" and i + 1 < len(argv)
      else None
    )
    if value is not None:
      path = pathlib.Path(value.split(":", 1)[0])
  return path


def _check_config_path(argv: list[str]) -> None:
  """A missing config file is one line here (config_flags would print a traceback and go on)."""
  path = _config_file(argv)
  if path is not None and not path.is_file():
    from headspec import configs

    _fail(f"--config: no such config file {path}, nor a packaged config of that name ({', '.join(configs.names())})")


def _config_spec(argv: list[str]) -> str | None:
  """The value of the last --config=FILE[:ARG] (or `--config FILE`), None without one."""
  specs = [a.split("=", 1)[1] if a.startswith("--config=") else b for a, b in zip(argv, [*argv[1:], ""])
           if a.startswith("--config=") or a == "--config"]  # fmt: skip
  return specs[-1] if specs else None


def _load_config_file(argv: list[str]) -> None:
  """The --config file run once through the user-file loader (configs.load_config) before config_flags
  reads it: any exception of the file or its get_config (a syntax error, a failing import, a KeyError,
  non-UTF-8 bytes) is one line naming the file and the exception, not a traceback."""
  spec = _config_spec(argv)
  if spec:
    from headspec import configs

    configs.load_config(spec, "--config")


def _override_problem(argv: list[str], overrides: list[str]) -> str | None:
  """The one line naming a `--config.KEY` that the --config file lacks (config_help.override_problem),
  None when the file cannot be read again or every KEY exists."""
  spec = _config_spec(argv)
  if not spec:
    return None
  from headspec.cli import config_help

  try:
    from ml_collections.config_flags import config_flags as loader

    loaded = loader.ConfigFileFlagParser("config").parse(spec)
  except Exception:  # noqa: BLE001  (the file's own error is reported elsewhere; this only names a key)
    return None
  return config_help.override_problem(loaded, overrides, _config_file(argv))


def _missing_keys(config, defaults, prefix: str = "") -> list[str]:
  """The keys of `defaults` (nested, dotted) that `config` lacks."""
  missing = []
  for key, value in defaults.items():
    if key not in config:
      missing.append(prefix + key)
    elif hasattr(value, "items"):
      got = config[key]
      missing += _missing_keys(got, value, f"{prefix}{key}.") if hasattr(got, "items") else [f"{prefix}{key}.*"]
  return missing


def _check_keys(command: str, config, path) -> None:
  """UserError (one line) naming the config file and the first key of the command's defaults it lacks
  (`headspec probe --config=configs/attention_ewt.py`: no `probe` section)."""
  module, function = COMMANDS[command].defaults.split(":")
  missing = _missing_keys(config, getattr(importlib.import_module(module), function)())
  if missing:
    more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
    raise UserError(
      f"{path}: no config key {missing[0]}{more}, which `headspec {command}` needs (a config of another "
      f"command? {command}'s keys and defaults: {module.replace('.', '/')}.py)"
    )


def _quiet_libraries(verbose: bool) -> None:
  """headspec's progress lines (absl INFO) on stderr; the libraries' (orbax, tfds) INFO logs only with
  --verbose."""
  if not flags.FLAGS.is_parsed():  # absl's own flags (ours are FLAGS): their defaults, as app.run would parse
    flags.FLAGS.mark_as_parsed()  # (else every process's first log line is "Logging before flag parsing")
  logging.use_absl_handler()  # what app.run does: absl's format, on stderr, for every logger
  logging.set_verbosity(logging.INFO)  # (with absl's handler: the root logger's level)
  if not verbose:
    logging.set_stderrthreshold(logging.ERROR)
    logging.get_absl_handler().addFilter(_drop_library_chatter)  # std logging's (JAX) records too
    import tensorflow_datasets as tfds

    tfds.disable_progress_bar()


_HEADSPEC = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the package, not cli/


def _drop_library_chatter(record) -> bool:
  """Only headspec's own INFO lines (a library's need --verbose), and no warnings about how headspec uses
  its libraries on purpose: TFDS builder configs made at run time, orbax managers opened read-only to
  load a checkpoint for analysis. Nor orbax's logged tracebacks of a failed save (a full disk): orbax
  raises the same error to headspec, which reports it in one line (headspec/runs/checkpoints.py)."""
  if record.levelno < std_logging.WARNING and not os.path.abspath(record.pathname).startswith(_HEADSPEC):
    return False
  if record.exc_info and f"{os.sep}orbax{os.sep}" in os.path.abspath(record.pathname):
    return False
  return not library_logs.is_note(record)


def run() -> None:
  """Console-script entry point."""
  try:
    sys.exit(main(sys.argv))
  except BrokenPipeError:  # `headspec probe --help | head`: the reader left; not an error of ours
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(0)
