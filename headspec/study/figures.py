"""The study's figures (ROOT/study/*.png), drawn from its tables."""

from __future__ import annotations

import numpy as np
from etils import epath

from headspec.io import remote
from headspec.study.collect import ROLES, tasks
from headspec.study.statistics import _by_condition
from headspec.words import figures


def figure_tasks(em) -> list[str]:
  """The emergence figure's panels: every registered probe task (`collect.tasks()`) with rows, in its order."""
  present = set(em["task"])
  return [t for t in tasks() if t in present]


def _figures(frames: dict, out: epath.Path) -> list[str]:
  import matplotlib

  # Condition and run names are drawn as written: `$` is not mathtext.
  with matplotlib.rc_context({"text.parse_math": False}):
    return _draw(frames, out)


def _loss_figure(tr, colors):
  """study/loss.png: every run's training loss (line) and validation loss (points) by step."""
  fig, ax = figures.new_figure(figsize=(5.5, 3.5))
  for _run, g in tr.groupby("run"):
    c = colors.get(g["condition"].iloc[0], "k")
    ax.plot(g["step"], g["loss"], lw=0.8, color=c, alpha=0.6, label=g["condition"].iloc[0])
    ev = g.dropna(subset=["eval_loss"])
    ax.plot(ev["step"], ev["eval_loss"], "o--", ms=3, lw=1, color=c)
  ax.set_xlabel("training step")
  ax.set_ylabel("loss (nats/token): train —, validation o--")
  handles, labels = ax.get_legend_handles_labels()
  unique = dict(zip(labels, handles))
  ax.legend(unique.values(), unique.keys(), fontsize=8)
  return fig


def _induction_figure(ind, per_run, colors):
  """study/induction.png: the repeat drop and the top induction head's causal checks (k = 1, against
  layer-matched and unlabelled random heads) per run by step."""
  from matplotlib.lines import Line2D

  shown = (("repeat_drop", "repeat drop: 1st − 2nd copy (nats)"),
           ("loss_delta_second_vs_random (zero)", "top induction head ablated − random head\n(2nd copy loss, k = 1)"),
           ("loss_delta_second_vs_unlabelled (zero)",
            "top induction head ablated − random\nunlabelled head (2nd copy loss, k = 1)"))  # fmt: skip
  fig, axes = figures.new_figure(1, len(shown), figsize=(4.5 * len(shown), 3.4), squeeze=False)
  for ax, (measure, title) in zip(axes[0], shown):
    per_run(ax, ind[(ind["measure"] == measure) & (ind["k"].isna() | (ind["k"] == 1))], "value")
    ax.axhline(0, color="gray", lw=0.5)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("training step (0 drawn at 1)")
  drawn = sorted(set(ind["condition"]))
  axes[0, 0].legend([Line2D([], [], color=colors[c]) for c in drawn], drawn, fontsize=8)  # one line a run
  return fig


def _sae_figure(sae, per_run, colors):
  """study/sae.png: per run over training, the mean feature specialization S_h and the exclusive features."""
  from matplotlib.lines import Line2D

  shown = (("specialization_mean", "mean feature specialization S_h over heads"),
           ("exclusive_features", "head-exclusive SAE features (all heads)"))  # fmt: skip
  fig, axes = figures.new_figure(1, len(shown), figsize=(4.5 * len(shown), 3.4), squeeze=False)
  for ax, (measure, title) in zip(axes[0], shown):
    per_run(ax, sae[sae["measure"] == measure], "value")
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("training step (0 drawn at 1)")
  drawn = sorted(set(sae["condition"]))
  axes[0, 0].legend([Line2D([], [], color=colors[c]) for c in drawn], drawn, fontsize=8)
  return fig


def _draw(frames: dict, out: epath.Path) -> list[str]:
  written = []
  seen = set().union(*(set(f["condition"]) for f in frames.values() if "condition" in f))
  colors = {c: f"C{i}" for i, c in enumerate(sorted(seen))}  # a part's runs may lack a table yet

  def x_of(steps):  # log-spaced steps with step 0 drawn at 1
    return np.maximum(np.asarray(steps, float), 1.0)

  def per_run(ax, frame, y: str) -> None:  # one line per run, coloured by its condition, over log steps
    for _run, g in frame.groupby("run"):
      g = g.sort_values("step")
      ax.plot(x_of(g["step"]), g[y], "o-", ms=3, lw=1, color=colors[g["condition"].iloc[0]])
    figures.log_x(ax)

  def save(fig, name: str) -> None:
    fig.tight_layout()
    remote.save_figure(fig, out / name, dpi=110)
    written.append(name)

  em = frames["emergence"]
  drawn_tasks = figure_tasks(em)
  fig, axes = figures.new_figure(2, len(drawn_tasks), figsize=(4 * len(drawn_tasks), 6.5), squeeze=False)
  seeds = em.groupby("condition")["run"].nunique()
  for j, task in enumerate(drawn_tasks):
    for _run, g in em[em["task"] == task].groupby("run"):
      g = g.sort_values("step")
      condition = g["condition"].iloc[0]
      c, many = colors[condition], seeds[condition] > 1
      axes[0, j].plot(x_of(g["step"]), g["selectivity"], "o-", color=c, ms=2 if many else 3, lw=0.6 if many else 1,
                      alpha=0.35 if many else 1, label=None if many else condition)  # fmt: skip
      if not many:  # one seed: its sentence-bootstrap CI
        axes[0, j].fill_between(x_of(g["step"]), g["ci_low"], g["ci_high"], color=c, alpha=0.12)
      axes[1, j].plot(x_of(g["step"]), g["above_init_heads"], "o-", color=c, ms=3, lw=1)
    for condition, g in em[em["task"] == task].groupby("condition"):  # several seeds: mean, t interval band
      if seeds[condition] > 1:  # (a band from 3 seeds at a step on: with 2, t_0.975,1 = 12.7 swamps the plot)
        band = _by_condition(g, ["step"], "selectivity").sort_values("step")
        band = band.assign(
          t_low=band["t_low"].where(band["count"] >= 3), t_high=band["t_high"].where(band["count"] >= 3)
        )
        c = colors[condition]
        axes[0, j].plot(
          x_of(band["step"]),
          band["mean"],
          "-",
          color=c,
          lw=2,
          label=f"{condition}: mean of up to {seeds[condition]} seeds, 95% t band (≥3)",
        )
        axes[0, j].fill_between(x_of(band["step"]), band["t_low"], band["t_high"], color=c, alpha=0.18)
    axes[0, j].set_title(f"{task}: best head (dev-chosen), test")
    axes[0, j].axhline(0, color="gray", lw=0.5)
    axes[1, j].set_xlabel("training step (0 drawn at 1)")
    for ax in axes[:, j]:
      figures.log_x(ax)
  axes[0, 0].set_ylabel("selectivity (accuracy − control)")
  axes[1, 0].set_ylabel("heads above step 0's best (CI)")
  handles, labels = axes[0, 0].get_legend_handles_labels()
  unique = dict(zip(labels, handles))
  axes[0, 0].legend(unique.values(), unique.keys(), fontsize=8)
  save(fig, "emergence.png")

  div = frames["diversity"]
  if len(div):
    metrics = sorted(set(div["metric"]))
    cols = 3
    rows_ = -(-len(metrics) // cols)
    fig, axes = figures.new_figure(rows_, cols, figsize=(4.2 * cols, 3 * rows_), squeeze=False)
    for ax, metric in zip(axes.flat, metrics):
      per_run(ax, div[div["metric"] == metric], "value")
      ax.set_title(metric, fontsize=9)
    for ax in list(axes.flat)[len(metrics) :]:
      ax.axis("off")
    save(fig, "diversity.png")

  tr = frames["training"]
  if len(tr):
    save(_loss_figure(tr, colors), "loss.png")

  ind = frames.get("induction", ())  # a caller may draw a subset of the tables
  if len(ind):
    save(_induction_figure(ind, per_run, colors), "induction.png")

  sae = frames.get("sae", ())
  if len(sae):
    save(_sae_figure(sae, per_run, colors), "sae.png")

  ro = frames["roles"]
  if len(ro):
    fig, axes = figures.new_figure(1, len(ROLES), figsize=(4 * len(ROLES), 3.2), squeeze=False)
    for ax, role in zip(axes[0], ROLES):
      per_run(ax, ro[ro["role"] == role], "score")
      ax.set_title(f"best {role} score (repeated random)", fontsize=9)
      ax.set_ylim(0, 1)
    save(fig, "roles.png")
  return written
