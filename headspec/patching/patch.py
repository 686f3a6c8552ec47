"""Prompt pairs in, tidy tables out: the checks and DataFrames of `headspec.patch`, `headspec.attribution_patch`
and `headspec.path_patch` (headspec/api/patch.py) and of `headspec patch` (headspec/patching/run.py).

Tables: `layer, head, position, value` (head −1 for per-layer sites, position −1 when not by position;
docs/patching.md). `attrs` of each frame: the metric on the unpatched base and source runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from headspec.arguments import is_token_id, short, unicode_problem
from headspec.errors import UserError
from headspec.model.sites import SITES
from headspec.model.tokens import check_ids
from headspec.patching import core

DIRECTIONS = ("denoising", "noising")


@dataclasses.dataclass(frozen=True)
class Prompts:
  """Clean and corrupted prompts as right-padded token rows [B,T], with each row's last real position
  and its (correct, wrong) answer ids (zeros when the metric is a callable)."""

  clean_BT: np.ndarray
  corrupt_BT: np.ndarray
  valid_BT: np.ndarray
  last_B: np.ndarray
  answers_B2: np.ndarray

  def runs(self, direction: str) -> tuple[np.ndarray, np.ndarray]:
    """(base, source): denoising runs the corrupted prompt with clean activations, noising the reverse."""
    if direction not in DIRECTIONS:
      raise UserError(f"direction={direction!r}: choose 'denoising' (the default) or 'noising'")
    return (self.corrupt_BT, self.clean_BT) if direction == "denoising" else (self.clean_BT, self.corrupt_BT)


def answer_id(tokenizer, prompt, answer: str, where: str) -> int:
  """The token id of a text answer (' Mary'): the one token it adds after its clean prompt when that is a
  text (as `headspec circuit`'s pairs file reads it), its own one token after a prompt of token ids.
  UserError naming `where` for anything but one token."""
  if not isinstance(prompt, str):
    ids = list(tokenizer.encode(answer))
    if len(ids) != 1:
      raise UserError(f"{where}={answer!r} is {len(ids)} tokens {ids}, not one; give a single-token answer or its id")
    return int(ids[0])
  before, after = list(tokenizer.encode(prompt)), list(tokenizer.encode(prompt + answer))
  if after[: len(before)] != before:
    raise UserError(f"{where}={answer!r} merges with the end of its clean prompt's tokens; give its token id")
  if len(after) != len(before) + 1:
    raise UserError(
      f"{where}={answer!r} is {len(after) - len(before)} tokens after its clean prompt, not one; give a "
      "single-token answer or its token id"
    )
  return int(after[-1])


def _ids(prompt, tokenizer, what: str, index: int, V: int) -> list[int]:
  if isinstance(prompt, str):
    if tokenizer is None:
      raise UserError(f"{what}[{index}] is a text but no tokenizer was given; pass token ids or tokenizer=")
    if unicode_problem(prompt):
      raise UserError(f"{what}[{index}]: {unicode_problem(prompt)}; give valid Unicode text")
    return list(tokenizer.prefix_ids) + list(tokenizer.encode(prompt)) + list(tokenizer.suffix_ids)
  if isinstance(prompt, Sequence | np.ndarray) and all(isinstance(t, int | np.integer) for t in prompt):
    return check_ids(prompt, V, f"{what}[{index}]")  # the API's one check of token ids (no bools)
  raise UserError(f"{what}[{index}]: a {type(prompt).__name__}; give a text or a list of token ids")


def _listed(value, what: str, items: str) -> list:
  """A list, tuple or numpy array (of prompts, of answers) as a list; UserError naming `what` otherwise."""
  if isinstance(value, str) or not isinstance(value, Sequence | np.ndarray) or getattr(value, "ndim", 1) == 0:
    raise UserError(f"{what}={short(value)} must be a list of {items} (or a numpy array), not {type(value).__name__}")
  return list(value)


def prompts(cfg, clean, corrupt, answers, metric, tokenizer=None, pad_id: int = 0) -> Prompts:
  """Checked prompt pairs: equal numbers, pairwise equal non-zero token counts, within max_len, answers in
  range (a list of (correct, wrong) pairs or a numpy [B, 2] array)."""
  if isinstance(clean, str) or isinstance(corrupt, str):
    raise UserError("clean and corrupt are lists of prompts (texts or token-id lists), not one text")
  clean, corrupt = _listed(clean, "clean", "prompts"), _listed(corrupt, "corrupt", "prompts")
  if len(clean) != len(corrupt) or not clean:
    raise UserError(f"clean has {len(clean)} prompts and corrupt {len(corrupt)}: give equal, non-zero numbers")
  V = cfg.vocab_size
  rows_c = [_ids(p, tokenizer, "clean", i, V) for i, p in enumerate(clean)]
  rows_x = [_ids(p, tokenizer, "corrupt", i, V) for i, p in enumerate(corrupt)]
  for i, (c, x) in enumerate(zip(rows_c, rows_x)):
    if not c or not x:
      raise UserError(
        f"prompt pair {i}: {'clean' if not c else 'corrupt'} is empty (no tokens); every prompt needs one"
      )
    if len(c) != len(x):
      raise UserError(f"prompt pair {i}: clean has {len(c)} tokens and corrupt {len(x)}; they must be equal")
    if len(c) > cfg.max_len:
      raise UserError(f"prompt pair {i}: {len(c)} tokens exceed model.max_len={cfg.max_len}")
  if isinstance(metric, str) and metric in core.METRICS:  # every named metric reads the answers
    answers = None if answers is None else _listed(answers, "answers", "(correct_id, wrong_id) pairs")
    if answers is None or len(answers) != len(clean):
      got = "none" if answers is None else len(answers)
      raise UserError(
        f"metric={metric!r} needs answers: one (correct_id, wrong_id) per prompt ({got} for {len(clean)})"
      )
    for i, pair in enumerate(answers):
      ok = isinstance(pair, Sequence | np.ndarray) and not isinstance(pair, str) and getattr(pair, "ndim", 1) == 1
      if not (ok and len(pair) == 2 and all(is_token_id(a) for a in pair)):
        shown = pair.tolist() if isinstance(pair, np.ndarray) else pair
        raise UserError(f"answers[{i}] = {short(shown)}: give a (correct_id, wrong_id) pair of token ids")
      bad = [a for a in pair if not 0 <= a < V]
      if bad:
        raise UserError(f"answers[{i}]: token id {bad[0]} is outside the vocabulary 0..{V - 1}")
    answers_B2 = np.asarray(answers, np.int32)
  elif callable(metric):
    answers_B2 = np.zeros((len(clean), 2), np.int32)
  else:
    raise UserError(
      f"metric={metric!r}: give one of {', '.join(core.METRICS)} (with answers) or a callable on the logits [B,T,V]"
    )
  B, T = len(clean), max(map(len, rows_c))
  if callable(metric):
    check_metric(metric, B, T, V)
  out = {k: np.full((B, T), pad_id, np.int32) for k in ("clean", "corrupt")}
  valid = np.zeros((B, T), bool)
  for b, (c, x) in enumerate(zip(rows_c, rows_x)):
    out["clean"][b, : len(c)], out["corrupt"][b, : len(x)], valid[b, : len(c)] = c, x, True
  last = np.asarray([len(c) - 1 for c in rows_c], np.int32)
  return Prompts(out["clean"], out["corrupt"], valid, last, answers_B2)


def check_metric(metric, B: int, T: int, V: int) -> None:
  """A callable metric's output checked once, abstractly (jax.eval_shape, no computation): one number from
  the logits [B, T, V]; a vector (a value per prompt) or a failing call is one UserError line."""
  import jax

  try:
    out = jax.eval_shape(metric, jax.ShapeDtypeStruct((B, T, V), np.float32))
  except Exception as e:  # noqa: BLE001  (the user's function)
    first = (str(e).strip().splitlines() or [""])[0][:200]
    raise UserError(
      f"metric: calling it on logits [B={B}, T={T}, V={V}] failed ({type(e).__name__}: {first})"
    ) from None
  shape = getattr(out, "shape", None)
  if shape is None or int(np.prod(shape)) != 1:
    got = f"shape {tuple(shape)}" if shape is not None else f"a {type(out).__name__}"
    raise UserError(
      f"metric: returned {got} from logits [B={B}, T={T}, V={V}]; it must return one number (e.g. a mean over B)"
    )


def _range(values, size: int, what: str) -> list[int]:
  if values is None:
    return list(range(size))
  values = [values] if isinstance(values, int | np.integer) else list(values)
  for v in values:
    if not isinstance(v, int | np.integer) or not 0 <= v < size:
      raise UserError(f"{what} {v!r} is out of range: the model has {what}s 0..{size - 1}")
  if not values:
    raise UserError(f"no {what}s given")
  return [int(v) for v in values]


def check_site(site: str) -> str:
  if site not in SITES:
    raise UserError(f"unknown site {site!r}; choose from {', '.join(SITES)}")
  return site


def _frame(rows):
  import pandas as pd

  frame = pd.DataFrame(rows, columns=["layer", "head", "position", "value"])
  return frame.astype({"layer": "int64", "head": "int64", "position": "int64", "value": "float64"})


def patch(model, p: Prompts, *, site, metric, by_position=True, direction="denoising", layers=None, heads=None,
          positions=None):  # fmt: skip
  """Activation patching of every (layer, head, position) asked for, one compiled sweep: a DataFrame."""
  cfg = model.cfg
  check_site(site)
  base, source = p.runs(direction)
  layers = _range(layers, cfg.num_layers, "layer")
  heads = _range(heads, cfg.num_heads, "head")
  positions = _range(positions, base.shape[1], "position")
  patches = core.grid(cfg, site, base.shape[1], by_position, layers, heads, positions)
  base_value, source_value, values_LE = core.run_sweep(
    model, site, metric, base, source, p.valid_BT, p.last_B, p.answers_B2, patches
  )
  heads_E, positions_E, _ = patches
  rows = [(layer, int(h), int(t), float(values_LE[layer, e])) for layer in layers for e, (h, t) in
          enumerate(zip(heads_E, positions_E))]  # fmt: skip
  frame = _frame(rows)
  frame.attrs.update(base=base_value, source=source_value, site=site, direction=direction)
  return frame


def attribution(model, p: Prompts, *, site, metric, by_position=True, direction="denoising"):
  """Attribution patching: the estimated metric change (a_source − a_base)·∂metric/∂a per (layer, head,
  position) from one forward and one backward pass; same columns as `patch` (value: the estimated change)."""
  check_site(site)
  base, source = p.runs(direction)
  grads = core.run_attribution(model, site, metric, base, source, p.valid_BT, p.last_B, p.answers_B2)
  axes = SITES[site][1:]  # the batch axis is summed
  keep = [a for a in ("H", "T") if a in axes and (a == "H" or by_position)]  # the table's axes, in this order
  arr = grads.sum(axis=tuple(1 + i for i, a in enumerate(axes) if a not in keep))
  arr = np.transpose(arr, [0] + [1 + sorted(keep, key=axes.index).index(a) for a in keep])
  rows = []
  for layer in range(arr.shape[0]):
    for index in np.ndindex(*arr.shape[1:]):
      named = dict(zip(keep, index))
      rows.append((layer, named.get("H", -1), named.get("T", -1), float(arr[(layer, *index)])))
  frame = _frame(rows)
  frame.attrs.update(site=site, direction=direction)
  return frame


def agreement(exact, estimate) -> float:
  """Pearson correlation of attribution patching's estimated change with exact patching's (value − base)
  over the rows both have (Syed et al. 2023 report this agreement)."""
  merged = exact.merge(estimate, on=["layer", "head", "position"], suffixes=("_exact", "_estimate"))
  change = merged["value_exact"] - exact.attrs["base"]
  ok = np.isfinite(change) & np.isfinite(merged["value_estimate"])
  if ok.sum() < 2 or np.std(change[ok]) == 0 or np.std(merged["value_estimate"][ok]) == 0:
    return float("nan")
  return float(np.corrcoef(change[ok], merged["value_estimate"][ok])[0, 1])


def path(model, p: Prompts, *, metric, receivers=None, receiver_site="q", direction="denoising", senders=None):
  """Path patching: for each sender head (every head by default), the metric when its effect reaches only the
  receivers' `receiver_site` ('q', 'k', 'v'; receivers: (layer, head) pairs) or, with receiver_site='logits',
  only the logits directly. Columns layer, head (the sender's), position −1, value."""
  cfg = model.cfg
  L, H = cfg.num_layers, cfg.num_heads
  if receiver_site not in ("q", "k", "v", "logits"):
    raise UserError(f"receiver_site={receiver_site!r}: choose 'q', 'k', 'v' or 'logits'")
  receivers_LH = np.zeros((L, H), np.float32)
  if receiver_site != "logits":
    if not receivers:
      raise UserError(f"receiver_site={receiver_site!r} needs receivers: (layer, head) pairs")
    for pair in receivers:
      layer, head = _pair(pair, L, H, "receiver")
      receivers_LH[layer, head] = 1.0
  senders = [(a, b) for a in range(L) for b in range(H)] if senders is None else [
    _pair(s, L, H, "sender") for s in senders]  # fmt: skip
  if not senders:
    raise UserError("senders=[]: no sender heads given; give (layer, head) pairs, or None for every head")
  base, source = p.runs(direction)
  base_value, source_value, values = core.run_path(
    model, receiver_site, metric, base, source, p.valid_BT, p.last_B, p.answers_B2, senders, receivers_LH
  )
  frame = _frame([(s[0], s[1], -1, float(v)) for s, v in zip(senders, values)])
  frame.attrs.update(base=base_value, source=source_value, receiver_site=receiver_site, direction=direction)
  return frame


def _pair(pair, L: int, H: int, what: str) -> tuple[int, int]:
  if not (isinstance(pair, Sequence) and len(pair) == 2 and all(isinstance(v, int | np.integer) for v in pair)):
    raise UserError(f"{what} {pair!r}: give a (layer, head) pair of ints")
  if not (0 <= pair[0] < L and 0 <= pair[1] < H):
    raise UserError(f"{what} {tuple(pair)!r} is out of range: the model has layers 0..{L - 1}, heads 0..{H - 1}")
  return int(pair[0]), int(pair[1])
