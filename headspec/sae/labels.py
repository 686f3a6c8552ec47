"""SAE features against a UD treebank: where each fires, its top contexts and its label profiles.

Every word of the split is run through the model once (windows of word pieces, headspec/words/alignment.py,
batched and pooled by headspec/words/batches.py); a word's activation is its pieces' site activation pooled
as the probes pool it ('auto': the last piece for decoders, the first for encoders), and its features are
the SAE's encoding of that. Streamed per batch:
for each feature the words where it fires (a_f > 0), the counts of each UPOS, deprel (without subtype) and
head distance (head index − word index, clipped to ±`MAX_DISTANCE`, 'root' for the root) among them, and
its `top` highest activations with their words.

Feature selectivity for a label set Y (docs/sae.md): sel_f = max_y [P(y | f fires) − P(y)], with y* the
label attaining it: how far the words where f fires are concentrated on one label beyond that label's base
rate (0 for a feature that fires regardless of the label, 1 − P(y) for one that fires only on y). NaN
for a feature firing on fewer than `min_fires` words.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from flax import nnx

from headspec.parallel import mesh as mesh_lib
from headspec.parallel.compilations import program_cache
from headspec.words import alignment as align_lib
from headspec.words import batches as words_lib

LABEL_SETS = ("upos", "deprel", "head_distance")
MAX_DISTANCE = 5


def head_distance(head: int, position: int) -> str:
  """The signed distance from a word (1-based `position`) to its head, clipped: 'root', '-5'..'+5', '<-5', '>+5'."""
  if head == 0:
    return "root"
  d = head - position
  if d > MAX_DISTANCE:
    return f">+{MAX_DISTANCE}"
  if d < -MAX_DISTANCE:
    return f"<-{MAX_DISTANCE}"
  return f"{d:+d}"


def word_labels(sentences) -> dict[str, list[str]]:
  """{label set: one label per word of the split, in word order}."""
  out = {name: [] for name in LABEL_SETS}
  for s in sentences:
    out["upos"] += list(s.upos)
    out["deprel"] += [d.split(":")[0] for d in s.deprels]
    out["head_distance"] += [head_distance(h, i + 1) for i, h in enumerate(s.heads)]
  return out


@dataclasses.dataclass
class Profile:
  """What the streamed pass gathered: fires_F, activation sums, per label set the labels and counts_FC, the
  base counts_C, and the top activations (value_Fn, word_Fn; word −1 where a feature fired fewer times)."""

  num_words: int
  fires_F: np.ndarray
  activation_sum_F: np.ndarray
  labels: dict[str, list[str]]
  counts: dict[str, np.ndarray]
  base: dict[str, np.ndarray]
  top_value_Fn: np.ndarray
  top_word_Fn: np.ndarray

  def selectivity(self, label_set: str, min_fires: int) -> tuple[np.ndarray, list[str]]:
    """([F] sel_f, [F] y*) for `label_set` (module docstring); y* '' where sel is NaN."""
    counts_FC, base_C = self.counts[label_set], self.base[label_set] / max(self.num_words, 1)
    p_FC = counts_FC / np.maximum(self.fires_F, 1)[:, None]
    lift_FC = p_FC - base_C[None]
    best_F = lift_FC.argmax(1)
    ok_F = self.fires_F >= min_fires
    sel_F = np.where(ok_F, lift_FC[np.arange(len(best_F)), best_F], np.nan)
    names = self.labels[label_set]
    return sel_F, [names[c] if ok else "" for c, ok in zip(best_F, ok_F)]


@program_cache(8)
def _window_program(graphdef, site: str, layer: int):
  """jit(params, tokens_BT, valid_BT) -> [B, T, E] float32: `site` at `layer`, each token's values flat."""

  @mesh_lib.jit
  def run(params, tokens_BT, valid_BT):
    _, inter = nnx.merge(graphdef, params)(tokens_BT, valid_BT=valid_BT, capture=(site,))
    x = inter.site(site)[layer]
    return x.reshape(*x.shape[:2], -1).astype(jnp.float32)

  return run


def profile(model, tokenizer, sentences, sae, *, site: str, layer: int, pooling: str, batch_tokens: int, top: int):
  """The streamed `Profile` of `sae`'s features over every word of `sentences` (module docstring)."""
  cfg = model.cfg
  al = align_lib.align([s.words for s in sentences], tokenizer, cfg.max_len, causal=cfg.kind == "decoder")
  pooling = align_lib.resolve_pooling(pooling, cfg.kind)
  per_word = word_labels(sentences)
  labels, index = {}, {}
  for name, values in per_word.items():
    labels[name] = sorted(set(values))
    lookup = {v: i for i, v in enumerate(labels[name])}
    index[name] = np.array([lookup[v] for v in values], np.int64)
  F, N = sae.num_features, al.num_words
  counts = {name: np.zeros((F, len(labels[name]))) for name in LABEL_SETS}
  fires_F, activation_F = np.zeros(F, np.int64), np.zeros(F)
  top_value_Fn, top_word_Fn = np.full((F, top), -np.inf), np.full((F, top), -1, np.int64)
  words_of_window = words_lib.words_of_windows(al)
  graphdef, params = nnx.split(model)
  program = _window_program(graphdef, site, layer)
  lengths = np.array([len(w) for w in al.windows])
  for T, B, windows in words_lib.window_batches(lengths, cfg.max_len, batch_tokens):
    (tokens_BT, _, segment_BT, _), word_BW = words_lib.window_inputs(
      T, B, windows, al, words_of_window, tokenizer.pad_id, None
    )  # no word matrix: pool_rows pools on the host
    x_BTE = np.asarray(program(params, jnp.asarray(tokens_BT), jnp.asarray(segment_BT > 0)))
    x_WE, n_W = words_lib.pool_rows(x_BTE, word_BW, al, pooling)
    if not len(n_W):
      continue
    f_WF = np.asarray(sae.encode(x_WE), np.float64)
    on_WF = f_WF > 0
    fires_F += on_WF.sum(0)
    activation_F += f_WF.sum(0)
    for name in LABEL_SETS:
      onehot_WC = np.zeros((len(n_W), len(labels[name])))
      onehot_WC[np.arange(len(n_W)), index[name][n_W]] = 1.0
      counts[name] += on_WF.T.astype(np.float64) @ onehot_WC
    values_Fm = np.concatenate([top_value_Fn, np.where(on_WF, f_WF, -np.inf).T], 1)
    words_Fm = np.concatenate([top_word_Fn, np.broadcast_to(n_W, (F, len(n_W)))], 1)
    keep_Fn = np.argsort(-values_Fm, axis=1, kind="stable")[:, :top]
    top_value_Fn = np.take_along_axis(values_Fm, keep_Fn, 1)
    top_word_Fn = np.where(np.isfinite(top_value_Fn), np.take_along_axis(words_Fm, keep_Fn, 1), -1)
  base = {name: np.bincount(index[name], minlength=len(labels[name])).astype(np.float64) for name in LABEL_SETS}
  return Profile(N, fires_F, activation_F, labels, counts, base, top_value_Fn, top_word_Fn), al


def context(sentence_words, position: int, width: int) -> str:
  """The word at 0-based `position` in [[ ]] with up to `width` words either side."""
  left = sentence_words[max(0, position - width) : position]
  right = sentence_words[position + 1 : position + 1 + width]
  return " ".join([*left, f"[[{sentence_words[position]}]]", *right])
