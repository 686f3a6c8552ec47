"""Fetch public language-model corpora into headspec's corpus folder format.

`headspec data download text <corpus> [--force] [--sha256=FILE=HEX ...]` writes
DATA_DIR/text/<corpus>/{train,valid}.txt (documents separated by a blank line, docs/data.md) and
SOURCE.json (where every byte came from). The sources are parquet files of a Hugging Face dataset
repository at one pinned commit, fetched with `huggingface_hub.hf_hub_download(repo, path,
repo_type="dataset", revision=...)` (its retries, its cache under HF_HOME, HF_ENDPOINT and
HF_HUB_OFFLINE honoured), each checked against the size and SHA-256 recorded here before anything is
converted. `--base-url` names a plain HTTPS mirror serving the same `<repo>/resolve/<revision>/<path>`
paths instead (fetched with urllib, checked the same way). Everything is built in
a hidden `.<corpus>.*.partial.tmp-<pid>` folder beside the target and moved into place only when complete and
validated, so an interrupted or corrupt download never looks like a corpus.

WikiText (Merity et al. 2016) rows are the lines of the original files. An article starts at its
title heading ` = Title = ` (one `=` each side; sections are ` = = Section = = `) and becomes one
document: its non-blank lines, stripped, heading lines included verbatim. The raw variants are used
(no `<unk>`); WikiText's own tokenization (` @-@ `, spaces around punctuation) is kept as it is.

Every file of the shipped corpora is pinned. A source added with `sha256=None` (no public value found)
makes the download refuse to start until `--sha256=FILE=HEX` supplies one (see docs/data.md).

`english_mix`, the development corpus, comes from zip files rather than parquet: its sources and rules
are in headspec/data/english_mix.py; it is fetched, checked and swapped in the same way (headspec/data/fetch.py,
which holds what every downloader shares).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import sys
from collections.abc import Iterable, Iterator

from headspec.data import english_mix, fetch
from headspec.errors import UserError

HF_DATASETS_URL = "https://huggingface.co/datasets"
_HEX64 = re.compile(r"^[0-9a-f]{64}$")


@dataclasses.dataclass(frozen=True)
class TextSource:
  """A downloadable corpus: parquet files (one `text` column) of `repo` at commit `revision`."""

  name: str
  repo: str
  revision: str
  files: dict  # split ('train' | 'valid') -> tuple[fetch.RemoteFile, ...], read in order
  rows: dict  # split -> parquet rows over its files (the dataset card's num_examples); {} = unchecked
  download_size: str
  text_size: str
  license: str
  description: str

  def url(self, base_url: str, remote: fetch.RemoteFile) -> str:
    return f"{base_url.rstrip('/')}/{self.repo}/resolve/{self.revision}/{remote.path}"

  def page(self, remote: fetch.RemoteFile) -> str:
    """The file's page on huggingface.co, whose 'Git LFS Details' show its SHA-256 and size."""
    return f"{HF_DATASETS_URL}/{self.repo}/blob/{self.revision}/{remote.path}"


# Salesforce/wikitext at b08601e04326c79dfdd32d625aee71d232d685c3 ("Convert dataset to Parquet (#8)",
# 2024-01-04; still the files on `main`). WikiText-103 SHA-256 values: the files' LFS pointers as the
# repository's pages show them ("Git LFS Details"); byte sizes (and WikiText-2's train SHA-256): other
# projects' manifests pinned to this revision, matching the pages' rounded sizes. The download checks
# both. Provenance: docs/data.md.
WIKITEXT_REPO = "Salesforce/wikitext"
WIKITEXT_REVISION = "b08601e04326c79dfdd32d625aee71d232d685c3"
_WIKITEXT_VALID = (
  "validation-00000-of-00001.parquet",
  657_209,
  "204929b7ff9d6184953f867dedb860e40aa69c078fc1e54b3baaa8fb28511c4c",
)

CORPORA = {
  "wikitext_103": TextSource(
    name="wikitext_103",
    repo=WIKITEXT_REPO,
    revision=WIKITEXT_REVISION,
    files={
      "train": (
        fetch.RemoteFile(
          "wikitext-103-raw-v1/train-00000-of-00002.parquet",
          156_987_808,
          "74da360f23826045b3e6ac6375411fdb15f003030aa74f2596ed08b857cb9212",
        ),
        fetch.RemoteFile(
          "wikitext-103-raw-v1/train-00001-of-00002.parquet",
          157_088_770,
          "ba090ac30dbf5461e8dcbdd1a1b8e6f3cf9c2c756d64f0c1220450acd514f720",
        ),
      ),
      "valid": (fetch.RemoteFile("wikitext-103-raw-v1/" + _WIKITEXT_VALID[0], *_WIKITEXT_VALID[1:]),),
    },
    rows={"train": 1_801_350, "valid": 3_760},
    download_size="315 MB",
    text_size="about 540 MB",
    license="CC BY-SA 3.0 / GFDL (Wikipedia text)",
    description="WikiText-103 (raw): about 28k Wikipedia Good and Featured articles, 103M words",
  ),
  "wikitext_2": TextSource(
    name="wikitext_2",
    repo=WIKITEXT_REPO,
    revision=WIKITEXT_REVISION,
    files={
      # SHA-256 and size from several independent public manifests pinned to this revision (docs/data.md).
      "train": (
        fetch.RemoteFile(
          "wikitext-2-raw-v1/train-00000-of-00001.parquet",
          6_357_543,
          "e83889baabc497075506f91975be5fac0d45c5290b6b20582c8cd1e853d0c9f7",
        ),
      ),
      # WikiText-2 and -103 share their validation articles; the parquet files are byte-identical.
      "valid": (fetch.RemoteFile("wikitext-2-raw-v1/" + _WIKITEXT_VALID[0], *_WIKITEXT_VALID[1:]),),
    },
    rows={"train": 36_718, "valid": 3_760},
    download_size="7 MB",
    text_size="about 11 MB",
    license="CC BY-SA 3.0 / GFDL (Wikipedia text)",
    description="WikiText-2 (raw): 600 Wikipedia articles, 2M words (a subset of WikiText-103)",
  ),
}


def canonical_name(name: str) -> str:
  """'wikitext-103' and 'WikiText_103' name the corpus folder 'wikitext_103'."""
  return name.strip().lower().replace("-", "_")


ENGLISH_MIX = english_mix.NAME  # built from NLTK data packages (headspec/data/english_mix.py), not parquet


def downloadable() -> list[str]:
  """The corpus names `headspec data download text` takes."""
  return sorted([*CORPORA, ENGLISH_MIX])


def download_command(corpus: str) -> str | None:
  """`headspec data download text <corpus>` for a known corpus name, else None."""
  name = canonical_name(corpus)
  return f"headspec data download text {name}" if name in downloadable() else None


def is_title(line: str) -> bool:
  """A WikiText article heading ` = Title = ` (not a section heading ` = = Section = = `)."""
  s = line.strip()
  return len(s) > 4 and s.startswith("= ") and s.endswith(" =") and not s.startswith("= =") and not s.endswith("= =")


def wikitext_documents(rows: Iterable[str]) -> Iterator[str]:
  """Articles of WikiText rows (lines of the original files): non-blank lines, stripped, from one
  title heading to the next, joined by '\\n'. Lines before the first title form a document too."""
  lines: list[str] = []
  for row in rows:
    for line in (row or "").split("\n"):
      line = line.strip()
      if not line:
        continue
      if lines and is_title(line):
        yield "\n".join(lines)
        lines = []
      lines.append(line)
  if lines:
    yield "\n".join(lines)


def hub_file(source: TextSource, remote: fetch.RemoteFile, sha256: str, timeout: float) -> pathlib.Path:
  """`remote` of `source.repo` at `source.revision` through huggingface_hub's `hf_hub_download` (a
  dataset repository; the file lands in the Hugging Face cache, or is found there), then checked against
  the pinned size and SHA-256: a failed download or a file that is not the pinned one is a UserError (the
  mismatching copy is removed from the cache, so the next try fetches it again)."""
  import huggingface_hub  # pylint: disable=g-import-not-at-top
  from huggingface_hub import errors  # pylint: disable=g-import-not-at-top

  url = source.url(HF_DATASETS_URL, remote)
  try:
    path = pathlib.Path(
      huggingface_hub.hf_hub_download(
        source.repo, remote.path, repo_type="dataset", revision=source.revision, etag_timeout=timeout
      )
    )
  except (errors.LocalEntryNotFoundError, errors.OfflineModeIsEnabled):
    offline = huggingface_hub.constants.HF_HUB_OFFLINE
    raise UserError(
      f"{url}: download failed (not in the local Hugging Face cache {huggingface_hub.constants.HF_HUB_CACHE} "
      f"and {'HF_HUB_OFFLINE=1' if offline else 'the Hub cannot be reached'})"
    ) from None
  except (errors.HfHubHTTPError, errors.HFValidationError, OSError) as e:
    reason = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise UserError(f"{url}: download failed ({reason})") from None
  digest, size = fetch.file_digest(path)
  problem = None
  if remote.size is not None and size != remote.size:
    problem = f"{size} bytes, expected the pinned {remote.size}"
  elif digest.hexdigest() != sha256:
    problem = f"SHA-256 {digest.hexdigest()} does not match the pinned {sha256}"
  if problem:
    for stale in {path.resolve(), path}:
      stale.unlink(missing_ok=True)
    raise UserError(f"{url}: {problem} (removed from the Hugging Face cache)")
  return path


def _pyarrow():
  """(pyarrow, pyarrow.parquet); installed with tensorflow-datasets, imported only here."""
  try:
    import pyarrow  # pylint: disable=g-import-not-at-top
    import pyarrow.parquet  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise UserError("reading parquet needs pyarrow: pip install pyarrow") from None
  return pyarrow, pyarrow.parquet


def _parquet_rows(paths: list[pathlib.Path]) -> Iterator[str]:
  _, pq = _pyarrow()
  for path in paths:
    for batch in pq.ParquetFile(path).iter_batches(batch_size=8192, columns=["text"]):
      yield from batch.column(0).to_pylist()


def _check_parquet(source: TextSource, split: str, paths: list[pathlib.Path]) -> None:
  """Each file must be parquet with a string column `text`; the split's row count must match."""
  pa, pq = _pyarrow()
  rows = 0
  for path in paths:
    try:
      meta = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
      raise UserError(f"{path.name}: not a readable parquet file ({e})") from None
    field = meta.schema_arrow.get_field_index("text")
    if field < 0 or not pa.types.is_string(meta.schema_arrow.field(field).type):
      raise UserError(f"{path.name}: no string column 'text' (columns: {', '.join(meta.schema_arrow.names)})")
    rows += meta.metadata.num_rows
  expected = source.rows.get(split)
  if expected is not None and rows != expected:
    raise UserError(f"{source.name} {split}: {rows} rows in the parquet files, expected {expected}")


def _hashes(source: TextSource, overrides: dict[str, str]) -> dict[str, str]:
  """Remote path -> SHA-256 to check: the pinned values, plus --sha256 for the files that have none."""
  by_name = {pathlib.PurePosixPath(f.path).name: f for files in source.files.values() for f in files}
  by_path = {f.path: f for f in by_name.values()}
  hashes = {}
  for key, value in overrides.items():
    remote = by_path.get(key) or by_name.get(key)
    if remote is None:
      raise UserError(f"--sha256={key}=...: {source.name} has no file {key} (files: {', '.join(by_name)})")
    if not _HEX64.match(value.lower()):
      raise UserError(f"--sha256={key}={value}: not a SHA-256 (64 hex digits)")
    if remote.sha256 is not None and remote.sha256 != value.lower():
      raise UserError(f"--sha256={key}: differs from the pinned {remote.sha256}; the pinned value stands")
    hashes[remote.path] = value.lower()
  for remote in by_path.values():
    if remote.sha256 is not None:
      hashes[remote.path] = remote.sha256
    elif remote.path not in hashes:
      name = pathlib.PurePosixPath(remote.path).name
      raise UserError(
        f"{source.name}: no verified SHA-256 for {remote.path} at revision {source.revision[:12]}, so nothing "
        f"is downloaded; read it under 'Git LFS Details' at {source.page(remote)} and pass --sha256={name}=HEX"
      )
  return hashes


def download_text(
  corpus: str,
  data_dir,
  *,
  base_url: str | None = None,
  force: bool = False,
  sha256: dict[str, str] | None = None,
  timeout: float = 60.0,
  sources: dict[str, TextSource] | None = None,
  log=print,
) -> pathlib.Path:
  """Builds data_dir/text/<corpus>/ from its pinned, verified source files; returns the folder.

  An existing corpus (train.txt and valid.txt present) is kept unless `force`. `sha256` maps a file
  name (or repository path) to its SHA-256 for files that have no pinned value. `base_url`: a plain
  HTTPS mirror of the repository's paths; None (the default) fetches from the Hugging Face Hub through
  `huggingface_hub.hf_hub_download` (`hub_file`).
  """
  name = canonical_name(corpus)
  if sources is None and name == ENGLISH_MIX:
    if sha256:
      raise UserError("--sha256 is for unpinned files; every english_mix package is pinned")
    return english_mix.download(data_dir, base_url=base_url, force=force, timeout=timeout, log=log)
  sources = CORPORA if sources is None else sources
  source = sources.get(name)
  if source is None:
    known = downloadable() if sources is CORPORA else sorted(sources)
    raise UserError(
      f"unknown corpus {corpus!r}: downloadable are {', '.join(known)}; any other corpus is a folder "
      f"DATA_DIR/text/<name>/ with train.txt and valid.txt (documents separated by a blank line)"
    )
  hashes = _hashes(source, sha256 or {})  # before any network or file-system work
  target = pathlib.Path(data_dir) / "text" / name

  def fill(corpus_dir: pathlib.Path, staging: pathlib.Path) -> dict:
    record = {"corpus": name, "repository": source.repo, "revision": source.revision, "files": [], "documents": {}}
    for split in fetch.SPLITS:
      paths = []
      for remote in source.files[split]:
        url = source.url(base_url or HF_DATASETS_URL, remote)
        log(f"{url}: downloading ({'?' if remote.size is None else f'{remote.size / 1e6:.1f} MB'})")
        if base_url is None:  # the Hugging Face Hub itself: through huggingface_hub (its cache and retries)
          path = hub_file(source, remote, hashes[remote.path], timeout)
        else:  # a mirror of the same paths over plain HTTPS
          path = staging / pathlib.PurePosixPath(remote.path).name
          fetch.fetch_verified(url, path, remote, hashes[remote.path], timeout)
        paths.append(path)
        record["files"].append({"url": url, "bytes": path.stat().st_size, "sha256": hashes[remote.path]})
      _check_parquet(source, split, paths)
      count = fetch.write_documents(wikitext_documents(_parquet_rows(paths)), corpus_dir / f"{split}.txt")
      if count == 0:
        raise UserError(f"{source.name} {split}: no documents in the downloaded files")
      record["documents"][split] = count
      log(f"{target / f'{split}.txt'}: {count} documents")
    record["conversion"] = "one document per article (from a ' = Title = ' heading to the next), lines stripped"
    return record

  return fetch.install_corpus(data_dir, name, fill, force=force, log=log)


def parser():
  """`headspec data download text`'s options (its --help needs no data directory)."""
  parser = fetch.ArgumentParser(
    prog="headspec data download text", description="Fetch a public LM corpus into DATA_DIR/text/<corpus>/."
  )
  parser.add_argument("corpus", help=f"one of {', '.join(downloadable())}")
  parser.add_argument("--sha256", action="append", default=[], metavar="FILE=HEX", help="for unpinned files")
  parser.add_argument("--base-url", default=None, help="another host serving the same paths (default: the source's)")
  parser.add_argument("--force", action="store_true", help="replace an existing corpus folder")
  return parser


def main_download_text(args: list[str], data_dir) -> pathlib.Path:
  """CLI entry: `headspec data download text <corpus> [--force] [--sha256 FILE=HEX] [--base-url URL]`."""
  options = parser().parse_args(args)
  overrides = {}
  for item in options.sha256:
    key, sep, value = item.partition("=")
    if not sep:
      raise UserError(f"--sha256={item}: use --sha256=FILE=HEX")
    overrides[key.strip()] = value.strip()
  return download_text(
    options.corpus,
    data_dir,
    base_url=options.base_url,
    force=options.force,
    sha256=overrides,
    log=lambda line: print(line, file=sys.stderr),
  )
