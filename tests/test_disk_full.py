"""A full disk: each writer stops with one line naming the file it was writing, leaves
nothing half-written (no temporary, no partial line, no partial checkpoint), and training stops at the
save that failed. The disk is a small tmpfs (CI runs as root; skipped for other users, who cannot mount,
and a mount refused to root fails the test) filled to the last block; one test injects ENOSPC instead, so
it runs anywhere."""

import errno
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from test_atlas_fixtures import write_run
from test_train_errors import tiny_config

from headspec.cli import main as cli
from headspec.io import metrics, tables
from headspec.runs import checkpoints
from headspec.train.loop import train_and_evaluate

REPO = pathlib.Path(__file__).resolve().parents[1]


class Disk:
  """A tmpfs mounted at `path`: `fill()` writes a ballast file until the disk is full, `grow()` remounts it
  larger (the ballast stays)."""

  def __init__(self, path: pathlib.Path, size: str):
    self.path = path
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:  # CI runs as root: there the disk tests always run
      pytest.skip("mounting a tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True)
    assert done.returncode == 0, f"cannot mount a tmpfs as root: {done.stderr.decode().strip() or done.returncode}"

  def fill(self) -> None:
    chunk = os.urandom(1 << 16)
    with open(self.path / ".ballast", "ab", buffering=0) as f:
      try:
        while True:
          f.write(chunk)
      except OSError as e:
        assert e.errno == errno.ENOSPC
    for size in (4096, 512, 1):  # the last partial blocks
      with open(self.path / ".ballast", "ab", buffering=0) as f:
        try:
          while True:
            f.write(b"\0" * size)
        except OSError:
          pass

  def grow(self, size: str = "64m") -> None:
    subprocess.run(["mount", "-o", f"remount,size={size}", str(self.path)], check=True)

  def unmount(self) -> None:
    subprocess.run(["umount", "-l", str(self.path)], check=False)


@pytest.fixture
def disk(tmp_path):
  made = []

  def mount(path=None, size="8m"):
    made.append(Disk(path or tmp_path / "disk", size))
    return made[-1]

  try:
    yield mount
  finally:
    for d in made:
      d.unmount()


def files(folder: pathlib.Path) -> dict:
  return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file() and p.name != ".ballast"}


def assert_one_line_naming(e: BaseException, path) -> str:
  """The CLI's line for `e`: one line, naming `path`."""
  line = cli.disk_error(e, workdir="/the/workdir")
  assert line is not None and "\n" not in line and line.startswith(f"{path}: No space left on device"), line
  return line


# --- the tables' atomic writer ----------------------------------------------------------------------------


TABLE = tables.PROBE_BASELINES


def _table_rows(n: int, step: int = 0) -> list[dict]:
  return [dict(task="upos", split=f"dev{step}", baseline=f"b{i}", accuracy=0.5, n=10) for i in range(n)]


def test_a_table_on_a_full_disk_is_left_as_it_was(disk):
  d = disk()
  path = tables.path_of(d.path, TABLE)
  tables.merge(path, _table_rows(2), TABLE)
  before = files(d.path)
  d.fill()
  with pytest.raises(OSError) as e:
    tables.merge(path, _table_rows(2000, step=1), TABLE)  # more than the last free bytes
  assert e.value.errno == errno.ENOSPC and e.value.filename == str(path)
  assert_one_line_naming(e.value, path)
  assert files(d.path) == before  # the table as it was; no temporary, no lock file


def test_a_table_write_that_fails_midway_removes_its_temporary(tmp_path, monkeypatch):
  """ENOSPC injected after half the bytes (no mount needed)."""
  from etils import epath

  path = tables.path_of(tmp_path, TABLE)
  tables.merge(path, _table_rows(2), TABLE)
  before = files(tmp_path)
  real = type(epath.Path(path)).write_text

  def half_then_full(self, text, *a, **k):
    real(self, text[: len(text) // 2])
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

  monkeypatch.setattr(type(epath.Path(path)), "write_text", half_then_full)
  with pytest.raises(OSError) as e:
    tables.merge(path, _table_rows(3, step=1), TABLE)
  assert e.value.filename == str(path)
  assert files(tmp_path) == before


# --- the feature cache ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_encoder(synthetic_data_dir, tmp_path_factory):
  from headspec.data.tokenizer import train_sentencepiece
  from headspec.data.treebank import load_split
  from headspec.model.config import ModelConfig
  from headspec.model.transformer import random_like

  dev = load_split(synthetic_data_dir, "synthetic", "dev")
  tokenizer = train_sentencepiece([" ".join(s.words) for s in dev], tmp_path_factory.mktemp("spm"), vocab_size=400)
  cfg = ModelConfig(
    "encoder", tokenizer.vocab_size, num_layers=2, num_heads=2, d_model=64, d_head=32, d_ff=16, max_len=64
  )
  return random_like(cfg, 0), tokenizer, [s.words for s in dev]


def test_a_feature_cache_on_a_full_disk_leaves_no_folder(disk, tiny_encoder):
  from headspec.probing import features

  model, tokenizer, sentences = tiny_encoder
  d = disk(size="1m")  # the features of 150 sentences: about 2 MB in float32
  kw = dict(cache_dir=d.path / "cache", identity={"run": "x"}, name="dev", log=None, dtype="float32")
  with pytest.raises(OSError) as e:
    features.extract_features(model, tokenizer, sentences, **kw)
  assert e.value.errno == errno.ENOSPC and "cache/dev-" in e.value.filename and ".tmp-" not in e.value.filename
  assert_one_line_naming(e.value, e.value.filename)
  assert files(d.path) == {} and list((d.path / "cache").iterdir()) == []
  d.grow()
  got = features.extract_features(model, tokenizer, sentences, **kw)  # space again: the same call succeeds
  assert not got.from_cache and got.z(0).shape[1:] == (2, 32)


# --- probe parts ------------------------------------------------------------------------------------------


def test_a_probe_part_on_a_full_disk_leaves_no_temporary(disk):
  from headspec.probing import suite

  d = disk(size="1m")
  part = {k: [] for k in suite.PART_TABLES} | {
    "per_word": {("upos", "dev"): (np.zeros((40000, 8), np.int8), np.ones(40000))}
  }
  d.fill()
  with pytest.raises(OSError) as e:
    suite._write_part(d.path / "partial" / "layer-0-heads.npz", part)
  assert files(d.path) == {} and not list((d.path / "partial").iterdir()), list((d.path / "partial").iterdir())
  assert e.value.filename == str(d.path / "partial" / "layer-0-heads.npz")


# --- metrics.jsonl and TensorBoard events ---------------------------------------------------------------


def test_metrics_on_a_full_disk_leave_no_partial_line(disk):
  d = disk(size="1m")
  writer = metrics.MetricsWriter(d.path)
  writer.write({"step": 1, "loss": 2.0})
  before = files(d.path)
  d.fill()
  with pytest.raises(OSError) as e:
    writer.write({"step": 2, "loss": 1.5, **{f"diversity/x{i}": 0.1 for i in range(2000)}})
  assert e.value.errno == errno.ENOSPC and e.value.filename in (str(d.path / "metrics.jsonl"), str(writer._tb.path))
  assert_one_line_naming(e.value, e.value.filename)
  writer.close()
  assert files(d.path) == before
  assert [r["step"] for r in metrics.read_metrics(d.path)] == [1]


def test_tensorboard_events_are_readable_records(tmp_path):
  """The event file written in the caller's thread is TensorBoard's format: TFRecord framing with masked
  CRC-32C around Event protobufs (tensorboardX's own reader-free check)."""
  import struct

  from tensorboardX.proto import event_pb2
  from tensorboardX.record_writer import masked_crc32c

  writer = metrics.MetricsWriter(tmp_path)
  writer.write({"step": 3, "loss": 2.5, "eval/loss": 3.0})
  writer.close()
  (path,) = tmp_path.glob("events.out.tfevents.*")
  data, events = path.read_bytes(), []
  while data:
    (n,) = struct.unpack("Q", data[:8])
    assert struct.unpack("I", data[8:12])[0] == masked_crc32c(data[:8])
    body = data[12 : 12 + n]
    assert struct.unpack("I", data[12 + n : 16 + n])[0] == masked_crc32c(body)
    events.append(event_pb2.Event.FromString(body))
    data = data[16 + n :]
  assert events[0].file_version == "brain.Event:2"
  assert events[1].step == 3 and {v.tag: v.simple_value for v in events[1].summary.value} == {
    "loss": 2.5,
    "eval/loss": 3.0,
  }


# --- training: a checkpoint that cannot be saved ------------------------------------------------------------


def _train_args(workdir, data_dir, steps: int):
  shape = "data.vocab_size=512 model.num_layers=1 model.num_heads=2 model.d_model=16 model.d_head=8 model.d_ff=32"
  rest = f"train.seq_len=16 train.batch_size=8 train.steps={steps} train.log_every=1 train.checkpoint_every=1"
  rest += " train.keep_last=20 train.eval_every=0 train.diversity_every=0"
  cmd = [sys.executable, "-m", "headspec", "train", f"--config={REPO}/configs/quickstart.py:decoder"]
  cmd += [f"--workdir={workdir}", f"--config.data_dir={data_dir}"]
  return cmd + [f"--config.{flag}" for flag in f"{shape} {rest}".split()]


def _lines_but_bars(stderr: str) -> list[str]:
  """stderr's non-empty lines less the training bar's redraws (`train:  17%|█▋  | 2/12 ...`) and absl's
  INFO lines (`I1202 03:50:22.81 ... text_tfds.py:93] ...`): what is left must be the one error line."""
  bar_or_info = re.compile(r"\s*train: +\d+%\||I\d{4} \d\d:\d\d:\d\d")
  return [line for line in stderr.splitlines() if line.strip() and not bar_or_info.match(line)]


@pytest.mark.slow  # a training subprocess: about 15 s on an idle 2-core machine
def test_training_stops_at_the_save_that_fails(disk, synthetic_data_dir, tmp_path):
  """checkpoints/ on a tmpfs of room for a few steps: the save that does not fit stops the run there, in one
  line naming the step's folder, with no partial checkpoint and nothing logged after it; with space again
  the same command resumes from the step before and finishes."""
  run = tmp_path / "run"
  d = disk(run / "checkpoints", size="600k")  # a step of this model takes about 240 kB
  done = subprocess.run(_train_args(run, synthetic_data_dir, 12), cwd=REPO, capture_output=True, text=True, timeout=300)
  errors = _lines_but_bars(done.stderr)
  assert done.returncode == 2 and len(errors) == 1, done.stderr[-3000:]
  failed = int(errors[0].split("saving the checkpoint of step ")[1].split()[0])
  assert errors[0].startswith(
    f"headspec: error: {run}/checkpoints/{failed}: saving the checkpoint of step {failed} failed (No space"
  )
  assert 1 < failed < 12, errors[0]
  assert checkpoints.saved_steps(run) == list(range(1, failed))
  assert sorted(p.name for p in d.path.iterdir() if p.name != ".ballast") == [str(s) for s in range(1, failed)]
  assert [r["step"] for r in metrics.read_metrics(run)][-1] == failed  # stopped there: nothing logged after
  assert f"resumes from step {failed - 1}" in errors[0]
  d.grow()
  config = tiny_config(synthetic_data_dir, steps=failed + 1)
  config.train.keep_last = 20
  train_and_evaluate(config, run)
  assert checkpoints.saved_steps(run) == list(range(1, failed + 2))


@pytest.mark.slow  # as above
def test_metrics_jsonl_on_a_full_disk_stops_training_in_one_line(disk, synthetic_data_dir, tmp_path):
  """The run's folder is full after its first step (the tokenizer, cache and checkpoints fit, no more):
  one line, no traceback, metrics.jsonl whole."""
  d = disk(size="8m")
  run = d.path / "run"
  train_and_evaluate(tiny_config(synthetic_data_dir, steps=1), run)
  d.fill()
  done = subprocess.run(_train_args(run, synthetic_data_dir, 3), cwd=REPO, capture_output=True, text=True, timeout=300)
  errors = _lines_but_bars(done.stderr)
  assert done.returncode == 2 and len(errors) == 1 and "No space left on device" in errors[0], done.stderr[-3000:]
  assert errors[0].startswith(f"headspec: error: {run}"), errors[0]
  assert not [p for p in run.rglob("*") if ".tmp-" in p.name or "orbax-checkpoint-tmp" in p.name]
  json_lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]  # every line whole
  assert json_lines[0]["step"] == 1


# --- the atlas ---------------------------------------------------------------------------------------------


def test_the_atlas_on_a_full_disk_leaves_no_temporary(disk, capsys):
  d = disk(size="2m")
  run = write_run(d.path / "run", layers=2, heads=2)
  before = files(d.path)
  d.fill()
  cli.FLAGS.unparse_flags()
  assert cli.main(["headspec", "atlas", f"--workdir={run}"]) == 2
  errors = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("headspec: warning")]
  assert len(errors) == 1 and errors[0].startswith(f"headspec: error: {run / 'atlas.html'}: No space left"), errors
  assert files(d.path) == before  # no atlas.html, no .atlas.html.tmp-<pid> (0 bytes, before the fix)
  d.grow()
  cli.FLAGS.unparse_flags()
  assert cli.main(["headspec", "atlas", f"--workdir={run}"]) == 0
  assert (run / "atlas.html").stat().st_size > 0


def test_disk_errors_are_one_line_only_for_full_disks(tmp_path):
  full = OSError(errno.ENOSPC, "No space left on device")
  assert cli.disk_error(full, tmp_path) == (
    f"{tmp_path}: No space left on device (errno ENOSPC) while writing; the command stopped. Free space (or make "
    "the folder writable) and run the same command again"
  )
  wrapped = ValueError("saving failed")
  wrapped.__cause__ = OSError(errno.EDQUOT, "Disk quota exceeded", "/x/y.csv")
  assert cli.disk_error(wrapped).startswith("/x/y.csv: Disk quota exceeded")
  assert cli.disk_error(OSError(errno.ENOENT, "No such file")) is None
  assert cli.disk_error(ValueError("x")) is None
  shutil.rmtree(tmp_path, ignore_errors=True)


# --- the shared writers (tokenizer, config.json, run_info.json, markers, figures, summaries) -------------


def test_the_shared_writers_on_a_full_disk_leave_no_temporary_and_name_the_file(disk):
  """remote.write_bytes_atomic and remote.save_figure carry about 25 writers (tokenizer files, config.json,
  run_info.json, stage markers, the study's tables, every figure): a failed write leaves the file as it
  was, no `.NAME.tmp-<pid>`, and an OSError naming the file."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from headspec.io import remote

  d = disk(size="1m")
  kept = d.path / "config.json"
  kept.write_bytes(b"{}")
  d.fill()
  with pytest.raises(OSError) as e:
    remote.write_bytes_atomic(kept, os.urandom(1 << 20))
  assert_one_line_naming(e.value, kept)
  fig, ax = plt.subplots(figsize=(20, 20), dpi=200)
  ax.imshow(np.random.default_rng(0).random((400, 400)))
  with pytest.raises(OSError) as e:
    remote.save_figure(fig, d.path / "figure.png")
  plt.close(fig)
  assert_one_line_naming(e.value, d.path / "figure.png")
  assert files(d.path) == {pathlib.Path("config.json"): b"{}"}


def test_analyses_write_through_the_atomic_writers():
  """Every analysis file goes through remote.write_bytes_atomic / save_figure / tables (or a temporary it
  renames): a direct `.write_text(` or `fig.savefig(` in an analysis would leave a half-written file on a
  full disk. The few writers allowed here write into a temporary folder they rename, or a local scratch
  file, and say so beside the call."""
  import re

  allowed = {
    "headspec/io/remote.py",  # the atomic writers themselves
    "headspec/io/tables.py",  # its own temporary + rename, and the lock file
    "headspec/probing/features.py",  # into the cache's temporary folder, renamed whole
    "headspec/data/fetch.py",  # into the corpus's .partial.tmp-<pid> folder, renamed whole (install_corpus)
    "headspec/data/download.py",  # into a .part.tmp-<pid> file, renamed after its hash is checked
    "headspec/launch/__init__.py",  # a local sbatch script, not a run directory
  }
  root = pathlib.Path(__file__).resolve().parent.parent
  direct = re.compile(r"\.write_text\(|\bfig\.savefig\(|open\([^)]*[\"']w")
  found = [
    f"{p.relative_to(root)}:{n}"
    for p in sorted((root / "headspec").rglob("*.py"))
    if str(p.relative_to(root)) not in allowed
    for n, line in enumerate(p.read_text().splitlines(), 1)
    if direct.search(line) and "remote.replacing" not in line
  ]
  assert not found, found


def test_a_feature_cache_finished_by_another_process_meanwhile_is_kept(tiny_encoder, tmp_path, monkeypatch):
  """Two processes extracting the same cache: the one that renames second finds the folder there (between
  its check and its rename) and keeps the first's copy, instead of failing on the rename."""
  from headspec.probing import features

  model, tokenizer, sentences = tiny_encoder
  kw = dict(cache_dir=tmp_path / "cache", identity={"run": "x"}, name="dev", log=None, dtype="float32")
  first = features.extract_features(model, tokenizer, sentences, **kw)
  folder = pathlib.Path(first.folder) if hasattr(first, "folder") else next((tmp_path / "cache").iterdir())
  aside = tmp_path / "first"
  folder.rename(aside)  # as if not yet there when the second process checks
  rename = pathlib.Path.rename

  def the_other_finishes_first(self, target):
    if pathlib.Path(target) == folder and not folder.exists():
      rename(aside, folder)
    return rename(self, target)

  monkeypatch.setattr(pathlib.Path, "rename", the_other_finishes_first)
  got = features.extract_features(model, tokenizer, sentences, **kw)
  assert not got.from_cache and [p.name for p in (tmp_path / "cache").iterdir()] == [folder.name]


# --- an SAE's Orbax checkpoint ----------------------------------------------------------------------------


def test_an_sae_checkpoint_on_a_full_disk_is_one_line_and_leaves_no_temporary(disk, capfd):
  """fit_sae's checkpoint does not fit (4096 features with Adam's moments: about 6 MB on a 1 MB disk): one
  UserError line naming the step and the full disk, no traceback printed, no `*.orbax-checkpoint-tmp`; with
  space again the same call trains and saves."""
  import headspec
  from headspec.errors import UserError

  d = disk(size="1m")
  x = np.random.default_rng(0).normal(size=(256, 64)).astype(np.float32)
  kw = dict(features=4096, k=4, steps=20, batch_size=32, chunk=10, progress=False, checkpoint_every=10)
  with pytest.raises(UserError) as e:
    headspec.fit_sae(x, checkpoint_dir=d.path / "sae", **kw)
  line = str(e.value)
  assert "\n" not in line and line.startswith(f"{d.path / 'sae' / '10'}: saving the checkpoint of step 10 failed")
  assert "No space left on device" in line
  assert "Traceback" not in capfd.readouterr().err
  assert not [p for p in d.path.rglob("*") if "orbax-checkpoint-tmp" in p.name]
  d.grow()
  headspec.fit_sae(x, checkpoint_dir=d.path / "sae", **kw)
  assert checkpoints.saved_steps_of(d.path / "sae") == [20]
