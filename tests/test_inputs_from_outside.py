"""Inputs from outside under faults: UD downloads (pins, names, modes, stale parts), a CoNLL-U
byte-order mark, shell quoting in the launchers, one-line errors that keep their reason, head_mask forms."""

import hashlib
import shlex
import stat
import types

import numpy as np
import pytest

from headspec import launch
from headspec.api.load import head_mask_array
from headspec.cli import main as cli
from headspec.data import download, synthetic, treebank
from headspec.errors import UserError


@pytest.fixture(scope="module")
def dev_bytes(tmp_path_factory):
  out = synthetic.write_synthetic(
    tmp_path_factory.mktemp("src"), seed=2, num_train=3, num_dev=7, num_test=3, num_text_sentences=3
  )
  return (out / "ud" / "synthetic" / "synthetic-ud-dev.conllu").read_bytes()


def _serve(root, data, repo="UD_English-EWT", release="r2.16", name="en_ewt-ud-dev.conllu"):
  (root / repo / release).mkdir(parents=True, exist_ok=True)
  (root / repo / release / name).write_bytes(data)


def _git_blob(data: bytes) -> str:
  return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


def test_a_file_that_is_not_the_pinned_release_is_refused(server, dev_bytes, tmp_path):
  base_url, root = server
  _serve(root, dev_bytes)  # a valid CoNLL-U file, but not EWT r2.16's dev file
  with pytest.raises(UserError, match=r"en_ewt-ud-dev.conllu: SHA-256 [0-9a-f]{64} does not match the pinned 531a54ff"):
    download.download_ud("en_ewt", tmp_path, base_url=base_url, splits=("dev",), log=lambda _: None)
  assert list((tmp_path / "ud" / "en_ewt").iterdir()) == []  # nothing kept, no .part file


def test_pinned_file_is_kept_readable_and_stale_parts_go(server, dev_bytes, tmp_path, monkeypatch):
  base_url, root = server
  _serve(root, dev_bytes)
  pin = download.Pin(7, _git_blob(dev_bytes), hashlib.sha256(dev_bytes).hexdigest())
  monkeypatch.setitem(download.PINS, ("en_ewt", "dev"), pin)
  folder = tmp_path / "ud" / "en_ewt"
  folder.mkdir(parents=True)
  (folder / ".en_ewt-ud-dev.conllu.k2x9_a.part").write_bytes(b"half")  # left by a killed download
  notices = []
  (path,) = download.download_ud("en_ewt", tmp_path, base_url=base_url, splits=("dev",), log=notices.append)
  assert path.read_bytes() == dev_bytes and notices == [f"{path}: 7 sentences, as pinned"]
  assert stat.S_IMODE(path.stat().st_mode) == 0o644
  assert sorted(p.name for p in folder.iterdir()) == ["en_ewt-ud-dev.conllu"]
  # The SHA-256 matches but the sentence count is another (a pin is checked whole); only the blob id pinned.
  monkeypatch.setitem(download.PINS, ("en_ewt", "dev"), download.Pin(8, pin.git_blob, pin.sha256))
  with pytest.raises(UserError, match="7 sentences, the release has 8"):
    download.download_ud("en_ewt", tmp_path, base_url=base_url, splits=("dev",), force=True, log=lambda _: None)
  monkeypatch.setitem(download.PINS, ("en_ewt", "dev"), download.Pin(7, "0" * 40))
  with pytest.raises(UserError, match=r"git blob [0-9a-f]{40} does not match the pinned 0000"):
    download.download_ud("en_ewt", tmp_path, base_url=base_url, splits=("dev",), force=True, log=lambda _: None)
  assert path.read_bytes() == dev_bytes and sorted(p.name for p in folder.iterdir()) == ["en_ewt-ud-dev.conllu"]


def test_pins_match_the_development_copy_of_r2_16(data_dir):
  # The test treebanks (HEADSPEC_DATA_DIR, or the r2.16 download) are UD r2.16 byte for byte: they pass their pins.
  checked = 0
  for (tb, split), pin in download.PINS.items():
    path = treebank.split_path(data_dir, tb, split)
    if path.is_file():
      data = path.read_bytes()
      assert (hashlib.sha256(data).hexdigest(), _git_blob(data)) == (pin.sha256, pin.git_blob), path
      assert data.count(b"\n# sent_id") + data.startswith(b"# sent_id") == pin.sentences, path
      checked += 1
  assert checked >= 3
  assert all(len(p.git_blob) == 40 and (p.sha256 is None or len(p.sha256) == 64) for p in download.PINS.values())


@pytest.mark.parametrize(
  "args, message",
  [
    (["../../outside", "--repo=UD_English-EWT"], "treebank '../../outside': not a UD treebank code"),
    (["en_ewt/../../x"], "not a UD treebank code"),
    (["xx_toy", "--repo=../../UD_x"], r"--repo=../../UD_x: not a UD repository name"),
    (["en_ewt", "--release=../../main"], r"--release=../../main: not a git tag"),
  ],
)
def test_names_are_checked_before_anything_is_written(tmp_path, args, message):
  data_dir = tmp_path / "data"
  with pytest.raises(UserError, match=message):
    download.main_download([*args, "--base-url=http://127.0.0.1:9"], data_dir)
  assert list(tmp_path.iterdir()) == []  # no DATA_DIR/ud/..., nothing beside it


def test_conllu_with_a_byte_order_mark_reads(tmp_path):
  text = "# sent_id = s1\n1\tGo\tgo\tVERB\tVB\t_\t0\troot\t_\t_\n2\thome\thome\tADV\tRB\t_\t1\tadvmod\t_\t_\n"
  path = tmp_path / "bom.conllu"
  path.write_bytes(b"\xef\xbb\xbf" + text.encode())
  (sentence,) = treebank.read_conllu(path)
  assert sentence.sent_id == "s1" and sentence.words == ("Go", "home")


def _tpu(data, *extra):
  _, steps, _ = launch.build(
    ["tpu", f"--data={data}", "--tpu-name=t", "--zone=z", *extra, "--", "probe", "--config=configs/probe_ewt.py", "--workdir=gs://b/r"]
  )  # fmt: skip
  return [a.removeprefix("--command=") for s in steps for a in s.argv if a.startswith("--command=")]


def test_tpu_remote_commands_quote_every_value():
  evil = "gs://b/d; touch /tmp/owned #"
  commands = _tpu(evil)
  rsync = [shlex.split(c) for c in commands if "rsync" in c]
  assert rsync and evil in rsync[0] and ";" not in rsync[0] and "touch" not in rsync[0]
  probe = shlex.split(next(c for c in commands if "headspec probe" in c))
  assert probe[-3:] == ["--config=configs/probe_ewt.py", "--workdir=gs://b/r", "--config.multihost=True"]


@pytest.mark.parametrize("flag", ["--job-name=x\nrm -rf ~", "--partition=a b", "--account=$(id)", "--time=1:00 #"])
def test_slurm_directives_are_one_word(flag):
  with pytest.raises(UserError, match=r"one word without spaces"):
    launch.build(["slurm", flag, "--", "probe", "--config=configs/probe_ewt.py", "--workdir=r"])
  _, script, _ = launch.build(["slurm", "--data=/d; x", "--", "probe", "--config=configs/probe_ewt.py", "--workdir=r"])
  assert "export HEADSPEC_DATA_DIR='/d; x'" in script


def test_a_config_error_keeps_its_reason_on_one_line(capsys, tmp_path):
  code = cli.main(["headspec", "probe", "--config=configs/attention_ewt.py:bogus", f"--workdir={tmp_path}"])
  err = capsys.readouterr().err
  assert code == 2 and len(err.strip().splitlines()) == 1, err
  assert err.startswith("headspec: error: ") and "unknown argument 'bogus'" in err
  assert cli.one_line("a:\n\nTraceback (most recent call last):\n  File x\nValueError: why") == "a: ValueError: why"


def test_data_download_help_needs_no_data_directory(capsys, monkeypatch):
  monkeypatch.delenv("HEADSPEC_DATA_DIR", raising=False)
  for kind in ("text", "ud"):
    assert cli.main(["headspec", "data", "download", kind, "--help"]) == 0
    out = capsys.readouterr()
    assert out.out.startswith(f"usage: headspec data download {kind}") and out.err == ""


def test_head_mask_nested_list_is_refused():
  cfg = types.SimpleNamespace(num_layers=2, num_heads=2)
  with pytest.raises(ValueError, match=r"head_mask: a nested list is ambiguous .* shape \[2, 2\]"):
    head_mask_array(cfg, [[1, 0], [1, 1]])  # an [L, H] mask as a list: once read as pairs (1, 0), (1, 1)
  with pytest.raises(ValueError, match="head_mask: a int is neither"):
    head_mask_array(cfg, 3)
  with pytest.raises(ValueError, match="NaN or infinite"):
    head_mask_array(cfg, np.array([[1, np.nan], [1, 1]]))
  expected = np.array([[1, 0], [1, 1]], np.float32)
  np.testing.assert_array_equal(head_mask_array(cfg, [(0, 1)]), expected)
  np.testing.assert_array_equal(head_mask_array(cfg, expected), expected)
