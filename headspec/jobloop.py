"""The one job loop of every analysis (probing, diversity, attention, ablation), written once.

An analysis describes itself as an `Analysis` (its run.py) and `run` calls its parts in order:
  plan      the config's values and the targets (headspec/targets.py): every UserError a config or a
            workdir can cause, before anything is written
  tables    every table it may write: `tables.check_writable` before any computation
  prepare   the data every job shares
  job       per (model, step): {table: rows}, merged into the tables right after that job (so an
            interrupted run keeps the jobs that finished); then `merged`: that job's figures
  finish    figures and reports; returns the path `run` returns (the main table or summary)
A progress bar runs over the jobs (tqdm.auto: a widget in a notebook, a line on stderr in a terminal);
`progress` makes the bars of stages inside a job. Provenance (run_info.json) is the decorator on each
analysis's `run` (headspec/provenance.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from absl import logging
from tqdm.auto import tqdm

from headspec import remote, tables, targets
from headspec.errors import UserError


@dataclasses.dataclass(frozen=True)
class Rows:
  """Rows for a table two analyses write: the existing rows of a replaced key for which `others(row)`
  is true are kept (`tables.merge`)."""

  rows: list[dict] | Callable
  others: Callable[[dict], bool] | None = None


class Analysis:
  """One analysis's parts, called in order by `run` (module docstring). `name` is its command's."""

  name = ""

  def __init__(self, config, workdir):
    if not workdir:
      raise UserError(f"{self.name} needs --workdir=DIR (a training run, or any folder with --config.model.pretrained)")
    self.config = config
    self.workdir = remote.run_path(workdir)

  def plan(self) -> list[targets.Target]:
    raise NotImplementedError

  def tables(self, jobs: Sequence[targets.Target]) -> Sequence[tables.Table]:
    raise NotImplementedError

  def prepare(self, jobs: Sequence[targets.Target]) -> None:
    pass

  def job(self, job: targets.Target) -> dict:
    """{tables.Table: rows (a list, a function of the old rows, or `Rows`)} of one (model, step)."""
    raise NotImplementedError

  def merged(self, job: targets.Target) -> None:
    """After `job`'s rows are in the tables: its own figures, if any."""

  def finish(self, jobs: Sequence[targets.Target]):
    raise NotImplementedError


def progress(total: int, desc: str, unit: str = "it"):
  """A progress bar (tqdm.auto) of `total` items, redrawn at most once a second."""
  return tqdm(total=total, desc=desc, unit=unit, leave=True, mininterval=1.0)


def merge(workdir, table: tables.Table, rows) -> None:
  """One job's rows of `table` merged into WORKDIR's copy (rows: a list, a function, or `Rows`)."""
  others = rows.others if isinstance(rows, Rows) else None
  tables.merge(tables.path_of(workdir, table), rows.rows if isinstance(rows, Rows) else rows, table, others=others)


def run(analysis: Analysis):
  """plan -> check writable -> prepare -> each job's rows merged -> finish; returns what finish returns."""
  jobs = analysis.plan()
  tables.check_writable(analysis.workdir, *analysis.tables(jobs))
  analysis.prepare(jobs)
  with progress(len(jobs), f"{analysis.name}: model steps", unit="step") as bar:
    for job in jobs:
      bar.set_postfix_str(f"{job.name} step {job.step}", refresh=False)
      logging.info("%s step %d", job.name, job.step)
      for table, rows in analysis.job(job).items():
        merge(analysis.workdir, table, rows)
      analysis.merged(job)
      bar.update(1)
  return analysis.finish(jobs)
