"""The command line in use: one spelling rule for list-valued keys, plain error lines,
quickstart's overrides, bars and log lines together, TFDS quiet offline, the Hub's dataset files through
huggingface_hub with their pinned SHA-256."""

import hashlib
import logging
import pathlib

import pytest
from absl import logging as absl_logging

from headspec.cli import config_help, quickstart
from headspec.cli import main as cli
from headspec.data import fetch, text_download, text_tfds
from headspec.errors import UserError
from headspec.words import jobloop


class _Stop(Exception):
  """Raised by a stand-in analysis once it has the config the command line built."""


def _config_reaching(monkeypatch, tmp_path, module: str, argv: list[str]):
  """The config `headspec ARGV` hands to `module.run` (replaced, so nothing is computed)."""
  seen = {}

  def run(config, workdir):
    seen["config"] = config
    raise _Stop

  monkeypatch.setattr(f"{module}.run", run)
  with pytest.raises(_Stop):
    cli.main(["headspec", *argv, f"--workdir={tmp_path}"])
  return seen["config"]


def test_list_valued_keys_are_read_from_the_defaults():
  assert config_help.list_keys("headspec.patching.config:patch_config") == {"sites": "text", "steps": "text"}
  assert config_help.list_keys("headspec.patching.circuit:circuit_config") == {
    "methods": "text",
    "sizes": "text",
    "steps": "text",
  }
  probe = config_help.list_keys("headspec.probing.config:probe_config")
  assert probe["probe.tasks"] == probe["probe.l2_grid"] == probe["probe.eval_splits"] == "tuple"
  assert probe["probe.steps"] == "text"  # "'all' | 'last' | comma-separated steps": its meaning says so


SPELLINGS = [
  # (command, config, override, key, what the analysis reads)
  ("probe", "probe_ewt", "--config.probe.tasks=upos,deprel", "probe.tasks", ("upos", "deprel")),
  ("probe", "probe_ewt", "--config.probe.tasks=upos", "probe.tasks", ("upos",)),
  ("probe", "probe_ewt", "--config.probe.tasks=('upos', 'deprel')", "probe.tasks", ("upos", "deprel")),
  ("probe", "probe_ewt", "--config.probe.l2_grid=1e-4,1e-3", "probe.l2_grid", (1e-4, 1e-3)),
  ("probe", "probe_ewt", "--config.probe.eval_splits=dev", "probe.eval_splits", ("dev",)),
  ("probe", "probe_ewt", "--config.probe.extra_treebanks=", "probe.extra_treebanks", ()),
  ("probe", "probe_ewt", "--config.probe.steps=(100, 1000)", "probe.steps", "100,1000"),
  ("patch", "patch_induction", "--config.sites=('z', 'pattern')", "sites", "z,pattern"),
  ("patch", "patch_induction", "--config.sites=[z, pattern]", "sites", "z,pattern"),
  ("patch", "patch_induction", "--config.sites=z, pattern", "sites", "z,pattern"),
  ("ablate", "ablate", "--config.gates.penalties=0.01,0.1", "gates.penalties", (0.01, 0.1)),
  ("ablate", "ablate", "--config.methods=(zero,mean)", "methods", "zero,mean"),
  ("attention", "attention_ewt", "--config.pictures.sentences=0,2", "pictures.sentences", (0, 2)),
  ("attention", "attention_ewt", "--config.roles.labels=positional,broad", "roles.labels", ("positional", "broad")),
]
MODULES = {
  "probe": "headspec.probing.run",
  "patch": "headspec.patching.run",
  "ablate": "headspec.ablation.run",
  "attention": "headspec.attention.run",
}


@pytest.mark.parametrize(("command", "config", "override", "key", "expected"), SPELLINGS)
def test_a_list_key_takes_a_comma_text_or_a_literal(monkeypatch, tmp_path, command, config, override, key, expected):
  got = _config_reaching(monkeypatch, tmp_path, MODULES[command], [command, f"--config={config}", override])
  value = got
  for part in key.split("."):
    value = value[part]
  assert value == expected and type(value) is type(expected)


def test_a_non_number_in_a_list_of_numbers_is_one_line(capsys, tmp_path):
  argv = ["headspec", "probe", "--config=probe_ewt", f"--workdir={tmp_path}", "--config.probe.l2_grid=1e-4,x"]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert err.endswith("probe_ewt.py: probe.l2_grid: x is not a number (give numbers as a comma text, e.g. 1e-4,1e-3)")
  assert len(err.splitlines()) == 1


@pytest.mark.parametrize(
  ("override", "expected"),
  [
    ("--config.probe.tolx=1", "--config.probe.tolx: no config key probe.tolx in {file}; did you mean probe.tol?"),
    ("--config.prob.tol=1", "--config.prob.tol: no config key prob in {file}; did you mean probe?"),
    ("--config.probe.tol.x=1", "--config.probe.tol.x=1: probe.tol is a value (float), not a section, in {file}"),
  ],
)
def test_a_mistyped_key_is_one_plain_line(capsys, tmp_path, override, expected):
  from headspec import configs

  argv = ["headspec", "probe", "--config=probe_ewt", f"--workdir={tmp_path}", override]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip()
  assert err == "headspec: error: " + expected.format(file=configs.resolve("probe_ewt"))
  assert "\\" not in err and "'" not in err  # no repr: no escaped quotes or newlines


def test_quickstart_takes_the_keywords_of_run_quickstart(monkeypatch, capsys, tmp_path):
  calls = []
  monkeypatch.setattr(quickstart, "run_quickstart", lambda workdir, **kw: calls.append((str(workdir), kw)))
  assert cli.main(["headspec", "quickstart", f"--workdir={tmp_path}", "--config.train.steps=2"]) == 0
  assert cli.main(["headspec", "quickstart", f"--workdir={tmp_path}", "--config.train.steps", "3"]) == 0
  assert calls == [(str(tmp_path), {"steps": 2}), (str(tmp_path), {"steps": 3})]
  assert cli.main(["headspec", "quickstart", "--config.train.lr=2"]) == 2
  assert capsys.readouterr().err.strip() == (
    "headspec: error: quickstart: unknown argument --config.train.lr=2; it takes --workdir=DIR and "
    "--config.train.steps=N"
  )
  assert cli.main(["headspec", "quickstart", "--config.train.steps=0"]) == 2
  assert "--config.train.steps=0 must be a whole number of steps >= 1" in capsys.readouterr().err
  assert calls == [(str(tmp_path), {"steps": 2}), (str(tmp_path), {"steps": 3})]  # nothing ran on a bad one


def test_log_lines_go_above_the_bars(capsys):
  """An absl INFO line inside the job loop's bars is written whole, on a line of its own (tqdm.write),
  in absl's format; the bar is redrawn below it. Before, the line was written into the bar's line."""
  absl_logging.use_absl_handler()
  saved = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.INFO)
  handlers = list(logging.getLogger().handlers)
  try:
    with jobloop.lines_above_bars(), jobloop.progress(2, "demo: model steps") as bar:
      bar.update(1)
      bar.refresh()
      absl_logging.warning("a line from a stage")  # (the CLI's filter keeps only headspec's own INFO lines)
      print("a printed line")
      bar.update(1)
  finally:
    absl_logging.set_verbosity(saved)
  assert logging.getLogger().handlers == handlers  # absl's handler is back
  captured = capsys.readouterr()
  err = captured.err.replace("\r", "\n").splitlines()
  line = next(x for x in err if "a line from a stage" in x)
  assert line.startswith("W") and line.endswith("] a line from a stage")  # absl's format, not inside a bar
  assert "a printed line\n" in captured.out


def test_the_first_job_says_it_is_compiling(tmp_path, capsys):
  from headspec.io import tables

  class Slow(jobloop.Analysis):
    name = "slow"

    def plan(self):
      return [type("T", (), {"name": "m", "step": 0})()]

    def tables(self, jobs):
      return (tables.ICL,)

    def job(self, job):
      before = capsys.readouterr().err  # what the bar showed before the job's first result
      assert "m step 0 (loading, compiling…)" in before, before
      return {}

    def finish(self, jobs):
      return None

  jobloop.run(Slow(None, tmp_path))


def test_ticking_redraws_a_bar_with_no_updates():
  class Bar:
    refreshed = 0

    def refresh(self):
      Bar.refreshed += 1

  import time

  with jobloop.ticking(Bar(), every=0.05):
    time.sleep(0.3)
  assert Bar.refreshed >= 2


def test_preparing_a_local_corpus_prints_no_download_message(tmp_path, capfd):
  corpus = tmp_path / "data" / "text" / "tiny"
  corpus.mkdir(parents=True)
  (corpus / "train.txt").write_text("one document .\n\nanother one .\n")
  (corpus / "valid.txt").write_text("a valid document .\n")
  docs = text_tfds.load_documents(tmp_path / "data", "tiny", "valid", tfds_dir=tmp_path / "tfds")
  assert list(docs) == ["a valid document ."]
  out = capfd.readouterr().out
  assert "Downloading and preparing" not in out and "downloaded and prepared" not in out, out


# ------------------------------------------------------------------ the Hub's dataset files


def _tiny_source(tmp_path) -> tuple[text_download.TextSource, dict[str, pathlib.Path]]:
  """A WikiText-like source of two parquet files (as the Hub would serve them) and those files."""
  import pyarrow as pa
  import pyarrow.parquet as pq

  files = {}
  for name, rows in (("train.parquet", [" = A = \n", " a . \n"]), ("valid.parquet", [" = V = \n", " v . \n"])):
    files[f"w/{name}"] = tmp_path / "hub" / name
    files[f"w/{name}"].parent.mkdir(exist_ok=True)
    pq.write_table(pa.table({"text": rows}), files[f"w/{name}"])

  def remote(path):
    data = files[path].read_bytes()
    return fetch.RemoteFile(path, len(data), hashlib.sha256(data).hexdigest())

  source = text_download.TextSource(
    name="tiny_wiki",
    repo="Salesforce/wikitext",
    revision="b08601e04326c79dfdd32d625aee71d232d685c3",
    files={"train": (remote("w/train.parquet"),), "valid": (remote("w/valid.parquet"),)},
    rows={"train": 2, "valid": 2},
    download_size="1 kB",
    text_size="1 kB",
    license="test",
    description="test",
  )
  return source, files


def test_hub_files_come_through_hf_hub_download_pinned(tmp_path, monkeypatch):
  import huggingface_hub

  source, files = _tiny_source(tmp_path)
  calls = []

  def hf_hub_download(repo_id, filename, *, repo_type=None, revision=None, **kwargs):
    calls.append((repo_id, filename, repo_type, revision))
    return str(files[filename])

  monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
  folder = text_download.download_text("tiny_wiki", tmp_path / "data", sources={"tiny_wiki": source}, log=print)
  assert calls == [
    ("Salesforce/wikitext", "w/train.parquet", "dataset", source.revision),
    ("Salesforce/wikitext", "w/valid.parquet", "dataset", source.revision),
  ]
  assert (folder / "train.txt").read_text() == "= A =\na .\n"
  assert (folder / "valid.txt").read_text() == "= V =\nv .\n"


def test_a_hub_file_not_matching_its_pin_writes_nothing(tmp_path, monkeypatch):
  import huggingface_hub

  source, files = _tiny_source(tmp_path)
  bad = files["w/valid.parquet"]
  bad.write_bytes(bad.read_bytes()[:-1] + b"\x00")  # same size, other bytes
  monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo_id, filename, **kw: str(files[filename]))
  with pytest.raises(UserError, match=r"w/valid.parquet: SHA-256 [0-9a-f]{64} does not match the pinned [0-9a-f]{64}"):
    text_download.download_text("tiny_wiki", tmp_path / "data", sources={"tiny_wiki": source}, log=print)
  assert not (tmp_path / "data" / "text" / "tiny_wiki").exists()
  assert [p.name for p in (tmp_path / "data" / "text").iterdir()] == []  # no partial folder
  assert not bad.exists()  # the cached copy that is not the pinned file is gone: the next try fetches again


def test_a_hub_that_cannot_be_reached_is_one_line(tmp_path, monkeypatch):
  import huggingface_hub
  from huggingface_hub import errors

  source, _ = _tiny_source(tmp_path)

  def offline(*args, **kwargs):
    raise errors.LocalEntryNotFoundError("cannot reach the Hub and no cached copy")

  monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
  with pytest.raises(UserError, match=r"w/train.parquet: download failed \(not in the local Hugging Face cache"):
    text_download.download_text("tiny_wiki", tmp_path / "data", sources={"tiny_wiki": source}, log=print)


def test_huggingface_hub_is_a_declared_dependency():
  try:
    import tomllib
  except ImportError:  # Python 3.10: pip's own copy of the same parser
    from pip._vendor import tomli as tomllib

  pyproject = tomllib.loads((pathlib.Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())
  names = [
    d.split(">")[0].split("=")[0].split("[")[0].strip().replace("-", "_") for d in pyproject["project"]["dependencies"]
  ]
  assert "huggingface_hub" in names


def test_training_has_a_bar_and_its_metrics_lines_stay_whole(tmp_path, capsys):
  """The training loop's schedule (headspec/train/loop.py) with a stand-in step, manager and writer: a bar
  over the steps that says it compiles before the first step, and the metrics lines printed whole."""
  from headspec.cli.quickstart import quickstart_config
  from headspec.train import loop as train

  config = quickstart_config("decoder")
  config.train.steps, config.train.log_every, config.train.eval_every = 3, 1, 0

  class Manager:
    directory = tmp_path

    def all_steps(self):
      return range(10)  # every step saved already: nothing written

    def latest_step(self):
      return None

    def wait_until_finished(self):
      pass

    def close(self):
      pass

  class Writer:
    def write(self, record):
      print(f"step={record['step']} loss={record['loss']:.4g}")

    def close(self):
      pass

  seen = {"out": "", "err": ""}

  def read():
    captured = capsys.readouterr()
    seen["out"] += captured.out
    seen["err"] += captured.err

  class Stepper:
    def __call__(self, batch, key):
      read()
      assert "compiling the step…" in seen["err"]  # on the bar before the first step (its compilation)
      return {"loss": 2.5, "grad_norm": 1.0}

    def host_state(self):
      return None

  schedule = train._Loop(config, tmp_path, Manager(), evaluate=None, div_probe=None, writer=Writer())
  schedule.run(Stepper(), 0, iter(range(10)), None, None)
  read()
  err = seen["err"].replace("\r", "\n")
  assert "train:" in err and "3/3" in err and "loss 2.5" in err
  assert [line for line in seen["out"].splitlines() if line] == [
    "step=1 loss=2.5",
    "step=2 loss=2.5",
    "step=3 loss=2.5",
  ]


# ------------------------------------------------------------------ BENCHMARKS.md at a glance


def test_the_report_opens_with_one_summary_table():
  import benchmarks.__main__ as runner

  info = {"date": "2026-12-01", "device": "1 × cpu (cpu)", "host": "x86_64, 2 CPU cores, Linux", "python": "3.11"}
  info["versions"] = {"jax": "0"}
  entries = {
    "probe": {
      "command": "python -m benchmarks.bench_probe",
      "wall_s": 3.0,
      "result": {"jax_seconds": 50.0, "sklearn_seconds": 150.0},
    },
    "attention": {"command": "python -m benchmarks.bench_attention", "wall_s": 0.0, "skipped": "needs data"},
  }
  text = runner.markdown(info, entries, full=False)
  lines = text.splitlines()
  assert lines[0] == "# Benchmarks" and lines[3].startswith("| figure | headspec | reference it is measured against |")
  row = next(line for line in lines if line.startswith("| [softmax probes"))
  assert row.endswith(
    "| 50.0 s | scikit-learn LogisticRegression, same grid (extrapolated from 1 head): 150.0 s | 3.00× "
    "| 2-core x86_64 CPU, 2026-12-01 |"
  )
  assert "| jax_seconds | 50.0 |" in text  # the key-value dump stays below
  assert "`python -m benchmarks.bench_probe` — 3.0 s wall, measured 2026-12-01" in text
  assert not any(line.startswith("| [attention") for line in lines)  # skipped: no figure, no row


def test_the_summary_is_rewritten_from_the_sections_and_keeps_them_all(tmp_path):
  import benchmarks.__main__ as runner

  report = tmp_path / "BENCHMARKS.md"
  body = (
    "Written by `python -m benchmarks` on 2026-11-29. Every figure below was\n\n"
    "- device: 1 × cpu (cpu)\n- host: x86_64, 2 CPU cores, Linux 6; Python 3.11\n\n"
    "## patching\n\n`python -m benchmarks.bench_patching` — 41.0 s wall\n\n| figure | value |\n|---|---|\n"
    "| sweep_seconds | 0.938 |\n| loop_seconds | 4.849 |\n\n"
    "## circuit\n\nwritten by hand by another script\n\n| figure | value |\n|---|---|\n| x | 1 |\n"
  )
  report.write_text("# Benchmarks\n\n" + body)
  assert runner.main(["--summary", f"--out={report}"]) == 0
  once = report.read_text()
  assert once.endswith(body)  # every section kept as it was, the hand-written one included
  row = next(line for line in once.splitlines() if line.startswith("| [512 activation patches"))
  assert row == (
    "| [512 activation patches of z, compiled sweep](#patching) | 0.94 s | a per-patch loop: 4.85 s | 5.17× "
    "| 2-core x86_64 CPU, ≤ 2026-11-29 |"
  )  # no date of its own, no git: the report's date as an upper bound
  runner.main(["--summary", f"--out={report}"])
  assert report.read_text() == once  # the table replaced, not added again


def test_a_rate_is_compared_the_other_way_and_a_recorded_load_is_shown():
  import benchmarks.__main__ as runner

  record = {"figures": {"headspec_steps_per_second": 2.685, "torch_steps_per_second": 0.523}, "date": "2026-12-02"}
  record["figures"]["load_average"] = "[19.35, 17.01, 13.13]"
  rows = runner.summary({"host": "x86_64, 2 CPU cores"}, {"sae": record}, "≤ 2026-12-02")
  row = next(line for line in rows if line.startswith("| [TopK SAE"))
  assert row.endswith(
    "| 2.69 steps/s | the same SAE in an eager PyTorch loop: 0.52 steps/s | 5.13× | 2-core x86_64 CPU, 2026-12-02, load 19.4 |"
  )


def test_a_section_keeps_the_date_its_command_line_states():
  import benchmarks.__main__ as runner

  body = "`python -m benchmarks.bench_sae` — 7 min 49 s wall (2026-12-02, code of 1e47656)\n\n| figure | value |\n"
  assert runner.recorded(body + "| a | 1 |\n") == {
    "figures": {"a": 1.0},
    "date": "2026-12-02",
    "command": "python -m benchmarks.bench_sae",
  }
  assert runner.recorded("`python -m x` — 3.0 s wall, measured 2026-12-01\n")["date"] == "2026-12-01"
  assert runner.recorded("`python -m x` — 3.0 s wall\n")["date"] is None
