"""Benchmark of compile time against depth: the layers run as one scanned block (prints JSON; not a test).

  python -m benchmarks.bench_depth [--layers=4,16] [--heads=4] [--tokens=16] [--prompts=4]

For a tiny random-weight decoder (d_model 64) at each depth: the first-call seconds (trace, compile and run)
of the jitted forward, of the single-head ablation sweep (`ablation.core.run_sweep`, every head zeroed) and
of the per-head per-position patching sweep of z (`patching.core.run_sweep`, L·H·T patches), each with the
seconds XLA spent compiling (headspec/parallel/compilations.py), then the deepest over the shallowest as ratios (issue
64's check: within ~2×). The persistent compilation cache is off, so every program compiles; a warm-up at
the first depth is run and discarded first (jax's one-time start-up). The load average is read before and
after: on a shared machine the figures are upper bounds.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np


def _first_call(fn) -> dict:
  """{seconds, compile_seconds} of one call of `fn` (results read back)."""
  import jax

  from headspec.parallel.compilations import Compilations

  with Compilations() as seen:
    t0 = time.perf_counter()
    jax.block_until_ready(fn())
    seconds = time.perf_counter() - t0
  return {"seconds": round(seconds, 2), "compile_seconds": round(seen.total_seconds, 2)}


def depth(L: int, H: int, T: int, B: int) -> dict:
  """First-call figures of the forward and both sweeps of a fresh L-layer model."""
  import jax
  from flax import nnx

  from headspec.ablation import core as ablation
  from headspec.model.config import ModelConfig
  from headspec.model.transformer import random_like
  from headspec.patching import core as patching
  from headspec.patching import patch as patch_lib
  from headspec.words import evalset

  V = 256
  cfg = ModelConfig(kind="decoder", vocab_size=V, num_layers=L, num_heads=H, d_model=64, d_head=16, d_ff=256,
                    max_len=max(T, 16))  # fmt: skip
  model = random_like(cfg, 0)
  rng = np.random.default_rng(0)
  clean = rng.integers(3, V, (B, T))
  graphdef, params = nnx.split(model)
  forward = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x)[0])
  out = {"forward": _first_call(lambda: forward(params, clean.astype(np.int32)))}

  class Tok:
    mask_id, unk_id, vocab_size = 1, 0, V

  es = evalset.lm_eval_set(clean.astype(np.int32), np.ones((B, T), bool), model_kind="decoder", tokenizer=Tok(),
                           batch_size=B, seed=0)  # fmt: skip
  drop = np.broadcast_to(1 - np.eye(H, dtype=np.float32), (L, H, H))
  zero = ablation.zero_replacement(model)
  out["ablation_sweep"] = _first_call(lambda: ablation.run_sweep(model, es, drop, zero)[1])

  corrupt = clean.copy()
  corrupt[:, T // 2] = rng.integers(3, V, B)
  answers = rng.integers(3, V, (B, 2))
  p = patch_lib.prompts(cfg, clean.tolist(), corrupt.tolist(), answers.tolist(), "logit_diff")
  runs = (p.corrupt_BT, p.clean_BT, p.valid_BT, p.last_B, p.answers_B2)
  patches = patching.grid(cfg, "z", T, True, range(L), range(H), range(T))
  out["patching_sweep_z_by_position"] = _first_call(lambda: patching.run_sweep(model, "z", "logit_diff", *runs,
                                                                              patches)[2])  # fmt: skip
  return out


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--layers", default="4,16", help="comma-separated depths, shallowest first")
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--tokens", type=int, default=16)
  parser.add_argument("--prompts", type=int, default=4)
  args = parser.parse_args()
  os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)
  import jax

  jax.config.update("jax_enable_compilation_cache", False)
  depths = [int(x) for x in args.layers.split(",")]
  H, T, B = args.heads, args.tokens, args.prompts
  out = {
    "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {jax.devices()[0].device_kind}",
    "load_average_before": os.getloadavg(),
    "model": f"decoder Lx{H}, d_model 64, d_head 16, d_ff 256, {B} prompts x {T} tokens; patching: L·{H}·{T} "
    f"patches of z",
  }
  depth(1 if 1 not in depths else max(depths) + 1, H, T, B)  # warm-up at another depth, discarded
  out["depths"] = {str(L): depth(L, H, T, B) for L in depths}
  shallow, deep = out["depths"][str(depths[0])], out["depths"][str(depths[-1])]
  out["ratio_deepest_over_shallowest"] = {
    name: round(deep[name]["seconds"] / shallow[name]["seconds"], 2) for name in shallow
  }
  out["load_average_after"] = os.getloadavg()
  print(json.dumps(out, indent=1))


if __name__ == "__main__":
  main()
