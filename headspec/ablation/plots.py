"""Figures of `headspec ablate`, drawn from the rows of the ablation tables (matplotlib without pyplot:
headspec/words/figures.py).

One file per (model, step) and figure: heads_<tag>.png (layer × head heatmaps of every method and metric
of heads.csv), pruning_<tag>.png (metric vs fraction pruned per ranking; random: mean with min–max band
over seeds), gates_<tag>.png (heads kept vs held-out loss over λ), causal_<tag>.png (probe accuracy vs k,
selective vs layer-matched random), interactions_<tag>.png (pair matrix and a graph of the strongest
pairs, spring layout from networkx). <tag> = <model>_step<step>, the model's name made one file-name
component (headspec/io/filenames.py). A path may be a URL (gs://...): each figure is written whole
(headspec.io.remote.save_figure).
"""

from __future__ import annotations

import matplotlib
import numpy as np
from etils import epath

from headspec.io import remote
from headspec.words import figures


def _save(fig, path) -> epath.Path:
  fig.tight_layout()
  return remote.save_figure(fig, path, dpi=110)


@matplotlib.rc_context({"text.parse_math": False})  # names and words drawn as written: `$` is not mathtext
def heads(rows: list[dict], L: int, H: int, path) -> epath.Path:
  panels = sorted({(r["method"], r["metric"]) for r in rows})
  cols = min(3, len(panels))
  fig, axes = figures.new_figure(
    -(-len(panels) // cols), cols, figsize=(4.2 * cols, 3.2 * -(-len(panels) // cols)), squeeze=False
  )
  for ax, (method, metric) in zip(axes.ravel(), panels):
    grid = np.full((L, H), np.nan)
    for r in rows:
      if (r["method"], r["metric"]) == (method, metric):
        grid[int(r["layer"]), int(r["head"])] = float(r["value"])
    im = ax.imshow(grid, aspect="auto", cmap="viridis")
    ax.set(title=f"{method}: {metric}", xlabel="head", ylabel="layer")
    fig.colorbar(im, ax=ax)
  for ax in axes.ravel()[len(panels) :]:
    ax.axis("off")
  return _save(fig, path)


@matplotlib.rc_context({"text.parse_math": False})
def pruning(rows: list[dict], path) -> epath.Path:
  metrics = sorted({r["metric"] for r in rows})
  fig, axes = figures.new_figure(1, len(metrics), figsize=(5 * len(metrics), 3.8), squeeze=False)
  for ax, metric in zip(axes[0], metrics):
    for ranking in sorted({r["ranking"] for r in rows}):
      mine = [r for r in rows if r["metric"] == metric and r["ranking"] == ranking]
      fractions = sorted({float(r["fraction_pruned"]) for r in mine})
      by = np.array(
        [[float(r["value"]) for r in mine if float(r["fraction_pruned"]) == f] for f in fractions], dtype=object
      )
      if ranking == "random":
        vals = [np.asarray(v, float) for v in by]
        ax.plot(fractions, [v.mean() for v in vals], "k--", label="random (mean)")
        ax.fill_between(
          fractions, [v.min() for v in vals], [v.max() for v in vals], color="0.8", label="random (min–max)"
        )
      else:
        ax.plot(fractions, [float(v[0]) for v in by], marker="o", ms=3, label=ranking)
    ax.set(xlabel="fraction of heads pruned", ylabel=metric)
    ax.legend(fontsize=7)
  return _save(fig, path)


@matplotlib.rc_context({"text.parse_math": False})
def gates(rows: list[dict], path) -> epath.Path:
  summary = {}
  for r in rows:
    if int(r["layer"]) == -1:
      entry = summary.setdefault(float(r["penalty"]), {"heads_kept": int(r["heads_kept"])})
      entry[r["metric"]] = float(r["value"])
  lams = sorted(summary)
  fig, ax = figures.new_figure(figsize=(5, 3.8))
  ax.plot([summary[x]["heads_kept"] for x in lams], [summary[x]["loss"] for x in lams], "o-")
  for x in lams:
    ax.annotate(f"λ={x:g}", (summary[x]["heads_kept"], summary[x]["loss"]), fontsize=7)
  ax.set(xlabel="heads kept (ẑ > 0)", ylabel="held-out LM loss", title="L0 gates")
  return _save(fig, path)


@matplotlib.rc_context({"text.parse_math": False})
def causal(rows: list[dict], path) -> epath.Path:
  tasks = sorted({r["task"] for r in rows})
  fig, axes = figures.new_figure(1, len(tasks), figsize=(4.5 * len(tasks), 3.6), squeeze=False)
  for ax, task in zip(axes[0], tasks):
    mine = [r for r in rows if r["task"] == task and r["metric"] == "probe_accuracy"]
    ks = sorted({int(r["k"]) for r in mine if int(r["k"]) > 0})
    sel = [next(r for r in mine if int(r["k"]) == k and r["selection"] == "selective") for k in ks]
    ax.errorbar(
      ks, [float(r["value"]) for r in sel],
      yerr=[[float(r["value"]) - float(r["ci_low"]) for r in sel], [float(r["ci_high"]) - float(r["value"]) for r in sel]],
      marker="o", label="selective",
    )  # fmt: skip
    rand = [
      [float(r["value"]) for r in mine if int(r["k"]) == k and r["selection"] == "random_layer_matched"] for k in ks
    ]
    ax.plot(ks, [np.mean(v) for v in rand], "k--", label="random, layer-matched (mean)")
    ax.fill_between(ks, [min(v) for v in rand], [max(v) for v in rand], color="0.85")
    ax.set(xlabel="heads ablated (k)", ylabel="refitted probe accuracy (test)", title=task)
    figures.log_x(ax)
    ax.legend(fontsize=7)
  return _save(fig, path)


@matplotlib.rc_context({"text.parse_math": False})
def interactions(rows: list[dict], path) -> epath.Path:
  import networkx as nx

  heads = sorted(
    {(int(r["layer_a"]), int(r["head_a"])) for r in rows} | {(int(r["layer_b"]), int(r["head_b"])) for r in rows}
  )
  index = {h: i for i, h in enumerate(heads)}
  matrix = np.zeros((len(heads), len(heads)))
  for r in rows:
    i, j = index[(int(r["layer_a"]), int(r["head_a"]))], index[(int(r["layer_b"]), int(r["head_b"]))]
    matrix[i, j] = matrix[j, i] = float(r["interaction"])
  fig, (ax1, ax2) = figures.new_figure(1, 2, figsize=(11, 4.8))
  lim = max(np.abs(matrix).max(), 1e-12)
  im = ax1.imshow(matrix, cmap="RdBu_r", vmin=-lim, vmax=lim)
  labels = [f"{l}.{h}" for l, h in heads]
  ax1.set_xticks(range(len(heads)), labels, rotation=90, fontsize=7)
  ax1.set_yticks(range(len(heads)), labels, fontsize=7)
  ax1.set_title(f"interaction ({rows[0]['metric'] if rows else ''})")
  fig.colorbar(im, ax=ax1)
  graph = nx.Graph()
  graph.add_nodes_from(labels)
  strongest = sorted(rows, key=lambda r: -abs(float(r["interaction"])))[: max(1, len(rows) // 4)]
  for r in strongest:
    graph.add_edge(f"{r['layer_a']}.{r['head_a']}", f"{r['layer_b']}.{r['head_b']}", weight=float(r["interaction"]))
  pos = nx.spring_layout(graph, seed=0)
  weights = [graph[u][v]["weight"] for u, v in graph.edges]
  nx.draw_networkx_nodes(graph, pos, ax=ax2, node_color="0.85", node_size=420)
  nx.draw_networkx_labels(graph, pos, ax=ax2, font_size=7)
  nx.draw_networkx_edges(
    graph, pos, ax=ax2, edge_color=["tab:red" if w > 0 else "tab:blue" for w in weights],
    width=[0.5 + 4 * abs(w) / lim for w in weights],
  )  # fmt: skip
  ax2.set_title("strongest quarter of pairs (red > 0, blue < 0)")
  ax2.axis("off")
  return _save(fig, path)
