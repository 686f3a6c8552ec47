"""Check: a rank sweep of Hewitt & Manning's structural probes on a probe run's residual streams (issue 36).

  python -m benchmarks.check_structural_rank --config=configs/probe_minilm_ewt.py --workdir=runs/minilm \
      --layers=2 --ranks=8,16,32,64,128,384 [--tasks=distance,depth] [--config.key=value ...]

Run it after `headspec probe` with the same --config and overrides: it reads the probe run's feature
cache (extracting nothing new). Hewitt & Manning 2019 ("A Structural Probe for Finding Syntax in Word
Representations") sweep the rank of B up to the full width and find UUAS flat above ~64 on BERT-base; the
suite fits one rank, `probe.structural_rank`. For every asked layer's residual stream (-1 or
'embeddings': the embeddings) and rank (capped at the width, `capped` in the row) it fits the probe as the
suite does (tasks.fit_structural's train subset, epochs, patience and learning rate; its gold trees, with
the treebank's punctuation rule), without the control-tree probe, and reports the suite's metrics on dev
and every evaluation split (UUAS and DSpr. for distance, root accuracy and NSpr. for depth, 95% bootstrap
intervals of `probe.bootstrap_resamples` resamples), the epochs run and the fit's wall time. Different
ranks cannot share one B, so each (layer, rank, task) is its own fit; a layer's features, its train
subset and its trees are read once. Prints a markdown table to stderr and one JSON object to stdout.
"""

from __future__ import annotations

import json
import os
import sys
import time

from absl import app, flags
from ml_collections import config_flags

from headspec.cli import main as cli

_FLAGS = {}  # filled by _define_flags() when run as a script


def _define_flags() -> dict:
  """The command's flags, defined only when it runs as a script: the tests import this module beside
  check_residual_probes, whose flags have the same names (absl refuses a name defined twice)."""
  return dict(
    config=config_flags.DEFINE_config_file("config", None, "the probe run's config, configs/NAME.py"),
    workdir=flags.DEFINE_string("workdir", None, "the probe run's directory"),
    layers=flags.DEFINE_list("layers", ["0"], "residual-stream layers to sweep (-1 or 'embeddings': the embeddings)"),
    ranks=flags.DEFINE_list("ranks", ["8", "16", "32", "64", "128"], "ranks of B (capped at the width)"),
    tasks=flags.DEFINE_list("tasks", ["distance", "depth"], "structural tasks to sweep"),
  )


def _load() -> list[float]:
  return [round(v, 2) for v in os.getloadavg()]


def sweep(config, workdir, layers, ranks, task_names) -> dict:
  """The sweep (see the module docstring) as a dict; `rows` holds one entry per (layer, rank, task, split, metric)."""
  from headspec.errors import UserError
  from headspec.io import remote
  from headspec.probing import features, plan, structural, suite
  from headspec.probing import tasks as tasks_lib

  load_before = _load()
  workdir = remote.run_path(workdir)
  cache_dir = features.run_cache_dir(workdir)
  if not cache_dir.is_dir() or not any(cache_dir.iterdir()):
    raise UserError(f"{cache_dir}: no feature cache; run `headspec probe` with this config first")
  bad = [t for t in task_names if not suite._structural(tasks_lib.REGISTRY.get(t))]
  if bad or not task_names:
    raise UserError(f"--tasks: {bad or task_names!r} not structural; choose from distance, depth")
  if not ranks or min(ranks) < 1:
    raise UserError(f"--ranks: {ranks!r}; give positive integers")
  config = config.copy_and_resolve_references()
  config.probe.random_baseline = False  # else the last job is the random-weights copy
  job = plan.plan_jobs(config, workdir)[-1]  # the run's last step
  config.probe.tasks = tuple(task_names)  # only the trees the sweep scores are built
  data, _ = suite.representable_data(config, job)  # the sentences the suite probed
  _, feats = suite.job_features(job, data, config, cache_dir)
  p, train, tune = config.probe, data.train, data.tune
  num_layers = feats[train.key].num_layers
  if any(not -1 <= l < num_layers for l in layers):
    raise UserError(f"--layers: {layers!r}; the model has layers 0..{num_layers - 1} (-1: the embeddings)")
  score_splits = {tune.key: tune} | {s.key: s for s in data.evals}  # as the suite: dev (rankings) and the evals
  chosen_U, chosen_N = tasks_lib._train_subset(train, p.structural_max_train_words, config)
  rows, fits = [], []
  for layer in layers:
    x_train, x_tune = feats[train.key].residual(layer)[:, None, :], feats[tune.key].residual(layer)[:, None, :]
    x_train = x_train[chosen_N]
    width = x_train.shape[-1]
    x_eval = {key: x_tune if key == tune.key else feats[key].residual(layer)[:, None, :] for key in score_splits}
    for rank in ranks:
      for task in task_names:
        t0 = time.perf_counter()
        fitted = structural.fit_structural_probes(
          x_train,
          [train.labels[task][u] for u in chosen_U],
          x_tune,
          tune.labels[task],
          kind=task,
          rank=rank,
          epochs=p.structural_epochs,
          patience=p.structural_patience,
          learning_rate=p.structural_learning_rate,
          batch_sentences=p.get("structural_batch_sentences", 20),
          scale=p.get("structural_scale", "raw"),
          seed=config.seed,
        )
        fit_s = time.perf_counter() - t0
        fit = dict(layer=layer, rank=fitted.rank, asked_rank=rank, capped=fitted.rank < rank, task=task)
        fit |= dict(epochs_run=fitted.epochs_run, best_epoch=int(fitted.best_epoch_G[0]),
                    converged=bool(fitted.converged_G[0]), fit_s=round(fit_s, 1))  # fmt: skip
        fits.append(fit)
        for key, split in score_splits.items():
          trees = split.labels[task]
          scores = structural.score_sentences(structural.predictions(fitted, x_eval[key], trees), trees, task)
          m = structural.metrics(scores, num_resamples=p.bootstrap_resamples, seed=config.seed)
          for metric, (value_G, low_G, high_G) in m.items():
            rows.append(dict(fit, split=key, metric=metric, value=round(float(value_G[0]), 4),
                             ci_low=round(float(low_G[0]), 4), ci_high=round(float(high_G[0]), 4), n=len(trees)))  # fmt: skip
        print(json.dumps(fit), file=sys.stderr, flush=True)
        if fitted.rank < rank:
          print(f"layer {layer}: rank {rank} capped at the width {width}", file=sys.stderr, flush=True)
  return dict(
    model=job.name,
    step=job.step,
    run_rank=p.structural_rank,
    train_words=int(sum(len(train.words[u]) for u in chosen_U)),
    train_sentences=int(len(chosen_U)),
    splits=list(score_splits),
    epochs=p.structural_epochs,
    patience=p.structural_patience,
    learning_rate=p.structural_learning_rate,
    rows=rows,
    total_fit_s=round(sum(f["fit_s"] for f in fits), 1),
    load_average_before=load_before,
    load_average_after=_load(),
    cores=os.cpu_count(),
  )


def markdown(result: dict) -> str:
  """One line per (layer, rank, task, split): each metric as value [low, high], epochs and fit seconds."""
  lines = ["| layer | rank | task | split | metrics (95% CI) | epochs | fit s |", "|---|---|---|---|---|---|---|"]
  keyed: dict = {}
  for r in result["rows"]:
    keyed.setdefault(
      (r["layer"], r["rank"], r["capped"], r["task"], r["split"], r["epochs_run"], r["fit_s"]), []
    ).append(f"{r['metric']} {r['value']:.3f} [{r['ci_low']:.3f}, {r['ci_high']:.3f}]")
  for (layer, rank, capped, task, split, epochs, fit_s), metrics in keyed.items():
    rank_text = f"{rank} (capped)" if capped else str(rank)
    lines.append(f"| {layer} | {rank_text} | {task} | {split} | {'; '.join(metrics)} | {epochs} | {fit_s} |")
  return "\n".join(lines)


def main(argv):
  del argv
  from headspec.errors import UserError

  if _FLAGS["config"].value is None or not _FLAGS["workdir"].value:
    raise app.UsageError("needs --config=configs/NAME.py and --workdir=RUN (the probe run)")
  try:
    layers = [-1 if v == "embeddings" else int(v) for v in _FLAGS["layers"].value]
    ranks = [int(v) for v in _FLAGS["ranks"].value]
  except ValueError as e:
    print(f"check_structural_rank: error: --layers/--ranks: {e}", file=sys.stderr)
    sys.exit(2)
  try:
    result = sweep(_FLAGS["config"].value, _FLAGS["workdir"].value, layers, ranks, _FLAGS["tasks"].value)
  except UserError as e:
    print(f"check_structural_rank: error: {e}", file=sys.stderr)
    sys.exit(2)
  print(markdown(result), file=sys.stderr)
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  cli.use_every_cpu_core()
  _FLAGS.update(_define_flags())
  app.run(main, argv=cli.resolve_config(sys.argv))  # configs/NAME.py by name, as the headspec command
