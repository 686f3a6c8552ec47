"""The one job loop of every analysis (probing, diversity, attention, ablation), written once.

An analysis describes itself as an `Analysis` (its run.py) and `run` calls its parts in order:
  plan      the config's values and the targets (headspec/runs/targets.py): every UserError a config or a
            workdir can cause, before anything is written
  tables    every table it may write: `tables.check_writable` before any computation
  prepare   the data every job shares
  job       per (model, step): {table: rows}, merged into the tables right after that job (so an
            interrupted run keeps the jobs that finished); then `merged`: that job's figures
  finish    figures and reports; returns the path `run` returns (the main table or summary)
A progress bar runs over the jobs (tqdm: a text line on stderr, in a terminal and in a notebook alike);
`progress` makes the bars of stages inside a job. Before a job's first result the bar already shows
which (model, step) runs and that it is loading and compiling, and its clock keeps moving (`ticking`),
so a one-step command's bar is not a frozen 0% while XLA compiles; once that job is done the note goes, so
a finished bar never says it is compiling. Log lines and printed lines go above the bars
(`lines_above_bars`: tqdm.contrib.logging.logging_redirect_tqdm, and `write_above_bars` for stdout, whose
lines share the terminal with the bars on stderr), never after a bar's fragment.
Provenance (run_info.json) is the decorator on each analysis's `run` (headspec/io/provenance.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging as std_logging
import os
import sys
import threading
from collections.abc import Callable, Sequence

from absl import logging
from tqdm import tqdm
from tqdm.contrib import DummyTqdmFile
from tqdm.contrib.logging import logging_redirect_tqdm

from headspec.errors import UserError
from headspec.io import remote, tables
from headspec.runs import targets


@dataclasses.dataclass(frozen=True)
class Rows:
  """Rows for a table two analyses write: the existing rows of a replaced key for which `others(row)`
  is true are kept (`tables.merge`); `groups`: keys whose rows this job replaces even where it has none."""

  rows: list[dict] | Callable
  others: Callable[[dict], bool] | None = None
  groups: tuple[dict, ...] = ()


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


def progress(total: int, desc: str, unit: str = "it", *, initial: int = 0, disable: bool | None = None):
  """A progress bar (tqdm, on stderr) of `total` items (`initial` of them done), redrawn at most once a second;
  by default shown by the writer of a multi-process command only (`remote.is_writer`)."""
  disable = not remote.is_writer() if disable is None else disable
  return tqdm(total=total, desc=desc, unit=unit, leave=True, mininterval=1.0, initial=initial, disable=disable)


def write_above_bars(text: str, file) -> None:
  """`text` written to `file` (stdout) above the progress bars: every bar on `file` or on stderr is cleared
  first and redrawn after. tqdm.write clears only the bars of the stream it writes to, so a printed line on
  stdout landed after the stderr bar's fragment on the same terminal line ("train: 40%|███▌ |step=... loss=...")."""
  with tqdm.external_write_mode(file=file), tqdm.external_write_mode(file=sys.stderr, nolock=True):
    file.write(text)
    file.flush()


class _AboveBars(DummyTqdmFile):
  """stdout while the bars run: whole lines go through `write_above_bars` (a partial line waits for its end)."""

  def write(self, x, nolock=False):
    pre, sep, post = x.rpartition("\n")
    if sep:
      write_above_bars("".join(self._buf) + pre + sep, self._wrapped)
      self._buf = [post] if post else []
    else:
      self._buf.append(x)

  def flush(self):
    return getattr(self._wrapped, "flush", lambda: None)()


@contextlib.contextmanager
def lines_above_bars():
  """Log records (absl's handler included, its format and filters kept) and printed lines are written
  above the progress bars through `tqdm.write`, so a bar is never broken by a line. absl's handler is no
  plain StreamHandler, which `logging_redirect_tqdm` would not recognise (it would add a second handler
  beside it): while the bars run it is replaced by a StreamHandler of its stream (stderr, as this process
  has it now), format and filters, which `logging_redirect_tqdm` then redirects. A log file is left as it is."""
  root = std_logging.getLogger()
  saved = list(root.handlers)
  absl_handler = logging.get_absl_handler()
  name = getattr(absl_handler.python_handler.stream, "name", None)
  to_file = isinstance(name, str) and os.path.isfile(name)  # absl logging into a log file: left as it is
  if absl_handler in saved and not to_file:
    console = std_logging.StreamHandler(sys.stderr)  # where absl's handler writes when no log file is set
    console.setFormatter(absl_handler.python_handler.formatter)
    console.setLevel(absl_handler.level)
    for log_filter in absl_handler.filters:
      console.addFilter(log_filter)
    root.handlers = [console if h is absl_handler else h for h in saved]
  try:
    with contextlib.ExitStack() as stack:
      if not (absl_handler in saved and to_file):
        stack.enter_context(logging_redirect_tqdm(loggers=[root], tqdm_class=tqdm))
      stack.enter_context(contextlib.redirect_stdout(_AboveBars(sys.stdout)))
      yield
  finally:
    root.handlers = saved


@contextlib.contextmanager
def ticking(bar, every: float | None = None):
  """Redraws `bar` every `every` seconds while the block runs, so its clock moves during a step that
  has no update of its own (a compilation). By default once a second on a terminal or in a notebook, once
  every 30 s into a log file (a heartbeat, not a line a second)."""
  if every is None:
    interactive = hasattr(bar, "container") or getattr(sys.stderr, "isatty", lambda: False)()
    every = 1.0 if interactive else 30.0
  done = threading.Event()

  def tick():
    while not done.wait(every):
      bar.refresh()

  thread = threading.Thread(target=tick, daemon=True)
  thread.start()
  try:
    yield
  finally:
    done.set()
    thread.join()


def merge(workdir, table: tables.Table, rows) -> None:
  """One job's rows of `table` merged into WORKDIR's copy (rows: a list, a function, or `Rows`)."""
  if not isinstance(rows, Rows):
    rows = Rows(rows)
  tables.merge(tables.path_of(workdir, table), rows.rows, table, others=rows.others, groups=rows.groups)


def run(analysis: Analysis):
  """plan -> check writable -> prepare -> each job's rows merged -> finish; returns what finish returns.

  A multi-process command (`config.multihost`) runs this on every process as one SPMD program: each
  process plans, prepares and computes every job (the programs span all processes' devices), and the
  writer (process 0, `remote.is_writer`) merges the rows, draws the figures and finishes; the others return
  None once every job is computed."""
  writer = remote.is_writer()
  jobs = analysis.plan()
  tables.check_writable(analysis.workdir, *analysis.tables(jobs))
  analysis.prepare(jobs)
  bar = progress(len(jobs), f"{analysis.name}: model steps", unit="step")
  with lines_above_bars(), bar, ticking(bar):
    for i, job in enumerate(jobs):
      first = " (loading, compiling…)" if i == 0 else ""  # the first job compiles what the later ones reuse
      bar.set_postfix_str(f"{job.name} step {job.step}{first}", refresh=True)
      logging.info("%s step %d", job.name, job.step)
      for table, rows in analysis.job(job).items():
        merge(analysis.workdir, table, rows)
      if writer:
        analysis.merged(job)
      bar.set_postfix_str(f"{job.name} step {job.step}", refresh=False)  # done: compiled, loaded
      bar.update(1)
  return analysis.finish(jobs) if writer else None
