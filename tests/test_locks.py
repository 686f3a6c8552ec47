"""Locks: two launches on one workdir, and a damaged experiment.json.

Two processes training one run at once are one too many (every metrics line twice): the second is refused
in one line naming the holder's pid. Two launches of one experiment stage: the second waits, then finds
it done. A probing job's part folder that another live process fills is never removed under it. A damaged
ROOT/experiment.json is one line naming the file and what is wrong, in `study` and `launch`, before any work.
"""

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap
import types

import pytest

from headspec import launch, study
from headspec.cli import stage
from headspec.errors import UserError
from headspec.io import locks
from headspec.launch import experiments
from headspec.probing import suite

REPO = pathlib.Path(__file__).resolve().parents[1]
ENV = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(REPO)}
TINY = {  # a tiny decoder, a few seconds of training
  "data.vocab_size": 512,
  "model.num_layers": 1,
  "model.d_model": 32,
  "model.d_head": 8,
  "model.d_ff": 64,
  "model.num_heads": 4,
  "train.steps": 30,
  "train.batch_size": 8,
  "train.seq_len": 32,
  "train.log_every": 1,
  "train.eval_every": 0,
  "train.diversity_every": 0,
  "train.checkpoint_every": 100,
}


def _python(code: str, *args) -> subprocess.Popen:
  return subprocess.Popen(
    [sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
    cwd=REPO,
    env=ENV,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


def _ready(proc: subprocess.Popen) -> None:
  """Waits for `proc` to print 'ready' (it holds what it took)."""
  for line in proc.stdout:
    if line.strip() == "ready":
      return
  raise AssertionError(proc.stderr.read())


HOLD = """
import sys, time
from headspec.io import locks
with locks.held(sys.argv[1], sys.argv[2], wait=False):
  print("ready", flush=True)
  time.sleep(60)
"""


def _train(workdir, data_dir, *, launcher=False) -> subprocess.Popen:
  """`headspec train` of the tiny decoder on `workdir` (with `launcher`: `headspec.launch local -- train ...`)."""
  flags = [f"--config.{k}={v}" for k, v in TINY.items()]
  command = ["headspec.launch", "local", "--"] if launcher else ["headspec"]
  return subprocess.Popen(
    [sys.executable, "-m", *command, "train", "--config=configs/quickstart.py:decoder", f"--workdir={workdir}"]
    + [f"--config.data_dir={data_dir}", *flags],
    cwd=REPO,
    env=ENV,
    stdout=subprocess.PIPE,
    stderr=subprocess.PIPE,
    text=True,
  )


def test_training_a_run_another_live_process_trains_is_refused_in_one_line(tmp_path, synthetic_data_dir):
  """`headspec train` on a run whose training lock a live process holds: one line naming the run and the
  holder's pid, exit non-zero, nothing written (no tokenizer, cache or metrics)."""
  run = tmp_path / "run"
  holder = _python(HOLD, run, "train")
  try:
    _ready(holder)
    done = _train(run, synthetic_data_dir)
    _, err = done.communicate(timeout=120)
  finally:
    holder.kill()
    holder.wait()
  assert done.returncode != 0
  last = err.strip().splitlines()[-1]
  assert f"{run}: training is running there already (pid {holder.pid} on" in last, err[-2000:]
  assert "Traceback" not in err
  assert sorted(p.name for p in run.iterdir()) == [".train.lock"]  # the holder's; nothing of the refused run


@pytest.mark.slow
def test_two_trainings_of_one_run_at_once_one_trains_the_other_refuses(tmp_path, synthetic_data_dir):
  """Two launchers on one workdir: one trains, the other is refused in one line; metrics.jsonl has each
  step once, and no lock file is left."""
  run = tmp_path / "run"
  procs = [_train(run, synthetic_data_dir, launcher=True) for _ in range(2)]
  outs = [p.communicate(timeout=300) for p in procs]
  codes = sorted(p.returncode for p in procs)
  errs = [err for _, err in outs]
  assert codes[0] == 0 and codes[1] != 0, errs
  refused = errs[[p.returncode for p in procs].index(codes[1])]
  assert "training is running there already (pid" in refused.strip().splitlines()[-1], refused[-2000:]
  steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
  steps = [s for s in steps if s is not None]
  assert len(steps) == len(set(steps)) and max(steps) == TINY["train.steps"], steps
  assert not (run / ".train.lock").exists()


STAGE = """
import sys, time
from headspec.cli import main as cli
from headspec.cli import stage
log = sys.argv[2]

def main(argv):
  with open(log, "a") as f:
    f.write(" ".join(argv[1:]) + "\\n")
  print("ready", flush=True)  # running, under the stage's lock
  time.sleep(2)
  return 0

cli.main = main
sys.exit(stage.run_stage(sys.argv[1], ["atlas", "--workdir=x"]))
"""


def test_a_second_launch_of_a_stage_waits_for_the_first_then_finds_it_done(tmp_path):
  """Two `python -m headspec.cli.stage MARKER -- ...` at once: the command runs once; the second waits (saying
  so, with the first's pid) and then skips it as done."""
  marker, log = tmp_path / "stages" / "run-atlas.done", tmp_path / "ran.txt"
  first = _python(STAGE, marker, log)
  _ready(first)  # its command runs: it holds the stage's lock
  second = _python(STAGE, marker, log)
  (_, err1), (out2, err2) = first.communicate(timeout=60), second.communicate(timeout=60)
  assert first.returncode == second.returncode == 0, err1 + err2
  assert log.read_text() == "atlas --workdir=x\n"  # once
  assert f"waiting for stage run-atlas of pid {first.pid} on" in err2
  assert "done already" in out2
  assert not (marker.parent / ".run-atlas.lock").exists()


USE = """
import sys, time
from headspec.io import locks
parts = locks.SharedFolder(sys.argv[1])
print("ready", flush=True)
time.sleep(60)
"""


def test_a_probe_part_folder_another_live_process_uses_is_not_removed(tmp_path, monkeypatch):
  """probe_job removes its job's part folder when the job is whole, but not while another live process
  probing the same job (the same folder) still writes into it; the last user removes it."""
  partial = tmp_path / "cache" / "m-step0.partial-0123"
  part = {"per_word": {}, **{key: [] for key in suite.PART_TABLES}}
  monkeypatch.setattr(suite, "job_features", lambda *a: (types.SimpleNamespace(cfg=None), {}))
  monkeypatch.setattr(suite, "_partial_dir", lambda *a: partial)
  monkeypatch.setattr(suite.plan, "feature_sources", lambda cfg: [(0, [0, 1], None)])
  monkeypatch.setattr(suite, "_probe_source", lambda *a: part)
  monkeypatch.setattr(suite.tasks_lib, "from_config", lambda config: [])
  config = types.SimpleNamespace(probe={"residuals": True})
  data = types.SimpleNamespace(evals=[], tune=types.SimpleNamespace(key="dev"))
  job = types.SimpleNamespace(name="m", step=0)
  other = _python(USE, partial)
  try:
    _ready(other)
    suite.probe_job(job, data, config, tmp_path / "cache", want=())
    assert (partial / "layer-0-heads.npz").is_file()  # the other process's parts stay
  finally:
    other.kill()
    other.wait()
  suite.probe_job(job, data, config, tmp_path / "cache", want=())  # alone now: the folder goes
  assert not partial.exists() and not list(partial.parent.iterdir())


@pytest.mark.parametrize("where", ["a file", "under a file", "read-only"])
def test_a_lock_in_a_folder_that_cannot_be_written_is_one_line(tmp_path, monkeypatch, where):
  """The lock is the first thing a training writes: a --workdir that is a file, under a file or read-only
  is the one line of tables.check_writable, not the lock file's traceback."""
  afile = tmp_path / "afile"
  afile.write_text("not a folder\n")
  folder = {"a file": afile, "under a file": afile / "run", "read-only": tmp_path / "run"}[where]
  if where == "read-only":  # as root, chmod would not stop us: the check asks os.access
    folder.mkdir()
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: access(p, mode) and os.fspath(p) != os.fspath(folder))
  with pytest.raises(UserError, match="is a file, not a folder" if where != "read-only" else "cannot write in"):
    with locks.held(folder, "train", wait=False):
      pass
  assert afile.read_text() == "not a folder\n"


def test_a_lock_dies_with_its_holder(tmp_path):
  """kill -9 of a holder frees its lock at once (the kernel's flock): the next process takes it."""
  holder = _python(HOLD, tmp_path, "train")
  _ready(holder)
  with pytest.raises(UserError, match=rf"training is running there already \(pid {holder.pid} on"):
    with locks.held(tmp_path, "train", wait=False, what="training"):
      pass
  holder.kill()
  holder.wait()
  with locks.held(tmp_path, "train", wait=False, what="training"):
    assert (tmp_path / ".train.lock").read_text().split()[0] == str(os.getpid())
  assert not (tmp_path / ".train.lock").exists()


GOOD = {"experiment": "g.py", "runs": [{"name": "a_s0", "config": "g.py", "condition": "a", "seed": 0}]}
DAMAGED = [
  ('{"experiment": "g.py", "runs": [{"na', "not valid JSON"),
  ("[]", "a JSON list at the top"),
  (json.dumps({"experiment": "g.py"}), "no 'runs' list"),
  (json.dumps({**GOOD, "runs": {"a_s0": {}}}), "'runs' is a dict, not a list"),
  (json.dumps({**GOOD, "runs": ["a_s0"]}), "runs[0] is a str, not an object"),
  (json.dumps({**GOOD, "runs": [{"condition": "a", "seed": 0}]}), "runs[0] has no 'name'"),
  (json.dumps({**GOOD, "runs": [{"name": 3, "condition": "a", "seed": 0}]}), "runs[0].name is 3, not a string"),
  (json.dumps({**GOOD, "runs": [{"name": "a", "condition": "a", "seed": "0"}]}), "runs[0].seed is '0', not an integer"),
  (json.dumps({**GOOD, "runs": [{"name": "../a", "condition": "a", "seed": 0}]}), "is not a folder name"),
  (json.dumps({**GOOD, "references": "minilm"}), "'references' is 'minilm', not a list"),
]


@pytest.mark.parametrize("text, message", DAMAGED)
def test_a_damaged_experiment_json_is_one_line_in_study(tmp_path, text, message):
  (tmp_path / "experiment.json").write_text(text)
  with pytest.raises(UserError, match="^" + re.escape(f"{tmp_path}/experiment.json:") + ".*" + re.escape(message)):
    study.collect(tmp_path)
  (tmp_path / "experiment.json").write_text(json.dumps(GOOD))
  assert experiments.read_plan(tmp_path) == GOOD


@pytest.mark.parametrize("text, message", DAMAGED[:6])
def test_a_damaged_experiment_json_is_one_line_in_launch(tmp_path, capsys, text, message):
  """A part's launch merges its runs into ROOT/experiment.json: a damaged one is one line, exit 2, before
  any stage (the dry run refuses it too), and the file is left as it was."""
  (tmp_path / "experiment.json").write_text(text)
  spec = "configs/experiments/specialization.py:small,seed=1"
  for extra in (["--dry-run"], []):
    assert launch.main(["local", *extra, f"--experiment={spec}", f"--workdir={tmp_path}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{tmp_path}/experiment.json" in err and message in err, err
  assert (tmp_path / "experiment.json").read_text() == text
  assert sorted(p.name for p in tmp_path.iterdir()) == ["experiment.json"]  # no stage ran


def test_stage_main_is_unchanged_by_the_lock(tmp_path, monkeypatch):
  """A stage alone: runs, writes its marker, leaves no lock; again: done already."""
  ran = []
  monkeypatch.setattr(stage.cli, "main", lambda argv: ran.append(argv) or 0)
  marker = tmp_path / "stages" / "x.done"
  assert stage.main(["stage", str(marker), "--", "atlas", "--workdir=w"]) == 0
  assert stage.main(["stage", str(marker), "--", "atlas", "--workdir=w"]) == 0
  assert ran == [["headspec", "atlas", "--workdir=w"]] and marker.read_text() == "atlas --workdir=w\n"
  assert sorted(p.name for p in marker.parent.iterdir()) == ["x.done"]


SLOW_UD = """
import sys, time
from headspec.data import download
fetch = download._fetch

def slow(url, part, timeout):
  got = fetch(url, part, timeout)
  print("ready", flush=True)  # downloaded into its part file, not yet checked or moved into place
  time.sleep(3)
  return got

download._fetch, download.PINS = slow, {}
download.download_ud("en_ewt", sys.argv[1], base_url=sys.argv[2], splits=("dev",), log=lambda _: None)
"""


def test_two_downloads_of_one_treebank_at_once_both_finish(server, synthetic_data_dir, tmp_path, monkeypatch):
  """A second `headspec data download ud` while the first is mid-file neither removes nor overwrites the
  first's part file (each process has its own `.part.tmp-<pid>`): both finish, the file is whole."""
  from headspec.data import download

  base_url, root = server
  dev = (synthetic_data_dir / "ud" / "synthetic" / "synthetic-ud-dev.conllu").read_bytes()
  (root / "UD_English-EWT" / "r2.16").mkdir(parents=True)
  (root / "UD_English-EWT" / "r2.16" / "en_ewt-ud-dev.conllu").write_bytes(dev)
  first = _python(SLOW_UD, tmp_path, base_url)
  _ready(first)
  monkeypatch.setattr(download, "PINS", {})
  download.download_ud("en_ewt", tmp_path, base_url=base_url, splits=("dev",), log=lambda _: None)
  _, err = first.communicate(timeout=60)
  assert first.returncode == 0, err[-2000:]
  folder = tmp_path / "ud" / "en_ewt"
  assert sorted(p.name for p in folder.iterdir()) == ["en_ewt-ud-dev.conllu"]
  assert (folder / "en_ewt-ud-dev.conllu").read_bytes() == dev


SLOW_TEXT = """
import sys, time
from headspec.data import fetch

def fill(corpus_dir, staging):
  for split in ("train", "valid"):
    (corpus_dir / f"{split}.txt").write_text(f"slow {split}\\n")
  print("ready", flush=True)  # its staging folder is half-built
  time.sleep(3)
  return {"by": "slow"}

fetch.install_corpus(sys.argv[1], "c", fill, log=lambda _: None)
"""


def test_a_live_text_download_s_staging_folder_is_not_removed(tmp_path):
  """A second corpus install of the same name removes only the staging folders of dead processes: the
  live first one finishes (its `.c.*.partial.tmp-<pid>` is kept), and nothing is left behind."""
  from headspec.data import fetch

  first = _python(SLOW_TEXT, tmp_path)
  _ready(first)

  def fill(corpus_dir, staging):
    for split in ("train", "valid"):
      (corpus_dir / f"{split}.txt").write_text(f"fast {split}\n")
    return {"by": "fast"}

  fetch.install_corpus(tmp_path, "c", fill, log=lambda _: None)
  _, err = first.communicate(timeout=60)
  assert first.returncode == 0, err[-2000:]
  assert sorted(p.name for p in (tmp_path / "text").iterdir()) == ["c"]
  assert (tmp_path / "text" / "c" / "train.txt").read_text() == "slow train\n"  # the last one in place
