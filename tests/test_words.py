"""The shared word layer (headspec/words/batches.py): every word reaches exactly one pooled slot in both batch layouts,
one-window rows and packed rows give each word the same vector, and interventions reach the pooled forward."""

import numpy as np
import pytest
from flax import nnx

from headspec.data.tokenizer import train_sentencepiece
from headspec.data.treebank import load_split
from headspec.model.config import ModelConfig
from headspec.model.edits import head_mask
from headspec.model.transformer import random_like
from headspec.words import batches as words
from headspec.words.alignment import align


@pytest.fixture(scope="module")
def setup(data_dir, tmp_path_factory):
  dev = load_split(data_dir, "en_ewt", "dev")[:60]
  tokenizer = train_sentencepiece([" ".join(s.words) for s in dev], tmp_path_factory.mktemp("spm"), vocab_size=400)
  cfg = ModelConfig(
    kind="decoder", vocab_size=tokenizer.vocab_size, num_layers=2, num_heads=2, d_model=16, d_head=8, d_ff=32,
    max_len=32,
  )  # fmt: skip
  sentences = [s.words for s in dev]
  return random_like(cfg, 0), tokenizer, align(sentences, tokenizer, cfg.max_len, causal=True)


def test_every_word_lands_in_one_slot_of_either_layout(setup):
  model, tokenizer, al = setup
  of_window = words.words_of_windows(al)
  assert np.array_equal(np.sort(np.concatenate(of_window)), np.arange(al.num_words))
  lengths = np.array([len(w) for w in al.windows])
  batches = words.window_batches(lengths, 32, 256)
  assert sorted(int(w) for _, _, ws in batches for w in ws) == list(range(len(al.windows)))
  slots = np.concatenate([
    words.window_inputs(T, B, ws, al, of_window, tokenizer.pad_id, "last")[1].ravel() for T, B, ws in batches
  ])  # fmt: skip
  assert np.array_equal(np.sort(slots[slots >= 0]), np.arange(al.num_words))
  widths, packed = words.packed_batches(lengths, 32, 256)
  placed = sorted(w for _, rows in packed for row in rows for w, _ in row)
  assert placed == list(range(len(al.windows))) and all(
    col + lengths[w] <= T for T, rows in packed for row in rows for w, col in row
  )


def test_window_and_packed_rows_pool_the_same_word_vectors(setup):
  """The final hidden state per word from one-window rows (the causal test's) equals the packed rows' (the
  probes'), word for word, and a head-mask edit changes it (the edit reaches the forward)."""
  model, tokenizer, al = setup
  of_window = words.words_of_windows(al)
  lengths = np.array([len(w) for w in al.windows])
  rows = [
    words.window_inputs(T, B, ws, al, of_window, tokenizer.pad_id, "last")
    for T, B, ws in words.window_batches(lengths, 32, 256)
  ]
  alone = words.hidden_words(model, rows, al.num_words)
  _, packed = words.packed_batches(lengths, 32, 256)
  graphdef, state = nnx.split(model)
  forward = words.pooled_forward(graphdef, ("resid_post",), True)
  side_by_side = np.zeros_like(alone)
  for T, batch in packed:
    inputs, per_row = words.packed_inputs(T, batch, al, lengths, of_window, tokenizer.pad_id, 256, "last")
    hidden_BWD = np.asarray(forward(state, *inputs, None)["hidden"])
    for b, mine in enumerate(per_row):
      side_by_side[mine] = hidden_BWD[b, : len(mine)]
  np.testing.assert_allclose(side_by_side, alone, atol=2e-5)
  mask = np.ones((2, 2), np.float32)
  mask[1, 0] = 0.0
  edited = words.hidden_words(model, rows, al.num_words, {"z": head_mask(mask)})
  assert np.abs(edited - alone).max() > 1e-3


def test_interventions_fingerprint_tells_edits_apart():
  mask = np.ones((2, 2), np.float32)
  same = words.interventions_fingerprint({"z": head_mask(mask)})
  assert same == words.interventions_fingerprint({"z": head_mask(mask.copy())})
  mask[0, 0] = 0.0
  assert same != words.interventions_fingerprint({"z": head_mask(mask)})
  assert same != words.interventions_fingerprint({"z": [head_mask(np.ones((2, 2)))] * 2})
