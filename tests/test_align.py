"""Word ↔ sub-word alignment: punctuation, multiword tokens, many-piece words, windows for long sentences."""

import dataclasses

import numpy as np
import pytest

from headspec.data.tokenizer import train_sentencepiece
from headspec.data.treebank import load_split
from headspec.errors import UserError
from headspec.words import alignment as align


@pytest.fixture(scope="module")
def ewt_dev(data_dir):
  return load_split(data_dir, "en_ewt", "dev")


@pytest.fixture(scope="module")
def tokenizer(ewt_dev, tmp_path_factory):
  text = [" ".join(s.words) for s in ewt_dev[:400]]
  return train_sentencepiece(text, tmp_path_factory.mktemp("spm"), vocab_size=700)


@dataclasses.dataclass
class WithSpecials:
  """A BERT-like view of a tokenizer: [CLS]-like prefix and [SEP]-like suffix ids."""

  inner: object
  prefix_ids: tuple = (3,)
  suffix_ids: tuple = (2,)

  def word_pieces(self, words):
    return self.inner.word_pieces(words)


def _check_spans(al, sentences, tokenizer):
  """Every word is in exactly one window, and its span's tokens are exactly its pieces."""
  assert al.num_words == sum(len(s) for s in sentences)
  n = 0
  for i, words in enumerate(sentences):
    pieces = tokenizer.word_pieces(words)
    for j in range(len(words)):
      w = al.word_window_N[n]
      assert al.window_sentence[w] == i and al.word_sentence_N[n] == i
      assert list(al.windows[w][al.word_start_N[n] : al.word_end_N[n]]) == list(pieces[j])
      n += 1


def test_punctuation_and_text_round_trip(tokenizer):
  words = ("Hello", ",", "world", "!", "(", "yes", ")", "--", "it's", "$", "5.00", ".")
  al = align.align([words], tokenizer, max_len=64)
  _check_spans(al, [words], tokenizer)
  assert len(al.windows) == 1 and al.num_split_sentences == 0
  for n, word in enumerate(words):
    assert tokenizer.decode(al.windows[0][al.word_start_N[n] : al.word_end_N[n]]) == word
  assert np.all(al.word_start_N[1:] == al.word_end_N[:-1])  # consecutive, nothing skipped


def test_multiword_token_from_ewt(ewt_dev, tokenizer):
  sentence = next(s for s in ewt_dev if "n't" in s.words)  # CoNLL-U "didn't" = "did" + "n't"
  j = sentence.words.index("n't")
  al = align.align([sentence.words], tokenizer, max_len=512)
  _check_spans(al, [sentence.words], tokenizer)
  assert al.word_end_N[j - 1] == al.word_start_N[j]  # the two syntactic words are adjacent, each >= 1 piece
  assert tokenizer.decode(al.windows[0][al.word_start_N[j] : al.word_end_N[j]]) == "n't"
  assert al.num_words == len(sentence.words)


def test_many_piece_word_and_pooling(tokenizer):
  words = ("a", "Pneumonoultramicroscopicsilicovolcanoconiosis", "b")
  al = align.align([words], WithSpecials(tokenizer), max_len=128)
  s, e = al.word_start_N[1], al.word_end_N[1]
  assert e - s >= 5 and s == 1 + al.word_end_N[0] - al.word_start_N[0]  # after the prefix special and "a"
  assert al.windows[0][0] == 3 and al.windows[0][-1] == 2
  start_BW, end_BW = al.word_start_N[None], al.word_end_N[None]
  T = len(al.windows[0])
  first = align.pooling_matrix(start_BW, end_BW, T, "first")[0, 1]
  last = align.pooling_matrix(start_BW, end_BW, T, "last")[0, 1]
  mean = align.pooling_matrix(start_BW, end_BW, T, "mean")[0, 1]
  np.testing.assert_array_equal(np.nonzero(first)[0], [s])
  np.testing.assert_array_equal(np.nonzero(last)[0], [e - 1])
  np.testing.assert_allclose(mean[s:e], 1.0 / (e - s))
  assert mean.sum() == pytest.approx(1.0) and mean[:s].sum() == 0 and mean[e:].sum() == 0
  with pytest.raises(UserError, match="pooling"):
    align.pooling_matrix(start_BW, end_BW, T, "max")


@pytest.mark.parametrize("causal", [False, True])
def test_long_sentences_are_windowed_nothing_dropped(ewt_dev, tokenizer, causal):
  long = sorted(ewt_dev, key=lambda s: -len(s.words))[:3]
  sentences = [s.words for s in long] + [("Short", "one", ".")]
  tok = WithSpecials(tokenizer)
  max_len = 24
  al = align.align(sentences, tok, max_len=max_len, causal=causal)
  _check_spans(al, sentences, tok)
  assert al.num_split_sentences == 3
  assert all(len(w) <= max_len and w[0] == 3 and w[-1] == 2 for w in al.windows)
  # Each word is taken from the window where it has the most context (brute force over all windows).
  for n in range(al.num_words):
    i = al.word_sentence_N[n]
    offset = int(np.searchsorted(al.word_sentence_N, i))
    j = n - offset
    pieces = [len(p) for p in tok.word_pieces(sentences[i])]
    best, chosen = -1, None
    for w in np.nonzero(al.window_sentence == i)[0]:
      s, e = al.window_words[w]
      assert sum(pieces[s:e]) == len(al.windows[w]) - 2
      if not s <= j < e:
        continue
      left = sum(pieces[s:j])
      right = sum(pieces[j + 1 : e])
      score = left if causal else min(left, right)
      if score > best:
        best, chosen = score, w
    assert al.word_window_N[n] == chosen
  # consecutive windows of a sentence overlap and cover it
  for i in range(3):
    spans = al.window_words[al.window_sentence == i]
    assert spans[0][0] == 0 and spans[-1][1] == len(sentences[i])
    assert all(s0 < s1 < e0 for (s0, e0), (s1, _) in zip(spans, spans[1:]))


def test_windows_overlap_and_progress():
  counts = np.array([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5])
  spans = align._spans(counts, context=10)
  assert spans[0][0] == 0 and spans[-1][1] == len(counts)
  for (s0, e0), (s1, _e1) in zip(spans, spans[1:]):
    assert s0 < s1 < e0 or s1 == e0 == s0 + 1  # progress and overlap (one-word windows cannot overlap)
  assert all(counts[s:e].sum() <= 10 or e - s == 1 for s, e in spans)


def test_context_too_small(tokenizer):
  with pytest.raises(UserError, match="max_len"):
    align.align([("a",)], WithSpecials(tokenizer), max_len=2)
