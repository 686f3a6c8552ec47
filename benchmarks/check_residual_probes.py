"""Check: a probe run's residual-stream probes against scikit-learn on the same features.

  python -m benchmarks.check_residual_probes --config=configs/probe_minilm_ewt.py --workdir=runs/minilm \
      --layers=0,5 [--tasks=upos,xpos,deprel] [--chosen_l2] [--config.key=value ...]

Run it after `headspec probe` with the same --config and overrides: it reads the probe run's feature
cache (extracting nothing new when the cache is there) and its probes/results.csv. For every asked
layer's residual stream and softmax task it fits scikit-learn `LogisticRegression(C = 1/(λ n))` (lbfgs,
tol 1e-6, at most `--max_iter` iterations; n = labelled train words) on StandardScaler'd train features
for every λ of `probe.l2_grid`, keeps the best on the dev split (ties go to the stronger λ, as the
suite does; with --chosen_l2 only at the λ the run chose, from probes/fits.csv: a third of the fits,
a check of convergence but not of the λ choice), and compares its dev accuracy with the run's row (words labelled with a class unseen in
train count as wrong on both sides). headspec's probe is the same model (probing/probe.py), so a
converged fit agrees to within float noise and the dev-set tie-breaking; the issue-11 criterion is
"within about a point". Prints one JSON object: per (layer, task) both accuracies, their difference in
points, scikit-learn's λ and iterations, and the wall time.
"""

from __future__ import annotations

import json
import os
import sys
import time

from absl import app, flags
from ml_collections import config_flags

from headspec.cli import main as cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "the probe run's config, configs/NAME.py")
_WORKDIR = flags.DEFINE_string("workdir", None, "the probe run's directory")
_LAYERS = flags.DEFINE_list("layers", ["0"], "residual-stream layers to check")
_TASKS = flags.DEFINE_list("tasks", ["upos", "xpos", "deprel"], "softmax tasks to check")
_MAX_ITER = flags.DEFINE_integer("max_iter", 3000, "scikit-learn lbfgs iterations at most")
_CHOSEN_L2 = flags.DEFINE_bool("chosen_l2", False, "fit only at the λ the run chose (probes/fits.csv)")


def check(config, workdir, layers, task_names, max_iter: int, chosen_l2: bool = False) -> dict:
  """The comparison (see the module docstring) as a dict."""
  import numpy as np
  from sklearn.linear_model import LogisticRegression
  from sklearn.preprocessing import StandardScaler

  from headspec.errors import UserError
  from headspec.io import remote, tables
  from headspec.probing import features, plan, suite

  workdir = remote.run_path(workdir)
  results = tables.path_of(workdir, tables.PROBES)
  if not results.exists():
    raise UserError(f"{results}: no probe results; run `headspec probe` with this config first")
  rows = tables.read(results, tables.PROBES)
  fits = tables.read(tables.path_of(workdir, tables.PROBE_FITS), tables.PROBE_FITS) if chosen_l2 else []
  config = config.copy_and_resolve_references()
  config.probe.random_baseline = False  # else the last job is the random-weights copy
  job = plan.plan_jobs(config, workdir)[-1]
  data, _ = suite.representable_data(config, job)  # the sentences the suite probed
  _, feats = suite.job_features(job, data, config, features.run_cache_dir(workdir))
  train, dev = feats[data.train.key], feats[data.tune.key]
  out = []
  for layer in layers:
    scaler = StandardScaler().fit(train.residual(layer).astype(np.float64))
    xs_train = scaler.transform(train.residual(layer).astype(np.float64))
    xs_dev = scaler.transform(dev.residual(layer).astype(np.float64))
    for task in task_names:
      ours = [
        r
        for r in rows
        if (r["model"], int(r["step"]), r["task"], int(r["layer"]), int(r["head"]), r["split"])
        == (job.name, job.step, task, layer, -1, data.tune.key)
      ]
      if not ours:
        raise UserError(f"{results}: no row for {job.name} step {job.step} {task} layer {layer} residual on dev")
      y_train, y_dev = data.train.labels[task], data.tune.labels[task]
      keep = y_train >= 0
      scored = y_dev >= 0
      best = None
      t0 = time.perf_counter()
      grid = sorted(config.probe.l2_grid, reverse=True)  # strongest first: ties keep it
      if chosen_l2:
        grid = [
          float(f["l2"])
          for f in fits
          if (f["model"], int(f["step"]), f["task"], int(f["layer"]), int(f["head"]), f["probe"])
          == (job.name, job.step, task, layer, -1, "task")
        ][:1]
      for l2 in grid:
        model = LogisticRegression(C=1.0 / (l2 * keep.sum()), max_iter=max_iter, tol=1e-6)
        model.fit(xs_train[keep], y_train[keep])
        accuracy = float((model.predict(xs_dev[scored]) == y_dev[scored]).mean())
        if best is None or accuracy > best[0]:
          best = (accuracy, l2, int(model.n_iter_.max()))
      accuracy, l2, iterations = best
      headspec_accuracy = float(ours[0]["accuracy"])
      out.append(
        dict(
          layer=layer,
          task=task,
          headspec_dev_accuracy=round(headspec_accuracy, 4),
          sklearn_dev_accuracy=round(accuracy, 4),
          difference_points=round(100 * (headspec_accuracy - accuracy), 2),
          sklearn_l2=l2,
          sklearn_iterations=iterations,
          sklearn_converged=iterations < max_iter,
          sklearn_seconds=round(time.perf_counter() - t0, 1),
        )
      )
      print(json.dumps(out[-1]), flush=True)
  return dict(
    model=job.name,
    step=job.step,
    train_words=int(data.train.num_words),
    dev=data.tune.key,
    l2_grid=list(config.probe.l2_grid),
    chosen_l2=chosen_l2,
    checks=out,
    max_abs_difference_points=max(abs(c["difference_points"]) for c in out),
    cores=os.cpu_count(),
  )


def main(argv):
  del argv
  from headspec.errors import UserError

  if _CONFIG.value is None or not _WORKDIR.value:
    raise app.UsageError("needs --config=configs/NAME.py and --workdir=RUN (the probe run)")
  layers = [int(v) for v in _LAYERS.value]
  try:
    print(
      json.dumps(
        check(_CONFIG.value, _WORKDIR.value, layers, _TASKS.value, _MAX_ITER.value, _CHOSEN_L2.value), indent=1
      )
    )
  except UserError as e:
    print(f"check_residual_probes: error: {e}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
  cli.use_every_cpu_core()
  app.run(main, argv=cli.resolve_config(sys.argv))  # configs/NAME.py by name, as the headspec command
