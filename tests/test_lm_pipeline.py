"""LM input: packing with eos, host shards of global batches, resumable deterministic iteration."""

import json

import numpy as np
import pytest

from headspec.data import lm_pipeline
from headspec.errors import UserError


class CharTokenizer:
  """One id per character (ord - 94 for 'a'..), eos=2: known answers for packing."""

  vocab_size, pad_id, unk_id, eos_id, mask_id = 40, 0, 1, 2, None
  prefix_ids, suffix_ids = (), ()

  def encode(self, text):
    return [ord(c) - 94 for c in text]

  def word_pieces(self, words):
    return [self.encode(w) for w in words]

  def decode(self, ids):
    return "".join(chr(i + 94) for i in ids)


def test_pack_tokens_known_answer_and_cache(tmp_path):
  tok = CharTokenizer()
  a, b, c, d = (ord(ch) - 94 for ch in "abcd")
  packed = lm_pipeline.pack_tokens(["ab", "c", "d"], tok, 2, cache_path=tmp_path / "cache" / "tokens.npy")
  assert packed.dtype == np.int32
  np.testing.assert_array_equal(packed, [[a, b], [2, c], [2, d]])  # stream a b eos c eos d eos: tail dropped
  assert (tmp_path / "cache" / "tokens.npy").is_file()
  # The cache holds the whole stream: later calls read it (documents ignored), for any seq_len.
  np.testing.assert_array_equal(
    lm_pipeline.pack_tokens([], tok, 3, cache_path=tmp_path / "cache" / "tokens.npy"), [[a, b, 2], [c, 2, d]]
  )
  small_vocab = CharTokenizer()
  small_vocab.vocab_size = 5
  with pytest.raises(UserError, match="tokens.npy"):
    lm_pipeline.pack_tokens([], small_vocab, 2, cache_path=tmp_path / "cache" / "tokens.npy")


def test_empty_corpus_is_user_error():
  with pytest.raises(UserError, match="no documents"):
    lm_pipeline.pack_tokens([], CharTokenizer(), 4)
  with pytest.raises(UserError, match="fewer than one row"):
    lm_pipeline.pack_tokens(["ab"], CharTokenizer(), 4)
  with pytest.raises(UserError, match="empty corpus"):
    lm_pipeline.make_lm_iterator(np.zeros((0, 4), np.int32), global_batch_size=2, seed=0)
  with pytest.raises(UserError, match="batch_size=6"):
    lm_pipeline.make_lm_iterator(np.zeros((8, 4), np.int32), global_batch_size=6, seed=0, process_count=4)


def rows(n, t=3):
  """Row i holds i in every position, so a batch's first column names its rows."""
  return np.repeat(np.arange(n, dtype=np.int32)[:, None], t, axis=1)


def take(iterator, k):
  return [next(iterator)["tokens"] for _ in range(k)]


@pytest.mark.parametrize("process_count", [2, 4])
def test_hosts_split_every_global_batch(process_count):
  tokens = rows(10)  # 10 rows, global batch 8: batches cross epoch boundaries
  single = take(lm_pipeline.make_lm_iterator(tokens, global_batch_size=8, seed=3), 6)
  hosts = [
    take(
      lm_pipeline.make_lm_iterator(tokens, global_batch_size=8, seed=3, process_index=p, process_count=process_count), 6
    )
    for p in range(process_count)
  ]
  for step, batch in enumerate(single):
    assert batch.shape == (8, 3) and batch.dtype == np.int32
    shares = [host[step] for host in hosts]
    assert all(share.shape == (8 // process_count, 3) for share in shares)
    np.testing.assert_array_equal(np.concatenate(shares), batch)  # the union is the global batch, in order
  # Within an epoch no row repeats, so the hosts' shares of the first batch are disjoint.
  assert len(set(single[0][:, 0])) == 8


def test_each_epoch_is_a_fresh_permutation():
  tokens = rows(8)
  batches = take(lm_pipeline.make_lm_iterator(tokens, global_batch_size=8, seed=0), 3)
  epochs = [b[:, 0].tolist() for b in batches]
  assert all(sorted(e) == list(range(8)) for e in epochs)
  assert len({tuple(e) for e in epochs}) == 3  # reshuffled each epoch
  in_order = take(lm_pipeline.make_lm_iterator(tokens, global_batch_size=4, seed=0, shuffle=False), 3)
  assert [b[:, 0].tolist() for b in in_order] == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]]


def test_deterministic_given_seed():
  tokens = rows(50)
  first = take(lm_pipeline.make_lm_iterator(tokens, global_batch_size=8, seed=7), 10)
  again = take(lm_pipeline.make_lm_iterator(tokens, global_batch_size=8, seed=7), 10)
  other = take(lm_pipeline.make_lm_iterator(tokens, global_batch_size=8, seed=8), 10)
  np.testing.assert_array_equal(np.stack(first), np.stack(again))
  assert not np.array_equal(np.stack(first), np.stack(other))


@pytest.mark.parametrize("process_index", [0, 1])
def test_state_resumes_exactly(process_index):
  tokens = rows(23)
  make = lambda: lm_pipeline.make_lm_iterator(
    tokens, global_batch_size=6, seed=1, process_index=process_index, process_count=2
  )
  iterator = make()
  take(iterator, 5)
  state = json.loads(json.dumps(iterator.get_state()))  # storable as JSON in a checkpoint
  expected = take(iterator, 7)
  resumed = make()
  resumed.set_state(state)
  np.testing.assert_array_equal(np.stack(take(resumed, 7)), np.stack(expected))


def test_finite_epochs_end_on_a_full_global_batch():
  tokens = rows(10)
  for p in range(2):
    iterator = lm_pipeline.make_lm_iterator(
      tokens, global_batch_size=4, seed=0, process_index=p, process_count=2, shuffle=False, num_epochs=1
    )
    expected = [[0, 1], [4, 5]] if p == 0 else [[2, 3], [6, 7]]  # rows 8, 9 make no full global batch
    assert [b["tokens"][:, 0].tolist() for b in iterator] == expected
  with pytest.raises(UserError, match="less than one global batch"):
    lm_pipeline.make_lm_iterator(rows(3), global_batch_size=4, seed=0, num_epochs=1)


def _repeats(fraction, chunk=16, process_index=0):
  from headspec.data.repeats import RepeatRows

  return RepeatRows(
    fraction=fraction, ids=np.arange(3, 200), chunk=chunk, bos=(2,), vocab_size=256, seed=5, process_index=process_index
  )


def test_repeat_rows_replace_the_first_rows_and_resume():
  """data.repeat_rows: the first round(fraction·B) rows of each batch are `BOS p r r f` chunks over the given
  ids (each chunk's tokens distinct but for r's second copy), the rest the corpus' rows; a resumed iterator
  draws the same rows."""
  tokens = rows(40, t=32)
  make = lambda: lm_pipeline.make_lm_iterator(tokens, global_batch_size=8, seed=1, repeats=_repeats(0.75))
  batches = take(make(), 6)
  plain = take(lm_pipeline.make_lm_iterator(tokens, global_batch_size=8, seed=1), 6)
  for mixed, text in zip(batches, plain):
    np.testing.assert_array_equal(mixed[6:], text[6:])  # round(0.75 · 8) = 6 rows replaced
    for row in mixed[:6]:
      for chunk in row.reshape(2, 16):
        assert chunk[0] == 2 and np.isin(chunk[1:], np.arange(3, 200)).all()
        values, counts = np.unique(chunk[1:], return_counts=True)
        n = int((counts == 2).sum())  # r, written twice, back to back
        assert 5 <= n <= 7 and counts.max() == 2
        starts = [i for i in range(1, 16 - 2 * n + 1) if (chunk[i : i + n] == chunk[i + n : i + 2 * n]).all()]
        assert starts, chunk
  assert not np.array_equal(batches[0][:6], batches[1][:6])  # each batch its own draw
  iterator = make()
  take(iterator, 2)
  state = json.loads(json.dumps(iterator.get_state()))
  resumed = make()
  resumed.set_state(state)
  np.testing.assert_array_equal(np.stack(take(resumed, 4)), np.stack(batches[2:]))
  other_host = take(
    lm_pipeline.make_lm_iterator(tokens, global_batch_size=8, seed=1, repeats=_repeats(0.75, process_index=1)), 1
  )
  assert not np.array_equal(other_host[0][:6], batches[0][:6])


def test_repeat_rows_config_is_checked_before_training(tmp_path):
  from headspec.train.config import train_config
  from headspec.train.loop import check_config

  c = train_config()
  c.train.seq_len = 32
  c.data.repeat_rows = 1.5
  with pytest.raises(UserError, match=r"data.repeat_rows=1.5: must be a number in \[0, 1\]"):
    check_config(c)
  c.data.repeat_rows, c.data.repeat_chunk = 0.5, 12
  with pytest.raises(UserError, match="data.repeat_chunk=12: must divide train.seq_len=32"):
    check_config(c)
  c.data.repeat_chunk = 16
  check_config(c)
