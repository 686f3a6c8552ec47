"""Attention pictures of a few example sentences, under RUN/attention/pictures/<model>-step<step>/.

  L{l}H{h}.png              one per head: its word-level map (headspec/attention/words.py) of each
                            example sentence side by side, query words on the rows, attended words on
                            the columns (the head atlas puts these on the head's card: the name holds
                            L and H); L·H files per (model, step), not L·H per sentence
  lines_sentence{i}_layer{l}.png   a bertviz-style line view of one layer for sentence i: words left
                            (from) and right (to), a line per (head, from, to) with opacity the weight,
                            one colour per head
  rollout_flow_sentence{i}.png     attention rollout and flow (Abnar & Zuidema 2020) at the last layer,
                            over tokens, special tokens included (headspec/attention/flow.py)
  maps.npz                  the example maps themselves: words_{i}, attn_{i} [L, H, N, N], special_{i} [L, H, N]

Matplotlib figures made without pyplot (headspec/words/figures.py); nothing here needs JAX. Words are drawn as
written: mathtext is off (`PLAIN_TEXT`), so a treebank word with `$` (EWT has `$$`, `me$$age`) is never
parsed as a formula.
Paths may be local or URLs (gs://...): each file is written whole (headspec.io.remote.save_figure).
"""

from __future__ import annotations

import matplotlib
import numpy as np
from etils import epath
from matplotlib.collections import LineCollection
from matplotlib.lines import Line2D

from headspec.io import remote
from headspec.words import figures

# rcParams for every picture: words and names drawn literally, never parsed as mathtext ($...$).
PLAIN_TEXT = {"text.parse_math": False}


def _short(word: str, width: int = 12) -> str:
  return word if len(word) <= width else word[: width - 1] + "…"


@matplotlib.rc_context(PLAIN_TEXT)
def head_pictures(maps, words_list, out_dir, *, max_words: int = 40, dpi: int = 72) -> list[epath.Path]:
  """L{l}H{h}.png for every head: the example sentences' word maps side by side (first `max_words` words)."""
  out_dir = epath.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  L, H = maps[0][0].shape[:2]
  paths = []
  cut = [min(len(w), max_words) for w in words_list]
  size = [max(2.2, 0.14 * n + 1.0) for n in cut]
  fig, axes = figures.new_figure(1, len(maps), figsize=(sum(size), max(size)), squeeze=False, dpi=dpi)
  images = []
  for i, words in enumerate(words_list):
    ax, n = axes[0, i], cut[i]
    images.append(ax.imshow(np.zeros((n, n)), cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest"))
    labels = [_short(w) for w in words[:n]]
    ax.set_xticks(range(n), labels, rotation=90, fontsize=6)
    ax.set_yticks(range(n), labels, fontsize=6)
    ax.set_title(f"sentence {i}", fontsize=8)
  for l in range(L):
    for h in range(H):
      for i, (attn_LHNN, _) in enumerate(maps):
        shown = attn_LHNN[l, h, : cut[i], : cut[i]]
        images[i].set_data(shown)
        images[i].set_clim(0.0, max(float(shown.max()), 1e-6))
      fig.suptitle(
        f"layer {l} head {h}: word-level attention, rows attend to columns (colour scale 0 to max)", fontsize=9
      )
      paths.append(remote.save_figure(fig, out_dir / f"L{l}H{h}.png", dpi=dpi, bbox_inches="tight"))
  return paths


@matplotlib.rc_context(PLAIN_TEXT)
def line_view(attn_HNN, words, path, *, title: str = "", min_weight: float = 0.1, max_words: int = 40, dpi: int = 80):
  """A bertviz-style line view of one layer: a line from word i (left) to word j (right) per head,
  opacity = attn[h, i, j] (lines under `min_weight` left out), one colour per head."""
  H = attn_HNN.shape[0]
  n = min(len(words), max_words)
  fig, ax = figures.new_figure(figsize=(4.5, 0.22 * n + 1.2), dpi=dpi)
  colours = matplotlib.colormaps["tab20" if H > 10 else "tab10"](np.arange(H) % (20 if H > 10 else 10))
  segments, rgba = [], []
  for h in range(H):
    i, j = np.nonzero(attn_HNN[h, :n, :n] >= min_weight)
    for a, b in zip(i, j):
      segments.append([(0.0, -a), (1.0, -b)])
      rgba.append((*colours[h][:3], float(min(1.0, attn_HNN[h, a, b]))))
  ax.add_collection(LineCollection(segments, colors=rgba, linewidths=1.2))
  for k, w in enumerate(words[:n]):
    ax.text(-0.03, -k, _short(w, 16), ha="right", va="center", fontsize=7)
    ax.text(1.03, -k, _short(w, 16), ha="left", va="center", fontsize=7)
  ax.set_xlim(-0.6, 1.6)
  ax.set_ylim(-n + 0.5, 0.5)
  ax.axis("off")
  handles = [Line2D([], [], color=colours[h], label=f"head {h}") for h in range(H)]
  ax.legend(handles=handles, fontsize=6, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=min(H, 6), frameon=False)
  ax.set_title(title, fontsize=8)
  return remote.save_figure(fig, path, dpi=dpi, bbox_inches="tight")


@matplotlib.rc_context(PLAIN_TEXT)
def rollout_flow_picture(rollout_TT, flow_TT, tokens, path, *, title: str = "", dpi: int = 80):
  """Two heatmaps over tokens: rollout and (if given) flow, output positions on the rows."""
  panels = [("attention rollout", rollout_TT)] + ([("attention flow", flow_TT)] if flow_TT is not None else [])
  T = len(tokens)
  side = max(3.0, 0.16 * T + 1.2)
  fig, axes = figures.new_figure(1, len(panels), figsize=(side * len(panels), side), squeeze=False, dpi=dpi)
  for ax, (name, matrix) in zip(axes[0], panels):
    ax.imshow(matrix, cmap="Purples", interpolation="nearest")
    labels = [_short(t) for t in tokens]
    ax.set_xticks(range(T), labels, rotation=90, fontsize=6)
    ax.set_yticks(range(T), labels, fontsize=6)
    ax.set_title(name, fontsize=8)
  fig.suptitle(title, fontsize=9)
  return remote.save_figure(fig, path, dpi=dpi, bbox_inches="tight")
