"""Run metrics: one JSON object per line in WORKDIR/metrics.jsonl, mirrored to TensorBoard events.

Local workdir: metrics.jsonl is appended to and flushed each record, as always. Remote workdir
(gs://...): objects cannot be appended to, so the writer keeps the file's lines (those of earlier
segments of the run too, read back at start) and rewrites the whole object at most every
`upload_every` seconds and at close; TensorBoard events are written on local scratch disk and uploaded
whole at the same moments (headspec/io/remote.py).

A run stopped while writing a record (kill -9, a lost host) leaves a cut-off last line: the writer drops
it when the run resumes (so the next record starts on a line of its own), and `read_metrics` skips any
line that is not a JSON record, with a warning naming file:line. A write that fails (a full disk, a
quota) leaves no partial line either: each record (and each TensorBoard event) is one write, cut back
when it fails, and the OSError names the file (the CLI prints it as one line).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import socket
import struct
import sys
import time

from etils import epath

from headspec.io import remote


class MetricsWriter:
  """Writes `{"step": ..., key: value, ...}` records; only the lead process writes (multi-host)."""

  def __init__(self, workdir, *, is_lead: bool = True, upload_every: float = 30.0, resume_step: int | None = None):
    """resume_step: the step the run resumes from; records of later steps (logged before a kill, past the
    last checkpoint) are dropped, as the run logs those steps again."""
    self.is_lead = is_lead
    if not is_lead:
      return
    workdir = epath.Path(workdir)
    self.path = workdir / "metrics.jsonl"
    self.remote = remote.is_remote(workdir)
    self.upload_every = upload_every
    text = self.path.read_text() if self.path.exists() else ""
    lines = _complete(self.path, text)
    if resume_step is not None:
      lines = _up_to(self.path, lines, resume_step)
    if self.remote:
      self._lines = lines
      self._dirty, self._uploaded_at = "".join(lines) != text, time.monotonic()
    else:
      if "".join(lines) != text:
        remote.write_bytes_atomic(self.path, "".join(lines).encode())
      self._jsonl = _Appender(self.path)
    self._tb_dir = remote.LocalMirror(workdir, "tensorboard")
    self._tb = _EventFile(self._tb_dir.local)

  def write(self, record: dict) -> None:
    """Appends one record (a whole line, or nothing: a failed write, like a full disk, is an OSError
    naming the file, the file as it was)."""
    if not self.is_lead:
      return
    line = json.dumps(record) + "\n"
    if self.remote:
      self._lines.append(line)
      self._dirty = True
    else:
      self._jsonl.append(line.encode())
    self._tb.add_scalars({k: v for k, v in record.items() if k != "step"}, record["step"])
    shown = {k: v for k, v in record.items() if not k.startswith("diversity/")}
    if len(shown) > 1:  # a progress line on stdout, above the progress bar (tqdm.write clears it first)
      from tqdm import tqdm

      tqdm.write(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()))
      sys.stdout.flush()
    if self.remote and time.monotonic() - self._uploaded_at >= self.upload_every:
      self.flush()

  def flush(self) -> None:
    """Remote: rewrites metrics.jsonl whole and uploads new TensorBoard events (a no-op locally)."""
    if not (self.is_lead and self.remote):
      return
    self._upload()

  def _upload(self) -> None:
    if self._dirty:
      remote.write_bytes_atomic(self.path, "".join(self._lines).encode())
      self._dirty = False
    self._tb_dir.sync()
    self._uploaded_at = time.monotonic()

  def close(self) -> None:
    if not self.is_lead:
      return
    self._tb.close()
    try:
      if self.remote:
        self._upload()
    finally:
      if self.remote:
        self._tb_dir.cleanup()
      else:
        self._jsonl.close()


class _Appender:
  """metrics.jsonl opened for appending, each record one unbuffered write: a write that fails (a full disk)
  is cut back to the file's length before it, so the file never ends in a partial line, and raises an
  OSError naming the file."""

  def __init__(self, path):
    self.path = path
    self._fd = os.open(os.fspath(path), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

  def append(self, data: bytes) -> None:
    size = os.fstat(self._fd).st_size
    try:
      view = memoryview(data)
      while view:
        view = view[os.write(self._fd, view) :]
    except OSError as e:
      with contextlib.suppress(OSError):
        os.ftruncate(self._fd, size)
      raise OSError(e.errno, e.strerror, os.fspath(self.path)) from None

  def close(self) -> None:
    os.close(self._fd)


class _EventFile:
  """A TensorBoard event file (`events.out.tfevents.<time>.<host>` in a local folder), each record appended in
  the caller's thread like metrics.jsonl's lines (`_Appender`): tensorboardX's SummaryWriter writes from a
  thread of its own and flushes again at exit, so a full disk was a traceback from each after the run
  had stopped. The records are TensorBoard's (tensorboardX's protobufs, TFRecord framing with masked
  CRC-32C), one Event per metrics record."""

  def __init__(self, local: pathlib.Path):
    """local: a local folder (a remote run's events are written on scratch and uploaded: remote.LocalMirror)."""
    self.path = local / f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}"
    self._file = _Appender(self.path)
    try:
      self._append(_event(file_version="brain.Event:2"))
    except OSError:
      self._file.close()
      self.path.unlink(missing_ok=True)  # an empty events file is not one
      raise

  def _append(self, event) -> None:
    from tensorboardX.record_writer import masked_crc32c  # here: readers of metrics.jsonl do not import it

    data = event.SerializeToString()
    header = struct.pack("Q", len(data))
    crc = lambda b: struct.pack("I", masked_crc32c(b))
    self._file.append(header + crc(header) + data + crc(data))

  def add_scalars(self, values: dict, step: int) -> None:
    if values:
      from tensorboardX import summary

      parts = [summary.scalar(k, float(v)) for k, v in values.items()]
      self._append(_event(step=step, summary=type(parts[0])(value=[v for p in parts for v in p.value])))

  def close(self) -> None:
    self._file.close()


def _event(**fields):
  from tensorboardX.proto import event_pb2

  return event_pb2.Event(wall_time=time.time(), **fields)


def _complete(path, text: str) -> list[str]:
  """The lines of metrics.jsonl, each ending in a newline. A last line without one was cut off as it was
  written: kept (terminated) when it is a whole JSON record, else dropped, with a warning."""
  lines = text.splitlines(keepends=True)
  if lines and not lines[-1].endswith("\n"):
    try:
      json.loads(lines[-1])
      lines[-1] += "\n"
    except json.JSONDecodeError:
      _warn(f"{path}:{len(lines)}: dropped a cut-off last line (the run was stopped while writing it)")
      lines.pop()
  return lines


def _up_to(path, lines: list[str], step: int) -> list[str]:
  """The lines up to the first record of a step after `step` (the run redoes those steps)."""
  for i, line in enumerate(lines):
    try:
      record = json.loads(line)
    except json.JSONDecodeError:
      continue
    if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] > step:
      _warn(f"{path}:{i + 1}: dropped {len(lines) - i} lines logged after step {step}, the step this run resumes from")
      return lines[:i]
  return lines


def read_metrics(workdir) -> list[dict]:
  """The records of WORKDIR/metrics.jsonl (none when there is no file): every reader's one reader (sweeps,
  study, the atlas, the induction figure, analysis/ scripts). A line that is not a JSON object with an
  integer `step` (cut off by a killed run, not UTF-8, a hand edit) is skipped; one warning names the file,
  the first such line and how many."""
  path = remote.run_path(workdir) / "metrics.jsonl"
  if not path.is_file():
    return []
  records, bad = [], []
  for number, line in enumerate(path.read_bytes().splitlines(), 1):
    if not line.strip():
      continue
    try:
      record = json.loads(line.decode("utf-8"))
    except ValueError:  # UnicodeDecodeError and JSONDecodeError are both ValueErrors
      record = None
    step = record.get("step") if isinstance(record, dict) else None
    if not isinstance(step, int) or isinstance(step, bool):
      bad.append(number)
      continue
    records.append(record)
  if bad:
    _warn(
      f"{path}:{bad[0]}: {len(bad)} line(s) left out: not a JSON object with an integer step (cut off by a killed run?)"
    )
  return records


def _warn(message: str) -> None:
  print(f"headspec: warning: {message}", file=sys.stderr, flush=True)
