"""Run metrics: one JSON object per line in WORKDIR/metrics.jsonl, mirrored to TensorBoard events."""

from __future__ import annotations

import json
import pathlib

import tensorboardX


class MetricsWriter:
  """Appends `{"step": ..., key: value, ...}` records; only the lead process writes (multi-host)."""

  def __init__(self, workdir, *, is_lead: bool = True):
    self.is_lead = is_lead
    if is_lead:
      self._jsonl = open(pathlib.Path(workdir) / "metrics.jsonl", "a")
      self._tb = tensorboardX.SummaryWriter(str(workdir))

  def write(self, record: dict) -> None:
    if not self.is_lead:
      return
    self._jsonl.write(json.dumps(record) + "\n")
    self._jsonl.flush()
    step = record["step"]
    for key, value in record.items():
      if key != "step":
        self._tb.add_scalar(key, value, step)
    shown = {k: v for k, v in record.items() if not k.startswith("diversity/")}
    if len(shown) > 1:  # a progress line on stdout
      print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()), flush=True)

  def close(self) -> None:
    if self.is_lead:
      self._jsonl.close()
      self._tb.close()
