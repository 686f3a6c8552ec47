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

from headspec.cli.quickstart import quickstart_config
from headspec.data import lm_pipeline
from headspec.data import tokenizer as tokenizer_lib
from headspec.errors import UserError
from headspec.io import remote
from headspec.io.metrics import MetricsWriter
from headspec.runs import directory as runs

REPO = pathlib.Path(__file__).resolve().parents[1]
OWNED = ["train/loop.py", "io/metrics.py", "runs/checkpoints.py", "runs/directory.py", "io/remote.py", "launch/sweeps.py", "data/lm_pipeline.py", "data/tokenizer.py", "diversity/run.py",
         "pretrained/hf_tokenizer.py", "probing/suite.py", "probing/run.py", "probing/report.py", "probing/features.py", "attention/run.py",
         "attention/pictures.py", "attention/induction_run.py", "ablation/run.py", "ablation/plots.py", "atlas/data.py",
         "atlas/grid.py", "atlas/head_data.py", "atlas/sae_data.py", "atlas/circuit_data.py", "atlas/page.py",
         "atlas/build.py", "atlas/features.py"]  # fmt: skip


def test_unknown_scheme_is_one_user_error_and_urls_are_not_local_folders():
  with pytest.raises(UserError, match=r"unknown URL scheme ftp://"):
    remote.run_path("ftp://host/run")
  assert str(remote.run_path("gs://bucket/run/")) == "gs://bucket/run"
  assert remote.run_path("runs/x") == epath.Path(os.path.realpath("runs/x"))


def test_no_local_only_calls_on_run_paths():
  """A supplement to the tests below: run directories never meet pathlib's resolve(), builtin open(),
  `pathlib.Path(workdir)` or a savefig of their own (figures go through remote.save_figure)."""
  for name in OWNED:
    text = (REPO / "headspec" / name).read_text()
    assert not re.search(r"pathlib\.Path\([^)]*\)\.resolve\(\)", text), name
    assert not re.search(r"(?<![.\w])open\(", text), name
    assert not re.search(r"pathlib\.Path\((workdir|run_dir|out_dir|folder)\)", text), name
    assert name == "io/remote.py" or ".savefig(" not in text, name


def _mock_gcs(root: pathlib.Path):
  """gs://... -> root/...; appending to an object fails, as it does on GCS; writing an object needs no
  folder; glob answers URLs and walk answers roots without the scheme, as gcsfs does."""
  root = os.fspath(root)

  def local(path):
    p = os.fspath(path)
    return os.path.join(root, p[len("gs://") :]) if p.startswith("gs://") else p

  def url(path):  # a local answer back into the bucket's terms
    p = os.fspath(path)
    return "gs://" + os.path.relpath(p, root) if p.startswith(root + os.sep) else p

  def open_(fn, path, mode="r", **kw):
    assert "a" not in mode, f"append to an object: {path}"
    if os.fspath(path).startswith("gs://") and ("w" in mode or "x" in mode):
      os.makedirs(os.path.dirname(local(path)), exist_ok=True)
    return fn(local(path), mode, **kw)

  def glob(fn, pattern):
    found = fn(local(pattern))
    return [url(p) for p in found] if os.fspath(pattern).startswith("gs://") else found

  def walk(fn, top, **kw):
    for where, dirs, files in fn(local(top), **kw):
      yield (url(where).removeprefix("gs://") if os.fspath(top).startswith("gs://") else where), dirs, files

  wrap = lambda fn, path, *a, **kw: fn(local(path), *a, **kw)
  wrap2 = lambda fn, path, dst, *a, **kw: fn(local(path), local(dst), *a, **kw)
  return epath_testing.mock_epath(
    open=open_, exists=wrap, isdir=wrap, listdir=wrap, makedirs=wrap, mkdir=wrap, glob=glob, walk=walk,
    remove=wrap, rmtree=wrap, stat=wrap, rename=wrap2, replace=wrap2, copy=wrap2,
  )  # fmt: skip


def _tiny_bert_tokenizer():
  import tokenizers
  from tokenizers import models, pre_tokenizers

  from headspec.pretrained.hf_tokenizer import HFTokenizer

  vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat"])}
  backend = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
  backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  specials = {
    "pad_token": "[PAD]",
    "unk_token": "[UNK]",
    "sep_token": "[SEP]",
    "cls_token": "[CLS]",
    "mask_token": "[MASK]",
  }
  return HFTokenizer(backend, "bert", specials, "a test vocabulary")


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
    hf = _tiny_bert_tokenizer()
    hf.save(workdir / "hf_tokenizer")  # an imported model's tokenizer (kind huggingface)
    hf_again = tokenizer_lib.load_tokenizer("gs://bkt/run/hf_tokenizer")
    assert hf_again.encode("the cat sat") == hf.encode("the cat sat") == [5, 6, 1]
    assert hf_again.prefix_ids == (2,) and hf_again.suffix_ids == (3,)
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


def _tiny_decoder(data_dir):
  """conftest.train_tiny_decoder's config: 2 layers of 4 heads, d_model 32, rows of 32 tokens."""
  c = quickstart_config("decoder")
  c.data_dir = str(data_dir)
  c.data.vocab_size = 512
  c.model.num_layers, c.model.num_heads, c.model.d_model, c.model.d_head, c.model.d_ff = 2, 4, 32, 8, 64
  c.train.steps, c.train.batch_size, c.train.seq_len = 4, 8, 32
  c.train.eval_every = c.train.diversity_every = 0
  c.train.checkpoint_every, c.train.keep_steps = 100, (2,)
  return c


def _analysis_configs(data_dir):
  """Small probe, diversity, attention and ablate configs (as in test_api, test_diversity_run,
  test_attention_run and test_ablation_run)."""
  import importlib.util

  from headspec.ablation.config import ablate_config
  from headspec.attention.config import synthetic_attention_config
  from headspec.probing.config import synthetic_probe_config

  probe = synthetic_probe_config(str(data_dir))
  probe.probe.update(tasks=("upos",), eval_splits=("dev",), random_baseline=False, max_train_words=500)
  probe.probe.update(refine_samples=0, max_iter=20, l2_grid=(1e-3,), bootstrap_resamples=50, batch_tokens=1024)
  spec = importlib.util.spec_from_file_location("_diversity_config", REPO / "configs" / "diversity.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  diversity = module.get_config(None)
  diversity.update(num_tokens=300, batch_size=4, steps="last")
  attention = synthetic_attention_config(str(data_dir))
  attention.update(steps="all", max_sentences=20, report_split="")
  attention.pictures.sentences = (0,)
  attention.clark.min_count, attention.roles.bootstrap_resamples = 5, 20
  attention.induction.update(num_sequences=10, num_tokens=300)
  attention.induction.causal.enabled = False
  ablate = ablate_config()
  ablate.update(steps="last", methods="zero,importance,pruning", num_tokens=256, batch_size=4, bootstrap_resamples=50)
  ablate.pruning.update(rankings="importance,random", random_seeds=2)
  ablate.data_dir = str(data_dir)
  return probe, diversity, attention, ablate


@pytest.mark.slow
def test_every_analysis_on_a_gs_workdir(synthetic_data_dir, tmp_path, monkeypatch, capsys):
  """train, probe, diversity, attention, ablate and atlas on gs://bkt/run (the epath mock): tables and
  figures land in the bucket, whole; the feature cache on local scratch (HEADSPEC_SCRATCH), not in the
  bucket; no local folder `gs:` anywhere."""
  from headspec.ablation.run import run as run_ablation
  from headspec.attention.run import run as run_attention
  from headspec.cli import main as cli
  from headspec.diversity.run import run as run_diversity
  from headspec.probing import features
  from headspec.probing.run import run as run_probe_suite
  from headspec.runs import checkpoints
  from headspec.train.loop import train_and_evaluate

  monkeypatch.chdir(tmp_path)
  scratch = tmp_path / "scratch"
  monkeypatch.setenv("HEADSPEC_SCRATCH", str(scratch))
  bucket = tmp_path / "bucket"
  url = "gs://bkt/run"

  def checkpoint_dir(workdir):  # orbax writes gs:// through tensorstore, which the epath mock cannot reach
    assert str(remote.run_path(workdir)) == url
    return epath.Path(tmp_path / "orbax" / "checkpoints")

  monkeypatch.setattr(checkpoints, "checkpoint_dir", checkpoint_dir)
  probe, diversity, attention, ablate = _analysis_configs(synthetic_data_dir)
  with _mock_gcs(bucket):
    train_and_evaluate(_tiny_decoder(synthetic_data_dir), url)
    assert runs.resolve_steps(url, "all") == [2, 4]
    assert run_probe_suite(probe, url) == epath.Path(f"{url}/probes/results.csv")
    run_diversity(diversity, url)
    assert str(run_attention(attention, url)) == f"{url}/attention/clark_summary.md"
    run_ablation(ablate, url)
    assert cli.main(["headspec", "atlas", f"--workdir={url}"]) == 0
    cache = features.run_cache_dir(url)
  out = capsys.readouterr().out
  run = bucket / "bkt" / "run"
  files = {p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file()}
  for name in [
    "config.json", "metrics.jsonl", "tokenizer/headspec_tokenizer.json",
    "probes/results.csv", "probes/baselines.csv", "probes/selectivity.csv", "probes/summary.md",
    "probes/heatmap_upos.png", "diversity/results.csv",
    "attention/clark.csv", "attention/clark_baselines.csv", "attention/roles.csv", "attention/labels.csv",
    "attention/icl.csv", "attention/clark_summary.md", "attention/induction_summary.md",
    "attention/induction_formation.png", "attention/pictures/run-step4/maps.npz",
    "attention/pictures/run-step4/L1H3.png", "attention/pictures/run-step2/lines_sentence0_layer1.png",
    "ablation/heads.csv", "ablation/pruning.csv", "ablation/heads_run_step4.png",
    "ablation/pruning_run_step4.png", "atlas.html",
  ]:  # fmt: skip
    assert name in files, name
  assert any(n.startswith("diversity/") and n.endswith(".png") for n in files)
  assert not [n for n in files if ".tmp" in n or n.startswith("probes/cache")], "no temporary files, no cache"
  assert cache.is_relative_to(scratch) and list(cache.glob("run-step4-synthetic-train-*/z_0.npy"))
  for png in (run / "probes/heatmap_upos.png", run / "attention/pictures/run-step4/L0H0.png"):
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  page = (run / "atlas.html").read_text()
  assert "L1H3.png" in page and "data:image/png;base64," in page and '"path":"gs://bkt/run"' in page
  assert f"{url}/atlas.html" in out
  assert not (tmp_path / "gs:").exists() and not (REPO / "gs:").exists()


def test_a_workdir_of_an_unknown_scheme_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
  from headspec.cli import main as cli

  monkeypatch.chdir(tmp_path)
  config = f"--config={REPO / 'headspec' / 'configs' / 'probe_synthetic.py'}"
  for argv in (["probe", config, "--workdir=ftp://x/y"], ["atlas", "--workdir=ftp://x/y"]):
    assert cli.main(["headspec", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("headspec: error: --workdir=ftp://x/y: unknown URL scheme ftp://"), err
    assert len(err.strip().splitlines()) == 1
  assert not list(tmp_path.iterdir()) and not (REPO / "ftp:").exists()


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
    from headspec.runs import checkpoints

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


def test_only_the_writer_process_writes(tmp_path, monkeypatch):
  """On a process other than process 0 of a multi-process command (`remote.is_writer`), tables, files,
  figures and swapped folders are computed but not written, no temporary is left and no other writer's is
  removed; process 0 and a lone process write. Temporaries name their process (hosts' pids may coincide)."""
  import jax
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  from headspec.io import tables

  table = tables.PROBE_BASELINES
  row = {c: 1 for c in table.columns}

  def write_all(folder):
    remote.write_bytes_atomic(folder / "a.txt", b"a")
    fig = plt.figure()
    remote.save_figure(fig, folder / "b.png")
    plt.close(fig)
    return tables.merge(folder / "c.csv", [row], table)

  assert remote.is_writer() and remote.temp_suffix() == f".tmp-{os.getpid()}"
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
  monkeypatch.setattr(jax, "process_count", lambda: 2)
  for index, writes in ((1, False), (0, True)):
    monkeypatch.setattr(jax, "process_index", lambda index=index: index)
    folder = tmp_path / str(index)
    folder.mkdir()
    assert remote.is_writer() is writes and remote.temp_suffix() == f".p{index}.tmp-{os.getpid()}"
    rows = write_all(folder)
    assert len(rows) == 1  # the merged rows come back either way
    assert sorted(p.name for p in folder.iterdir()) == (["a.txt", "b.png", "c.csv"] if writes else [])
    drawn, tmp = folder / "drawn", folder / f".drawn{remote.temp_suffix()}"  # a folder swapped into place
    drawn.mkdir()
    tmp.mkdir()
    (tmp / "new.png").write_bytes(b"x")
    remote.swap_folder(tmp, drawn)
    assert not tmp.exists() and [p.name for p in drawn.iterdir()] == (["new.png"] if writes else [])
    stale = folder / ".gone.tmp-999999999"  # no such pid; changed long ago
    stale.write_bytes(b"x")
    os.utime(stale, (0, 0))
    assert remote.remove_stale_temps(folder) == ([stale] if writes else []) and stale.exists() is not writes
