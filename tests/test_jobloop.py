"""The one job loop (headspec/jobloop.py), the one face of every analysis, and the CLI's log lines."""

import ast
import logging
import pathlib

import pytest

from headspec import cli, jobloop, tables
from headspec.errors import UserError

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
  from headspec.commands import COMMANDS

  runs = {command.run for command in COMMANDS.values()}
  for analysis in ANALYSES:
    assert f"headspec.{analysis}.run:run" in runs


def _record(level: int, path: str) -> logging.LogRecord:
  return logging.LogRecord("absl", level, path, 1, "a line", None, None)


def test_the_cli_shows_headspec_info_lines_and_drops_the_libraries():
  assert cli._drop_library_chatter(_record(logging.INFO, str(PACKAGE / "probing" / "suite.py")))
  assert not cli._drop_library_chatter(_record(logging.INFO, "/site-packages/orbax/checkpoint/manager.py"))
  assert cli._drop_library_chatter(_record(logging.WARNING, "/site-packages/orbax/checkpoint/manager.py"))
