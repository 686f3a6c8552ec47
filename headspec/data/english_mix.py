"""english_mix, the development corpus, rebuilt from seven NLTK data packages.

`headspec data download text english_mix` fetches the packages below (the zip files that
`nltk.download` fetches, at one pinned commit of the nltk_data repository), checks each against its
pinned size and SHA-256, and writes DATA_DIR/text/english_mix/{train,valid}.txt: 2,831 documents,
about 4.2M words, byte-identical to the development corpus (both files' SHA-256 are pinned too, and
checked after the build). NLTK itself is not needed: the packages are plain text in zip files.

Documents, in this order (one per file; lines of a document joined by '\\n', documents by a blank line):
- Brown (ca01 … cr09, the 500 tagged files): one sentence a line, the words without their tags
  (`word/tag` → `word`, split at the last '/').
- ABC (rural, science), movie reviews (neg, then pos), State of the Union, inaugural addresses, web text,
  and the raw Penn Treebank sample (wsj_0001 … wsj_0199, `.START` removed): the file's non-blank lines
  with runs of whitespace made one space.
Files are read as Latin-1 (the development corpus was built that way; so a few curly quotes of the newer
addresses appear as Latin-1 mojibake, as they do there). The validation split is the 56 documents in
`VALID` (the development corpus's split, about 2 % of the documents); the rest, in order, are train.

The packages carry their own licences (research use; see each package's README): use the corpus for
experiments and tests, not for redistribution.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import re
import zipfile
from collections.abc import Iterator

from headspec.data import fetch
from headspec.errors import UserError

NAME = "english_mix"
# nltk/nltk_data's gh-pages branch at this commit (2024) serves the packages nltk.download fetches.
REVISION = "5db857e6f7df11eabb5e5665836db9ec8df07e28"
BASE_URL = "https://raw.githubusercontent.com/nltk/nltk_data"


@dataclasses.dataclass(frozen=True)
class Package:
  """One NLTK data package: packages/corpora/<name>.zip, its byte size and SHA-256."""

  name: str
  size: int
  sha256: str

  @property
  def path(self) -> str:
    return f"packages/corpora/{self.name}.zip"


# In document order. Sizes and SHA-256 hashed from the files at REVISION.
PACKAGES = (
  Package("brown", 3_314_357, "9b275f9b3b95d7bd66ccfb7cd259f445a13bbe5d1f4107aba09fd3e8364bafa6"),
  Package("abc", 1_487_851, "129bb6001beb828049a90a59b7dd3c2f0594a47012e48fc5177dfae38e658565"),
  Package("movie_reviews", 4_004_848, "a41211ae685019137410268134db6a1a14428c89b671eb83056151a878539008"),
  Package("state_union", 808_757, "366c1dc82b2abf896f42b2ec50ba802a0141a29f75d29ca48a7a243ce5bfbe8d"),
  Package("inaugural", 346_476, "7c5fb5793e31fbeae12bf1aa0ffda5336468f07cedb50654c6d31ca384e2046b"),
  Package("webtext", 646_297, "9e32dbae4879464b8f420a0dc721855bb26167b720d7695588d2ca2aeadf501a"),
  Package("treebank", 1_740_034, "9da92d76c3666cfb6cddeaed0f7e86b344cce0f0928a286d439e555f19c37399"),
)

# The built files: the development corpus's SHA-256 (the build is checked against them).
OUTPUT_SHA256 = {
  "train": "c4584b97fe010ddbb938a10de3689cb2ed8ff7f77bdf11adda4dd9cecff33bc0",
  "valid": "f1f7640e276893d37ce5e69c565f0a356ed754d196eb1e3bd2a719d7ff0cde60",
}

# The validation documents, by their path in the packages' zip files.
VALID = frozenset(
  [f"brown/{f}" for f in "ca05 ce16 ce21 ce22 ce23 cg02 cg71 ch03 ch05 ch08 cj37 ck07 cl01 cl09".split()]
  + [
    f"movie_reviews/neg/{f}.txt"
    for f in (
      "cv055_8926 cv087_2145 cv133_18065 cv135_12506 cv197_29271 cv259_11827 cv381_21673 cv416_12048 "
      "cv465_23401 cv550_23226 cv599_22197 cv607_8235 cv705_11973 cv748_14044 cv865_28796 cv896_17819 "
      "cv941_10718 cv948_25870 cv951_11816 cv990_12443"
    ).split()
  ]
  + [
    f"movie_reviews/pos/{f}.txt"
    for f in (
      "cv038_9749 cv090_0042 cv112_11193 cv145_11472 cv154_9328 cv157_29372 cv376_19435 cv662_13320 "
      "cv725_10103 cv752_24155 cv831_14689 cv945_12160 cv972_26417"
    ).split()
  ]
  + ["state_union/1972-Nixon.txt", "state_union/1985-Reagan.txt"]
  + [f"treebank/raw/wsj_{n:04d}" for n in (5, 86, 136, 156, 163, 178, 191)]
)

_BROWN_FILE = re.compile(r"brown/c[a-r]\d\d")
_TREEBANK_RAW = re.compile(r"treebank/raw/wsj_\d{4}")


def url(package: Package, base_url: str = BASE_URL) -> str:
  return f"{base_url.rstrip('/')}/{REVISION}/{package.path}"


def _lines(text: str, tagged: bool = False) -> str:
  """The non-blank lines, words joined by one space; `tagged` (Brown): each `word/tag` as its word."""
  word = (lambda t: t.rsplit("/", 1)[0]) if tagged else (lambda t: t)
  return "\n".join(" ".join(map(word, line.split())) for line in text.splitlines() if line.strip())


def _members(package: str, archive: zipfile.ZipFile) -> list[str]:
  """The package's document files, sorted by path (which is the documents' order)."""
  names = sorted(n for n in archive.namelist() if not n.endswith("/"))
  if package == "brown":
    return [n for n in names if _BROWN_FILE.fullmatch(n)]
  if package == "treebank":
    return [n for n in names if _TREEBANK_RAW.fullmatch(n)]
  return [n for n in names if n.endswith(".txt") and n.startswith(f"{package}/")]


def documents(package: str, data: bytes) -> Iterator[tuple[str, str]]:
  """(path in the zip, document) for one package's zip file, in order."""
  with zipfile.ZipFile(io.BytesIO(data)) as archive:
    for name in _members(package, archive):
      text = archive.read(name).decode("latin-1")
      if package == "treebank":
        text = text.replace(".START", "")
      yield name, _lines(text, tagged=package == "brown")


def split_documents(zips: dict[str, bytes], packages: tuple[Package, ...] = PACKAGES) -> dict[str, list[str]]:
  """{'train': [...], 'valid': [...]}: every package's documents in `packages` order, split by VALID."""
  out = {"train": [], "valid": []}
  for package in packages:
    for name, doc in documents(package.name, zips[package.name]):
      out["valid" if name in VALID else "train"].append(doc)
  return out


def download(
  data_dir,
  *,
  base_url: str | None = None,
  force: bool = False,
  timeout: float = 60.0,
  packages: tuple[Package, ...] = PACKAGES,
  output_sha256: dict[str, str] | None = None,
  log=print,
):
  """Fetches and checks every package, builds DATA_DIR/text/english_mix/ and checks the built files
  against `output_sha256` (the development corpus's) before it is moved into place; returns the folder.
  `packages` and `output_sha256` are for tests (a small corpus served locally)."""
  base_url = base_url or BASE_URL
  output_sha256 = OUTPUT_SHA256 if output_sha256 is None else output_sha256

  def fill(corpus_dir, staging) -> dict:
    zips, files = {}, []
    for package in packages:
      where = url(package, base_url)
      log(f"{where}: downloading ({package.size / 1e6:.1f} MB)")
      path = staging / f"{package.name}.zip"
      remote = fetch.RemoteFile(package.path, package.size, package.sha256)
      fetch.fetch_verified(where, path, remote, package.sha256, timeout)
      zips[package.name] = path.read_bytes()
      files.append({"url": where, "bytes": package.size, "sha256": package.sha256})
    counts = {}
    for split, docs in split_documents(zips, packages).items():
      path = corpus_dir / f"{split}.txt"
      counts[split] = fetch.write_documents(docs, path)
      digest = hashlib.sha256(path.read_bytes()).hexdigest()
      if digest != output_sha256[split]:
        raise UserError(
          f"english_mix {split}.txt: built with SHA-256 {digest}, not the development corpus's "
          f"{output_sha256[split]}; nothing written"
        )
      log(f"english_mix {split}.txt: {counts[split]} documents, SHA-256 as pinned")
    return {
      "corpus": NAME,
      "repository": "nltk/nltk_data",
      "revision": REVISION,
      "files": files,
      "documents": counts,
      "sha256": {split: output_sha256[split] for split in counts},
      "conversion": "headspec/data/english_mix.py: one document per file, the development corpus's split",
    }

  return fetch.install_corpus(data_dir, NAME, fill, force=force, log=log)
