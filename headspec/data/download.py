"""Fetch official UD release files from the UniversalDependencies GitHub repositories.

`headspec data download ud <treebank> [--repo=UD_<Lang>-<Name>] [--release=r2.16] [--splits=dev,test]
[--force]` writes data_dir/ud/<treebank>/<treebank>-ud-{train,dev,test}.conllu. Each file goes to a
temporary file first, is validated with `read_conllu`, and only then moved into place, so a broken
download never looks like data. Standard-library urllib only: three plain GET requests need no client.

The default release, r2.16 (2025-05-15), is the one the development data matches: its EWT has
12,544 / 2,001 / 2,077 sentences, as the development copy (and the tests) do. `headspec data download
text` (headspec/data/text_download.py) fetches language-model corpora the same way.
"""

import argparse
import os
import pathlib
import sys
import tempfile
import urllib.error
import urllib.request

from headspec.data import treebank as treebank_lib
from headspec.errors import UserError

DEFAULT_RELEASE = "r2.16"
DEFAULT_BASE_URL = "https://raw.githubusercontent.com/UniversalDependencies"

# UD treebank code -> GitHub repository. Others: pass repo="UD_<Language>-<Name>".
REPOSITORIES = {
  "en_ewt": "UD_English-EWT",
  "en_gum": "UD_English-GUM",
  "en_lines": "UD_English-LinES",
  "en_partut": "UD_English-ParTUT",
  "en_pud": "UD_English-PUD",
  "de_gsd": "UD_German-GSD",
  "fr_gsd": "UD_French-GSD",
  "es_ancora": "UD_Spanish-AnCora",
  "zh_gsd": "UD_Chinese-GSD",
  "ja_gsd": "UD_Japanese-GSD",
}


def _fetch(url, target, timeout):
  """Downloads url into target's folder as a temporary file; returns its path, or None on 404."""
  fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
  try:
    with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
      while chunk := response.read(1 << 20):
        out.write(chunk)
  except urllib.error.HTTPError as e:
    os.unlink(tmp)
    if e.code == 404:
      return None
    raise UserError(f"{url}: HTTP {e.code} {e.reason}") from None
  except (urllib.error.URLError, OSError) as e:
    os.unlink(tmp)
    reason = getattr(e, "reason", e)
    raise UserError(f"{url}: download failed ({reason})") from None
  return pathlib.Path(tmp)


def download_ud(
  treebank: str,
  data_dir,
  *,
  repo: str | None = None,
  release: str = DEFAULT_RELEASE,
  base_url: str = DEFAULT_BASE_URL,
  splits=treebank_lib.SPLITS,
  force: bool = False,
  timeout: float = 60.0,
  log=print,
) -> list[pathlib.Path]:
  """Fetches <base_url>/<repo>/<release>/<treebank>-ud-<split>.conllu for each of `splits`.

  Splits the server lacks (404) are skipped with a notice; none at all is an error. Existing
  files are kept unless `force`. Returns the paths now present for the splits found.
  """
  unknown = [s for s in splits if s not in treebank_lib.SPLITS]
  if unknown or not splits:
    raise UserError(f"splits {','.join(splits)!r}: choose from {', '.join(treebank_lib.SPLITS)}")
  repo = repo or REPOSITORIES.get(treebank)
  if repo is None:
    raise UserError(
      f"unknown treebank {treebank!r}: pass its repository, e.g. "
      f"--repo=UD_<Language>-<Name> (known: {', '.join(sorted(REPOSITORIES))})"
    )
  folder = pathlib.Path(data_dir) / "ud" / treebank
  folder.mkdir(parents=True, exist_ok=True)
  paths = []
  for split in splits:
    target = treebank_lib.split_path(data_dir, treebank, split)
    if target.exists() and not force:
      log(f"{target} exists; kept (use --force to replace it)")
      paths.append(target)
      continue
    url = f"{base_url.rstrip('/')}/{repo}/{release}/{target.name}"
    tmp = _fetch(url, target, timeout)
    if tmp is None:
      log(f"{url}: not found (404); {treebank} has no {split} split in {release}, skipped")
      continue
    try:
      sentences = treebank_lib.read_conllu(tmp)
    except UserError as e:
      os.unlink(tmp)
      raise UserError(f"{url}: downloaded file is not valid CoNLL-U: {e}") from None
    os.replace(tmp, target)
    log(f"{target}: {len(sentences)} sentences")
    paths.append(target)
  if not paths:
    raise UserError(
      f"no {treebank} files found at {base_url}/{repo}/{release}/ (check the repository name and release)"
    )
  return paths


class _ArgumentParser(argparse.ArgumentParser):
  """argparse whose errors are one-line UserErrors (it would print usage and exit otherwise)."""

  def error(self, message):
    raise UserError(f"{self.prog}: {message}")


def main_download(args: list[str], data_dir) -> list[pathlib.Path]:
  """CLI entry: `headspec data download ud <treebank> [--repo R] [--release R] [--splits S] [--force]`."""
  parser = _ArgumentParser(
    prog="headspec data download ud", description="Fetch a UD treebank into DATA_DIR/ud/<treebank>/."
  )
  parser.add_argument("treebank", help="UD code, e.g. en_ewt")
  parser.add_argument("--repo", default=None, help="GitHub repository, e.g. UD_English-EWT")
  parser.add_argument("--release", default=DEFAULT_RELEASE, help="git tag or branch")
  parser.add_argument("--splits", default=",".join(treebank_lib.SPLITS), help="comma-separated, e.g. dev,test")
  parser.add_argument("--base-url", default=DEFAULT_BASE_URL)
  parser.add_argument("--force", action="store_true", help="replace existing files")
  options = parser.parse_args(args)
  return download_ud(
    options.treebank,
    data_dir,
    repo=options.repo,
    release=options.release,
    base_url=options.base_url,
    splits=tuple(s.strip() for s in options.splits.split(",") if s.strip()),
    force=options.force,
    log=lambda line: print(line, file=sys.stderr),
  )
