"""First-fit-decreasing packing of variable-length sequences side by side into rows of one width.

Wherever sequences of different lengths go through one compiled program, packing spends the compute on
items rather than padding: the arc probe packs sentences (their words) into rows of candidates
(probing/arc.py), feature extraction packs token windows into model rows (probing/features.py; the
model keeps them apart with `positions_BT` and `segment_BT`). EWT sentences average ~16 words, so one
row per sentence padded to a power of two wastes a third to a half of every pass.
"""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Packing:
  """Item n (a word, a token) sits at (row_N[n], col_N[n]) of a [num_rows, width] grid; start_N[n] is the
  column of its sequence's first item (which also names the sequence within its row)."""

  width: int
  num_rows: int
  row_N: np.ndarray
  col_N: np.ndarray
  start_N: np.ndarray

  def grid(self, values_N, fill, dtype) -> np.ndarray:
    """values_N (with trailing axes) laid out as [num_rows, width, ...]; `fill` elsewhere."""
    values_N = np.asarray(values_N)
    out = np.full((self.num_rows, self.width) + values_N.shape[1:], fill, dtype)
    out[self.row_N, self.col_N] = values_N
    return out


def first_fit(lengths_U: np.ndarray, width: int) -> Packing:
  """First-fit decreasing: the longest sequence first, each into the first row with room (items of
  sequence u are consecutive in the flat order, lengths_U[u] of them; each length must be <= width).

  By hand: grain's first-fit packing iterates a dataset example by example to emit training batches;
  here one placement is reused for inputs, labels and outputs, so only the (row, column) of each item
  is wanted."""
  lengths_U = np.asarray(lengths_U, np.int64)
  free_B = np.zeros(len(lengths_U), np.int64)  # at most one row per sequence
  row_U, start_U = np.zeros_like(lengths_U), np.zeros_like(lengths_U)
  num_rows = 0
  for s in np.argsort(-lengths_U, kind="stable"):
    fits = np.flatnonzero(free_B[:num_rows] >= lengths_U[s])
    r = int(fits[0]) if len(fits) else num_rows
    if r == num_rows:
      free_B[r], num_rows = width, num_rows + 1
    row_U[s], start_U[s] = r, width - free_B[r]
    free_B[r] -= lengths_U[s]
  seq_N = np.repeat(np.arange(len(lengths_U)), lengths_U)
  first_N = np.concatenate([[0], np.cumsum(lengths_U)[:-1]])[seq_N]
  start_N = start_U[seq_N]
  return Packing(width, num_rows, row_U[seq_N], start_N + np.arange(len(seq_N)) - first_N, start_N)


def by_width(lengths_U: np.ndarray, width: int) -> list[tuple[np.ndarray, np.ndarray, Packing]]:
  """Sequences grouped by the row width they need (`width`, or the next power of two for longer ones),
  each group packed: [(sequence ids, item ids in flat order, packing)] per width, narrowest first."""
  lengths_U = np.asarray(lengths_U, np.int64)
  offsets_U = np.concatenate([[0], np.cumsum(lengths_U)[:-1]])
  widths_U = np.array([max(width, 1 << max(0, int(n) - 1).bit_length()) for n in lengths_U])
  out = []
  for w in np.unique(widths_U):
    which_U = np.flatnonzero(widths_U == w)
    items_N = np.concatenate([np.arange(offsets_U[s], offsets_U[s] + lengths_U[s]) for s in which_U])
    out.append((which_U, items_N, first_fit(lengths_U[which_U], int(w))))
  return out
