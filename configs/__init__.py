"""The config files shipped with headspec, found by name from any directory.

`--config=NAME[:ARG]` is configs/NAME.py (`probe_minilm_ewt`, `experiments/specialization`);
`--config=FILE[:ARG]` is that file. A `configs/NAME.py` path that does not exist (the checkout's former
folder, named in older docs, scripts and experiments' stage command lines) is the packaged NAME.py, so those
command lines keep working from any directory, and so does a renamed config's former name (RENAMED). Each
file defines `get_config(arg=None)`.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib

DIR = pathlib.Path(__file__).resolve().parent
# former name -> name: "study" is the specialization study's word (experiments/specialization, `headspec study`)
RENAMED = {"induction_study": "induction"}


def names() -> list[str]:
  """The packaged configs' names (`ablate`, ..., `experiments/specialization`)."""
  return sorted(p.relative_to(DIR).with_suffix("").as_posix() for p in DIR.rglob("*.py") if p.name != "__init__.py")


def resolve(spec: str) -> str:
  """`spec` (FILE[:ARG] or NAME[:ARG]) with FILE made the path of an existing file where there is one:
  an existing file as given, else a packaged config by name or by its `configs/NAME.py` path. Anything
  else is returned as given (the caller reports the missing file)."""
  file, sep, arg = spec.partition(":")
  packaged = packaged_file(file)
  return f"{packaged}{sep}{arg}" if packaged is not None and not os.path.isfile(file) else spec


def packaged_file(file: str) -> pathlib.Path | None:
  """The packaged config that `file` names (`ablate`, `ablate.py`, `configs/ablate.py`,
  `configs/experiments/specialization.py`), or None."""
  parts = pathlib.PurePath(file).parts
  if "configs" in parts:
    parts = parts[len(parts) - list(reversed(parts)).index("configs") :]  # after the last `configs`
  elif len(parts) > 1 and parts[0] != "experiments":
    return None  # some other folder's file: not one of ours
  if not parts:
    return None
  rel = pathlib.PurePath(*parts)
  rel = rel.with_suffix("") if rel.suffix == ".py" else rel
  rel = pathlib.PurePath(RENAMED.get(rel.as_posix(), rel.as_posix()) + ".py")
  candidate = DIR / rel
  return candidate if candidate.is_file() and candidate.name != "__init__.py" else None


def load_module(spec: str, flag: str = "--config"):
  """(module, ARG or None) of a user's config or experiment file FILE.py[:ARG] (or a packaged NAME[:ARG]).
  A user's file is user input: missing, not a .py file, or any exception while it runs (a syntax error,
  non-UTF-8 bytes, a failing import) is one UserError line naming the flag, the file and the exception."""
  from headspec.errors import UserError

  path, _, arg = resolve(spec).partition(":")
  if not os.path.isfile(path):
    raise UserError(f"{flag}: no such config file {path}")
  if not path.endswith(".py"):
    raise UserError(f"{flag}={path}: not a Python config file (FILE.py[:ARG])")
  try:
    module_spec = importlib.util.spec_from_file_location("_headspec_user_config", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
  except Exception as e:  # noqa: BLE001  (anything the file does is the user's)
    raise UserError(f"{flag}={path}: cannot load the file ({exception_line(e)})") from None
  return module, arg or None


def load_config(spec: str, flag: str = "--config"):
  """`get_config(ARG)` (or `get_config()`) of FILE.py[:ARG]; any exception it raises is one UserError line
  naming the flag, the file and the exception (a headspec UserError passes on as it is)."""
  module, arg = load_module(spec, flag)
  config = call(module, "get_config", arg, spec, flag)
  if config is None:
    from headspec.errors import UserError

    raise UserError(f"{flag}={resolve(spec).partition(':')[0]}: get_config() returned None (no return statement?)")
  return config


def call(module, name: str, arg, spec: str, flag: str, *, always: bool = False):
  """`module.NAME(arg)` (no argument when `arg` is None, unless `always`), its exceptions one UserError line."""
  from headspec.errors import UserError

  path = resolve(spec).partition(":")[0]
  function = getattr(module, name, None)
  if not callable(function):
    raise UserError(f"{flag}={path}: the file defines no {name}(arg)")
  try:
    return function(arg) if arg is not None or always else function()
  except UserError:
    raise
  except Exception as e:  # noqa: BLE001
    raise UserError(f"{flag}={path}: {name}({'' if arg is None else repr(arg)}) failed ({exception_line(e)})") from None


def exception_line(e: BaseException) -> str:
  """`TYPE: first line of the message` (a SyntaxError with its line: 'SyntaxError: invalid syntax (x.py, line 1)')."""
  lines = [line.strip() for line in str(e).splitlines() if line.strip()]
  return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
