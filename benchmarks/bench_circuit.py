"""Benchmark of edge scores against exact edge patching (prints JSON; not a test).

  python -m benchmarks.bench_circuit [--layers=4] [--heads=4] [--d_model=64] [--prompts=16] [--n=6] [--steps=5]

Every edge of a random-weight GPT-2-style decoder (pre-LN, MLPs, learned positions; weights scaled to std
0.3 as the parity tests' initializer_range, so the metric moves) on induction prompt pairs
(patching/tasks.py): EAP (one forward and one backward pass for every edge at once), EAP-IG (`steps`
backward passes) and exact edge patching (one forward per edge, `lax.map` in one compiled program), all
from headspec/patching/edges.py. First calls (compilation included) are reported apart; steady-state
times are the best of 2. The ratio exact/EAP is the speed-up the issue asks for; the Spearman rank
correlation of each estimate with the exact scores is reported beside it. The load average is read before
and after (the machine is shared: under load every time is an upper bound).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np


def _best(fn, repeats=2) -> float:
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return min(times)


def spearman(a, b) -> float:
  """Rank correlation (average ranks for ties), without SciPy."""
  import pandas as pd

  return float(pd.Series(a).rank().corr(pd.Series(b).rank()))


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--d_model", type=int, default=64)
  parser.add_argument("--prompts", type=int, default=16)
  parser.add_argument("--n", type=int, default=6, help="induction: [BOS] r_1..r_n r_1..r_{n-1}")
  parser.add_argument("--steps", type=int, default=5, help="EAP-IG's interpolation points")
  args = parser.parse_args()
  import jax
  from flax import nnx

  from headspec.model import ModelConfig, random_like
  from headspec.patching import edges, tasks
  from headspec.patching import patch as patch_lib

  L, H, D, B = args.layers, args.heads, args.d_model, args.prompts
  cfg = ModelConfig(kind="decoder", vocab_size=200, num_layers=L, num_heads=H, d_model=D, d_head=D // H,
                    d_ff=4 * D, max_len=2 * args.n + 2, positions="learned")  # fmt: skip
  graphdef, params = nnx.split(random_like(cfg, 0))
  scaled = lambda a: a * (0.3 / max(float(np.std(a)), 1e-12)) if a.ndim > 1 else a
  model = nnx.merge(graphdef, jax.tree.map(scaled, params))
  clean, corrupt, answers = tasks.induction_pairs(cfg.vocab_size, (0, 1, 2), n=args.n, count=B, seed=0, bos=(2,))
  p = patch_lib.prompts(cfg, clean, corrupt, answers, "logit_diff")
  g = edges.graph(cfg)
  out = {"machine": f"{platform.machine()}, {os.cpu_count()} CPU cores", "load_average_before": os.getloadavg()}
  out["model"] = f"decoder {L}x{H}, d_model {D}, MLPs, {B} induction pairs x {len(clean[0])} tokens, {g.E} edges"
  runs = {
    "eap": lambda: edges.scores(model, p, method="eap")[0],
    "eap_ig": lambda: edges.scores(model, p, method="eap_ig", steps=args.steps)[0],
    "exact": lambda: edges.exact(model, p)[0],
  }
  values, seconds = {}, {}
  for name, fn in runs.items():
    t0 = time.perf_counter()
    values[name] = fn()
    out[f"{name}_first_call_seconds_incl_compile"] = round(time.perf_counter() - t0, 2)
    seconds[name] = _best(fn)
  out["seconds"] = {k: round(v, 4) for k, v in seconds.items()}
  out["exact_over_eap"] = round(seconds["exact"] / seconds["eap"], 1)
  out["exact_over_eap_ig"] = round(seconds["exact"] / seconds["eap_ig"], 1)
  out["spearman_with_exact"] = {k: round(spearman(values[k], values["exact"]), 3) for k in ("eap", "eap_ig")}
  out["eap_ig_steps"] = args.steps
  out["compilations"] = dict(edges.TRACES)
  out["load_average_after"] = os.getloadavg()
  print(json.dumps(out, indent=1))


if __name__ == "__main__":
  main()
