"""Benchmark of activation patching's compiled sweep (prints JSON; not a test).

  python -m benchmarks.bench_patching [--layers=4] [--heads=8] [--tokens=16] [--prompts=8]

Per-head per-position patching of z (every (layer, head, position): L·H·T patches) on a random-weight
decoder (d_model 128): `patching.core.run_sweep` (one compiled program: each layer's patches run blocks
l.. from the cached residual stream, lax.map over one-hot edits) against a Python loop calling one jitted
full forward per patch (`patching.core.per_site_loop`, the edit's arrays as data, so it compiles once too).
Compile time is reported apart; steady-state times are the best of 2. The load average is read before and
after (the machine is shared).
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


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--heads", type=int, default=8)
  parser.add_argument("--tokens", type=int, default=16)
  parser.add_argument("--prompts", type=int, default=8)
  args = parser.parse_args()
  from headspec.model.config import ModelConfig
  from headspec.model.transformer import random_like
  from headspec.patching import core
  from headspec.patching import patch as patch_lib

  L, H, T, B = args.layers, args.heads, args.tokens, args.prompts
  cfg = ModelConfig(kind="decoder", vocab_size=1000, num_layers=L, num_heads=H, d_model=128, d_head=16, d_ff=512,
                    max_len=max(T, 16))  # fmt: skip
  model = random_like(cfg, 0)
  rng = np.random.default_rng(0)
  clean = rng.integers(3, 1000, (B, T))
  corrupt = clean.copy()
  corrupt[:, T // 2] = rng.integers(3, 1000, B)
  answers = rng.integers(3, 1000, (B, 2))
  p = patch_lib.prompts(cfg, clean.tolist(), corrupt.tolist(), answers.tolist(), "logit_diff")
  runs = (p.corrupt_BT, p.clean_BT, p.valid_BT, p.last_B, p.answers_B2)
  patches = core.grid(cfg, "z", T, True, range(L), range(H), range(T))
  out = {"machine": f"{platform.machine()}, {os.cpu_count()} CPU cores", "load_average_before": os.getloadavg()}
  out["model"] = f"decoder {L}x{H}, d_model 128, {B} prompts x {T} tokens, {L * H * T} patches of z"
  t0 = time.perf_counter()
  _, _, swept = core.run_sweep(model, "z", "logit_diff", *runs, patches)
  out["sweep_first_call_seconds_incl_compile"] = round(time.perf_counter() - t0, 2)
  t0 = time.perf_counter()
  looped = core.per_site_loop(model, "z", "logit_diff", *runs, patches)
  out["loop_first_call_seconds_incl_compile"] = round(time.perf_counter() - t0, 2)
  sweep = _best(lambda: core.run_sweep(model, "z", "logit_diff", *runs, patches))
  loop = _best(lambda: core.per_site_loop(model, "z", "logit_diff", *runs, patches))
  out.update(sweep_seconds=round(sweep, 3), loop_seconds=round(loop, 3), loop_over_sweep=round(loop / sweep, 2))
  out["max_abs_difference"] = float(np.nanmax(np.abs(swept - looped)))
  out["compilations"] = dict(core.TRACES)
  out["load_average_after"] = os.getloadavg()
  print(json.dumps(out, indent=1))


if __name__ == "__main__":
  main()
