"""The evaluation set of an ablation (and of an SAE's spliced loss): fixed-shape batches of sequences and
what is scored in each. Shared layer: below the analyses that score a model on it.

Two kinds (docs/ablation.md):
  'lm'        a model with a trained LM head. Decoders: causal LM, token t predicts t + 1 (Radford et al.
              2019). Encoders: masked LM with ONE fixed seeded mask (BERT's 15% / 80-10-10 corruption,
              Devlin et al. 2019 §3.1, headspec.model.objectives.mlm_corrupt with a fixed key), so every
              intervention is scored on the same masked positions.
  'embedding' a model without one (all-MiniLM-L6-v2, random weights): the sentence embedding
              e = normalise(mean of the final hidden state over the non-padding tokens), as
              sentence-transformers pools all-MiniLM-L6-v2 ([CLS] and [SEP] included).
Every batch has the same number of tokens (rows × length), sentences are grouped into power-of-two
length buckets, so the compiled evaluations compile once per bucket length (once in all for LM rows).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from headspec.model.capture import bucket_length

KINDS = ("lm", "embedding")


@dataclasses.dataclass(frozen=True)
class Batch:
  """One fixed-shape batch. weights_BT: 1 where a token's prediction is scored (LM), else 0;
  sequence_B: each row's index in the evaluation set (-1 for padding rows)."""

  inputs_BT: np.ndarray
  valid_BT: np.ndarray
  targets_BT: np.ndarray
  weights_BT: np.ndarray
  sequence_B: np.ndarray


@dataclasses.dataclass(frozen=True)
class EvalSet:
  kind: str
  batches: list[Batch]
  num_sequences: int
  description: str

  @property
  def num_tokens(self) -> int:
    return int(sum(b.valid_BT.sum() for b in self.batches))

  def halves(self) -> tuple[EvalSet, EvalSet]:
    """(even batches, odd batches): a fit half and a held-out half (the L0 gates fit on the first)."""
    even, odd = self.batches[0::2], self.batches[1::2] or self.batches[:1]
    return dataclasses.replace(self, batches=even), dataclasses.replace(self, batches=odd)


def _batches(inputs_NT, valid_NT, targets_NT, weights_NT, batch_size: int) -> list[Batch]:
  """Rows in batches of `batch_size`; the last one padded with invalid rows (sequence -1)."""
  out = []
  for start in range(0, len(inputs_NT), batch_size):
    sl = slice(start, start + batch_size)
    parts = [inputs_NT[sl], valid_NT[sl], targets_NT[sl], weights_NT[sl], np.arange(len(inputs_NT))[sl]]
    pad = batch_size - len(parts[0])
    if pad:
      fill = [0, False, 0, 0.0, -1]
      parts = [np.concatenate([p, np.full((pad, *p.shape[1:]), f, p.dtype)]) for p, f in zip(parts, fill)]
    out.append(Batch(*parts))
  return out


def lm_eval_set(tokens_NT, valid_NT, *, model_kind: str, tokenizer, batch_size: int, seed: int) -> EvalSet:
  """Token rows scored as the model was trained: causal LM (decoder) or masked LM with a fixed mask."""
  tokens_NT, valid_NT = np.asarray(tokens_NT, np.int32), np.asarray(valid_NT, bool)
  if model_kind == "decoder":
    targets_NT = np.concatenate([tokens_NT[:, 1:], tokens_NT[:, -1:]], axis=1)
    weights_NT = (valid_NT & np.concatenate([valid_NT[:, 1:], np.zeros_like(valid_NT[:, :1])], axis=1)).astype(
      np.float32
    )
    inputs_NT = tokens_NT
  else:
    from headspec.model import objectives

    mask_id = tokenizer.mask_id if tokenizer.mask_id is not None else tokenizer.unk_id
    obj = objectives.Objective(kind="encoder", vocab_size=tokenizer.vocab_size, mask_id=mask_id)
    inputs, chosen = objectives.mlm_corrupt(tokens_NT, np.arange(len(tokens_NT)), jax.random.key(seed), obj)
    inputs_NT = np.where(valid_NT, np.asarray(inputs), tokens_NT).astype(np.int32)
    weights_NT = (np.asarray(chosen) * valid_NT).astype(np.float32)
    targets_NT = tokens_NT
  what = "causal LM" if model_kind == "decoder" else "masked LM (fixed seeded mask)"
  return EvalSet(
    "lm",
    _batches(inputs_NT, valid_NT, targets_NT, weights_NT, batch_size),
    len(tokens_NT),
    f"{int(weights_NT.sum())} scored tokens ({what}) in {len(tokens_NT)} rows of {tokens_NT.shape[1]}",
  )


def token_rows_embedding_set(tokens_NT, valid_NT, *, batch_size: int) -> EvalSet:
  """Token rows (a run's validation rows) scored by the shift of their mean-pooled final hidden state."""
  tokens_NT, valid_NT = np.asarray(tokens_NT, np.int32), np.asarray(valid_NT, bool)
  zeros = np.zeros(tokens_NT.shape, np.float32)
  batches = _batches(tokens_NT, valid_NT, tokens_NT, zeros, batch_size)
  return EvalSet("embedding", batches, len(tokens_NT), f"{len(tokens_NT)} rows of {tokens_NT.shape[1]} tokens")


def sentence_embedding_set(windows: list[np.ndarray], *, pad_id: int, max_len: int, batch_tokens: int) -> EvalSet:
  """Sentences (token ids with their specials) in power-of-two length buckets of `batch_tokens` tokens."""
  lengths = np.array([len(w) for w in windows])
  buckets = np.array([bucket_length(n, max_len) for n in lengths])
  batches = []
  for T in np.unique(buckets):
    idx = np.flatnonzero(buckets == T)
    B = max(1, batch_tokens // int(T))
    inputs_NT = np.full((len(idx), T), pad_id, np.int32)
    valid_NT = np.zeros((len(idx), T), bool)
    for r, i in enumerate(idx):
      inputs_NT[r, : lengths[i]] = windows[i][:T]
      valid_NT[r, : lengths[i]] = True
    zeros = np.zeros(inputs_NT.shape, np.float32)
    for b in _batches(inputs_NT, valid_NT, inputs_NT, zeros, B):
      batches.append(
        dataclasses.replace(b, sequence_B=np.where(b.sequence_B >= 0, idx[np.maximum(b.sequence_B, 0)], -1))
      )
  return EvalSet("embedding", batches, len(windows), f"{len(windows)} sentences, {int(lengths.sum())} tokens")
