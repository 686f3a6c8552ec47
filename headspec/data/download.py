"""Fetch official UD release files from the UniversalDependencies GitHub repositories.

`headspec data download ud <treebank> [--repo=UD_<Lang>-<Name>] [--release=r2.16] [--splits=dev,test]
[--force]` writes data_dir/ud/<treebank>/<treebank>-ud-{train,dev,test}.conllu. Each file goes to a
hidden `.part.tmp-<pid>` file first, is validated with `read_conllu` and against its pin, and only then moved into
place, so a broken download never looks like data. Standard-library urllib only: three plain GET
requests need no client.

The default release, r2.16 (2025-05-15), is the one the development data matches byte for byte (EWT:
12,544 / 2,001 / 2,077 sentences). Every file of that release from the known repositories is pinned
(`PINS`): a file that is not the released one is refused and nothing is written. The name is checked
first (a UD code such as en_ewt), so nothing is written outside DATA_DIR/ud/<treebank>/. `headspec data
download text` (headspec/data/text_download.py) fetches language-model corpora the same way.
"""

import argparse
import dataclasses
import hashlib
import os
import pathlib
import re
import sys
import urllib.error
import urllib.request

from headspec.data import treebank as treebank_lib
from headspec.data.fetch import ArgumentParser
from headspec.errors import UserError
from headspec.io import remote

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

# A UD treebank code (`<language>_<name>`, lower case), a repository and a git tag or branch: nothing
# that could leave DATA_DIR/ud/ or the repository's folder on the server.
_TREEBANK = re.compile(r"^[a-z]{2,3}_[a-z0-9]+$")
_REPO = re.compile(r"^UD_[A-Za-z_]+-[A-Za-z0-9]+$")
_RELEASE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclasses.dataclass(frozen=True)
class Pin:
  """What one file of DEFAULT_RELEASE must be: its sentence count (the release's stats.xml) and its
  git blob id (SHA-1 of `blob <size>\\0<bytes>`, as the release tag's tree lists it); SHA-256 where we
  hashed the released bytes ourselves (None where only the blob id could be checked)."""

  sentences: int
  git_blob: str
  sha256: str | None = None


# r2.16 (tag of every repository below, 2025-05-15). Blob ids and sentence counts: `git ls-tree r2.16` and
# stats.xml of each repository at that tag; SHA-256: the released files' bytes (blob ids checked first).
# en_ewt's three files and en_gum's dev and test are byte-identical to the development copy
# (HEADSPEC_DATA_DIR). en_pud has only a test split.
PINS: dict[tuple[str, str], Pin] = {
  ("en_ewt", "train"): Pin(
    12544,
    "34731d23bafeeff233fdcee18ffc0254b1aa0e28",
    "3fb78e2b55482c8ee00caa653af436c88c9e5bc9a73ce26e4ae3ddc79d2b7e7b",
  ),
  ("en_ewt", "dev"): Pin(
    2001, "a994b6990643429070ecc6e236d26ad6a04bfefb", "531a54ff90d6ab12201c5a50c3e78e6ddac4de69abc4bce5d275d3cd29efe2b6"
  ),
  ("en_ewt", "test"): Pin(
    2077, "c59667960ae967636606f47bc35f132a5557ad39", "e266e515a0a7547657ed3d90d9ba46487d6bd251f27ad4269d4e8a427c8555cd"
  ),
  ("en_gum", "train"): Pin(10224, "e159dc6ad8c6cc4d0639fa5062ddf00cb4f14349"),
  ("en_gum", "dev"): Pin(
    1575, "c302cf2a8dee9604b33b6f215a0c23efe6fc5971", "581997015a2d878ad49619032d265a9753e1b6b03d75ca18b04a00bb9ee8991d"
  ),
  ("en_gum", "test"): Pin(
    1464, "d2efc22fa870b39d17475fefca631e2ba726b523", "fe95c0e744f81cdf2a307ce522604ecc05cd359c7c6d1abaa3a46c85d024f34c"
  ),
  ("en_lines", "train"): Pin(
    3457, "c5e8c4c02a6bef6ffb59a0cbe0f417ed274eb1fc", "76fbee3ee9b5d3fc22fe8f7858619978341f488f2c8e76fdfe4042b710a3e627"
  ),
  ("en_lines", "dev"): Pin(
    1118, "200ad6f3656ef13563748cc041e5df4611db8b8a", "169b6712034f14d7cd12b30d13d1e56b61329c9663f2c889212deaaab467e89c"
  ),
  ("en_lines", "test"): Pin(
    1121, "4c3bbcd8f9e13bdf1e22cef09cbade5256dbb4e8", "3ff101e040676a9a59a0c241696b003fe0e17538548b4d9b46461aa1f25f9e55"
  ),
  ("en_partut", "train"): Pin(
    1781, "4df86fb465bfc4d0036903a919e05cf8b01396b4", "d7f3fa31fd8a6536e5c1ddcf37911621e77b6d37e20e73dbad1f8fc65e56ef84"
  ),
  ("en_partut", "dev"): Pin(
    156, "6528d5e371923fe401d99f1dcfad894c25a20080", "f52fe2eeedcbb916516a7cabaeda89a618e3832ade19750e30b4f514865cdb86"
  ),
  ("en_partut", "test"): Pin(
    153, "a0712dd67acb6e47b4e21a947a9db70cdb42aea7", "fdc9c5a5fd95f9b426b98cbe43fecad011cd4c33f9bf211d4673d060ee9d0e96"
  ),
  ("en_pud", "test"): Pin(
    1000, "af09b259b8ca88482423e3e7bd24ef094d4483fa", "8c23ea47522ca67cca7d1783e536aaa11e01a4b28465b9c40b7d222bf64863d2"
  ),
  ("de_gsd", "train"): Pin(13813, "9d2f5124449fc1b4ca34be17857c16e84a36bac2"),
  ("de_gsd", "dev"): Pin(
    799, "27d148550b267edfbfbf832759d6dde3b6d4488c", "00431f2624cbbf66796c097a9303bbc8f8e8ca88ef35c4c5664aa396b2d674c9"
  ),
  ("de_gsd", "test"): Pin(
    977, "93e8f95c5cdb44facb7a051525168edc38df4724", "bceb8e867ba3ee7f1449d44fb31538d63a514f07e6763e7d9a5ffe794407bed4"
  ),
  ("fr_gsd", "train"): Pin(14450, "280d3b6dd727c0c4083fa20af4ef194b1c8f9242"),
  ("fr_gsd", "dev"): Pin(
    1476, "01101b0087171ca6d27f87d24f993af286adf750", "3e7531b645e5bd6fe37bb619cdd8292e87f5937e64cd8627b4094324eb830e6b"
  ),
  ("fr_gsd", "test"): Pin(
    416, "ddb238ebd54508714a5d975fb5f29de5fcc580d6", "5d1743c7a9ce2908943d4a430ed9a77755e2a8d7e32d42ee0f1d6a0b528f0be8"
  ),
  ("es_ancora", "train"): Pin(14287, "f72bc2ea9fe03c4ff87cb7e5063a96bccc987884"),
  ("es_ancora", "dev"): Pin(1654, "7097d927993061a69dff2c3f51f0dae4d5ca616e"),
  ("es_ancora", "test"): Pin(1721, "c9b9e15324e24845684135cd4ab53e8b88d408b2"),
  ("zh_gsd", "train"): Pin(3997, "d6b3581ea606424e295afc20bd3917c06efddd90"),
  ("zh_gsd", "dev"): Pin(
    500, "138124a9029ce76b79afda4879c51ca31164e36f", "c47229001ede78b41a3304570689aedc841d3e5465082e19f418ecb29418733d"
  ),
  ("zh_gsd", "test"): Pin(
    500, "9b83830f9d76543593a4905165875bccbac50a1b", "b4984c1d8434c866c3b4e32906c941db274942ed0cde6af783939cfbeca68c99"
  ),
  ("ja_gsd", "train"): Pin(7050, "ccbd81cd9319b99f71db9cf092408f2fa407976f"),
  ("ja_gsd", "dev"): Pin(
    507, "4d620ec9079585dfbcdbffa31d0b0ce996b296cf", "1d53dd829cbb5ee1604746b2b2cf282ecf0922e6028dc95f9d19b0634c9625e2"
  ),
  ("ja_gsd", "test"): Pin(
    543, "880d599a2971cae417cfd2ba6404114653c9c550", "980d24fb9b245880454c088938b8417c13066b169b4f9246a060e2ef8be0c2ac"
  ),
}


def _check_names(treebank: str, repo: str | None, release: str) -> str:
  """The repository to fetch from; one line for a name that is not a UD treebank code, repository or tag."""
  if not _TREEBANK.match(treebank):
    raise UserError(
      f"treebank {treebank!r}: not a UD treebank code like en_ewt (lower-case <language>_<name>; known: "
      f"{', '.join(sorted(REPOSITORIES))})"
    )
  if repo is not None and not _REPO.match(repo):
    raise UserError(f"--repo={repo}: not a UD repository name like UD_English-EWT")
  if not _RELEASE.match(release):
    raise UserError(f"--release={release}: not a git tag or branch name like {DEFAULT_RELEASE}")
  repo = repo or REPOSITORIES.get(treebank)
  if repo is None:
    raise UserError(
      f"unknown treebank {treebank!r}: pass its repository, e.g. "
      f"--repo=UD_<Language>-<Name> (known: {', '.join(sorted(REPOSITORIES))})"
    )
  return repo


def _fetch(url, part: pathlib.Path, timeout):
  """Downloads url into `part`; returns (SHA-256, git blob id) of its bytes, or None on 404."""
  digest, blob, size = hashlib.sha256(), hashlib.sha1(usedforsecurity=False), 0
  try:
    with open(part, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
      while chunk := response.read(1 << 20):
        out.write(chunk)
        digest.update(chunk)
        size += len(chunk)
  except urllib.error.HTTPError as e:
    part.unlink(missing_ok=True)
    if e.code == 404:
      return None
    raise UserError(f"{url}: HTTP {e.code} {e.reason}") from None
  except (urllib.error.URLError, OSError) as e:
    part.unlink(missing_ok=True)
    reason = getattr(e, "reason", e)
    raise UserError(f"{url}: download failed ({reason})") from None
  blob.update(f"blob {size}\0".encode())
  blob.update(part.read_bytes())
  return digest.hexdigest(), blob.hexdigest()


def _verify(url, pin: Pin | None, sha256: str, git_blob: str, sentences: int) -> None:
  """One line if the file is not the pinned one (by SHA-256 where pinned, else its git blob id)."""
  if pin is None:
    return
  if pin.sha256 is not None and sha256 != pin.sha256:
    raise UserError(f"{url}: SHA-256 {sha256} does not match the pinned {pin.sha256}; not the released file")
  if git_blob != pin.git_blob:
    raise UserError(f"{url}: git blob {git_blob} does not match the pinned {pin.git_blob}; not the released file")
  if sentences != pin.sentences:
    raise UserError(f"{url}: {sentences} sentences, the release has {pin.sentences}; not the released file")


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
  files are kept unless `force`. A file of DEFAULT_RELEASE from its known repository must match its
  pin (`PINS`: SHA-256 or git blob id, and sentence count); another release or repository is checked as
  CoNLL-U only, with a notice. Files are left readable (0644). Returns the paths now present.
  """
  unknown = [s for s in splits if s not in treebank_lib.SPLITS]
  if unknown or not splits:
    raise UserError(f"splits {','.join(splits)!r}: choose from {', '.join(treebank_lib.SPLITS)}")
  repo = _check_names(treebank, repo, release)
  pinned = release == DEFAULT_RELEASE and repo == REPOSITORIES.get(treebank)
  folder = pathlib.Path(data_dir) / "ud" / treebank
  folder.mkdir(parents=True, exist_ok=True)
  paths = []
  for split in splits:
    target = treebank_lib.split_path(data_dir, treebank, split)
    remote.remove_stale_temps(folder)  # a killed download's .<name>.part.tmp-<pid>; a live one's is kept
    for stale in folder.glob(f".{target.name}.*part"):  # the pid-less name of earlier versions
      stale.unlink(missing_ok=True)
    if target.exists() and not force:
      log(f"{target} exists; kept (use --force to replace it)")
      paths.append(target)
      continue
    url = f"{base_url.rstrip('/')}/{repo}/{release}/{target.name}"
    part = folder / f".{target.name}.part.tmp-{os.getpid()}"  # its own: two downloads at once write two
    fetched = _fetch(url, part, timeout)
    if fetched is None:
      log(f"{url}: not found (404); {treebank} has no {split} split in {release}, skipped")
      continue
    try:
      sentences = treebank_lib.read_conllu(part)
    except UserError as e:
      part.unlink()
      raise UserError(f"{url}: downloaded file is not valid CoNLL-U: {e}") from None
    try:
      _verify(url, PINS.get((treebank, split)) if pinned else None, *fetched, len(sentences))
    except UserError:
      part.unlink()
      raise
    os.chmod(part, 0o644)
    os.replace(part, target)
    check = (
      "as pinned" if pinned and (treebank, split) in PINS else f"not pinned ({repo} {release}): CoNLL-U checked only"
    )
    log(f"{target}: {len(sentences)} sentences, {check}")
    paths.append(target)
  if not paths:
    raise UserError(
      f"no {treebank} files found at {base_url}/{repo}/{release}/ (check the repository name and release)"
    )
  return paths


def parser() -> argparse.ArgumentParser:
  """`headspec data download ud`'s options (its --help needs no data directory)."""
  parser = ArgumentParser(
    prog="headspec data download ud", description="Fetch a UD treebank into DATA_DIR/ud/<treebank>/."
  )
  parser.add_argument("treebank", help=f"UD code, e.g. en_ewt (known: {', '.join(sorted(REPOSITORIES))})")
  parser.add_argument("--repo", default=None, help="GitHub repository, e.g. UD_English-EWT")
  parser.add_argument("--release", default=DEFAULT_RELEASE, help="git tag or branch (only the default is pinned)")
  parser.add_argument("--splits", default=",".join(treebank_lib.SPLITS), help="comma-separated, e.g. dev,test")
  parser.add_argument("--base-url", default=DEFAULT_BASE_URL)
  parser.add_argument("--force", action="store_true", help="replace existing files")
  return parser


def main_download(args: list[str], data_dir) -> list[pathlib.Path]:
  """CLI entry: `headspec data download ud <treebank> [--repo R] [--release R] [--splits S] [--force]`."""
  options = parser().parse_args(args)
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
