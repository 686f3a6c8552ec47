"""TFDS array_record round trip equals read_conllu (runs without TensorFlow installed)."""

import shutil

import pytest
import tensorflow_datasets as tfds

from headspec.data import synthetic, treebank, ud_tfds
from headspec.errors import UserError


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
  return synthetic.write_synthetic(
    tmp_path_factory.mktemp("synth"), seed=1, num_train=200, num_dev=40, num_test=30, num_text_sentences=20
  )


def test_round_trip_synthetic(synth_dir, tmp_path):
  for split in ("train", "dev", "test"):
    expected = treebank.load_split(synth_dir, "synthetic", split)
    assert ud_tfds.load_split_tfds(synth_dir, "synthetic", split, tmp_path) == expected
  # Prepared once: the registered name reads it back with tfds.data_source, in file order.
  source = tfds.data_source("headspec_universal_dependencies/synthetic", split="dev", data_dir=tmp_path, download=False)
  dev = treebank.load_split(synth_dir, "synthetic", "dev")
  assert len(source) == 40
  assert source[7]["sent_id"].decode() == dev[7].sent_id == "synthetic-dev-00008"
  assert [int(h) for h in source[7]["heads"]] == list(dev[7].heads)


def test_rebuilds_when_source_changes(tmp_path):
  data = synthetic.write_synthetic(
    tmp_path / "data", seed=5, num_train=10, num_dev=10, num_test=10, num_text_sentences=20
  )
  first = ud_tfds.load_split_tfds(data, "synthetic", "dev", tmp_path / "tfds")
  synthetic.write_synthetic(data, seed=6, num_train=10, num_dev=12, num_test=10, num_text_sentences=20)
  second = ud_tfds.load_split_tfds(data, "synthetic", "dev", tmp_path / "tfds")
  assert len(first) == 10 and second == treebank.load_split(data, "synthetic", "dev")


def test_any_treebank_from_manual_dir(synth_dir, tmp_path):
  folder = tmp_path / "my_folder"
  folder.mkdir()
  shutil.copy(synth_dir / "ud/synthetic/synthetic-ud-test.conllu", folder / "xx_toy-ud-test.conllu")
  got = ud_tfds.load_split_tfds(None, "xx_toy", "test", tmp_path / "tfds", manual_dir=folder)
  assert got == treebank.load_split(synth_dir, "synthetic", "test")
  assert ud_tfds.config_for("xx_toy").name == "xx_toy"
  assert ud_tfds.config_for("en_ewt") is ud_tfds.UniversalDependencies.BUILDER_CONFIGS[0]
  with pytest.raises(UserError, match="split 'dev' not in xx_toy .*present: test"):
    ud_tfds.load_split_tfds(None, "xx_toy", "dev", tmp_path / "tfds", manual_dir=folder)
  with pytest.raises(UserError, match="no treebank folder .*ud/absent"):
    ud_tfds.load_split_tfds(tmp_path, "absent", "dev", tmp_path / "tfds")


@pytest.mark.slow
def test_round_trip_ewt_dev(data_dir, tmp_path):
  folder = tmp_path / "en_ewt"  # dev only, so train (12.5k sentences) is not built here
  folder.mkdir()
  shutil.copy(data_dir / "ud/en_ewt/en_ewt-ud-dev.conllu", folder)
  got = ud_tfds.load_split_tfds(data_dir, "en_ewt", "dev", tmp_path / "tfds", manual_dir=folder)
  assert got == treebank.load_split(data_dir, "en_ewt", "dev")
  assert len(got) == 2001
