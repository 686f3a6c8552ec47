"""One program cache and one word path: every program factory keyed by a graphdef is `program_cache`d
(headspec/parallel/compilations.py), so a call on inputs of a shape already seen compiles nothing and
`clear_programs` empties them all; the bucket batcher of every word-level batch is words/batches.py's."""

import numpy as np
import pytest

from headspec.attention import words as attention_words
from headspec.model.config import ModelConfig
from headspec.model.transformer import random_like
from headspec.parallel import compilations
from headspec.parallel.compilations import Compilations
from headspec.words import batches


class _Tokenizer:
  """One piece per word (two for words of even length), no special tokens."""

  prefix_ids, suffix_ids, pad_id = (), (), 0

  def word_pieces(self, words):
    return [[2 + sum(map(ord, w)) % 29] * (1 + (len(w) % 2 == 0)) for w in words]

  def decode(self, ids):
    return " ".join(map(str, ids))


@pytest.fixture(scope="module")
def model():
  cfg = ModelConfig(kind="decoder", vocab_size=32, num_layers=1, num_heads=2, d_model=16, d_head=8, d_ff=32, max_len=32)
  return random_like(cfg, 0)


def test_token_maps_of_a_seen_shape_compile_nothing(model):
  first, _ = attention_words.token_maps(model, _Tokenizer(), ["a", "bb", "c"])
  with Compilations() as compiled:
    probs_LHTT, labels = attention_words.token_maps(model, _Tokenizer(), ["d", "ee", "f"])  # 4 pieces again
  assert compiled.count == 0, compiled.counts
  assert probs_LHTT.shape == first.shape == (1, 2, 4, 4) and len(labels) == 4
  np.testing.assert_allclose(probs_LHTT.sum(-1), 1.0, rtol=1e-5)


def test_clear_programs_empties_every_program_cache(model):
  attention_words.token_maps(model, _Tokenizer(), ["a", "bb", "c"])
  caches = compilations.programs()
  assert caches["headspec.attention.words._patterns"].currsize >= 1
  assert {"headspec.words.batches.pooled_forward", "headspec.attention.words._forward"} <= caches.keys()
  compilations.clear_programs()
  assert all(info.currsize == 0 for info in compilations.programs().values())
  with Compilations() as compiled:
    attention_words.token_maps(model, _Tokenizer(), ["a", "bb", "c"])
  assert compiled.count >= 1  # built and compiled afresh


def test_one_bucket_batcher():
  """Items grouped by width, widths ascending, batch_tokens // T (at least 1) a batch; window_batches buckets
  lengths to the next power of two (at least 16, at most max_len)."""
  got = batches.bucketed(np.array([32, 16, 32, 32, 16]), 64)
  assert [(T, B, list(items)) for T, B, items in got] == [(16, 4, [1, 4]), (32, 2, [0, 2]), (32, 2, [3])]
  got = batches.window_batches(np.array([5, 17, 40, 3]), 32, 1)
  assert [(T, B, list(items)) for T, B, items in got] == [(16, 1, [0]), (16, 1, [3]), (32, 1, [1]), (32, 1, [2])]
