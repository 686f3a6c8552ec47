"""Token helpers: `to_tokens`, `to_str_tokens`, `to_single_token` agree with the tokenizer's own
encode (transformers' fast tokenizer over the same files, sentencepiece's processor) on punctuation,
runs of spaces and non-ASCII text, on the packaged MiniLM WordPiece, a GPT-2-style byte-level BPE built
offline and a headspec SentencePiece model; `run(text)` reads the text as written (it re-joined the words
with spaces: "store," became "store ,", 15 tokens where `patch` read 14)."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import headspec  # noqa: E402
from headspec.errors import UserError  # noqa: E402
from headspec.model import tokens as tokens_lib  # noqa: E402

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

TEXTS = [
  "When Mary and John went to the store, John gave a drink to",
  'two  spaces,   three   and a\ttab; (brackets) "quotes" it\'s--done...!?',
  "café naïve Zürich — 東京 straße 🙂 ﬁ",
  "  leading and trailing  ",
  "a.b,c;d",
]


def _gpt2_dir(path):
  import torch

  bpe = tokenizers.ByteLevelBPETokenizer()
  corpus = ["When Mary and John went to the store, John gave a drink to Mary.", "café naïve — 東京  two  spaces!?"]
  bpe.train_from_iterator(corpus * 3, vocab_size=400, min_frequency=1, special_tokens=["<|endoftext|>"])
  bpe.save_model(str(path))
  eos = bpe.token_to_id("<|endoftext|>")
  config = transformers.GPT2Config(
    vocab_size=bpe.get_vocab_size(), n_positions=64, n_embd=32, n_layer=2, n_head=4, n_inner=64,
    bos_token_id=eos, eos_token_id=eos,
  )  # fmt: skip
  torch.manual_seed(0)
  transformers.GPT2LMHeadModel(config).save_pretrained(path)
  return path


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
  path = _gpt2_dir(tmp_path_factory.mktemp("gpt2"))
  return headspec.load(path), transformers.AutoTokenizer.from_pretrained(str(path))


@pytest.fixture(scope="module")
def minilm():
  from headspec import pretrained

  return headspec.load("minilm"), transformers.AutoTokenizer.from_pretrained(str(pretrained.minilm_dir()))


@pytest.fixture(scope="module")
def spm_pair(tmp_path_factory):
  """A headspec SentencePiece tokenizer (BPE, byte fallback) and a random decoder of its vocabulary."""
  from headspec.data.tokenizer import train_sentencepiece
  from headspec.model.config import ModelConfig
  from headspec.model.transformer import random_like

  lines = ["the dog saw a cat. the cat saw the dog!", "When Mary went to the store, she gave a drink."] * 40
  tok = train_sentencepiece(lines, tmp_path_factory.mktemp("spm"), vocab_size=300)
  cfg = ModelConfig(kind="decoder", vocab_size=tok.vocab_size, num_layers=1, num_heads=2, d_model=16,
                              d_head=8, d_ff=32, max_len=64)  # fmt: skip
  return random_like(cfg, 0), tok


@pytest.mark.parametrize("text", TEXTS)
def test_to_tokens_equal_the_hugging_face_tokenizers(gpt2, minilm, text):
  for loaded, hf in (gpt2, minilm):
    ids = hf(text)["input_ids"]  # with the tokenizer's own specials: BERT [CLS] ... [SEP], GPT-2 none
    np.testing.assert_array_equal(headspec.to_tokens(loaded, text), [ids])
    assert headspec.to_str_tokens(loaded, text) == [hf.decode([i], clean_up_tokenization_spaces=False) for i in ids]
  loaded, hf = gpt2
  bos = hf.convert_tokens_to_ids("<|endoftext|>")  # TransformerLens's BOS for GPT-2
  assert headspec.to_tokens(loaded, text, prepend_bos=True)[0].tolist() == [bos, *hf(text)["input_ids"]]
  loaded, hf = minilm
  assert headspec.to_tokens(loaded, text, prepend_bos=False)[0].tolist() == hf(text)["input_ids"][1:]


def test_to_tokens_of_several_texts_are_right_padded(gpt2):
  loaded, hf = gpt2
  tokens_BT = headspec.to_tokens(loaded, TEXTS[:2])
  for row, text in zip(tokens_BT, TEXTS[:2]):
    ids = hf(text)["input_ids"]
    assert row[: len(ids)].tolist() == ids and (row[len(ids) :] == loaded.tokenizer.pad_id).all()
  assert headspec.to_str_tokens(loaded, tokens_BT[0][:3]) == headspec.to_str_tokens(loaded, TEXTS[0])[:3]
  assert headspec.to_str_tokens(loaded, TEXTS[:2]) == [headspec.to_str_tokens(loaded, t) for t in TEXTS[:2]]


@pytest.mark.parametrize("text", TEXTS)
def test_sentencepiece_tokens_equal_its_processor(spm_pair, text):
  import sentencepiece as spm

  net, tok = spm_pair
  sp = spm.SentencePieceProcessor(model_file=str(tok.model_file))
  assert headspec.to_tokens((net, tok), text)[0].tolist() == sp.encode(text)
  pieces = headspec.to_str_tokens((net, tok), text)
  assert pieces == [p.replace("\u2581", " ") for p in sp.encode(text, out_type=str)]
  assert headspec.to_tokens((net, tok), text, prepend_bos=True)[0].tolist() == [tok.eos_id, *sp.encode(text)]


def test_to_single_token(gpt2, minilm):
  loaded, hf = gpt2
  assert headspec.to_single_token(loaded, " Mary") == hf(" Mary")["input_ids"][0]
  assert headspec.to_single_token(loaded, ",") == hf(",")["input_ids"][0]
  with pytest.raises(UserError, match=r"to_single_token: ' Mary and' is 2 tokens \[\d+, \d+\], not one"):
    headspec.to_single_token(loaded, " Mary and")
  loaded, hf = minilm
  assert headspec.to_single_token(loaded, "Mary") == hf("mary", add_special_tokens=False)["input_ids"][0]
  with pytest.raises(UserError, match="is 0 tokens"):
    headspec.to_single_token(loaded, "  ")


def test_run_reads_the_text_as_written(gpt2, minilm, spm_pair):
  """run(text)'s tokens are to_tokens(text)'s and patch's; its words are split_words's cut at token
  boundaries, every token in exactly one word."""
  texts = TEXTS + ["the dog saw a cat. the cat saw the dog!"]
  for model in (gpt2[0], minilm[0], spm_pair):
    tokenizer = tuple(model)[1]
    prefix, suffix = len(tokenizer.prefix_ids), len(tokenizer.suffix_ids)
    for c, text in zip(headspec.run(model, texts), texts, strict=True):  # one compile per padded length
      assert c.tokens_T.tolist() == headspec.to_tokens(model, text)[0].tolist()
      assert c.piece_start_N[0] == prefix and c.piece_end_N[-1] == len(c.tokens_T) - suffix
      np.testing.assert_array_equal(c.piece_start_N[1:], c.piece_end_N[:-1])  # contiguous, none empty
      assert (c.piece_end_N > c.piece_start_N).all()
      joined = "".join(c.words).replace(" ", "")
      assert joined == "".join(headspec.split_words(text))  # the words as written, none lost


def test_run_keeps_punctuation_attached_as_written(gpt2):
  """The issue's case: "store," is the tokens of "store," (',' without a space before it), as patch reads it."""
  loaded, hf = gpt2
  text = TEXTS[0]
  (c,) = headspec.run(loaded, text)
  assert len(c.tokens_T) == len(hf(text)["input_ids"]) == 14
  n = c.words.index("store")
  assert c.words[n + 1] == "," and c.pieces[c.piece_start_N[n + 1]] == ","  # not 'Ġ,'
  frame = headspec.patch(loaded, [text], [text.replace("Mary", "John")], site="resid_pre", answers=[(1, 2)],
                         layers=[0], positions=[0])  # fmt: skip
  assert len(frame) == 1  # the same token count as the clean prompt's


def test_text_words_joins_a_token_that_spans_two_words():
  class Pieces:  # a tokenizer whose one token covers 'dog.' (as SentencePiece's '▁dog.' can)
    vocab = {"▁the": 0, "▁dog.": 1, "▁dog": 2, "▁a": 3}

    def encode(self, text):
      return [self.vocab["▁" + w] for w in text.split()]

  words, ids, start_N, end_N = tokens_lib.text_words(Pieces(), "the dog. a")
  assert words == ["the", "dog.", "a"] and ids == [0, 1, 3]
  assert start_N.tolist() == [0, 1, 2] and end_N.tolist() == [1, 2, 3]


@pytest.mark.parametrize(
  "call,message",
  [
    (lambda m: headspec.to_tokens(m, 3), r"to_tokens: text=3 must be a list of texts"),
    (lambda m: headspec.to_tokens(m, []), "to_tokens: text=\\[\\] is empty"),
    (lambda m: headspec.to_tokens(m, "a", prepend_bos="yes"), "prepend_bos='yes' must be True or False"),
    (lambda m: headspec.to_str_tokens(m, [10**6]), r"token id 1000000 is outside the vocabulary"),
    (lambda m: headspec.to_single_token(m, ["a"]), r"to_single_token: text=\['a'\] must be a text"),
    (lambda m: headspec.to_tokens(None, "a"), "to_tokens: model: expected headspec.load"),
  ],
)
def test_bad_input_is_one_line(gpt2, call, message):
  with pytest.raises(UserError, match=message) as e:
    call(gpt2[0])
  assert "\n" not in str(e.value)
