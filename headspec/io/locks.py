"""Locks on a run directory: one process per (run, stage) at a time, and folders several processes share.

Two launches on one workdir must not train one run twice at once (every metrics line twice) or run one
experiment stage twice; a second `headspec train` on a run another live process trains is refused in one
line naming the holder's pid, and a second experiment stage waits for the first (then finds it done).

The lock is `fcntl.flock` on a file `.<stage>.lock` in the folder, from the standard library on purpose:
the kernel drops it when its holder exits, kill -9 and out-of-memory included, so a lock never outlives
its process and there is no stale lock to clean up (or to clean up wrongly); `filelock` would wrap the
same call and is not a dependency. The holder writes its pid and host into the file, for the message of
the process it turns away, and removes the file when it lets go. flock works on local disks and NFS (Linux
emulates it with byte-range locks there); object stores (gs://) have no locks, so a remote folder is not
locked (one launcher per gs:// run, as docs/scale.md says).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import inspect
import os
import shutil
import socket
import sys
import time

from headspec.errors import UserError
from headspec.io import remote


def lock_path(folder, stage: str) -> str:
  """The lock file of `stage` in `folder`."""
  return os.path.join(os.fspath(folder), f".{stage}.lock")


def open_locked(lock: str, how: int) -> int | None:
  """A descriptor of `lock` holding flock `how` (None: another holds it and `how` has LOCK_NB), the file
  still at that path: a process that got the flock of a file its holder has just removed opens anew."""
  while True:
    try:
      fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except FileNotFoundError:  # its folder was removed (an emptied run folder): made again
      os.makedirs(os.path.dirname(lock), exist_ok=True)
      continue
    try:
      fcntl.flock(fd, how)
    except OSError as e:
      os.close(fd)
      if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
        return None
      raise
    try:
      if os.stat(lock).st_ino == os.fstat(fd).st_ino:
        return fd
    except FileNotFoundError:
      pass
    os.close(fd)


def holder(lock: str) -> str:
  """Who holds `lock` as its holder wrote it ('pid N on HOST since TIME'), or 'a process' when unknown."""
  for _ in range(20):  # the holder writes its line just after taking the lock (a dead one's may be there still)
    try:
      with open(lock) as f:
        words = f.read().split()
    except OSError:
      words = []
    if len(words) >= 3 and (words[1] != socket.gethostname() or _alive(words[0])):
      since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(words[2])))
      return f"pid {words[0]} on {words[1]} (since {since})"
    time.sleep(0.05)
  return "a process"


def _alive(pid: str) -> bool:
  try:
    os.kill(int(pid), 0)
  except (ValueError, ProcessLookupError):
    return False
  except PermissionError:  # another user's live process
    pass
  return True


@contextlib.contextmanager
def held(folder, stage: str, *, wait: bool, what: str = ""):
  """Holds `stage`'s lock in `folder` (made if missing, and removed again if it is left empty) for the
  block. Another live holder: `wait` waits for it (saying so once on stderr), else one UserError line
  naming the folder, the stage and the holder's pid. `what` names the stage in messages (default `stage`).
  A remote folder is not locked (module docstring)."""
  what = what or stage
  if remote.is_remote(folder):
    yield
    return
  remote.check_folder(folder)  # a file, under a file, read-only: the command's one line, not a traceback here
  folder = os.fspath(remote.run_path(folder))
  made = not os.path.isdir(folder)
  os.makedirs(folder, exist_ok=True)
  lock = lock_path(folder, stage)
  fd = open_locked(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
  if fd is None:
    if not wait:
      raise UserError(
        f"{folder}: {what} is running there already ({holder(lock)}, holding {lock}); wait for it to finish "
        "or stop it, or use another --workdir"
      )
    print(f"{folder}: waiting for {what} of {holder(lock)} to finish ({lock})", file=sys.stderr, flush=True)
    fd = open_locked(lock, fcntl.LOCK_EX)
  try:
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()} {socket.gethostname()} {time.time():.3f}\n".encode())
    yield
  finally:
    with contextlib.suppress(FileNotFoundError):
      os.unlink(lock)  # before the flock goes: a process waiting on this file sees it gone and locks anew
    os.close(fd)
    if made:
      with contextlib.suppress(OSError):  # only when empty: a refused first run leaves no folder behind
        os.rmdir(folder)


def checkpoint_folder(folder, what: str) -> dict | None:
  """`held`'s keywords for a checkpoint folder other than a run's own (which its run lock covers): the lock
  `.<name>.lock` beside it, waited for, so two processes never run orbax managers on one folder at once (one
  would remove the other's temporary step); None for no folder."""
  if folder is None:
    return None
  path = remote.run_path(folder)
  return dict(folder=path.parent, stage=path.name, wait=True, what=what)


def holding(lock_of):
  """Decorates `f(...)` to run inside `held(**lock_of(**its arguments))`: `lock_of` gets the call's
  arguments by name and returns held's keywords (folder, stage, wait, what), or None for no lock."""

  def decorate(function):
    signature = inspect.signature(function)

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
      bound = signature.bind(*args, **kwargs)
      bound.apply_defaults()
      lock = lock_of(**bound.arguments)
      if lock is None:
        return function(*args, **kwargs)
      with held(**lock):
        return function(*args, **kwargs)

    return wrapper

  return decorate


class SharedFolder:
  """A folder that several live processes may fill at once (one probing job's finished parts: two
  launches probing one run with one config share it), removed by the last one done with it, never under
  another's feet. Each user holds a shared flock of `.users.lock` in the folder (made here) from before its
  first read or write; `done(remove=True)` removes the folder only if it gets the exclusive flock (no
  other user), else leaves it to the last user. A user killed on the way leaves the folder, as a kill always
  did: what it holds is keyed by everything its contents depend on, so a later run reads it back."""

  def __init__(self, folder):
    self.folder = folder
    self.lock = os.path.join(os.fspath(folder), ".users.lock")  # goes with the folder
    self._fd = open_locked(self.lock, fcntl.LOCK_SH)  # waits only while a last user removes the folder

  def done(self, *, remove: bool) -> bool:
    """Lets go of the folder; with `remove`, removes it (and its lock file) when no other process uses it.
    Returns whether it was removed."""
    fd, self._fd = self._fd, None
    if fd is None:
      return False
    if remove:
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except OSError as e:  # another live user: it removes the folder when it is done
        if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
          raise
        remove = False
    try:
      if remove:  # its lock file too: a process waiting on it opens anew and finds no folder (none used it)
        shutil.rmtree(self.folder, ignore_errors=True)
    finally:
      os.close(fd)
    return remove

  def __del__(self):  # an exception on the way: the shared flock goes with the object (and the process)
    if getattr(self, "_fd", None) is not None:
      os.close(self._fd)
