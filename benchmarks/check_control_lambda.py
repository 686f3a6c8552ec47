"""Check: what fitting each control at its task's λ (probe.control_lambda='tied', Hewitt & Liang 2019) moves
against letting it choose its own ('separate'), on a probe run's heads (issue 61, item 9).

  python -m benchmarks.check_control_lambda CONFIG WORKDIR LAYERS TRAIN_WORDS
  e.g. python -m benchmarks.check_control_lambda probe_minilm_ewt runs/minilm_struct 0,3 10000

CONFIG names a configs/ file (its defaults, with max_train_words 40000, no MDL, no extra treebanks);
WORKDIR holds a probe run of that config (its feature cache is read; nothing new is extracted when it is
there). For each asked layer's heads one softmax fit (headspec/probing/probe.py) of upos, xpos and deprel
on a seeded TRAIN_WORDS subset fits every control twice, once choosing its own λ on dev and once at its
task's (fit_softmax_probes' choose_with), so both choices come from the same fit; it prints per task how
many heads' choices differ and how much test selectivity moves, and writes every cell to
check_control_lambda.json in the working directory.
"""

from __future__ import annotations

import importlib
import json
import sys
import time

import numpy as np


def main(config_name: str, workdir: str, layers: list[int], train_words: int) -> dict:
  from headspec.probing import features as features_lib
  from headspec.probing import plan, probe, stats, suite

  config = importlib.import_module(f"headspec.configs.{config_name}").get_config()
  p = config.probe
  p.max_train_words, p.mdl, p.extra_treebanks, p.random_baseline = 40000, False, (), False
  p.tasks = ("upos", "xpos", "deprel")
  job = plan.plan_jobs(config, workdir)[0]
  data, _ = suite.representable_data(config, job)
  _, feats = suite.job_features(job, data, config, features_lib.run_cache_dir(workdir))
  train, dev = data.train, data.tune
  test = next(s for s in data.evals if s.key.endswith("/test"))
  chosen_N = np.isin(train.sentence_N, stats.subsample([len(w) for w in train.words], train_words, 0))
  out = {"train_words": int(chosen_N.sum()), "l2_grid": list(p.l2_grid), "layers": layers, "cells": []}
  for layer in layers:
    t0 = time.perf_counter()
    x_tr, x_dv, x_te = feats[train.key].z(layer)[chosen_N], feats[dev.key].z(layer), feats[test.key].z(layer)
    specs, tie = [], {}
    for task in p.tasks:
      c, y_dev = len(data.vocab[task].classes), dev.labels[task]
      specs.append(probe.ProbeSpec(task, c, train.labels[task][chosen_N], np.where(y_dev < c, y_dev, -1)))
      for name in (f"{task}/control", f"{task}/control_tied"):
        specs.append(probe.ProbeSpec(name, c, train.controls[task][chosen_N], dev.controls[task]))
      tie[f"{task}/control_tied"] = task
    f = probe.fit_softmax_probes(
      x_tr, x_dv, specs, l2_grid=tuple(p.l2_grid), seed=config.seed, refine_samples=p.refine_samples, tol=p.tol,
      max_iter=p.max_iter, choose_with=tie,
    )  # fmt: skip
    for task in p.tasks:
      acc = lambda name, y, f=f, x_te=x_te: (probe.predict(f, x_te, name) == y[:, None]).mean(0)
      a = acc(task, test.labels[task])
      separate, tied = acc(f"{task}/control", test.controls[task]), acc(f"{task}/control_tied", test.controls[task])
      for h in range(x_tr.shape[1]):
        out["cells"].append(
          dict(layer=layer, head=h, task=task, l2_task=float(f.l2[task][h]),
               l2_control_separate=float(f.l2[f"{task}/control"][h]), accuracy=float(a[h]),
               selectivity_separate=float(a[h] - separate[h]), selectivity_tied=float(a[h] - tied[h]))
        )  # fmt: skip
    print(f"layer {layer}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
  for task in p.tasks:
    moved = [c for c in out["cells"] if c["task"] == task and c["l2_control_separate"] != c["l2_task"]]
    d = np.array([c["selectivity_tied"] - c["selectivity_separate"] for c in moved] or [0.0])
    n = sum(c["task"] == task for c in out["cells"])
    print(f"{task}: {len(moved)}/{n} heads choose another λ for the control; there Δ selectivity (tied − separate, "
          f"test) {d.min():+.4f} … {d.max():+.4f}, mean {d.mean():+.4f}")  # fmt: skip
  return out


if __name__ == "__main__":
  result = main(sys.argv[1], sys.argv[2], [int(v) for v in sys.argv[3].split(",")], int(sys.argv[4]))
  with open("check_control_lambda.json", "w") as f:
    json.dump(result, f, indent=1)
