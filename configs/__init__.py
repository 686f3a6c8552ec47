"""The config files shipped with headspec, found by name from any directory.

`--config=NAME[:ARG]` is configs/NAME.py (`probe_minilm_ewt`, `experiments/specialization`);
`--config=FILE[:ARG]` is that file. A `configs/NAME.py` path that does not exist (the checkout's former
folder, named in older docs, scripts and experiments' stage command lines) is the packaged NAME.py, so those
command lines keep working from any directory, and so does a renamed config's former name (RENAMED). Each
file defines `get_config(arg=None)`.
"""

from __future__ import annotations

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
