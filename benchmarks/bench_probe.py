"""Benchmark: every head's UPOS/XPOS/DEPREL probe in JAX vs scikit-learn, on EWT-sized synthetic features.

  python -m benchmarks.bench_probe [--sklearn_heads=3] [--heads=72] [--train=200000] [--dev=25000]
                                   [--scaling_heads=4,8,16] [--scaling_train=10000,20000,40000]

Like for like: headspec.probing.probe.fit_softmax_probes fits 72 heads × 3 tasks (17, 50, 37 classes)
at every λ of the default grid, each to convergence (tol 1e-5, at most 500 L-BFGS iterations), and
keeps the best λ on dev; scikit-learn LogisticRegression (lbfgs, C = 1/(λ·n), tol 1e-5, max_iter 500)
does the same head by head, task by task and λ by λ with joblib n_jobs=2. scikit-learn runs on
--sklearn_heads heads and its time is extrapolated linearly to all heads (the output says so). Then
two small scaling tables of headspec's fit time: against the number of heads (at the first of
--scaling_train) and against the number of training words (at the first of --scaling_heads).
Prints one JSON object: wall and CPU seconds, speed-up, per-task mean and max |Δ dev accuracy| on the
heads both fitted, the scaling tables and the machine. Also, from the same run: the XLA compilations of
every headspec fit (count and seconds), each fit stage's achieved GFLOP/s beside a plain matmul of the
same shapes (the pass's two matmuls, logits and weight gradient, with no softmax), and with --before=REV
the fit as it was at git revision REV (headspec/probing/probe.py and the fitter's modules beside it, from
`git show`) on the scaling rows, so before and after are measured under the same load. Every timing comes
with the load average.
"""

import argparse
import importlib.util
import json
import os
import pathlib
import platform
import re
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={os.cpu_count()}")

import joblib  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

from benchmarks import plain_matmul  # noqa: E402
from benchmarks import synthetic_probe_data as synth  # noqa: E402
from headspec.parallel.compilations import Compilations  # noqa: E402
from headspec.probing import probe  # noqa: E402

TASKS = (("upos", synth.NUM_UPOS), ("xpos", synth.NUM_XPOS), ("deprel", synth.NUM_DEPREL))


def _sklearn_fit(x_train, y_train, x_dev, y_dev, l2_grid):
  """One head, one task, every λ (C = 1/(λ n), as headspec's objective); returns the dev predictions of
  the λ with the best dev accuracy (ties to the larger λ, as headspec), the worker's CPU seconds and
  the most iterations any λ took."""
  cpu = time.process_time()
  scaler = StandardScaler().fit(x_train)
  xs_train, xs_dev = scaler.transform(x_train), scaler.transform(x_dev)
  best, iterations = None, 0
  for l2 in sorted(l2_grid, reverse=True):
    model = LogisticRegression(C=1.0 / (l2 * len(y_train)), tol=probe.DEFAULT_TOL, max_iter=probe.DEFAULT_MAX_ITER)
    pred = model.fit(xs_train, y_train).predict(xs_dev)
    iterations = max(iterations, int(model.n_iter_.max()))
    if best is None or (pred == y_dev).mean() > (best == y_dev).mean():
      best = pred
  return best, time.process_time() - cpu, iterations


def _timed_fit(module, x_train, x_dev, specs, **kwargs):
  """One cold fit: (fitted, wall s, CPU s, compilations, compile seconds, load average before)."""
  load = os.getloadavg()
  with Compilations() as compiles:
    wall, cpu = time.time(), time.process_time()
    fitted = module.fit_softmax_probes(x_train, x_dev, specs, **kwargs)
    wall, cpu = time.time() - wall, time.process_time() - cpu
  return fitted, wall, cpu, compiles, load


def _stages(fitted, compiles, n_train, heads, k, batch_size=2048, refine_samples=200_000):
  """Each fit stage's seconds (compilation excluded) and achieved GFLOP/s (matmul multiply-adds ×2 of
  logits and weight gradient), beside the plain matmul of the same shapes measured now."""
  prof = fitted.profile
  total_t = sum(c for _, c in TASKS) * len(fitted.l2_grid)
  chunk = probe.pass_chunk_words(n_train, heads, total_t)
  lbfgs_s = prof["lbfgs_s"] - compiles.seconds_of("_lbfgs", "_take_groups")
  lbfgs_flops = fitted.lbfgs_arithmetic()["gflop"] * 1e9
  steps = refine_samples // batch_size
  forked = round(steps * 0.25)
  adam_flops = 4.0 * batch_size * heads * k * ((steps - forked) * total_t / len(fitted.l2_grid) + forked * total_t)
  adam_s = prof["adam_s"] - compiles.seconds_of("_refine", "_adam_init", "_fork", "_shuffles")
  matmul = plain_matmul.gflops(heads, n_train, k, total_t, chunk)
  load = os.getloadavg()
  return {
    "lbfgs": {"seconds": round(lbfgs_s, 1), "gflop_per_s": round(lbfgs_flops / max(lbfgs_s, 1e-9) / 1e9, 1)},
    "adam": {"seconds": round(adam_s, 1), "gflop_per_s": round(adam_flops / max(adam_s, 1e-9) / 1e9, 1)},
    "plain_matmul_gflop_per_s": round(matmul, 1),
    "plain_matmul_shapes": f"G {heads} x chunks of {chunk} words x K {k} x T {total_t} (L-BFGS pass, all columns)",
    "load_average": [round(v, 2) for v in load],
  }


FIT_MODULES = ("probe", "probe_objective", "probe_adam", "probe_start", "lbfgs", "fanout")  # the fitter's modules


def _before_module(rev):
  """headspec/probing/probe.py as it was at git revision rev, with the fitter's modules of that revision
  (FIT_MODULES that exist there: the fit was one file before it was split), imported as package
  `probing_before` beside today's."""
  folder = pathlib.Path(tempfile.mkdtemp()) / "probing_before"
  folder.mkdir()
  (folder / "__init__.py").write_text("")
  for name in FIT_MODULES:
    shown = subprocess.run(["git", "show", f"{rev}:headspec/probing/{name}.py"], capture_output=True, text=True)
    if shown.returncode == 0:
      fit = "|".join(FIT_MODULES)  # `from headspec.probing import lbfgs` and `headspec.probing.lbfgs`: that revision's
      source = re.sub(rf"\bheadspec\.probing\b(?= import\b|\.({fit})\b)", "probing_before", shown.stdout)
      (folder / f"{name}.py").write_text(source)
  sys.path.insert(0, str(folder.parent))
  return importlib.import_module("probing_before.probe")


def _scaling(args, labels_all):
  """headspec's fit time (one cold fit, as a command runs it) against heads (at the first
  --scaling_train words) and words (first heads); with --before, the old fit on the same rows."""
  heads_list = [int(v) for v in args.scaling_heads.split(",") if v]
  train_list = [int(v) for v in args.scaling_train.split(",") if v]
  before = _before_module(args.before) if args.before else None
  rows = []
  for heads, n_train in [(h, train_list[0]) for h in heads_list] + [(heads_list[0], n) for n in train_list[1:]]:
    n = n_train + args.dev
    labels = (
      [y[:n] for y in labels_all] if len(labels_all[0]) >= n else synth.synthetic_labels(n, np.random.default_rng(1))
    )
    x = synth.synthetic_head_features(labels, heads, args.k, seed=1)
    specs = [probe.ProbeSpec(name, c, labels[i][:n_train], labels[i][n_train:]) for i, (name, c) in enumerate(TASKS)]
    for label, module in (("after", probe), ("before", before)):
      if module is None:
        continue
      fitted, wall, cpu, compiles, load = _timed_fit(module, x[:n_train], x[n_train:], specs)
      rows.append(
        dict(
          code=label if before else "now",
          heads=heads,
          n_train=n_train,
          seconds=round(wall, 1),
          cpu_seconds=round(cpu, 1),
          compilations=compiles.count,
          compile_seconds=round(compiles.total_seconds, 1),
          dev_accuracy_mean={name: round(float(fitted.dev_accuracy_best[name].mean()), 4) for name, _ in TASKS},
          load_average_before=[round(v, 2) for v in load],
        )
      )
  return rows


def _cpu_model():
  try:
    with open("/proc/cpuinfo") as f:
      return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    return platform.processor() or platform.machine()


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--heads", type=int, default=72)
  parser.add_argument("--k", type=int, default=32)
  parser.add_argument("--train", type=int, default=200_000)
  parser.add_argument("--dev", type=int, default=25_000)
  parser.add_argument("--sklearn_heads", type=int, default=3)
  parser.add_argument("--scaling_heads", default="4,8,16", help="'' skips the scaling tables")
  parser.add_argument("--scaling_train", default="10000,20000,40000")
  parser.add_argument("--before", default="", help="git revision whose probe.py to time on the scaling rows too")
  args = parser.parse_args()

  n = args.train + args.dev
  labels = synth.synthetic_labels(n, np.random.default_rng(0))
  x = synth.synthetic_head_features(labels, args.heads, args.k, seed=0)
  x_train, x_dev = x[: args.train], x[args.train :]
  specs = [
    probe.ProbeSpec(name, c, labels[i][: args.train], labels[i][args.train :]) for i, (name, c) in enumerate(TASKS)
  ]
  load_before = os.getloadavg()

  fitted, jax_wall, jax_cpu, compiles, _ = _timed_fit(probe, x_train, x_dev, specs)
  load_after_jax = os.getloadavg()
  jax_acc = {name: fitted.dev_accuracy_best[name] for name, _ in TASKS}

  heads = np.linspace(0, args.heads - 1, args.sklearn_heads).round().astype(int)
  jobs = [(h, t) for h in heads for t in range(len(TASKS))]
  load_before_sklearn = os.getloadavg()
  wall = time.time()
  results = joblib.Parallel(n_jobs=2)(
    joblib.delayed(_sklearn_fit)(
      x_train[:, h], labels[t][: args.train], x_dev[:, h], labels[t][args.train :], fitted.l2_grid
    )
    for h, t in jobs
  )
  sk_wall = time.time() - wall
  sk_cpu = sum(r[1] for r in results)
  scale = args.heads / len(heads)

  deltas = {name: [] for name, _ in TASKS}
  for (h, t), (pred, _, _) in zip(jobs, results):
    name = TASKS[t][0]
    deltas[name].append(100 * (jax_acc[name][h] - (pred == labels[t][args.train :]).mean()))
  out = {
    "probes": args.heads * len(TASKS),
    "heads": args.heads,
    "k": args.k,
    "n_train": args.train,
    "n_dev": args.dev,
    "tasks": {name: c for name, c in TASKS},
    "l2_grid": list(fitted.l2_grid),
    "jax_seconds": round(jax_wall, 1),
    "jax_cpu_seconds": round(jax_cpu, 1),
    "jax_compilations": compiles.count,
    "jax_compile_seconds": round(compiles.total_seconds, 1),
    "jax_lbfgs_iterations_max": {name: int(fitted.iterations[name].max()) for name, _ in TASKS},
    "jax_load_average_before_after": [[round(v, 2) for v in load_before], [round(v, 2) for v in load_after_jax]],
    "stages": _stages(fitted, compiles, args.train, args.heads, args.k),
    "sklearn_heads_measured": [int(h) for h in heads],
    "sklearn_seconds_measured": round(sk_wall, 1),
    "sklearn_seconds": round(sk_wall * scale, 1),
    "sklearn_seconds_note": f"extrapolated linearly from {len(heads)} of {args.heads} heads (x{scale:.1f}), joblib n_jobs=2",
    "sklearn_cpu_seconds": round(sk_cpu * scale, 1),
    "sklearn_max_iterations": max(r[2] for r in results),
    "sklearn_load_average_before_after": [
      [round(v, 2) for v in load_before_sklearn],
      [round(v, 2) for v in os.getloadavg()],
    ],
    "speedup_wall": round(sk_wall * scale / jax_wall, 1),
    "speedup_cpu": round(sk_cpu * scale / jax_cpu, 1),
    "dev_accuracy_delta_points": {
      name: {
        "mean_abs": round(float(np.mean(np.abs(d))), 3),
        "max_abs": round(float(np.max(np.abs(d))), 3),
        "mean_signed": round(float(np.mean(d)), 3),
      }
      for name, d in deltas.items()
    },
    "like_for_like": "both fit every λ of the grid to tol 1e-5 (at most 500 iterations) and keep the best on dev",
    "scaling": _scaling(args, labels) if args.scaling_heads else [],
    "jax_dev_accuracy_range": {
      name: [round(float(a.min()), 3), round(float(a.max()), 3)] for name, a in jax_acc.items()
    },
    "machine": {
      "cpu": _cpu_model(),
      "description": "2-core CPU" if os.cpu_count() == 2 else f"{os.cpu_count()}-core CPU",
      "cores": os.cpu_count(),
      "load_average_before": [round(v, 2) for v in load_before],
      "load_average_after": [round(v, 2) for v in os.getloadavg()],
      "jax_devices": os.environ.get("XLA_FLAGS", ""),
    },
  }
  print(json.dumps(out, indent=1))


if __name__ == "__main__":
  main()
