"""Sweeps: a grid of config overrides times seeds, each run in its own workdir named after its overrides.

  grid = parse_grid(["train.regularizers.drophead=0,0.1,0.2"], seeds="0,1")
  runs = expand(base_config, grid, root="gs://bucket/drophead")   # 6 runs, checked against the config
  write_plan(root, runs)         # ROOT/sweep.csv: name, workdir, overrides (before anything starts)
  summarize(root)                # ROOT/sweep.csv again, with each run's last step, loss and eval loss

Names: `drophead=0.1,seed=1` (the last part of each key, then its value), so a workdir says what differs.
`python -m headspec.launch.sweeps summarize ROOT` rewrites the table from whatever runs have finished.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import itertools
import re
import sys

import ml_collections
from etils import epath

from headspec.errors import UserError
from headspec.io import metrics, remote, tables

TABLE = "sweep.csv"
COLUMNS = ("name", "workdir", "overrides", "step", "loss", "eval_loss")


@dataclasses.dataclass(frozen=True)
class Run:
  name: str
  workdir: str
  overrides: tuple[tuple[str, str], ...]  # (config key, value text), seed included as `seed`

  @property
  def flags(self) -> list[str]:
    return [f"--config.{k}={v}" for k, v in self.overrides]


def parse_grid(specs: list[str], seeds: str = "") -> list[tuple[str, list[str]]]:
  """['a.b=1,2', ...] and '0,1' -> [('a.b', ['1', '2']), ..., ('seed', ['0', '1'])]."""
  grid = []
  for spec in specs:
    key, sep, values = spec.partition("=")
    key = key.strip().removeprefix("--config.").removeprefix("config.")
    items = [v.strip() for v in values.split(",") if v.strip()] if sep else []
    if not key or not items:
      raise UserError(f"--grid {spec!r}: use KEY=V1,V2,... (a config key and comma-separated values)")
    grid.append((key, items))
  if seeds:
    items = [s.strip() for s in seeds.split(",") if s.strip()]
    if not all(s.lstrip("-").isascii() and s.lstrip("-").isdigit() for s in items):
      raise UserError(f"--seeds={seeds}: use comma-separated integers")
    grid.append(("seed", items))
  keys = [k for k, _ in grid]
  if len(set(keys)) != len(keys):
    raise UserError(f"sweep grid names a key twice: {', '.join(keys)}")
  return grid


def check_keys(config: ml_collections.ConfigDict, keys) -> None:
  """UserError (one line) for a key the config does not have."""
  for key in keys:
    node = config
    for i, part in enumerate(key.split(".")):
      if not isinstance(node, ml_collections.ConfigDict) or part not in node:
        raise UserError(
          f"sweep grid: unknown config key {key!r} ({'.'.join(key.split('.')[:i]) or 'the config'} has no {part!r})"
        )
      node = node[part]
    if isinstance(node, ml_collections.ConfigDict):
      raise UserError(f"sweep grid: {key!r} is a section of the config, not a value")


def _slug(text: str) -> str:
  return re.sub(r"[^A-Za-z0-9._+-]", "_", text)


def expand(config: ml_collections.ConfigDict | None, grid, root) -> list[Run]:
  """Every combination of the grid, in order (the last key varies fastest), as Runs under `root`."""
  if config is not None:
    check_keys(config, [k for k, _ in grid])
  remote.check_url(str(root), "sweep root --workdir")
  root = str(root).rstrip("/")
  runs = []
  for combo in itertools.product(*[[(k, v) for v in values] for k, values in grid]):
    name = ",".join(f"{_slug(k.split('.')[-1])}={_slug(v)}" for k, v in combo) or "run"
    runs.append(Run(name=name, workdir=f"{root}/{name}", overrides=tuple(combo)))
  if len({r.name for r in runs}) != len(runs):
    raise UserError("sweep grid: two keys end in the same name and their runs would share a workdir")
  return runs


def _write(root, rows: list[dict]) -> epath.Path:
  out = io.StringIO()
  writer = csv.DictWriter(out, COLUMNS, lineterminator="\n")
  writer.writeheader()
  writer.writerows(rows)
  path = remote.run_path(root) / TABLE
  path.parent.mkdir(parents=True, exist_ok=True)
  remote.write_bytes_atomic(path, out.getvalue().encode())
  return path


def write_plan(root, runs: list[Run]) -> epath.Path:
  """ROOT/sweep.csv listing every run (its metrics columns empty until `summarize`)."""
  return _write(
    root,
    [dict(name=r.name, workdir=r.workdir, overrides=" ".join(r.flags), step="", loss="", eval_loss="") for r in runs],
  )


def _last(workdir) -> dict:
  """The last logged step, loss and eval loss of a run (malformed lines skipped with a warning)."""
  out = {}
  for record in metrics.read_metrics(workdir):
    out["step"] = record["step"]
    for key, column in (("loss", "loss"), ("eval/loss", "eval_loss")):
      if isinstance(record.get(key), (int, float)):
        out[column] = f"{record[key]:.6f}"
  return out


def summarize(root) -> epath.Path:
  """Rewrites ROOT/sweep.csv with each run's last logged step, training loss and eval loss."""
  path = remote.run_path(root) / TABLE
  if not path.exists():
    raise UserError(f"{path}: no sweep table here (the launcher writes it when it submits a sweep)")
  with tables.locked(path):  # the jobs of a SLURM array each summarize when they end: one at a time
    try:
      reader = csv.DictReader(io.StringIO(path.read_text()))
    except UnicodeDecodeError:
      raise UserError(f"{path}: not a UTF-8 text file; not a sweep table (or a damaged one)") from None
    missing = [c for c in ("name", "workdir") if c not in (reader.fieldnames or [])]
    if missing:
      raise UserError(f"{path}: no {missing[0]!r} column; not a sweep table (or a damaged one)")
    rows = list(reader)
    for row in rows:
      if row["workdir"]:
        row.update(_last(row["workdir"]))
    return _write(root, rows)


def main(argv: list[str]) -> int:
  if len(argv) != 3 or argv[1] != "summarize":
    print("usage: python -m headspec.launch.sweeps summarize SWEEP_ROOT", file=sys.stderr)
    return 2
  try:
    print(summarize(argv[2]))
  except UserError as e:
    print(f"headspec: error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv))
