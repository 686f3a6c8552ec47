"""TextCorpus builder: plain-text folder -> TFDS (array_record) -> documents, with no TensorFlow."""

import importlib.util
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

from headspec.data import text_tfds
from headspec.errors import UserError

TRAIN = "First line of doc one.\n  Second line, stripped.  \n\n\n\nDoc two only line.\n \t\nDoc three\nends here"
VALID = "\n\nValid doc.\n"
TRAIN_DOCS = ["First line of doc one.\nSecond line, stripped.", "Doc two only line.", "Doc three\nends here"]


def write_corpus(data_dir, name="tiny", train=TRAIN, valid=VALID):
  corpus = data_dir / "text" / name
  corpus.mkdir(parents=True, exist_ok=True)
  (corpus / "train.txt").write_text(train)
  (corpus / "valid.txt").write_text(valid)
  return corpus


def test_round_trip_keeps_order_and_lines(tmp_path):
  write_corpus(tmp_path)
  train = text_tfds.load_documents(tmp_path, "tiny", "train", tfds_dir=tmp_path / "tfds")
  assert list(train) == TRAIN_DOCS
  assert len(train) == 3 and train[1] == "Doc two only line." and train[-1] == TRAIN_DOCS[-1]
  assert train[0:2] == TRAIN_DOCS[:2]
  with pytest.raises(IndexError):
    train[3]  # pylint: disable=pointless-statement
  assert list(text_tfds.load_documents(tmp_path, "tiny", "valid", tfds_dir=tmp_path / "tfds")) == ["Valid doc."]
  assert (tmp_path / "tfds" / "text_corpus" / "tiny" / "1.0.0").is_dir()


def test_changed_source_is_prepared_again(tmp_path):
  corpus = write_corpus(tmp_path)
  assert len(text_tfds.load_documents(tmp_path, "tiny", "train", tfds_dir=tmp_path / "tfds")) == 3
  (corpus / "train.txt").write_text("Only\n\nTwo docs now, longer file")
  assert list(text_tfds.load_documents(tmp_path, "tiny", "train", tfds_dir=tmp_path / "tfds")) == [
    "Only",
    "Two docs now, longer file",
  ]


def test_prepared_corpus_reads_through_catalog_name(tmp_path):
  write_corpus(tmp_path)
  text_tfds.load_documents(tmp_path, "tiny", "train", tfds_dir=tmp_path / "tfds")
  docs = text_tfds.load_documents(tmp_path, "tfds:text_corpus/tiny", "train", tfds_dir=tmp_path / "tfds")
  assert list(docs) == TRAIN_DOCS


def test_builder_needs_no_tensorflow(tmp_path):
  """Prepare and read in a fresh interpreter: TensorFlow is never imported (when installed at all)."""
  write_corpus(tmp_path)
  script = textwrap.dedent(f"""
      import sys
      from headspec.data import text_tfds
      docs = text_tfds.load_documents({str(tmp_path)!r}, "tiny", "train", tfds_dir={str(tmp_path / "tfds")!r})
      print(len(docs), docs[2].split()[-1], "tensorflow" in sys.modules)
  """)
  result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.splitlines()[-1].split() == ["3", "here", "False"]


@pytest.mark.parametrize("problem", ["no_dir", "no_valid", "empty_train", "blank_train"])
def test_bad_corpus_is_user_error_naming_path(tmp_path, problem):
  if problem != "no_dir":
    corpus = write_corpus(tmp_path, train={"empty_train": "", "blank_train": "\n \n\n"}.get(problem, TRAIN))
    if problem == "no_valid":
      (corpus / "valid.txt").unlink()
  expected = {"no_dir": "text/tiny", "no_valid": "valid.txt", "empty_train": "train.txt", "blank_train": "train.txt"}[
    problem
  ]
  with pytest.raises(UserError, match=re.escape(expected)):
    text_tfds.load_documents(tmp_path, "tiny", "train", tfds_dir=tmp_path / "tfds")


def test_bad_names_are_user_errors(tmp_path):
  write_corpus(tmp_path)
  with pytest.raises(UserError, match="corpus name"):
    text_tfds.load_documents(tmp_path, "../tiny", "train", tfds_dir=tmp_path / "tfds")
  with pytest.raises(UserError, match="split 'test'"):
    text_tfds.load_documents(tmp_path, "tiny", "test", tfds_dir=tmp_path / "tfds")
  with pytest.raises(UserError, match="no such TFDS dataset"):
    text_tfds.load_documents(tmp_path, "tfds:no_such_dataset_xyz", "train", tfds_dir=tmp_path / "tfds")


@pytest.mark.skipif(importlib.util.find_spec("tensorflow") is not None, reason="TensorFlow is installed")
def test_catalog_tfrecord_dataset_without_tensorflow_asks_for_extra(tmp_path):
  with pytest.raises(UserError, match=re.escape("pip install headspec[tf]")):
    text_tfds.load_documents(tmp_path, "tfds:lm1b", "train", tfds_dir=tmp_path / "tfds")


def test_missing_corpus_names_its_download_command(tmp_path):
  with pytest.raises(UserError, match=re.escape("get it with `headspec data download text wikitext_103`")):
    text_tfds.load_documents(tmp_path, "wikitext_103", "train", tfds_dir=tmp_path / "tfds")
  with pytest.raises(UserError, match="make it: a folder with train.txt and valid.txt"):
    text_tfds.load_documents(tmp_path, "my_corpus", "train", tfds_dir=tmp_path / "tfds")


@pytest.fixture()
def english_mix_data_dir():
  """The development data folder when it holds text/english_mix (CI); otherwise the test is skipped, saying why."""
  configured = os.environ.get("HEADSPEC_DATA_DIR")
  if not configured or not (pathlib.Path(configured) / "text" / "english_mix").is_dir():
    (pytest.fail if os.environ.get("CI") else pytest.skip)(  # CI has the development data
      f"HEADSPEC_DATA_DIR={configured or '(unset)'} has no text/english_mix; get it with "
      "`headspec data download text english_mix` (CI: the development data folder has it)"
    )
  return pathlib.Path(configured)


def test_english_mix_pins_are_the_development_corpus(english_mix_data_dir):
  """`headspec data download text english_mix` checks what it builds against these SHA-256: the
  development corpus's (the real packages were checked to build it byte for byte, docs/data.md)."""
  import hashlib

  from headspec.data import english_mix

  for split, pin in english_mix.OUTPUT_SHA256.items():
    path = english_mix_data_dir / "text" / "english_mix" / f"{split}.txt"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == pin, split
  assert len(english_mix.VALID) == 56


@pytest.mark.slow
def test_english_mix_document_count(english_mix_data_dir, tmp_path):
  data_dir = english_mix_data_dir
  for split in text_tfds.SPLITS:
    raw = (data_dir / "text" / "english_mix" / f"{split}.txt").read_text(encoding="utf-8")
    expected = [d.strip() for d in re.split(r"\n\s*\n", raw) if d.strip()]
    docs = text_tfds.load_documents(data_dir, "english_mix", split, tfds_dir=tmp_path)
    assert len(docs) == len(expected)
    assert docs[0] == expected[0] and docs[len(docs) - 1] == expected[-1]


def test_two_processes_preparing_one_corpus_both_read_it(tmp_path):
  """Two commands started at once on a fresh data folder (two `headspec train` parts, say) prepare the
  same corpus: the second waits for the first's lock and reads what it wrote, instead of failing on
  TFDS's final rename."""
  docs = [f"document {i} " + " ".join(f"w{(i * j) % 97}" for j in range(40)) for i in range(3000)]
  write_corpus(tmp_path, train="\n\n".join(docs), valid="one valid doc")
  code = textwrap.dedent(f"""
    from headspec.data import text_tfds
    train = text_tfds.load_documents({str(tmp_path)!r}, "tiny", "train", tfds_dir={str(tmp_path / "tfds")!r})
    print(len(train))
  """)
  procs = [
    subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for _ in range(2)
  ]
  outs = [p.communicate() for p in procs]
  assert [(p.returncode, out.split()[-1:]) for p, (out, _) in zip(procs, outs)] == [(0, ["3000"])] * 2, outs
