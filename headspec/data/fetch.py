"""What every downloader of headspec's data shares: a file fetched and checked against its pinned size and
SHA-256 (`fetch_verified`), a text corpus written (`write_documents`) and installed whole or not at all
(`install_corpus`), and an argument parser whose errors are one line. The corpora's own rules live in
headspec/data/text_download.py (parquet sources, the `headspec data download text` command) and
headspec/data/english_mix.py (zip sources); treebanks in headspec/data/download.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import http.client
import json
import os
import pathlib
import shutil
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterable

from headspec.errors import UserError
from headspec.io.remote import remove_stale_temps

SPLITS = ("train", "valid")  # headspec's corpus splits (text_tfds.SPLITS)
_CHUNK = 1 << 20


class ArgumentParser(argparse.ArgumentParser):
  """argparse whose errors are one-line UserErrors (it would print usage and exit otherwise)."""

  def error(self, message):
    raise UserError(f"{self.prog}: {message}")


@dataclasses.dataclass(frozen=True)
class RemoteFile:
  """One file of a dataset repository: its path there, byte size and SHA-256 (None: not verified)."""

  path: str
  size: int | None
  sha256: str | None


def file_digest(path) -> tuple[hashlib._Hash, int]:
  """(SHA-256 digest, byte size) of a local file, read in chunks."""
  digest, size = hashlib.sha256(), 0
  with open(path, "rb") as f:
    while chunk := f.read(_CHUNK):
      digest.update(chunk)
      size += len(chunk)
  return digest, size


def fetch_verified(url: str, dest: pathlib.Path, remote: RemoteFile, sha256: str, timeout: float) -> None:
  """Streams url into dest, hashing as it goes; a short, oversized or altered file is a UserError."""
  request = urllib.request.Request(url, headers={"User-Agent": "headspec-data-download"})
  digest, size, length = hashlib.sha256(), 0, None
  try:
    with urllib.request.urlopen(request, timeout=timeout) as response, open(dest, "wb") as out:
      length = response.headers.get("Content-Length")
      while chunk := response.read(_CHUNK):
        out.write(chunk)
        digest.update(chunk)
        size += len(chunk)
        if remote.size is not None and size > remote.size:
          raise UserError(f"{url}: more than the pinned {remote.size} bytes; not the pinned file")
  except urllib.error.HTTPError as e:
    raise UserError(f"{url}: HTTP {e.code} {e.reason}") from None
  except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
    reason = getattr(e, "reason", None) or e.__class__.__name__
    raise UserError(f"{url}: download failed ({reason})") from None
  if length is not None and length.isascii() and length.isdigit() and size != int(length):
    raise UserError(f"{url}: connection closed after {size} of {length} bytes (interrupted download)")
  if remote.size is not None and size != remote.size:
    raise UserError(f"{url}: {size} bytes, expected the pinned {remote.size}")
  if digest.hexdigest() != sha256:
    raise UserError(f"{url}: SHA-256 {digest.hexdigest()} does not match the pinned {sha256}")


def write_documents(documents: Iterable[str], path: pathlib.Path) -> int:
  count = 0
  with open(path, "w", encoding="utf-8") as out:
    for count, doc in enumerate(documents, start=1):
      if count > 1:
        out.write("\n")
      out.write(doc + "\n")
  return count


def install_corpus(data_dir, name: str, fill, *, force: bool = False, log=print) -> pathlib.Path:
  """Builds data_dir/text/<name>/ through `fill(corpus_dir, staging) -> record` (it writes train.txt and
  valid.txt into corpus_dir, may keep downloads in staging, and returns what SOURCE.json records), all in
  a hidden `.<name>.*.partial.tmp-<pid>` folder that replaces the corpus only when complete. An existing corpus
  (train.txt and valid.txt present) is kept unless `force`."""
  root = pathlib.Path(data_dir) / "text"
  target = root / name
  if target.exists() and not force:
    if all((target / f"{s}.txt").is_file() for s in SPLITS):
      log(f"{target} exists; kept (use --force to replace it)")
      return target
    raise UserError(f"{target} exists but lacks train.txt or valid.txt; --force replaces it")
  root.mkdir(parents=True, exist_ok=True)
  remove_stale_temps(root)  # a killed run's .<name>.*.partial.tmp-<pid>; a live one's is kept
  for stale in root.glob(f".{name}.*.partial"):  # the pid-less name of earlier versions
    shutil.rmtree(stale, ignore_errors=True)
  staging = pathlib.Path(tempfile.mkdtemp(dir=root, prefix=f".{name}.", suffix=f".partial.tmp-{os.getpid()}"))
  try:
    corpus_dir = staging / name
    corpus_dir.mkdir()
    record = fill(corpus_dir, staging)
    (corpus_dir / "SOURCE.json").write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    if target.exists():  # --force: swap, so that the old corpus stays whole until the new one is in place
      old = staging / ".replaced"
      os.replace(target, old)
      try:
        os.replace(corpus_dir, target)
      except OSError:
        os.replace(old, target)  # put the old corpus back before the staging folder is removed
        raise
    else:
      os.replace(corpus_dir, target)
  finally:
    shutil.rmtree(staging, ignore_errors=True)
  return target
