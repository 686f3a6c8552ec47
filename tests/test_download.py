"""Downloads against a local http.server on 127.0.0.1: UD treebanks (404 splits skipped, validation, no
overwrite) and text corpora (pinned SHA-256, checksum mismatch, interrupted download, atomic folder)."""

import dataclasses
import hashlib
import http.server
import json
import re
import threading

import pytest

from headspec.cli import main as cli
from headspec.data import download, fetch, synthetic, text_download, text_tfds, treebank
from headspec.errors import UserError


@pytest.fixture(autouse=True)
def _unpinned(monkeypatch):
  """These tests serve synthetic files under real treebank names; pins: tests/test_inputs_from_outside.py."""
  monkeypatch.setattr(download, "PINS", {})


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  """A small valid treebank to serve: synthetic dev and test files."""
  out = synthetic.write_synthetic(
    tmp_path_factory.mktemp("src"), seed=2, num_train=5, num_dev=7, num_test=9, num_text_sentences=5
  )
  return out / "ud" / "synthetic"


def _serve(root, repo, release, files):
  folder = root / repo / release
  folder.mkdir(parents=True)
  for name, data in files.items():
    (folder / name).write_bytes(data)


def test_download_skips_missing_split(server, source, tmp_path):
  base_url, root = server
  dev = (source / "synthetic-ud-dev.conllu").read_bytes()
  test = (source / "synthetic-ud-test.conllu").read_bytes()
  _serve(root, "UD_English-EWT", "r2.16", {"en_ewt-ud-dev.conllu": dev, "en_ewt-ud-test.conllu": test})
  notices = []
  data_dir = tmp_path / "data"
  paths = download.download_ud("en_ewt", data_dir, base_url=base_url, log=notices.append)
  folder = data_dir / "ud" / "en_ewt"
  assert paths == [folder / "en_ewt-ud-dev.conllu", folder / "en_ewt-ud-test.conllu"]
  assert paths[0].read_bytes() == dev and paths[1].read_bytes() == test
  assert sorted(p.name for p in folder.iterdir()) == ["en_ewt-ud-dev.conllu", "en_ewt-ud-test.conllu"]
  assert any("en_ewt-ud-train.conllu: not found (404)" in n for n in notices)
  assert treebank.available_splits(data_dir, "en_ewt") == ["dev", "test"]
  assert len(treebank.load_split(data_dir, "en_ewt", "test")) == 9


def test_no_overwrite_unless_forced(server, source, tmp_path):
  base_url, root = server
  dev = (source / "synthetic-ud-dev.conllu").read_bytes()
  _serve(root, "UD_English-GUM", "r2.16", {"en_gum-ud-dev.conllu": dev})
  target = tmp_path / "ud" / "en_gum" / "en_gum-ud-dev.conllu"
  target.parent.mkdir(parents=True)
  mine = (source / "synthetic-ud-test.conllu").read_bytes()
  target.write_bytes(mine)
  download.download_ud("en_gum", tmp_path, base_url=base_url, log=lambda _: None)
  assert target.read_bytes() == mine
  download.download_ud("en_gum", tmp_path, base_url=base_url, force=True, log=lambda _: None)
  assert target.read_bytes() == dev


def test_explicit_repo_release_and_cli(server, source, tmp_path):
  base_url, root = server
  dev = (source / "synthetic-ud-dev.conllu").read_bytes()
  _serve(root, "UD_Toy-Test", "dev", {"xx_toy-ud-dev.conllu": dev})
  with pytest.raises(UserError, match="unknown treebank 'xx_toy': pass its repository"):
    download.download_ud("xx_toy", tmp_path, base_url=base_url)
  paths = download.main_download(
    ["xx_toy", "--repo", "UD_Toy-Test", "--release", "dev", "--base-url", base_url], tmp_path
  )
  assert paths == [tmp_path / "ud/xx_toy/xx_toy-ud-dev.conllu"]
  with pytest.raises(
    UserError,
    match=r"^headspec data download ud: unrecognized arguments: "
    r"--bogus$",
  ):
    download.main_download(["xx_toy", "--bogus"], tmp_path)


def test_zero_files_is_an_error(server, tmp_path):
  base_url, _ = server
  with pytest.raises(UserError, match=r"no en_ewt files found at .*/UD_English-EWT/r2.16/"):
    download.download_ud("en_ewt", tmp_path, base_url=base_url, log=lambda _: None)


def test_invalid_download_is_not_kept(server, source, tmp_path):
  base_url, root = server
  dev = (source / "synthetic-ud-dev.conllu").read_text(encoding="utf-8")
  broken = dev.replace("\t0\troot\t", "\t1x\troot\t", 1)
  _serve(root, "UD_English-EWT", "r2.16", {"en_ewt-ud-dev.conllu": broken.encode()})
  with pytest.raises(
    UserError,
    match=r"en_ewt-ud-dev.conllu: downloaded file is not valid "
    r"CoNLL-U: .*HEAD '1x' is not an integer",
  ):
    download.download_ud("en_ewt", tmp_path, base_url=base_url, log=lambda _: None)
  assert list((tmp_path / "ud" / "en_ewt").iterdir()) == []


def test_unreachable_server(tmp_path):
  with pytest.raises(UserError, match="download failed"):
    download.download_ud("en_ewt", tmp_path, base_url="http://127.0.0.1:9", timeout=5, log=lambda _: None)


# ---- text corpora (headspec/data/text_download.py) ----

REV = "0123456789abcdef0123456789abcdef01234567"
TRAIN_ROWS = [
  "",
  " = Alpha Article = \n",
  "",
  " Alpha text , with WikiText @-@ style tokens . \n",
  " = = Section = = \n",
  " More alpha text . \n",
]
TRAIN_ROWS_2 = ["", " = Beta = \n", " Beta line one . \n", "", " Beta line two . \n", " = Gamma = \n", " G . \n"]
VALID_ROWS = [" = Valid Article = \n", "", " Valid text . \n"]


def _parquet_bytes(rows, tmp_path, name):
  import pyarrow as pa
  import pyarrow.parquet as pq

  path = tmp_path / name
  pq.write_table(pa.table({"text": rows}), path)
  return path.read_bytes()


@pytest.fixture()
def wikitext(server, tmp_path):
  """(base_url, served folder, TextSource) for a tiny WikiText-like corpus served at a pinned revision."""
  base_url, root = server
  blobs = {
    "w/train-00000-of-00002.parquet": _parquet_bytes(TRAIN_ROWS, tmp_path, "a.parquet"),
    "w/train-00001-of-00002.parquet": _parquet_bytes(TRAIN_ROWS_2, tmp_path, "b.parquet"),
    "w/validation-00000-of-00001.parquet": _parquet_bytes(VALID_ROWS, tmp_path, "c.parquet"),
  }
  for path, data in blobs.items():
    target = root / "Salesforce/wikitext/resolve" / REV / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)

  def remote(path):
    return fetch.RemoteFile(path, len(blobs[path]), hashlib.sha256(blobs[path]).hexdigest())

  source = dataclasses.replace(
    text_download.CORPORA["wikitext_103"],
    name="tiny_wiki",
    revision=REV,
    files={
      "train": (remote("w/train-00000-of-00002.parquet"), remote("w/train-00001-of-00002.parquet")),
      "valid": (remote("w/validation-00000-of-00001.parquet"),),
    },
    rows={"train": len(TRAIN_ROWS) + len(TRAIN_ROWS_2), "valid": len(VALID_ROWS)},
  )
  return base_url, root, source


def _download(source, data_dir, base_url, **kwargs):
  return text_download.download_text(
    "tiny-wiki", data_dir, base_url=base_url, sources={"tiny_wiki": source}, log=lambda _: None, **kwargs
  )


def _leftovers(data_dir):
  return sorted(p.name for p in (data_dir / "text").iterdir())


def test_wikitext_articles_become_documents():
  docs = list(text_download.wikitext_documents(["x\n", " = A = \n", "", " a . \n", " = = S = = \n", " = B = \n"]))
  assert docs == ["x", "= A =\na .\n= = S = =", "= B ="]
  assert text_download.is_title(" = Valkyria Chronicles III = \n")
  assert not text_download.is_title(" = = Gameplay = = ") and not text_download.is_title(" a = b = ")


def test_text_download_writes_a_corpus_folder(wikitext, tmp_path):
  base_url, _, source = wikitext
  data_dir = tmp_path / "data"
  folder = _download(source, data_dir, base_url)
  assert folder == data_dir / "text" / "tiny_wiki" and _leftovers(data_dir) == ["tiny_wiki"]
  assert (folder / "train.txt").read_text() == (
    "= Alpha Article =\nAlpha text , with WikiText @-@ style tokens .\n= = Section = =\nMore alpha text .\n\n"
    "= Beta =\nBeta line one .\nBeta line two .\n\n= Gamma =\nG .\n"
  )
  record = json.loads((folder / "SOURCE.json").read_text())
  assert record["revision"] == REV and record["documents"] == {"train": 3, "valid": 1}
  assert [f["sha256"] for f in record["files"]] == [f.sha256 for s in ("train", "valid") for f in source.files[s]]
  assert record["files"][0]["url"] == f"{base_url}/Salesforce/wikitext/resolve/{REV}/w/train-00000-of-00002.parquet"
  docs = text_tfds.load_documents(data_dir, "tiny_wiki", "valid", tfds_dir=tmp_path / "tfds")
  assert list(docs) == ["= Valid Article =\nValid text ."]
  # Present: kept without a request (the server could be gone); --force fetches again.
  (folder / "train.txt").write_text("mine\n")
  _download(source, data_dir, "http://127.0.0.1:9")
  assert (folder / "train.txt").read_text() == "mine\n"
  _download(source, data_dir, base_url, force=True)
  assert (folder / "train.txt").read_text().startswith("= Alpha Article =")


def test_checksum_mismatch_writes_nothing_and_keeps_the_old_corpus(wikitext, tmp_path):
  base_url, root, source = wikitext
  served = root / "Salesforce/wikitext/resolve" / REV / "w/train-00001-of-00002.parquet"
  data = bytearray(served.read_bytes())
  data[-40] ^= 0xFF  # same size, different bytes
  served.write_bytes(bytes(data))
  with pytest.raises(UserError, match=r"train-00001-of-00002.parquet: SHA-256 [0-9a-f]{64} does not match the pinned"):
    _download(source, tmp_path, base_url)
  assert _leftovers(tmp_path) == []  # no corpus folder, no partial folder
  old = tmp_path / "text" / "tiny_wiki"
  old.mkdir()
  (old / "train.txt").write_text("old\n")
  (old / "valid.txt").write_text("old\n")
  with pytest.raises(UserError, match="does not match the pinned"):
    _download(source, tmp_path, base_url, force=True)
  assert _leftovers(tmp_path) == ["tiny_wiki"] and (old / "train.txt").read_text() == "old\n"


class _TruncatingHandler(http.server.BaseHTTPRequestHandler):
  """Promises the whole file, sends half of it and drops the connection."""

  body = b""

  def do_GET(self):  # noqa: N802
    self.send_response(200)
    self.send_header("Content-Length", str(len(self.body)))
    self.end_headers()
    self.wfile.write(self.body[: len(self.body) // 2])
    self.wfile.flush()
    self.close_connection = True

  def log_message(self, *args):
    pass


def test_interrupted_download_leaves_nothing_half_written(wikitext, tmp_path):
  _, root, source = wikitext
  served = root / "Salesforce/wikitext/resolve" / REV / "w/train-00000-of-00002.parquet"
  handler = type("H", (_TruncatingHandler,), {"body": served.read_bytes()})
  httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
  try:
    with pytest.raises(UserError, match=r"train-00000-of-00002.parquet: (connection closed after|download failed)"):
      _download(source, tmp_path, f"http://127.0.0.1:{httpd.server_address[1]}", timeout=5)
  finally:
    httpd.shutdown()
    httpd.server_close()
  assert _leftovers(tmp_path) == []


def test_unpinned_hash_refuses_before_any_download(wikitext, tmp_path):
  base_url, _, source = wikitext
  train = source.files["train"]
  unpinned = dataclasses.replace(
    source, files={**source.files, "train": (train[0], dataclasses.replace(train[1], sha256=None))}
  )
  with pytest.raises(
    UserError, match=r"no verified SHA-256 for w/train-00001-of-00002.parquet .* --sha256=train-00001"
  ):
    _download(unpinned, tmp_path, "http://127.0.0.1:9")
  assert not (tmp_path / "text").exists()
  with pytest.raises(UserError, match="not a SHA-256"):
    _download(unpinned, tmp_path, base_url, sha256={"train-00001-of-00002.parquet": "abc"})
  with pytest.raises(UserError, match="differs from the pinned"):
    _download(unpinned, tmp_path, base_url, sha256={"train-00000-of-00002.parquet": "0" * 64})
  folder = _download(unpinned, tmp_path, base_url, sha256={"train-00001-of-00002.parquet": train[1].sha256})
  assert (folder / "valid.txt").is_file()


def test_wrong_row_count_is_rejected(wikitext, tmp_path):
  base_url, _, source = wikitext
  with pytest.raises(UserError, match=r"tiny_wiki train: 13 rows in the parquet files, expected 14"):
    _download(dataclasses.replace(source, rows={"train": 14}), tmp_path, base_url)
  assert _leftovers(tmp_path) == []


def test_pinned_registry_and_cli(tmp_path, monkeypatch, capsys):
  for source in text_download.CORPORA.values():
    assert re.fullmatch(r"[0-9a-f]{40}", source.revision) and set(source.files) == {"train", "valid"}
    for remote in (f for files in source.files.values() for f in files):
      assert remote.sha256 is None or re.fullmatch(r"[0-9a-f]{64}", remote.sha256)
      assert source.url(text_download.HF_DATASETS_URL, remote).startswith(
        f"https://huggingface.co/datasets/Salesforce/wikitext/resolve/{source.revision}/wikitext-"
      )
  for source in text_download.CORPORA.values():
    assert all(f.sha256 and f.size for files in source.files.values() for f in files), source.name
  assert text_download.download_command("wikitext-103") == "headspec data download text wikitext_103"
  monkeypatch.setenv("HEADSPEC_DATA_DIR", str(tmp_path))
  # Nothing listens on port 9: one line naming the file that could not be fetched, nothing written.
  assert cli.main(["headspec", "data", "download", "text", "wikitext-2", "--base-url=http://127.0.0.1:9"]) == 2
  err = capsys.readouterr().err.strip().splitlines()[-1]  # progress lines, then the one error line
  assert err.startswith("headspec: error: ") and "train-00000-of-00001.parquet: download failed" in err, err
  assert "http://127.0.0.1:9/" in err  # --base-url was used
  assert not (tmp_path / "text" / "wikitext_2").exists()
  assert cli.main(["headspec", "data", "download", "text", "bogus"]) == 2
  assert "unknown corpus 'bogus': downloadable are english_mix, wikitext_103, wikitext_2" in capsys.readouterr().err


def test_ud_splits_option(server, source, tmp_path):
  base_url, root = server
  files = {
    f"en_gum-ud-{s}.conllu": (source / f"synthetic-ud-{s}.conllu").read_bytes() for s in ("train", "dev", "test")
  }
  _serve(root, "UD_English-GUM", "r2.16", files)
  paths = download.main_download(["en_gum", "--splits=dev,test", f"--base-url={base_url}"], tmp_path)
  assert [p.name for p in paths] == ["en_gum-ud-dev.conllu", "en_gum-ud-test.conllu"]
  assert treebank.available_splits(tmp_path, "en_gum") == ["dev", "test"]
  with pytest.raises(UserError, match="splits 'dev,valid': choose from train, dev, test"):
    download.download_ud("en_gum", tmp_path, base_url=base_url, splits=("dev", "valid"))


# ---- english_mix (headspec/data/english_mix.py) ----


def _zip(files: dict[str, str]) -> bytes:
  import io
  import zipfile

  out = io.BytesIO()
  with zipfile.ZipFile(out, "w") as archive:  # in reverse order, with folder entries: the build sorts and skips
    for name, text in reversed(files.items()):
      archive.writestr(name, text.encode("latin-1"))
    for folder in sorted({name.rsplit("/", 1)[0] + "/" for name in files}):
      archive.writestr(folder, b"")
  return out.getvalue()


# Tiny packages laid out as the real ones: a valid document (english_mix.VALID) and the files that are not
# documents (README, cats.txt, the treebank's parsed files) in each.
TINY_PACKAGES = {
  "brown": {
    "brown/README": "x",
    "brown/cats.txt": "ca01 news",
    "brown/ca01": "\n\n\tThe/at jury/nn said/vbd ``/`` no/at ''/'' ./.\n\n\n\tA/at 1/2-inch/jj pipe/nn ./.\n",
    "brown/ca05": "\n\n\tValid/jj one/cd ./.\n",
  },
  "abc": {"abc/README": "x", "abc/rural.txt": "PM  denies\n\nthe  claim .  \n"},
  "movie_reviews": {
    "movie_reviews/neg/cv000_1.txt": "bad film . \nvery . \n",
    "movie_reviews/pos/cv038_9749.txt": "good . \n",
  },
  "state_union": {"state_union/1945-Truman.txt": "Mr. Speaker,\n\n  Thank you.\n"},
  "inaugural": {"inaugural/1789-Washington.txt": "Fellow-Citizens \x96 of the Senate\n"},
  "webtext": {"webtext/README": "x", "webtext/wine.txt": "Lovely wine\n"},
  "treebank": {
    "treebank/raw/wsj_0001": ".START \n\nPierre Vinken, 61 years old. \n",
    "treebank/parsed/wsj_0001.prd": "(S)",
  },
}
TINY_TRAIN = (
  "The jury said `` no '' .\nA 1/2-inch pipe .\n\nPM denies\nthe claim .\n\nbad film .\nvery .\n\n"
  "Mr. Speaker,\nThank you.\n\nFellow-Citizens \x96 of the Senate\n\nLovely wine\n\nPierre Vinken, 61 years old.\n"
)
TINY_VALID = "Valid one .\n\ngood .\n"


@pytest.fixture()
def english_mix_served(server):
  """(base_url, served folder, packages) for the tiny packages at english_mix.REVISION."""
  from headspec.data import english_mix

  base_url, root = server
  packages = []
  for name, files in TINY_PACKAGES.items():
    data = _zip(files)
    package = english_mix.Package(name, len(data), hashlib.sha256(data).hexdigest())
    target = root / english_mix.REVISION / package.path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data)
    packages.append(package)
  return base_url, root, tuple(packages)


def _sha(text: str) -> str:
  return hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_english_mix_is_built_from_the_packages_by_its_rules(english_mix_served, tmp_path):
  """Brown without tags, one sentence a line; other files' non-blank lines with whitespace runs made one
  space; `.START` removed; README, cats.txt and parsed files skipped; VALID's documents in valid.txt."""
  from headspec.data import english_mix

  base_url, _, packages = english_mix_served
  pins = {"train": _sha(TINY_TRAIN), "valid": _sha(TINY_VALID)}
  folder = english_mix.download(tmp_path, base_url=base_url, packages=packages, output_sha256=pins, log=lambda _: None)
  assert folder == tmp_path / "text" / "english_mix" and _leftovers(tmp_path) == ["english_mix"]
  assert (folder / "train.txt").read_text(encoding="utf-8") == TINY_TRAIN
  assert (folder / "valid.txt").read_text(encoding="utf-8") == TINY_VALID
  record = json.loads((folder / "SOURCE.json").read_text())
  assert record["documents"] == {"train": 7, "valid": 2} and record["sha256"] == pins
  assert record["files"][0]["url"] == f"{base_url}/{english_mix.REVISION}/packages/corpora/brown.zip"
  assert list(text_tfds.load_documents(tmp_path, "english_mix", "valid", tfds_dir=tmp_path / "tfds")) == [
    "Valid one .",
    "good .",
  ]


def test_english_mix_refuses_an_altered_package_or_build_and_writes_nothing(english_mix_served, tmp_path):
  from headspec.data import english_mix

  base_url, root, packages = english_mix_served
  pins = {"train": _sha(TINY_TRAIN), "valid": _sha(TINY_VALID)}
  with pytest.raises(UserError, match=r"english_mix valid.txt: built with SHA-256 [0-9a-f]{64}, not the development"):
    english_mix.download(tmp_path, base_url=base_url, packages=packages, output_sha256={**pins, "valid": "0" * 64})
  assert _leftovers(tmp_path) == []
  served = root / english_mix.REVISION / packages[3].path
  data = bytearray(served.read_bytes())
  data[-30] ^= 0xFF
  served.write_bytes(bytes(data))
  with pytest.raises(UserError, match=r"state_union.zip: SHA-256 [0-9a-f]{64} does not match the pinned"):
    english_mix.download(tmp_path, base_url=base_url, packages=packages, output_sha256=pins, log=lambda _: None)
  assert _leftovers(tmp_path) == []


def test_english_mix_cli_names_the_package_it_could_not_fetch(tmp_path, monkeypatch, capsys):
  monkeypatch.setenv("HEADSPEC_DATA_DIR", str(tmp_path))
  assert text_download.download_command("english-mix") == "headspec data download text english_mix"
  assert cli.main(["headspec", "data", "download", "text", "english_mix", "--base-url=http://127.0.0.1:9"]) == 2
  err = capsys.readouterr().err.strip().splitlines()[-1]
  assert err.startswith("headspec: error: ") and "packages/corpora/brown.zip: download failed" in err, err
  assert err.split("headspec: error: ")[1].startswith("http://127.0.0.1:9/")
  assert not (tmp_path / "text" / "english_mix").exists()
  with pytest.raises(UserError, match="every english_mix package is pinned"):
    text_download.download_text("english_mix", tmp_path, sha256={"brown.zip": "0" * 64})


def test_each_corpus_is_fetched_from_its_own_host_by_default(tmp_path, monkeypatch):
  """With no --base-url, WikiText comes from the Hugging Face dataset at its pinned revision (through
  huggingface_hub's hf_hub_download) and english_mix from nltk_data at its pinned commit; every english_mix
  package is pinned (size and SHA-256)."""
  import huggingface_hub

  from headspec.data import english_mix

  asked = []

  def refuse(url, *args, **kwargs):
    asked.append(url)
    raise UserError(f"{url}: not fetched in this test")

  def refuse_hub(repo_id, filename, *, repo_type=None, revision=None, **kwargs):
    asked.append((repo_id, filename, repo_type, revision))
    raise huggingface_hub.errors.LocalEntryNotFoundError("not fetched in this test")

  monkeypatch.setattr(fetch, "fetch_verified", refuse)
  monkeypatch.setattr(huggingface_hub, "hf_hub_download", refuse_hub)
  for corpus in ("wikitext_2", "english_mix"):
    with pytest.raises(UserError, match="not fetched in this test|download failed"):
      text_download.download_text(corpus, tmp_path, log=lambda _: None)
  assert asked == [
    (
      "Salesforce/wikitext",
      "wikitext-2-raw-v1/train-00000-of-00001.parquet",
      "dataset",
      text_download.WIKITEXT_REVISION,
    ),
    f"https://raw.githubusercontent.com/nltk/nltk_data/{english_mix.REVISION}/packages/corpora/brown.zip",
  ]
  assert _leftovers(tmp_path) == []
  assert len(english_mix.PACKAGES) == 7 and re.fullmatch(r"[0-9a-f]{40}", english_mix.REVISION)
  assert all(p.size > 0 and re.fullmatch(r"[0-9a-f]{64}", p.sha256) for p in english_mix.PACKAGES)
  with pytest.raises(UserError, match=re.escape("get it with `headspec data download text english_mix`")):
    text_tfds.load_documents(tmp_path, "english_mix", "train", tfds_dir=tmp_path / "tfds")
