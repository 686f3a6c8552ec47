"""Run directories on local disk or in object storage (`gs://bucket/run`), through `etils.epath`.

`run_path(workdir)` is the one place a `--workdir` becomes a path: a local path is made absolute (as
before), a URL keeps its scheme (never pathlib's resolve(), which turns `gs://b/x` into a local folder
named `gs:`), and an unknown scheme is one UserError line. Object stores cannot append to or rename an
object, so writers here either write an object whole (`write_bytes`: atomic on GCS) or keep a local
copy on scratch disk and upload it whole (`LocalMirror`); figures are drawn in memory and written whole
(`save_figure`). What must be a real local file (feature caches: memory-mapped and appended to) lives on
scratch (`scratch_dir`, under HEADSPEC_SCRATCH). Orbax checkpoints go to the URL directly (tensorstore
speaks gs:// itself). A local file is written whole beside its target and renamed (`temp_beside`); a
writer killed mid-write leaves that temporary, and the next write into the folder removes it.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import math
import os
import pathlib
import re
import shutil
import sys
import tempfile
import time

from etils import epath

from headspec.errors import UserError

# URL schemes etils.epath reads and writes (gs: gcsfs or tf.io.gfile; s3: s3fs; az: adlfs).
SCHEMES = ("gs", "s3", "az")


def scheme_of(path) -> str | None:
  """'gs' for 'gs://b/x'; None for a local path."""
  text = os.fspath(path) if not isinstance(path, str) else path
  head, sep, _ = text.partition("://")
  return head if sep and "/" not in head else None


def check_url(path, what: str = "--workdir") -> None:
  """UserError (one line) for a URL whose scheme epath cannot write to, or a path that is not UTF-8 (a byte
  such as 0xff: orbax's tensorstore cannot open a checkpoint there, which read as 'does not match this model')."""
  text = os.fspath(path) if not isinstance(path, str) else path
  if isinstance(text, str):
    try:
      text.encode("utf-8")
    except UnicodeEncodeError:
      try:
        shown = os.fsencode(text).decode("utf-8", "backslashreplace")  # the bytes as `ls` shows them
      except UnicodeError:  # a lone surrogate that is no byte (the Python API)
        shown = ascii(text)
      raise UserError(
        f"{what}={shown}: the path has a byte that is not UTF-8, which checkpoints (orbax/tensorstore) cannot "
        "use; rename the folder"
      ) from None
  scheme = scheme_of(path)
  if scheme is not None and scheme not in SCHEMES:
    raise UserError(
      f"{what}={path}: unknown URL scheme {scheme}://; use a local path or one of "
      f"{', '.join(s + '://' for s in SCHEMES)}"
    )


def is_remote(path) -> bool:
  return scheme_of(str(path)) is not None


def run_path(workdir) -> epath.Path:
  """A run directory as an epath.Path: local paths absolute with symlinks resolved, URLs as given."""
  text = str(workdir)
  check_url(text)
  if is_remote(text):
    return epath.Path(text.rstrip("/"))
  return epath.Path(os.path.realpath(os.path.expanduser(text)))


def native_path(path) -> pathlib.Path | epath.Path:
  """What a command returns to its caller: a `pathlib.Path` for a local path (as before remote run
  directories: `.stat().st_size` and every other pathlib call keep working), an `epath.Path` for a URL."""
  return epath.Path(path) if is_remote(path) else pathlib.Path(os.fspath(path))


def scratch_dir(path, purpose: str) -> pathlib.Path:
  """A local folder standing in for remote `path` (HEADSPEC_SCRATCH, default the temp dir): caches,
  TensorBoard event files before upload, figures before upload. The same URL gets the same folder."""
  root = pathlib.Path(os.environ.get("HEADSPEC_SCRATCH") or pathlib.Path(tempfile.gettempdir()) / "headspec-scratch")
  digest = hashlib.sha1(str(path).encode()).hexdigest()[:12]
  out = root / f"{purpose}-{digest}"
  out.mkdir(parents=True, exist_ok=True)
  return out


def read_json(path):
  """The JSON value in `path` (local or remote); one UserError line naming the file when it is damaged."""
  try:
    return json.loads(epath.Path(path).read_text())
  except json.JSONDecodeError as e:
    raise UserError(f"{path}:{e.lineno}: not valid JSON ({e.msg}); the file is damaged or truncated") from None
  except UnicodeDecodeError:
    raise UserError(f"{path}: not a text file; the file is damaged") from None


def _multiprocess() -> bool:
  jax = sys.modules.get("jax")
  return jax is not None and jax.distributed.is_initialized() and jax.process_count() > 1


def temp_suffix() -> str:
  """`.tmp-<pid>`, a writer's temporary's ending (`TEMP_NAME`); `.p<i>.tmp-<pid>` in process i of a
  multi-process command, whose hosts' pids may coincide on a shared disk."""
  jax = sys.modules.get("jax")
  return f".p{jax.process_index()}.tmp-{os.getpid()}" if _multiprocess() else f".tmp-{os.getpid()}"


def is_writer() -> bool:
  """Whether this process writes a run's files. A multi-process command (`config.multihost`: TPU pod workers,
  SLURM tasks) runs the same program on every process; process 0 writes and the others drop their writes,
  so each file of a shared workdir has one writer. A single process always writes. jax is asked only once
  it is imported and distributed (a command without JAX never starts a backend here)."""
  jax = sys.modules.get("jax")
  return jax is None or not jax.distributed.is_initialized() or jax.process_index() == 0


def write_bytes_atomic(path, data: bytes) -> None:
  """Writes `path` whole: local through a temp file beside it and rename, remote as one object (atomic on GCS).
  A process other than the writer (`is_writer`) writes nothing."""
  path = epath.Path(path)
  if not is_writer():
    return
  if is_remote(path):
    path.write_bytes(data)
    return
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = temp_beside(path)
  with replacing(tmp, path):
    tmp.write_bytes(data)


def save_figure(fig, path, **savefig_kwargs) -> epath.Path:
  """`fig.savefig` to a local or remote path, whole: a local file is drawn beside it and renamed, a remote
  one is drawn in memory and written as one object (matplotlib cannot write to a URL). The format is
  the file's suffix (default png); a process other than the writer (`is_writer`) draws nothing. Returns the path."""
  path = epath.Path(path)
  fmt = path.suffix.lstrip(".") or "png"
  if not is_writer():
    return path
  if is_remote(path):
    buffer = io.BytesIO()
    fig.savefig(buffer, format=fmt, **savefig_kwargs)
    path.write_bytes(buffer.getvalue())
    return path
  tmp = temp_beside(path)
  with replacing(tmp, path):
    fig.savefig(os.fspath(tmp), format=fmt, **savefig_kwargs)
  return path


@contextlib.contextmanager
def replacing(tmp: epath.Path, path: epath.Path):
  """Renames `tmp` onto `path` once the body has filled it. A body that fails (a full disk, a quota, an
  interrupt) leaves `path` as it was and no temporary; its OSError names `path`, so the CLI's one line
  says which file could not be written. A process other than the writer (`is_writer`) removes `tmp` instead.
  """
  try:
    yield
    if not is_writer():
      tmp.unlink(missing_ok=True)
      return
    tmp.replace(path)
  except OSError as e:
    tmp.unlink(missing_ok=True)
    raise OSError(e.errno, e.strerror, str(path)) from None
  except BaseException:
    tmp.unlink(missing_ok=True)
    raise


def swap_folder(tmp, folder) -> None:
  """Renames the filled local folder `tmp` onto `folder`, replacing an earlier one. Two processes that
  swap at once both succeed (the last one's stays): a rename onto a non-empty folder fails, so the old
  one is first renamed aside as a temporary of this pid (`remove_stale_temps` finds it if we are killed)
  and removed once the new one is in place."""
  tmp, folder = pathlib.Path(os.fspath(tmp)), pathlib.Path(os.fspath(folder))
  if not is_writer():  # a multi-process command: process 0 swaps its own
    shutil.rmtree(tmp, ignore_errors=True)
    return
  aside = folder.with_name(f".{folder.name}.old{temp_suffix()}")
  for _ in range(100):
    try:
      tmp.rename(folder)
      break
    except OSError as e:
      if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
        raise
      shutil.rmtree(aside, ignore_errors=True)
      with contextlib.suppress(FileNotFoundError):  # another process moved it aside first
        folder.rename(aside)
  else:
    raise OSError(errno.ENOTEMPTY, f"{folder}: other processes kept replacing it")
  shutil.rmtree(aside, ignore_errors=True)


def temp_beside(path) -> epath.Path:
  """The temporary `.<name>.tmp-<pid>` beside `path` that a writer fills and renames into place. The
  stale ones in that folder (writers killed mid-write: kill -9 leaves them) are removed first
  (`remove_stale_temps`; those changed in the last minute are kept: they may be another host's), so
  every write into a folder cleans up after its killed predecessors."""
  path = epath.Path(path)
  remove_stale_temps(path.parent, min_age_s=60.0)
  return path.parent / f".{path.name}{temp_suffix()}"


def files_under(folder) -> list[epath.Path]:
  """Every file under `folder` (local or remote; [] when it does not exist), sorted. epath's rglob refuses
  `**` on every backend, so this walks the tree."""
  folder = epath.Path(folder)
  if not folder.is_dir():
    return []
  scheme, files = scheme_of(folder), []
  for root, _, names in folder.walk():
    root = os.fspath(root)
    if scheme and "://" not in root:  # fsspec (gcsfs, s3fs) walks without the scheme
      root = f"{scheme}://{root}"
    files += [epath.Path(root) / name for name in names]
  return sorted(files)


TEMP_NAME = re.compile(r"\.tmp-(\d+)$")
"""A writer's temporary file or folder beside its target: `<name>.tmp-<pid>` (renamed into place when whole)."""


def _start_time(pid: int) -> float | None:
  """When process `pid` started (seconds since the epoch; Linux /proc), None when unknown; +inf when no
  process has that pid (none ever will have started before now)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return math.inf
  except PermissionError:  # another user's live process
    pass
  try:
    ticks = int(pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    stat = pathlib.Path("/proc/stat").read_text().splitlines()
    boot = next(int(line.split()[1]) for line in stat if line.startswith("btime "))
  except (OSError, IndexError, ValueError, StopIteration):
    return None
  return boot + ticks / os.sysconf("SC_CLK_TCK")


def remove_stale_temps(folder, *, slack_s: float = 5.0, min_age_s: float = 0.0) -> list[pathlib.Path]:
  """Removes the temporaries (`TEMP_NAME`) in local `folder` whose writer is gone, and returns them: a
  killed writer (kill -9, out of memory) leaves its temporary behind, and a feature cache's holds
  gigabytes. Gone: no process has the pid, or the one that has it started after the temporary was last
  changed (the pid was reused: a restarted container, or this very process). A live writer's temporary
  is kept, so concurrent writers of one folder are safe. `min_age_s`: also keep the temporaries changed
  less than this long ago (a writer on another host of a shared disk: its pid means nothing here).
  Remote folders have none (objects are whole). In a multi-process command only the writer (process 0)
  removes, and keeps what changed in the last minute (the other processes' temporaries, just begun)."""
  if is_remote(folder) or not os.path.isdir(folder) or not is_writer():
    return []
  if _multiprocess():
    min_age_s = max(min_age_s, 60.0)
  removed = []
  for entry in pathlib.Path(os.fspath(folder)).iterdir():
    match = TEMP_NAME.search(entry.name)
    if not match:
      continue
    started = _start_time(int(match.group(1)))
    try:
      changed = entry.lstat().st_mtime
    except FileNotFoundError:  # its writer just renamed or removed it
      continue
    if started is None or started <= changed + slack_s or time.time() - changed < min_age_s:
      continue
    if entry.is_dir() and not entry.is_symlink():
      shutil.rmtree(entry, ignore_errors=True)
    else:
      entry.unlink(missing_ok=True)
    removed.append(entry)
  return removed


class LocalMirror:
  """A local folder whose files are uploaded to a remote folder on `sync()` (each file whole).

  For writers that need a real file (TensorBoard's event writer, matplotlib): they write to `.local`;
  `sync()` copies what changed since the last sync. A local target needs no mirror: `.local` is it.
  """

  def __init__(self, target, purpose: str):
    self.target = epath.Path(target)
    self.remote = is_remote(self.target)
    self.local = scratch_dir(self.target, purpose) if self.remote else pathlib.Path(os.fspath(self.target))
    self.local.mkdir(parents=True, exist_ok=True)
    self._sent: dict[str, tuple[int, int]] = {}

  def sync(self) -> list[epath.Path]:
    if not self.remote or not is_writer():
      return []
    sent = []
    for file in sorted(p for p in self.local.rglob("*") if p.is_file()):
      rel = file.relative_to(self.local).as_posix()
      stamp = (file.stat().st_size, file.stat().st_mtime_ns)
      if self._sent.get(rel) != stamp:
        dest = self.target / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(file.read_bytes())
        self._sent[rel] = stamp
        sent.append(dest)
    return sent

  def cleanup(self) -> None:
    if self.remote:
      shutil.rmtree(self.local, ignore_errors=True)


def check_folder(folder: epath.Path) -> None:
  """UserError unless local `folder` is, or can be made, a folder this process may write in: its nearest
  existing ancestor (itself included) must be a folder, writable. Object stores have no folders to check."""
  if is_remote(folder):
    return
  there = here = pathlib.Path(os.fspath(folder))
  while not there.exists() and there != there.parent:  # exists() is False under a file, too
    there = there.parent
  if not there.is_dir():
    raise UserError(f"{here}: {'it' if there == here else there} is a file, not a folder; use another --workdir")
  if not os.access(there, os.W_OK | os.X_OK):
    raise UserError(f"{folder}: cannot write in {there} (permission denied or a read-only disk)")
