"""Figures of `headspec sae`, drawn from the rows of sae/heads.csv and sae/features.csv (matplotlib without
pyplot: headspec/words/figures.py).

One file per (model, step, site, SAE configuration) and figure, in RUN/sae/:
  heads_<tag>.png     layer × head heatmaps of each head's features carried, exclusive features and feature
                      specialization S_h (docs/sae.md), over every layer of heads.csv with an SAE of this tag
                      (`layers=all` draws the whole model; one layer's SAE draws one row)
  entropy_<tag>.png   per layer, the histogram of the live features' head-attribution entropy H_f in bits,
                      with log2 H (a feature spread evenly over the heads) marked
<tag> = <model>_step<step>_<site>_<sae>, the model's name made one file-name component (headspec/io/filenames.py)
and <sae> the tables' `sae` column (topk-f256-k16). Each figure is written whole (headspec.io.remote.save_figure).
"""

from __future__ import annotations

import math

import matplotlib
import numpy as np
from etils import epath

from headspec.io import filenames, remote
from headspec.words import figures

HEAD_METRICS = (
  ("features_carried", "features carried (a_fh ≥ carry_min)"),
  ("exclusive_features", "exclusive features (a_fh ≥ exclusive_min)"),
  ("specialization", "feature specialization S_h"),
)


def tag(model: str, step: int, site: str, sae: str) -> str:
  """The figures' name part of one (model, step, site, SAE): model through filenames.component."""
  return f"{filenames.component(model)}_step{step}_{filenames.component(site)}_{filenames.component(sae)}"


def _save(fig, path) -> epath.Path:
  fig.tight_layout()
  return remote.save_figure(fig, path, dpi=110)


@matplotlib.rc_context({"text.parse_math": False})  # names drawn as written: `$` is not mathtext
def heads(rows: list[dict], num_heads: int, path, title: str) -> epath.Path:
  """heads_<tag>.png from heads.csv rows of one tag (every layer present)."""
  layers = sorted({int(r["layer"]) for r in rows})
  fig, axes = figures.new_figure(1, len(HEAD_METRICS), figsize=(4.2 * len(HEAD_METRICS), 1.2 + 0.45 * len(layers) + 1.4),
                           squeeze=False)  # fmt: skip
  for ax, (metric, label) in zip(axes[0], HEAD_METRICS):
    grid_LH = np.full((len(layers), num_heads), np.nan)
    for r in rows:
      if r["metric"] == metric:
        grid_LH[layers.index(int(r["layer"])), int(r["head"])] = float(r["value"])
    spec = metric == "specialization"
    top = 1.0 if spec else max(1.0, float(np.nanmax(grid_LH, initial=0.0)))  # counts of 0 everywhere: 0..1
    im = ax.imshow(grid_LH, aspect="auto", cmap="viridis", vmin=1 / num_heads if spec else 0, vmax=top)
    ax.set(title=label, xlabel="head", ylabel="layer", xticks=range(num_heads), yticks=range(len(layers)))
    ax.set_yticklabels(layers)
    ax.title.set_fontsize(9)
    for (i, h), v in np.ndenumerate(grid_LH):
      if np.isfinite(v):
        ax.text(h, i, f"{v:.2f}" if spec else f"{v:.0f}", ha="center", va="center", fontsize=7, color="w")
    fig.colorbar(im, ax=ax)
  fig.suptitle(title, fontsize=9)
  return _save(fig, path)


@matplotlib.rc_context({"text.parse_math": False})
def entropy(rows: list[dict], num_heads: int, path, title: str) -> epath.Path:
  """entropy_<tag>.png from features.csv rows of one tag: live features (firing_rate > 0) only."""
  layers = sorted({int(r["layer"]) for r in rows})
  top = math.log2(num_heads)
  fig, axes = figures.new_figure(1, len(layers), figsize=(3.6 * len(layers), 3.0), squeeze=False, sharey=True)
  for ax, layer in zip(axes[0], layers):
    live = [float(r["entropy_bits"]) for r in rows if int(r["layer"]) == layer and float(r["firing_rate"]) > 0]
    ax.hist(live, bins=np.linspace(0, top, 21), color="C0")
    ax.axvline(top, color="gray", lw=0.8, ls="--", label=f"log2 H = {top:g}: spread evenly")
    ax.set(title=f"layer {layer}: {len(live)} live features", xlabel="head attribution entropy H_f (bits)")
    ax.title.set_fontsize(9)
  axes[0, 0].set_ylabel("features")
  axes[0, 0].legend(fontsize=7, loc="upper left")
  fig.suptitle(title, fontsize=9)
  return _save(fig, path)
