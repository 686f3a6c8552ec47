"""run_info.json (headspec/io/provenance.py): written beside a command's tables, with the resolved config,
versions, git commit, the SHA-256 of every data file read, counts, host, devices and wall time."""

import hashlib
import json
import pathlib
import re
import subprocess

from headspec.io import provenance

KEYS = {"command", "argv", "config", "versions", "git_commit", "data_files", "host", "platform", "python"}
KEYS |= {"devices", "started", "wall_time_s"}


def _sha(path) -> str:
  return hashlib.sha256(path.read_bytes()).hexdigest()


def test_train_and_probe_write_run_info_with_data_hashes(train_tiny_decoder, synthetic_data_dir):
  from headspec.probing import run as probe_run
  from headspec.probing.config import synthetic_probe_config

  run = train_tiny_decoder(2, name="provenance")
  info = json.loads((run / "run_info.json").read_text())
  assert KEYS <= set(info) and info["command"] == "headspec.train.loop"
  text = synthetic_data_dir / "text" / "synthetic"
  assert info["data_files"] == {
    str(text / "train.txt"): _sha(text / "train.txt"),
    str(text / "valid.txt"): _sha(text / "valid.txt"),
  }
  assert info["config"]["train"]["steps"] == 2 and info["devices"]

  c = synthetic_probe_config(str(synthetic_data_dir))
  c.probe.update(tasks=("upos",), eval_splits=("dev",), random_baseline=False, residuals=False, max_train_words=500)
  c.probe.update(refine_samples=0, max_iter=20, l2_grid=(1e-3,), bootstrap_resamples=20, batch_tokens=1024)
  probe_run.run(c, run)
  info = json.loads((run / "probes" / "run_info.json").read_text())
  assert KEYS <= set(info) and info["command"] == "headspec.probing.run"
  ud = synthetic_data_dir / "ud" / "synthetic"
  files = {str(ud / f"synthetic-ud-{s}.conllu") for s in ("train", "dev")}
  assert files <= set(info["data_files"])
  for path, digest in info["data_files"].items():
    assert digest == hashlib.sha256(open(path, "rb").read()).hexdigest()
  assert 0 < info["train_words"] <= 700  # about max_train_words, whole sentences
  assert set(info["unrepresentable_sentences"].values()) == {0} and info["unrepresentable_sentences"]
  assert info["config"]["probe"]["max_train_words"] == 500
  assert set(info["versions"]) == set(provenance.PACKAGES) and info["versions"]["jax"]
  assert info["wall_time_s"] > 0


def test_nested_records_and_no_file_on_failure(tmp_path):
  @provenance.recorded("inner")
  def inner(config, workdir):
    provenance.note_read(tmp_path / "b.txt")

  @provenance.recorded("outer")
  def outer(workdir, fail=False):
    provenance.note_read(tmp_path / "a.txt")
    inner(None, workdir)
    provenance.note("skipped", 3, under="dev")
    if fail:
      raise ValueError("no")

  (tmp_path / "a.txt").write_text("a")
  (tmp_path / "b.txt").write_text("b")
  outer(tmp_path / "run")
  inner_info = json.loads((tmp_path / "run" / "inner" / "run_info.json").read_text())
  outer_info = json.loads((tmp_path / "run" / "outer" / "run_info.json").read_text())
  assert list(inner_info["data_files"]) == [str(tmp_path / "b.txt")] and inner_info["config"] is None
  assert outer_info["data_files"] == {str(tmp_path / p): _sha(tmp_path / p) for p in ("a.txt", "b.txt")}
  assert outer_info["skipped"] == {"dev": 3}
  try:
    outer(tmp_path / "failed", fail=True)
  except ValueError:
    pass
  assert not (tmp_path / "failed" / "outer").exists()


def test_git_commit_is_the_checkouts_head(monkeypatch):
  """The suite runs from a git checkout (README: clone, then install): git_commit is its HEAD."""
  root = pathlib.Path(provenance.__file__).resolve().parents[2]
  head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
  commit = provenance.git_commit()
  assert commit is not None and re.fullmatch(r"[0-9a-f]{40}(-dirty)?", commit)
  assert commit.removesuffix("-dirty") == head.stdout.strip()

  def no_git(*args, **kwargs):
    raise FileNotFoundError("git")

  monkeypatch.setattr(subprocess, "run", no_git)  # git missing
  assert provenance.git_commit() is None
  assert provenance.sha256("/nonexistent/file") is None
