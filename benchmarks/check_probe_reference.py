"""Before/after check of the softmax probe fit on a fixed synthetic problem.

  python -m benchmarks.check_probe_reference            # compare with benchmarks/probe_reference.json
  python -m benchmarks.check_probe_reference --write    # record the current code's figures there

The reference holds every probe's (group, task, λ) final penalised train objective and dev accuracy as
fitted by the code before issue 33's rewrite (recorded once with that code); a change to the fit must
keep every objective within 1e-3 relative of it or lower, and every dev accuracy within 0.1 point
(tests/test_probe_speed.py runs the comparison).
"""

from __future__ import annotations

import argparse
import json
import pathlib

import numpy as np

from headspec.probing import probe

REFERENCE = pathlib.Path(__file__).with_name("probe_reference.json")
N_TRAIN, N_DEV, G, K = 3000, 20000, 2, 8


def problem():
  """Two correlated label sets (8 and 20 classes, the second with unlabelled words) over G groups."""
  rng = np.random.default_rng(33)
  n = N_TRAIN + N_DEV
  y_a = rng.choice(8, n, p=rng.dirichlet(np.ones(8))).astype(np.int32)
  y_b = ((3 * y_a + rng.choice(3, n) + (rng.random(n) < 0.2) * rng.integers(0, 20, n)) % 20).astype(np.int32)
  x = np.empty((n, G, K), np.float32)
  for g, (sa, sb) in enumerate([(1.0, 0.6), (0.4, 1.0)]):
    h = sa * rng.standard_normal((8, K))[y_a] + sb * rng.standard_normal((20, K))[y_b] + rng.standard_normal((n, K))
    x[:, g] = 1.0 + np.tanh(h) @ (np.eye(K) + rng.standard_normal((K, K)) / 4)
  y_b[rng.random(n) < 0.05] = -1
  specs = [
    probe.ProbeSpec("a", 8, y_a[:N_TRAIN], y_a[N_TRAIN:]),
    probe.ProbeSpec("b", 20, y_b[:N_TRAIN], y_b[N_TRAIN:]),
  ]
  return x, specs


def fit_all():
  """{'objective': f_GQ, 'dev_accuracy': acc_GQ} of every probe (q = task·P + λ index)."""
  x, specs = problem()
  seen, real = [], probe._lbfgs

  def recording(*args, **kwargs):
    out = real(*args, **kwargs)
    seen.append(np.asarray(out[1], np.float64))
    return out

  probe._lbfgs = recording
  try:
    fitted = probe.fit_softmax_probes(x[:N_TRAIN], x[N_TRAIN:], specs, refine_samples=4 * N_TRAIN, batch_size=512)
  finally:
    probe._lbfgs = real
  acc = np.concatenate([fitted.dev_accuracy[s.name] for s in specs], axis=1)
  return {"objective": seen[0].tolist(), "dev_accuracy": acc.tolist()}


def compare(now, ref) -> dict:
  """Worst relative objective excess over the reference (≤ 1e-3 passes) and dev accuracy gap in points."""
  f, f_ref = np.asarray(now["objective"]), np.asarray(ref["objective"])
  acc, acc_ref = np.asarray(now["dev_accuracy"]), np.asarray(ref["dev_accuracy"])
  return {
    "objective_worst_relative_excess": float(((f - f_ref) / np.abs(f_ref)).max()),
    "objective_best_relative_gain": float(((f_ref - f) / np.abs(f_ref)).max()),
    "dev_accuracy_max_abs_points": float(100 * np.abs(acc - acc_ref).max()),
  }


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--write", action="store_true")
  args = parser.parse_args()
  now = fit_all()
  if args.write:
    REFERENCE.write_text(json.dumps(now) + "\n")
    print(f"wrote {REFERENCE}")
    return
  print(json.dumps(compare(now, json.loads(REFERENCE.read_text())), indent=1))


if __name__ == "__main__":
  main()
