"""The one job loop (headspec/words/jobloop.py), the one face of every analysis, and the CLI's log lines."""

import ast
import contextlib
import logging
import pathlib

import pytest

from headspec.cli import main as cli
from headspec.errors import UserError
from headspec.io import tables
from headspec.words import jobloop

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "headspec"
ANALYSES = ("probing", "diversity", "attention", "ablation")


class _Counting(jobloop.Analysis):
  """Two jobs writing attention/icl.csv rows; the second may fail."""

  name = "counting"

  def __init__(self, config, workdir, fail_on=None):
    super().__init__(config, workdir)
    self.calls, self.fail_on = [], fail_on

  def plan(self):
    self.calls.append("plan")
    return [_Target("m", 1), _Target("m", 2)]

  def tables(self, jobs):
    self.calls.append("tables")
    return (tables.ICL,)

  def prepare(self, jobs):
    self.calls.append("prepare")

  def job(self, job):
    self.calls.append(f"job {job.step}")
    if job.step == self.fail_on:
      raise KeyboardInterrupt
    row = dict(model=job.name, step=job.step, kind="icl_score", position="", value=0.5, ci_low=0.0, ci_high=1.0)
    return {tables.ICL: [row]}

  def merged(self, job):  # the job's rows are in the table by now (its figures are drawn from them)
    self.calls.append(f"merged {job.step}: steps {_steps(tables.path_of(self.workdir, tables.ICL))}")

  def finish(self, jobs):
    self.calls.append("finish")
    return tables.path_of(self.workdir, tables.ICL)


class _Target:
  def __init__(self, name, step):
    self.name, self.step = name, step


def _steps(path) -> list[str]:
  return [r["step"] for r in tables.read(path, tables.ICL)]


def test_run_calls_the_parts_in_order_and_merges_each_job(tmp_path, capsys):
  analysis = _Counting(None, tmp_path)
  path = jobloop.run(analysis)
  assert analysis.calls == [
    *("plan", "tables", "prepare"),
    *("job 1", "merged 1: steps ['1']", "job 2", "merged 2: steps ['1', '2']", "finish"),
  ]
  assert _steps(path) == ["1", "2"]
  assert "counting: model steps" in capsys.readouterr().err  # the progress bar over the jobs


def test_an_interrupted_run_keeps_the_jobs_that_finished(tmp_path):
  with pytest.raises(KeyboardInterrupt):
    jobloop.run(_Counting(None, tmp_path, fail_on=2))
  assert _steps(tables.path_of(tmp_path, tables.ICL)) == ["1"]


def test_a_foreign_table_is_refused_before_prepare(tmp_path):
  path = tables.path_of(tmp_path, tables.ICL)
  path.parent.mkdir(parents=True)
  path.write_text("a,b\n1,2\n")
  analysis = _Counting(None, tmp_path)
  with pytest.raises(UserError):
    jobloop.run(analysis)
  assert analysis.calls == ["plan", "tables"] and path.read_text() == "a,b\n1,2\n"


def test_no_workdir_is_one_line():
  with pytest.raises(UserError, match=r"^counting needs --workdir=DIR"):
    _Counting(None, "")


def test_rows_keep_what_others_say_another_analysis_wrote(tmp_path):
  def row(kind, value):
    return dict(model="m", step=1, kind=kind, position="", value=value, ci_low=0.0, ci_high=1.0)

  jobloop.merge(tmp_path, tables.ICL, [row("mine", 1.0), row("theirs", 2.0)])
  jobloop.merge(tmp_path, tables.ICL, jobloop.Rows([row("mine", 3.0)], others=lambda r: r["kind"] == "theirs"))
  got = {(r["kind"], r["value"]) for r in tables.read(tables.path_of(tmp_path, tables.ICL), tables.ICL)}
  assert got == {("mine", "3.000000"), ("theirs", "2.000000")}


def _functions(path: pathlib.Path) -> dict[str, ast.FunctionDef]:
  return {n.name: n for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}


@pytest.mark.parametrize("analysis", ANALYSES)
def test_every_analysis_has_one_face(analysis):
  """<pkg>/config.py (its keys) and <pkg>/run.py: run(config, workdir) through the job loop."""
  folder = PACKAGE / analysis
  assert (folder / "config.py").is_file() and not (folder / "defaults.py").exists()
  run = _functions(folder / "run.py")["run"]
  assert [a.arg for a in run.args.args] == ["config", "workdir"]
  assert "jobloop.run(" in ast.unparse(run)


def test_commands_call_each_analysis_run():
  from headspec.cli.commands import COMMANDS

  runs = {command.run for command in COMMANDS.values()}
  for analysis in ANALYSES:
    assert f"headspec.{analysis}.run:run" in runs


def _record(level: int, path: str) -> logging.LogRecord:
  return logging.LogRecord("absl", level, path, 1, "a line", None, None)


def test_the_cli_shows_headspec_info_lines_and_drops_the_libraries():
  assert cli._drop_library_chatter(_record(logging.INFO, str(PACKAGE / "probing" / "suite.py")))
  assert not cli._drop_library_chatter(_record(logging.INFO, "/site-packages/orbax/checkpoint/manager.py"))
  assert cli._drop_library_chatter(_record(logging.WARNING, "/site-packages/orbax/checkpoint/manager.py"))


class _Terminal:
  """One terminal that stdout and stderr both write to, each through its own stream object (as on a
  console: tqdm cannot tell they share a screen); `screen()` renders what it shows ('\\r' returns to the
  line's start and overwrites, '\\n' starts a new line)."""

  def __init__(self):
    self.written = []

  def stream(self):
    terminal = self

    class Stream:
      def write(self, text):
        terminal.written.append(text)

      def flush(self):
        pass

    return Stream()

  def screen(self) -> list[str]:
    lines, col = [[]], 0
    for ch in "".join(self.written):
      if ch == "\r":
        col = 0
      elif ch == "\n":
        lines.append([])
        col = 0
      else:
        line = lines[-1]
        line[col : col + 1] = [ch]
        col += 1
    return ["".join(line).rstrip() for line in lines]

  @contextlib.contextmanager
  def attached(self):
    """sys.stdout and sys.stderr on this terminal while the block runs (set in the test's body: pytest's own
    capture sets them again between a fixture and the test)."""
    with contextlib.redirect_stdout(self.stream()), contextlib.redirect_stderr(self.stream()):
      yield self


@pytest.mark.parametrize("inside", [False, True])
def test_metric_lines_never_follow_a_bars_fragment(tmp_path, inside):
  """A metrics line (io/metrics.py, on stdout) and a printed line each stand on a line of their own on the
  terminal, with the bar (on stderr) redrawn below them; with and without lines_above_bars (the trainer's)."""
  from headspec.io.metrics import MetricsWriter

  writer = MetricsWriter(tmp_path)
  terminal = _Terminal()
  with terminal.attached(), contextlib.ExitStack() as stack:
    bar = jobloop.progress(4, "train", unit="step", disable=False)
    if inside:
      stack.enter_context(jobloop.lines_above_bars())
    stack.enter_context(bar)
    bar.update(2)
    bar.refresh()
    writer.write({"step": 2, "loss": 2.5})
    if inside:  # a plain print: above the bars while they run under lines_above_bars
      print("a printed line")
    bar.update(2)
  writer.close()
  screen = terminal.screen()
  assert "step=2 loss=2.5" in screen and ("a printed line" in screen or not inside), screen
  assert screen[-1].startswith("train: 100%") or screen[-2].startswith("train: 100%"), screen


def test_a_finished_bar_says_no_more_that_it_compiles(tmp_path):
  """One job: its bar shows '(loading, compiling…)' while it runs, not once it is done."""

  class _One(_Counting):
    def plan(self):
      return [_Target("m", 1)]

  with _Terminal().attached() as terminal:
    jobloop.run(_One(None, tmp_path))
  screen = [line for line in terminal.screen() if "counting: model steps" in line]
  assert "compiling" in "".join(terminal.written)
  assert "100%" in screen[-1] and "compiling" not in screen[-1], screen
