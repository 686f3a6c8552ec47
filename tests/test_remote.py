"""Remote run directories (gs://): a real GCS API (gcp-storage-emulator, when installed) for training,
resume and reading back; an epath mock for the writers; and no local-only file calls left on run paths."""

import json
import os
import pathlib
import re
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from etils import epath
from etils.epath import testing as epath_testing

from headspec import remote, runs
from headspec.data import lm_pipeline
from headspec.data import tokenizer as tokenizer_lib
from headspec.errors import UserError
from headspec.quickstart import quickstart_config
from headspec.train_log import MetricsWriter

REPO = pathlib.Path(__file__).resolve().parents[1]
OWNED = ["train.py", "train_log.py", "checkpoints.py", "runs.py", "remote.py", "sweeps.py", "data/lm_pipeline.py", "data/tokenizer.py", "diversity/run.py"]  # fmt: skip


def test_unknown_scheme_is_one_user_error_and_urls_are_not_local_folders():
  with pytest.raises(UserError, match=r"unknown URL scheme ftp://"):
    remote.run_path("ftp://host/run")
  assert str(remote.run_path("gs://bucket/run/")) == "gs://bucket/run"
  assert remote.run_path("runs/x") == epath.Path(os.path.realpath("runs/x"))


def test_no_local_only_calls_on_run_paths():
  """A supplement to the tests below: run directories never meet pathlib's resolve() or builtin open()."""
  for name in OWNED:
    text = (REPO / "headspec" / name).read_text()
    assert not re.search(r"pathlib\.Path\([^)]*\)\.resolve\(\)", text), name
    assert not re.search(r"(?<![.\w])open\(", text), name


def _mock_gcs(root: pathlib.Path):
  """gs://... -> root/...; appending to an object fails, as it does on GCS."""

  def local(path):
    p = os.fspath(path)
    return os.path.join(root, p[len("gs://") :]) if p.startswith("gs://") else p

  def open_(fn, path, mode="r", **kw):
    assert "a" not in mode, f"append to an object: {path}"
    os.makedirs(os.path.dirname(local(path)), exist_ok=True)
    return fn(local(path), mode, **kw)

  wrap = lambda fn, path, *a, **kw: fn(local(path), *a, **kw)
  return epath_testing.mock_epath(
    open=open_, exists=wrap, isdir=wrap, listdir=wrap, makedirs=wrap, mkdir=wrap, glob=wrap, remove=wrap, stat=wrap
  )


def test_writers_on_a_gs_workdir_write_objects_whole(synthetic_data_dir, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  monkeypatch.setenv("HEADSPEC_SCRATCH", str(tmp_path / "scratch"))
  bucket = tmp_path / "bucket"
  workdir = remote.run_path("gs://bkt/run")
  config = quickstart_config("decoder")
  with _mock_gcs(bucket):
    runs.write_config(workdir, config)
    assert runs.read_config("gs://bkt/run").model.kind == "decoder"
    tok = tokenizer_lib.train_sentencepiece(
      [" ".join(f"word{i} cat{i % 7}" for i in range(j, j + 50)) for j in range(100)],
      workdir / "tokenizer",
      vocab_size=300,
    )
    again = tokenizer_lib.load_tokenizer("gs://bkt/run/tokenizer")
    assert again.encode("the cat") == tok.encode("the cat")
    rows = lm_pipeline.pack_tokens(["the cat sat"] * 50, tok, 8, cache_path=workdir / "cache" / "t.npy")
    np.testing.assert_array_equal(lm_pipeline.pack_tokens([], tok, 8, cache_path=workdir / "cache" / "t.npy"), rows)
    for segment in range(2):  # a run and its resumed segment: the second keeps the first's lines
      writer = MetricsWriter(workdir, upload_every=0.0)
      writer.write({"step": segment + 1, "loss": 1.0})
      writer.close()
    lines = (workdir / "metrics.jsonl").read_text().splitlines()
  assert [json.loads(line)["step"] for line in lines] == [1, 2]
  assert list((bucket / "bkt/run").glob("events.out.tfevents.*")), "TensorBoard events uploaded"
  assert not (tmp_path / "gs:").exists()


def _free_port():
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def test_writers_and_checkpoints_on_a_gcs_emulator(tmp_path, monkeypatch):
  """A real GCS JSON API on localhost: gcsfs (under epath) and tensorstore (under orbax) both talk to it.

  A whole `headspec train` on gcp-storage-emulator fails inside orbax: tensorstore's OCDBT reads back its
  manifest with a generation header the emulator does not give ("Malformed StorageGeneration"), so the
  training run itself is covered by the epath mock above and these writers and a small checkpoint here.
  """
  pytest.importorskip("gcsfs", reason="pip install gcsfs gcp-storage-emulator to run the GCS emulator test")
  pytest.importorskip("gcp_storage_emulator", reason="pip install gcsfs gcp-storage-emulator")
  port = _free_port()
  url = f"http://127.0.0.1:{port}"
  emulator = subprocess.Popen(
    [sys.executable, "-c", "from gcp_storage_emulator.__main__ import main; main()", "start", f"--port={port}", "--in-memory", "--default-bucket=bkt"],
    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
  )  # fmt: skip
  try:
    deadline = time.time() + 30
    while time.time() < deadline:
      try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        break
      except OSError:
        time.sleep(0.2)
    for k, v in {
      "STORAGE_EMULATOR_HOST": url,
      "TENSORSTORE_GCS_HTTP_URL": url,
      "HEADSPEC_SCRATCH": str(tmp_path),
    }.items():
      monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    workdir = remote.run_path("gs://bkt/run")
    runs.write_config(workdir, quickstart_config("decoder"))
    assert runs.read_config("gs://bkt/run").model.kind == "decoder"
    for segment in range(2):
      writer = MetricsWriter(workdir, upload_every=0.0)
      writer.write({"step": segment + 1, "loss": 1.0})
      writer.close()
    assert [json.loads(line)["step"] for line in (workdir / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    assert list(workdir.glob("events.out.tfevents.*"))
    from headspec import checkpoints

    mngr = checkpoints.manager(workdir)
    checkpoints.save(mngr, 3, {"w": np.arange(4.0)}, {"next_index": 3})
    mngr.wait_until_finished()
    state, data = checkpoints.restore(mngr, 3, {"w": np.zeros(4)})
    np.testing.assert_array_equal(state["w"], np.arange(4.0))
    assert data == {"next_index": 3} and checkpoints.saved_steps("gs://bkt/run") == [3]
    assert not (tmp_path / "gs:").exists()
  finally:
    emulator.terminate()
    emulator.wait(timeout=30)
