"""`headspec patch`: activation, attribution and path patching of a built-in task at every requested step,
through the one job loop (headspec/words/jobloop.py). Writes RUN/patching/results.csv, RUN/patching/summary.csv
(docs/outputs.md) and a heatmap per (task, site, direction, step):
patching/<task>_<site>_<direction>_<model>_step<step>.png (the model's name one file-name component,
headspec/io/filenames.py)."""

from __future__ import annotations

import pandas as pd

from headspec.errors import UserError
from headspec.io import filenames, remote, tables
from headspec.model.sites import SITES
from headspec.patching import core, tasks
from headspec.patching import patch as patch_lib
from headspec.runs import targets
from headspec.words import jobloop

RESULTS, SUMMARY = tables.PATCHING, tables.PATCHING_SUMMARY
METHODS = ("activation", "attribution", "path_logits")


def check_config(c) -> list[str]:
  """The sites asked for; UserError naming the first bad key."""
  if c.task not in tasks.TASKS:
    raise UserError(f"patch: task={c.task!r}; choose one of {', '.join(tasks.TASKS)}")
  if c.metric not in core.METRICS:
    raise UserError(f"patch: metric={c.metric!r}; choose one of {', '.join(core.METRICS)}")
  if c.get("corruption", "abc") not in tasks.CORRUPTIONS:
    raise UserError(f"patch: corruption={c.corruption!r}; choose one of {', '.join(map(repr, tasks.CORRUPTIONS))}")
  sites = [s.strip() for s in c.sites.split(",") if s.strip()]
  for site in sites:
    patch_lib.check_site(site)
  if not sites:
    raise UserError("patch: sites is empty; name at least one of " + ", ".join(SITES))
  if c.direction not in patch_lib.DIRECTIONS:
    raise UserError(f"patch: direction={c.direction!r}; choose 'denoising' or 'noising'")
  if c.count < 1:
    raise UserError(f"patch: count={c.count} must be at least 1")
  return sites


def task_pairs(c, model, tokenizer):
  """(clean, corrupt, answers) of the config's task for this model and tokenizer (tasks.TASKS)."""
  return tasks.TASKS[c.task].pairs(c, model, tokenizer)


def task_name(c) -> str:
  """The tables' `task`: the task's name ('induction', 'ioi': Wang et al.'s ABC corruption, or 'ioi_s2': the
  second B only), with `_<metric>` after it for a metric other than the logit difference (so the rows and
  heatmaps of two metrics never replace each other)."""
  metric = c.get("metric", "logit_diff")
  return tasks.TASKS[c.task].name(c) + ("" if metric == "logit_diff" else f"_{metric}")


class Patching(jobloop.Analysis):
  name = "patch"

  def plan(self):
    self.sites = check_config(self.config)
    return targets.plan(self.config, self.workdir, steps=self.config.steps, model_name=self.config.model_name)

  def tables(self, jobs):
    return (RESULTS, SUMMARY)

  def job(self, job):
    c = self.config
    model, tokenizer = job.load()
    if model.cfg.kind != "decoder":
      raise UserError(f"patch: {job.name} is an encoder; the built-in tasks read a decoder's next-token logits")
    clean, corrupt, answers = task_pairs(c, model, tokenizer)
    p = patch_lib.prompts(model.cfg, clean, corrupt, answers, c.metric, tokenizer, tokenizer.pad_id)
    rows, summary = [], []
    key = dict(model=job.name, step=job.step, task=task_name(c))

    def add(frame, method, site):
      for r in frame.itertuples(index=False):
        rows.append(key | dict(method=method, site=site, direction=c.direction, layer=r.layer, head=r.head,
                               position=r.position, value=float(r.value)))  # fmt: skip

    for site in self.sites:
      exact = patch_lib.patch(model, p, site=site, metric=c.metric, by_position=c.by_position, direction=c.direction)
      add(exact, "activation", site)
      summary += [
        key | dict(site=site, direction=c.direction, metric=m, value=exact.attrs[m]) for m in ("base", "source")
      ]
      if c.attribution:
        estimate = patch_lib.attribution(model, p, site=site, metric=c.metric, by_position=c.by_position,
                                         direction=c.direction)  # fmt: skip
        add(estimate, "attribution", site)
        summary.append(
          key | dict(site=site, direction=c.direction, metric="agreement", value=patch_lib.agreement(exact, estimate))
        )
    if c.path:
      add(patch_lib.path(model, p, metric=c.metric, receiver_site="logits", direction=c.direction), "path_logits", "z")
    self.drawn = rows  # drawn once the tables hold them
    return {RESULTS: rows, SUMMARY: summary}

  def merged(self, job):
    """A heatmap per site of this job's activation-patching rows (the table also keeps every other run's
    rows: another direction, task or set of sites, drawn under names of their own)."""
    c, task = self.config, task_name(self.config)
    frame = pd.DataFrame(self.drawn, columns=RESULTS.columns)
    frame = frame[frame["method"] == "activation"]
    name = f"{filenames.component(job.name)}_step{job.step}"
    for site in self.sites:
      heatmap(frame[frame["site"] == site], f"{task}: {site} ({c.direction}), {job.name} step {job.step}",
              remote.run_path(self.workdir) / f"patching/{task}_{site}_{c.direction}_{name}.png",
              core.METRICS[c.metric].label)  # fmt: skip

  def finish(self, jobs):
    return tables.path_of(self.workdir, RESULTS)


def heatmap(frame, title: str, path, label: str = core.METRICS["logit_diff"].label) -> None:
  """value by (layer·head or layer) rows × position columns, diverging around the base metric."""
  from headspec.words import figures

  if frame.empty:
    return
  frame = frame.astype({"layer": int, "head": int, "position": int, "value": float})
  grid = frame.pivot_table(index=["layer", "head"], columns="position", values="value")
  fig, ax = figures.new_figure(figsize=(1 + 0.4 * grid.shape[1], 1 + 0.3 * grid.shape[0]))
  image = ax.imshow(grid.to_numpy(), cmap="viridis", aspect="auto")
  ax.set_yticks(range(len(grid.index)), [f"L{a}" + (f"H{b}" if b >= 0 else "") for a, b in grid.index])
  ax.set_xticks(range(grid.shape[1]), [str(t) if t >= 0 else "all" for t in grid.columns])
  ax.set_xlabel("position")
  ax.set_title(title, fontsize=9)
  fig.colorbar(image, ax=ax, label=f"metric ({label})")
  fig.tight_layout()
  remote.save_figure(fig, path, dpi=100)  # whole or not at all (a full disk leaves no half-written file)


def run(config, workdir):
  """Every requested step; returns RUN/patching/results.csv."""
  return jobloop.run(Patching(config, workdir))
