"""UD download against a local http.server: 404 splits skipped, validation, no overwrite."""

import functools
import http.server
import threading

import pytest

from headspec.data import download, synthetic, treebank
from headspec.errors import UserError


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
  def log_message(self, *args):
    pass


@pytest.fixture()
def server(tmp_path):
  """(base_url, served folder) for an HTTP server on 127.0.0.1 in a thread."""
  root = tmp_path / "served"
  root.mkdir()
  handler = functools.partial(_QuietHandler, directory=str(root))
  httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
  thread = threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True)
  thread.start()
  yield f"http://127.0.0.1:{httpd.server_address[1]}", root
  httpd.shutdown()
  httpd.server_close()


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
  _serve(root, "UD_English-EWT", "r2.14", {"en_ewt-ud-dev.conllu": dev, "en_ewt-ud-test.conllu": test})
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
  _serve(root, "UD_English-GUM", "r2.14", {"en_gum-ud-dev.conllu": dev})
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
  with pytest.raises(UserError, match=r"no en_ewt files found at .*/UD_English-EWT/r2.14/"):
    download.download_ud("en_ewt", tmp_path, base_url=base_url, log=lambda _: None)


def test_invalid_download_is_not_kept(server, source, tmp_path):
  base_url, root = server
  dev = (source / "synthetic-ud-dev.conllu").read_text(encoding="utf-8")
  broken = dev.replace("\t0\troot\t", "\t1x\troot\t", 1)
  _serve(root, "UD_English-EWT", "r2.14", {"en_ewt-ud-dev.conllu": broken.encode()})
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
