"""Run metrics: one JSON object per line in WORKDIR/metrics.jsonl, mirrored to TensorBoard events.

Local workdir: metrics.jsonl is appended to and flushed each record, as always. Remote workdir
(gs://...): objects cannot be appended to, so the writer keeps the file's lines (those of earlier
segments of the run too, read back at start) and rewrites the whole object at most every
`upload_every` seconds and at close; TensorBoard events are written on local scratch disk and uploaded
whole at the same moments (headspec/remote.py).
"""

from __future__ import annotations

import json
import time

import tensorboardX
from etils import epath

from headspec import remote


class MetricsWriter:
  """Writes `{"step": ..., key: value, ...}` records; only the lead process writes (multi-host)."""

  def __init__(self, workdir, *, is_lead: bool = True, upload_every: float = 30.0):
    self.is_lead = is_lead
    if not is_lead:
      return
    workdir = epath.Path(workdir)
    self.path = workdir / "metrics.jsonl"
    self.remote = remote.is_remote(workdir)
    self.upload_every = upload_every
    if self.remote:
      self._lines = self.path.read_text().splitlines(keepends=True) if self.path.exists() else []
      self._dirty, self._uploaded_at = False, time.monotonic()
    else:
      self._jsonl = self.path.open("a")
    self._tb_dir = remote.LocalMirror(workdir, "tensorboard")
    self._tb = tensorboardX.SummaryWriter(str(self._tb_dir.local))

  def write(self, record: dict) -> None:
    if not self.is_lead:
      return
    line = json.dumps(record) + "\n"
    if self.remote:
      self._lines.append(line)
      self._dirty = True
    else:
      self._jsonl.write(line)
      self._jsonl.flush()
    step = record["step"]
    for key, value in record.items():
      if key != "step":
        self._tb.add_scalar(key, value, step)
    shown = {k: v for k, v in record.items() if not k.startswith("diversity/")}
    if len(shown) > 1:  # a progress line on stdout
      print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()), flush=True)
    if self.remote and time.monotonic() - self._uploaded_at >= self.upload_every:
      self.flush()

  def flush(self) -> None:
    """Remote: rewrites metrics.jsonl whole and uploads new TensorBoard events (a no-op locally)."""
    if not (self.is_lead and self.remote):
      return
    self._tb.flush()
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
    if self.remote:
      self._upload()
      self._tb_dir.cleanup()
    else:
      self._jsonl.close()
