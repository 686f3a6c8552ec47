"""SentencePiece tokenizer: specials, determinism, round trip, word pieces, loading."""

import json

import numpy as np
import pytest

from headspec.data import tokenizer as tk
from headspec.data.text_tfds import read_text_documents
from headspec.errors import UserError


@pytest.fixture(scope="module")
def valid_docs(synthetic_data_dir):
  """Documents of the synthetic text corpus (5-20 lines each; thousands of lines, real English words)."""
  return list(read_text_documents(synthetic_data_dir / "text" / "synthetic" / "train.txt"))


@pytest.fixture(scope="module")
def trained(valid_docs, tmp_path_factory):
  out = tmp_path_factory.mktemp("tok")
  return tk.train_sentencepiece(valid_docs, out, vocab_size=1000, max_sentences=2000), out


def test_specials_reserved_and_saved(trained):
  tokenizer, out = trained
  assert (tokenizer.pad_id, tokenizer.unk_id, tokenizer.eos_id, tokenizer.mask_id) == (0, 1, 2, 3)
  assert tokenizer.prefix_ids == () and tokenizer.suffix_ids == () and tokenizer.vocab_size == 1000
  assert isinstance(tokenizer, tk.Tokenizer)
  info = json.loads((out / tk.INFO_FILE).read_text())
  assert info["kind"] == "sentencepiece" and info["mask_id"] == 3 and info["num_sentences"] == 2000
  # Specials are control symbols: their text is not matched and they decode to nothing.
  ids = tokenizer.encode("a <mask> <pad> <eos> </s> <unk> b")
  assert not {0, 1, 2, 3} & set(ids)
  assert tokenizer.decode([0, 3] + tokenizer.encode("hello") + [2]) == "hello"


def test_training_is_deterministic(trained, valid_docs, tmp_path):
  _, out = trained
  tk.train_sentencepiece(valid_docs, tmp_path / "again", vocab_size=1000, max_sentences=2000)
  assert (tmp_path / "again" / tk.SPM_MODEL_FILE).read_bytes() == (out / tk.SPM_MODEL_FILE).read_bytes()


def test_round_trip_on_normalized_text(trained, valid_docs):
  tokenizer, _ = trained
  lines = [line for doc in valid_docs for line in doc.split("\n")][:300] + ["naïve café ﬁ  Ünïcödé ✓ 東京"]
  for line in lines:
    assert tokenizer.decode(tokenizer.encode(line)) == tokenizer.normalize(line)
  assert tokenizer.normalize("Plain text , single spaces .") == "Plain text , single spaces ."
  assert tokenizer.normalize(" two  spaces\nand ﬁ") == "two spaces and fi"  # NFKC, whitespace collapsed
  assert tokenizer.unk_id not in tokenizer.encode("東京 ✓")  # byte fallback instead of <unk>


def test_multiline_documents_encode_as_a_whole(trained, valid_docs):
  tokenizer, _ = trained
  for doc in valid_docs[:10]:
    assert "\n" in doc
    assert tokenizer.encode(doc) == tokenizer._sp.encode(doc)  # pylint: disable=protected-access
  assert tokenizer.decode(tokenizer.encode("one\n\ntwo\n")) == "one two"


def test_word_pieces_concatenate_to_running_text(trained, valid_docs):
  tokenizer, _ = trained
  for line in [line for doc in valid_docs for line in doc.split("\n")][:300]:
    words = line.split()
    pieces = tokenizer.word_pieces(words)
    assert len(pieces) == len(words) and all(pieces)
    assert sum(pieces, []) == tokenizer.encode(" ".join(words))
  assert tokenizer.word_pieces(["", " "]) == [[tokenizer.unk_id], [tokenizer.unk_id]]


@pytest.mark.parametrize("draw_block", [4096, 7])  # 7: draws span many blocks
def test_sample_lines_is_uniform_ordered_and_seeded(monkeypatch, draw_block):
  monkeypatch.setattr(tk, "_DRAW_BLOCK", draw_block)
  docs = ["\n".join(f"l{i}" for i in range(d * 10, d * 10 + 10)) for d in range(10)]  # 100 lines
  assert tk.sample_lines(docs, 1000, seed=0) == [f"l{i}" for i in range(100)]
  sample = tk.sample_lines(docs, 10, seed=0)
  assert len(sample) == 10 and sample == sorted(sample, key=lambda s: int(s[1:]))
  assert sample == tk.sample_lines(docs, 10, seed=0) != tk.sample_lines(docs, 10, seed=1)
  # Reservoir sampling keeps every line with probability k/n = 0.1: check the frequencies over seeds.
  counts = np.zeros(100)
  for seed in range(1000):
    for line in tk.sample_lines(docs, 10, seed=seed):
      counts[int(line[1:])] += 1
  assert np.all(np.abs(counts / 1000 - 0.1) < 0.045)  # > 4.7 binomial sd; fails if positions are biased
  assert abs(counts[:50].sum() - counts[50:].sum()) < 300


def test_load_tokenizer_and_kinds(trained, tmp_path):
  tokenizer, out = trained
  loaded = tk.load_tokenizer(out)
  assert loaded.encode("The jury said .") == tokenizer.encode("The jury said .")
  with pytest.raises(UserError, match="headspec_tokenizer.json"):
    tk.load_tokenizer(tmp_path)
  (tmp_path / tk.INFO_FILE).write_text(json.dumps({"kind": "mystery"}))
  with pytest.raises(UserError, match="unknown tokenizer kind 'mystery'"):
    tk.load_tokenizer(tmp_path)
  tk.register_tokenizer_kind("mystery", lambda path, info: (path, info["kind"]))
  try:
    assert tk.load_tokenizer(tmp_path) == (tmp_path, "mystery")
  finally:
    del tk._LOADERS["mystery"]  # pylint: disable=protected-access


def test_training_errors_are_user_errors(tmp_path):
  with pytest.raises(UserError, match="no text"):
    tk.train_sentencepiece(["", "\n \n"], tmp_path, vocab_size=100)
  with pytest.raises(UserError, match="vocab_size=50000"):
    tk.train_sentencepiece(["a tiny corpus\nwith few words"], tmp_path, vocab_size=50000)
  with pytest.raises(UserError, match="model_type"):
    tk.train_sentencepiece(["text"], tmp_path, vocab_size=100, model_type="wordpiece")
