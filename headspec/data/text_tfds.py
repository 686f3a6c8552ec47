"""Plain-text corpora as TFDS datasets (array_record, so no TensorFlow), and TFDS catalog text.

A corpus is a folder `data_dir/text/<corpus>/` holding `train.txt` and `valid.txt`: documents separated
by a blank line, one sentence or paragraph a line. `TextCorpus` prepares each corpus once (one builder
config per corpus name) into `tfds_dir/text_corpus/<corpus>/`; `load_documents` prepares if needed and
reads the documents back with random access through `tfds.data_source`.

`corpus="tfds:<name>"` (e.g. `tfds:lm1b`, `tfds:wiki40b/en`) reads a TFDS catalog dataset's text
feature instead. Catalog datasets are usually prepared as tfrecord, which needs TensorFlow (the optional
extra `headspec[tf]`); one already prepared as array_record in `tfds_dir` is read without it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pathlib
import re
import shutil
from collections.abc import Iterator, Sequence

import tensorflow_datasets as tfds
from etils import epath

from headspec.errors import UserError
from headspec.io import library_logs, provenance, tables

SPLITS = ("train", "valid")
CATALOG_PREFIX = "tfds:"
_CORPUS_NAME = re.compile(r"^[A-Za-z0-9_]+$")
_READ_CHUNK = 256  # documents fetched per array_record read while iterating


def _split_path(source_dir: pathlib.Path, split: str) -> pathlib.Path:
  return source_dir / f"{split}.txt"


def _fingerprint(source_dir: pathlib.Path) -> str:
  """Size and mtime of every split file: a change re-prepares the corpus."""
  stats = [_split_path(source_dir, s).stat() for s in SPLITS]
  return ";".join(f"{s}:{st.st_size}:{st.st_mtime_ns}" for s, st in zip(SPLITS, stats))


def read_text_documents(path: pathlib.Path) -> Iterator[str]:
  """Yields the blank-line-separated documents of a text file, lines stripped and joined by '\\n'."""
  lines: list[str] = []
  with open(path, encoding="utf-8") as f:
    for line in f:
      line = line.strip()
      if line:
        lines.append(line)
      elif lines:
        yield "\n".join(lines)
        lines = []
  if lines:
    yield "\n".join(lines)


class TextCorpus(tfds.core.GeneratorBasedBuilder):
  """A plain-text corpus folder (`train.txt`, `valid.txt`) as documents with one feature, `text`.

  Build with `TextCorpus(config=<corpus name>, source_dir=<folder>, data_dir=<tfds dir>,
  file_format="array_record")`; configs are made per corpus, not listed in advance.
  """

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Documents of a plain-text corpus folder."}

  # tfds 4.9.10 finds a packaged builder's code path through the `importlib_resources` backport, which
  # it only requires on Python < 3.9; naming the file here avoids that import (and the dependency).
  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> epath.Path:
    return epath.Path(__file__)

  def __init__(self, *, config: str, source_dir: str | os.PathLike | None = None, **kwargs):
    # Without source_dir the builder can only read what was prepared (e.g. `tfds:text_corpus/<corpus>`).
    self._source_dir = None if source_dir is None else pathlib.Path(source_dir)
    super().__init__(config=tfds.core.BuilderConfig(name=config, description=f"text corpus {config}"), **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self,
      description="Documents of a plain-text corpus (blank-line separated, lines joined by '\\n').",
      features=tfds.features.FeaturesDict({"text": tfds.features.Text()}),
      disable_shuffling=True,  # keep the file's document order
      metadata=tfds.core.MetadataDict(source=self._source_dir and _fingerprint(self._source_dir)),
    )

  # TFDS prints "Downloading and preparing dataset ..." (and "... downloaded and prepared") on stdout for
  # every builder; this one reads local files only, so it says what it does as a log line instead.
  def _log_download_bytes(self) -> None:
    logging.info("text corpus %s: preparing %s into %s (local files, nothing downloaded)",
                 self.builder_config.name, self._source_dir, self.data_dir)  # fmt: skip

  def _log_download_done(self) -> None:
    logging.info("text corpus %s: prepared in %s", self.builder_config.name, self.data_dir)

  def _split_generators(self, dl_manager):
    del dl_manager  # local files only
    if self._source_dir is None:
      raise UserError(
        f"text corpus {self.builder_config.name}: not prepared in {self._data_dir_root}; "
        "prepare it with load_documents(data_dir, corpus, ...)"
      )
    return {split: self._generate_examples(_split_path(self._source_dir, split)) for split in SPLITS}

  def _generate_examples(self, path: pathlib.Path):
    count = 0
    for count, text in enumerate(read_text_documents(path), start=1):
      yield count - 1, {"text": text}
    if count == 0:
      raise UserError(f"{path}: no documents (the file holds only blank lines)")


class _TextSequence(Sequence[str]):
  """Random access to a data source's text feature, decoded to str; iterates in chunked reads."""

  def __init__(self, source, feature: str):
    self._source, self._feature = source, feature

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index):
    if isinstance(index, slice):
      return [self[i] for i in range(*index.indices(len(self)))]
    if not -len(self) <= index < len(self):
      raise IndexError(index)
    return _as_str(self._source[index % len(self)][self._feature])

  def __iter__(self) -> Iterator[str]:
    for start in range(0, len(self), _READ_CHUNK):
      indices = list(range(start, min(start + _READ_CHUNK, len(self))))
      for example in self._source.__getitems__(indices):
        yield _as_str(example[self._feature])


@contextlib.contextmanager
def _without_tfds_bars():
  """TFDS's own progress bars off while it prepares (its generating/shuffling bars, tqdm.auto, which warns in
  a notebook without ipywidgets), then as they were: headspec logs one line per corpus prepared instead.
  TFDS keeps the switch in tqdm_utils._active and offers only a global setter (tfds.display_progress_bar)."""
  from tensorflow_datasets.core.utils import tqdm_utils

  before = tqdm_utils._active
  tfds.display_progress_bar(False)
  try:
    yield
  finally:
    tfds.display_progress_bar(before)


def _as_str(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _missing_corpus_hint(corpus: str) -> str:
  """How to get a corpus that is not there: its download command, or how to make a folder corpus."""
  from headspec.data import text_download  # pylint: disable=g-import-not-at-top

  command = text_download.download_command(corpus)
  if command:
    return f"get it with `{command}`"
  known = ", ".join(text_download.downloadable())
  return (
    f"make it: a folder with train.txt and valid.txt, documents separated by a blank line (docs/data.md); "
    f"or download {known} with `headspec data download text NAME` and set --config.data.corpus=NAME"
  )


def _check_source(source_dir: pathlib.Path) -> None:
  if not source_dir.is_dir():
    raise UserError(f"{source_dir}: corpus directory not found; {_missing_corpus_hint(source_dir.name)}")
  for split in SPLITS:
    path = _split_path(source_dir, split)
    if not path.is_file():
      raise UserError(f"{path}: corpus file not found")
    if path.stat().st_size == 0:
      raise UserError(f"{path}: corpus file is empty")


def prepare_corpus(data_dir: str | os.PathLike, corpus: str, *, tfds_dir: str | os.PathLike) -> TextCorpus:
  """Prepares `data_dir/text/<corpus>/` into `tfds_dir` unless already prepared from the same files."""
  if not _CORPUS_NAME.match(corpus):
    raise UserError(f"corpus name {corpus!r}: use letters, digits and underscores only (or tfds:<name>)")
  source_dir = pathlib.Path(data_dir) / "text" / corpus
  _check_source(source_dir)
  kwargs = dict(source_dir=source_dir, config=corpus, data_dir=os.fspath(tfds_dir), file_format="array_record")
  # Two commands preparing the same corpus at once (two runs started together on a fresh data folder):
  # the second waits here and finds it prepared; unlocked, TFDS's final rename fails in one of them.
  with tables.locked(epath.Path(tfds_dir) / TextCorpus.name / corpus), library_logs.quiet():
    builder = TextCorpus(**kwargs)
    if builder.is_prepared() and builder.info.metadata.get("source") != _fingerprint(source_dir):
      logging.info("%s changed since it was prepared: preparing again", source_dir)
      shutil.rmtree(builder.data_dir)
      builder = TextCorpus(**kwargs)
    with _without_tfds_bars():
      builder.download_and_prepare()
  return builder


def load_documents(
  data_dir: str | os.PathLike, corpus: str, split: str, *, tfds_dir: str | os.PathLike
) -> Sequence[str]:
  """The documents of one split of a corpus (prepared first if needed), as a lazy sequence of str.

  `corpus` names a folder under `data_dir/text/`, or a TFDS catalog dataset as `tfds:<name>`.
  `split` is `train` or `valid` (for catalog datasets without `valid`: `validation`, then `test`).
  """
  if corpus.startswith(CATALOG_PREFIX):
    return _load_catalog(corpus[len(CATALOG_PREFIX) :], split, tfds_dir=tfds_dir)
  if split not in SPLITS:
    raise UserError(f"split {split!r}: use one of {', '.join(SPLITS)}")
  builder = prepare_corpus(data_dir, corpus, tfds_dir=tfds_dir)
  provenance.note_read(_split_path(pathlib.Path(data_dir) / "text" / corpus, split))
  # builder.as_data_source is what tfds.data_source(name) calls; our builder needs its source_dir.
  return _TextSequence(builder.as_data_source(split=split), "text")


def _catalog_text_feature(name: str, features) -> str:
  """`text` if present, else the dataset's only Text feature."""
  if "text" in features:
    return "text"
  texts = [k for k, v in features.items() if isinstance(v, tfds.features.Text)]
  if len(texts) != 1:
    raise UserError(f"tfds:{name}: cannot tell which feature holds the text (features: {', '.join(features)})")
  return texts[0]


def _load_catalog(name: str, split: str, *, tfds_dir: str | os.PathLike) -> Sequence[str]:
  try:
    builder = tfds.builder(name, data_dir=os.fspath(tfds_dir))
  except tfds.core.registered.DatasetNotFoundError as e:
    raise UserError(f"tfds:{name}: no such TFDS dataset ({str(e).splitlines()[0]})") from None
  feature = _catalog_text_feature(name, builder.info.features)
  if builder.is_prepared() and builder.info.file_format == tfds.core.FileFormat.ARRAY_RECORD:
    return _TextSequence(builder.as_data_source(split=_catalog_split(builder, name, split)), feature)
  if isinstance(builder, TextCorpus):
    raise UserError(f"tfds:{name}: not prepared in {tfds_dir}; name the corpus folder instead of tfds:")
  try:
    import tensorflow  # noqa: F401  pylint: disable=g-import-not-at-top,unused-import
  except ImportError:
    raise UserError(  # noqa: B904  (the ImportError is the expected case, not a chained failure)
      f"tfds:{name}: not prepared as array_record in {tfds_dir}; preparing and reading TFDS "
      "catalog datasets needs TensorFlow: pip install headspec[tf]"
    )
  with _without_tfds_bars():
    builder.download_and_prepare()
  dataset = builder.as_dataset(split=_catalog_split(builder, name, split))
  return [_as_str(example[feature]) for example in tfds.as_numpy(dataset)]


def _catalog_split(builder, name: str, split: str) -> str:
  splits = list(builder.info.splits)
  candidates = [split] + (["validation", "test"] if split == "valid" else [])
  for candidate in candidates:
    if candidate in splits:
      return candidate
  raise UserError(f"tfds:{name}: no split {split!r} (splits: {', '.join(splits)})")
