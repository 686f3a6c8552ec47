"""run_info.json: where a command's tables came from, written beside them (docs/outputs.md).

Each command's entry point is decorated once, `@provenance.recorded("probes")`: on success it writes
WORKDIR/probes/run_info.json (atomically) with the resolved config, the library versions, the git commit
of the headspec source tree (null outside a checkout), the SHA-256 of every data file the command read
(treebank and corpus readers call `note_read`), counts the command noted (`note`: probe training words;
sentences skipped as unrepresentable, from `alignment.representable`), host, devices and wall time.
Recording never fails a command: a value it cannot get is null.
"""

from __future__ import annotations

import datetime
import functools
import hashlib
import inspect
import json
import os
import pathlib
import platform
import socket
import subprocess
import sys
import time

FILE = "run_info.json"
PACKAGES = ("headspec", "jax", "jaxlib", "flax", "optax", "numpy")
_ACTIVE: list[dict] = []  # one record per decorated call in progress (they nest: quickstart -> train, probe)


def note_read(path) -> None:
  """A data file the running command read (its SHA-256 goes into run_info.json)."""
  for record in _ACTIVE:
    record["files"].setdefault(os.fspath(path), None)


def note(key: str, value, *, under: str | None = None) -> None:
  """A count of the running command: `value` at `key`, or at `key`[`under`] (a per-split count)."""
  for record in _ACTIVE:
    if under is None:
      record["counts"][key] = value
    else:
      record["counts"].setdefault(key, {})[under] = value


def recorded(folder: str, file: str = FILE):
  """Decorates a command's entry point `f(config, workdir, ...)` (or `f(workdir)`, `f(root)`): after it
  returns, WORKDIR/folder/file holds its run_info (folder '' = WORKDIR itself)."""

  def decorate(function):
    signature = inspect.signature(function)

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
      bound = signature.bind(*args, **kwargs).arguments
      record = {"files": {}, "counts": {}, "started": time.time()}
      _ACTIVE.append(record)
      try:
        result = function(*args, **kwargs)
      finally:
        _ACTIVE.remove(record)
      workdir = bound.get("workdir", bound.get("root"))
      if workdir is not None:
        write(workdir, folder, file, function.__module__, bound.get("config"), record)
      return result

    return wrapper

  return decorate


def write(workdir, folder: str, file: str, command: str, config, record: dict) -> None:
  """WORKDIR/folder/file from `record` (the lead process only, atomically)."""
  from headspec.io import remote

  if not remote.is_writer():
    return
  info = {
    "command": command,
    "argv": list(sys.argv),
    "config": _config_dict(config),
    "versions": versions(),
    "git_commit": git_commit(),
    "data_files": {path: sha256(path) for path in sorted(record["files"])},
    **record["counts"],
    "host": socket.gethostname(),
    "platform": platform.platform(),
    "python": platform.python_version(),
    "devices": devices(),
    "started": datetime.datetime.fromtimestamp(record["started"], datetime.timezone.utc).isoformat(),
    "wall_time_s": round(time.time() - record["started"], 3),
  }
  out = remote.run_path(workdir) / folder / file if folder else remote.run_path(workdir) / file
  remote.write_bytes_atomic(out, (json.dumps(info, indent=2, default=repr) + "\n").encode())


def _config_dict(config):
  if config is None:
    return None
  return json.loads(json.dumps(config.to_dict() if hasattr(config, "to_dict") else dict(config), default=repr))


def versions() -> dict[str, str | None]:
  """Installed versions of headspec and its numeric libraries (None: not installed)."""
  from importlib import metadata

  out = {}
  for name in PACKAGES:
    try:
      out[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      out[name] = None
  return out


def git_commit() -> str | None:
  """HEAD of the git checkout headspec is imported from (with '-dirty' when headspec/ has uncommitted
  changes); None when it is not a checkout or git is missing."""
  here = pathlib.Path(__file__).resolve().parents[1]  # the headspec package folder (this file is headspec/io/)
  try:
    git = ["git", "-C", str(here)]
    top = subprocess.run([*git, "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=10)
    if top.returncode or pathlib.Path(top.stdout.strip()).resolve() / "headspec" != here:
      return None  # not a checkout, or a package installed inside some other repository
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True)
    dirty = subprocess.run([*git, "status", "--porcelain", "--", str(here)], capture_output=True, text=True, timeout=30)
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
  except (OSError, subprocess.SubprocessError):
    return None


def sha256(path) -> str | None:
  """The file's SHA-256 (hex), None when it cannot be read."""
  from etils import epath

  digest = hashlib.sha256()
  try:
    with epath.Path(path).open("rb") as f:
      for block in iter(lambda: f.read(1 << 20), b""):
        digest.update(block)
  except OSError:
    return None
  return digest.hexdigest()


def devices() -> list[str] | None:
  """The JAX devices the command ran on ('cpu: cpu x8'), None when it did not start JAX."""
  if "jax" not in sys.modules:
    return None
  jax = sys.modules["jax"]
  kinds: dict[str, int] = {}
  for d in jax.devices():
    key = f"{d.platform}: {d.device_kind}"
    kinds[key] = kinds.get(key, 0) + 1
  return [f"{k} x{n}" for k, n in kinds.items()]
