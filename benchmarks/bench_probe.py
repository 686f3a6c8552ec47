"""Benchmark: every head's UPOS/XPOS/DEPREL probe in JAX vs scikit-learn, on EWT-sized synthetic features.

  python -m benchmarks.bench_probe [--sklearn_heads=3] [--heads=72] [--train=200000] [--dev=25000]

Fits 72 heads × 3 tasks (17, 50, 37 classes) with headspec.probing.probe.fit_softmax_probes (default
l2 grid, chosen on dev) and scikit-learn LogisticRegression (lbfgs, C=1, default max_iter=100) head by
head with joblib n_jobs=2. scikit-learn runs on --sklearn_heads heads and its time is extrapolated
linearly to all heads (the output says so). Prints one JSON object: wall and CPU seconds, speed-up,
per-task mean and max |Δ dev accuracy| on the heads both fitted, and the machine.
"""

import argparse
import json
import os
import platform
import time

os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={os.cpu_count()}")

import joblib  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.linear_model import LogisticRegression  # noqa: E402
from sklearn.preprocessing import StandardScaler  # noqa: E402

from benchmarks import synthetic_probe_data as synth  # noqa: E402
from headspec.probing import probe  # noqa: E402

TASKS = (("upos", synth.NUM_UPOS), ("xpos", synth.NUM_XPOS), ("deprel", synth.NUM_DEPREL))


def _sklearn_fit(x_train, y_train, x_dev):
  """One head, one task; returns dev predictions and the worker's CPU seconds and iterations."""
  cpu = time.process_time()
  scaler = StandardScaler().fit(x_train)
  model = LogisticRegression(C=1.0).fit(scaler.transform(x_train), y_train)
  return model.predict(scaler.transform(x_dev)), time.process_time() - cpu, int(model.n_iter_.max())


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
  args = parser.parse_args()

  n = args.train + args.dev
  labels = synth.synthetic_labels(n, np.random.default_rng(0))
  x = synth.synthetic_head_features(labels, args.heads, args.k, seed=0)
  x_train, x_dev = x[: args.train], x[args.train :]
  specs = [
    probe.ProbeSpec(name, c, labels[i][: args.train], labels[i][args.train :]) for i, (name, c) in enumerate(TASKS)
  ]
  load_before = os.getloadavg()

  wall, cpu = time.time(), time.process_time()
  fitted = probe.fit_softmax_probes(x_train, x_dev, specs)
  jax_wall, jax_cpu = time.time() - wall, time.process_time() - cpu
  jax_acc = {name: fitted.dev_accuracy_best[name] for name, _ in TASKS}

  heads = np.linspace(0, args.heads - 1, args.sklearn_heads).round().astype(int)
  jobs = [(h, t) for h in heads for t in range(len(TASKS))]
  wall = time.time()
  results = joblib.Parallel(n_jobs=2)(
    joblib.delayed(_sklearn_fit)(x_train[:, h], labels[t][: args.train], x_dev[:, h]) for h, t in jobs
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
    "sklearn_heads_measured": [int(h) for h in heads],
    "sklearn_seconds_measured": round(sk_wall, 1),
    "sklearn_seconds": round(sk_wall * scale, 1),
    "sklearn_seconds_note": f"extrapolated linearly from {len(heads)} of {args.heads} heads (x{scale:.1f}), joblib n_jobs=2",
    "sklearn_cpu_seconds": round(sk_cpu * scale, 1),
    "sklearn_max_iterations": max(r[2] for r in results),
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
