"""UD treebanks as a TensorFlow Datasets builder (array_record files, read with data sources).

No TensorFlow is needed: TFDS 4.9 writes array_record and reads it back through
`as_data_source`/`tfds.data_source` with NumPy only. The builder reads CoNLL-U through
`treebank.read_conllu`, so the validated sentences are the same in both paths; the plain
`treebank.load_split` stays the default and this is the cached, random-access alternative.

The builder is registered as `headspec_universal_dependencies` (TFDS ships its own
`universal_dependencies`, which needs TensorFlow and downloads from the internet); its configs are
treebank codes, and its manual dir is the folder holding `<treebank>-ud-<split>.conllu`.
"""

import dataclasses
import hashlib
import json
import pathlib

import numpy as np
import tensorflow_datasets as tfds
from etils import epath

from headspec.data import treebank as treebank_lib
from headspec.errors import UserError

_SOURCE_STAMP = "headspec_source.json"  # sha256 of each source file, to rebuild when it changes


def config_for(treebank: str) -> tfds.core.BuilderConfig:
  """The predefined config for `treebank`, or a new one for any other UD code."""
  for config in UniversalDependencies.BUILDER_CONFIGS:
    if config.name == treebank:
      return config
  return tfds.core.BuilderConfig(name=treebank, description=f"UD treebank {treebank} (user-supplied files)")


class UniversalDependencies(tfds.core.GeneratorBasedBuilder):
  """UD CoNLL-U treebank: words, UPOS, XPOS, 1-based heads, deprels per sentence, in file order."""

  name = "headspec_universal_dependencies"
  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Words, tags, heads and relations from CoNLL-U via headspec."}
  BUILDER_CONFIGS = [
    tfds.core.BuilderConfig(name="en_ewt", description="UD English EWT (web text)"),
    tfds.core.BuilderConfig(name="en_gum", description="UD English GUM (multi-genre)"),
    tfds.core.BuilderConfig(name="synthetic", description="headspec's seeded synthetic English treebank"),
  ]
  MANUAL_DOWNLOAD_INSTRUCTIONS = (
    "Pass the folder holding <treebank>-ud-{train,dev,test}.conllu as manual_dir "
    "(`headspec data download ud <treebank>` fetches it to $HEADSPEC_DATA_DIR/ud/<treebank>)."
  )

  # TFDS 4.9.10 finds a builder's code with the `importlib_resources` backport, which it declares
  # only for Python < 3.9; naming the file here keeps that import (and a dependency) away.
  code_path = epath.Path(__file__)

  def __init__(self, *, file_format="array_record", **kwargs):
    super().__init__(file_format=file_format, **kwargs)

  def _info(self):
    return tfds.core.DatasetInfo(
      builder=self,
      description="Universal Dependencies treebank sentences (syntactic words only).",
      # Tensor features, not Sequence(Text): one array per field encodes ~10x faster.
      features=tfds.features.FeaturesDict(
        {
          "sent_id": tfds.features.Text(),
          "words": tfds.features.Tensor(shape=(None,), dtype=np.str_),
          "upos": tfds.features.Tensor(shape=(None,), dtype=np.str_),
          "xpos": tfds.features.Tensor(shape=(None,), dtype=np.str_),
          "heads": tfds.features.Tensor(shape=(None,), dtype=np.int32),
          "deprels": tfds.features.Tensor(shape=(None,), dtype=np.str_),
        }
      ),
      disable_shuffling=True,  # keep file order, so examples line up with read_conllu
      homepage="https://universaldependencies.org/",
    )

  def _split_generators(self, dl_manager):
    folder = pathlib.Path(dl_manager.manual_dir)
    paths = {split: folder / f"{self.builder_config.name}-ud-{split}.conllu" for split in treebank_lib.SPLITS}
    paths = {split: path for split, path in paths.items() if path.is_file()}
    if not paths:
      raise UserError(f"{folder}: no {self.builder_config.name}-ud-<split>.conllu files")
    return {split: self._generate_examples(path) for split, path in paths.items()}

  def _generate_examples(self, path):
    for i, sentence in enumerate(treebank_lib.read_conllu(path)):
      # Not dataclasses.asdict: it deep-copies every string and was a third of the build time.
      yield i, {field.name: getattr(sentence, field.name) for field in dataclasses.fields(sentence)}


def _sentence(example) -> treebank_lib.Sentence:
  text = lambda values: tuple(v.decode("utf-8") for v in values)
  return treebank_lib.Sentence(
    sent_id=example["sent_id"].decode("utf-8"),
    words=text(example["words"]),
    upos=text(example["upos"]),
    xpos=text(example["xpos"]),
    heads=tuple(int(h) for h in example["heads"]),
    deprels=text(example["deprels"]),
  )


def _fingerprint(folder, treebank):
  return {
    split: hashlib.sha256(path.read_bytes()).hexdigest()
    for split in treebank_lib.SPLITS
    if (path := folder / f"{treebank}-ud-{split}.conllu").is_file()
  }


def prepare(data_dir, treebank: str, tfds_dir, *, manual_dir=None) -> UniversalDependencies:
  """Builds (or reuses, when the source files are unchanged) the array_record dataset."""
  folder = pathlib.Path(manual_dir) if manual_dir else pathlib.Path(data_dir) / "ud" / treebank
  if not folder.is_dir():
    raise UserError(f"no treebank folder {folder} (get it with `headspec data download ud {treebank}`)")
  builder = UniversalDependencies(config=config_for(treebank), data_dir=str(tfds_dir))
  stamp_path = pathlib.Path(builder.data_dir) / _SOURCE_STAMP
  fingerprint = _fingerprint(folder, treebank)
  stale = not (builder.is_prepared() and stamp_path.is_file() and json.loads(stamp_path.read_text()) == fingerprint)
  if stale:
    builder.download_and_prepare(
      download_config=tfds.download.DownloadConfig(
        manual_dir=str(folder), download_mode=tfds.download.GenerateMode.REUSE_CACHE_IF_EXISTS
      )
    )
    builder = UniversalDependencies(config=config_for(treebank), data_dir=str(tfds_dir))
    stamp_path.write_text(json.dumps(fingerprint, indent=1) + "\n")
  return builder


def load_split_tfds(data_dir, treebank: str, split: str, tfds_dir, *, manual_dir=None) -> list[treebank_lib.Sentence]:
  """The same sentences as `treebank.load_split`, via a prepared TFDS array_record data source."""
  builder = prepare(data_dir, treebank, tfds_dir, manual_dir=manual_dir)
  if split not in builder.info.splits:
    raise UserError(
      f"split {split!r} not in {treebank} under {builder.data_dir} (present: "
      f"{', '.join(builder.info.splits) or 'none'})"
    )
  source = builder.as_data_source(split=split)
  return [_sentence(example) for example in source.__getitems__(range(len(source)))]
