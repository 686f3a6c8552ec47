"""Benchmark of `headspec ablate`'s single-head sweep (prints JSON; not a test).

  python benchmarks/bench_ablation.py [--minilm_sentences=500] [--skip_minilm]

1. The zero-ablation sweep of every head of a base_decoder-sized model (6 layers × 8 heads, d_model 256,
   random weights) on 16 rows of 128 tokens: `core.run_sweep` (one compiled program per batch, each
   layer's masks started from the cached residual stream) against a Python loop calling the jitted model
   once per mask (`core.run_one`). Compile time is reported apart; steady-state times are the best of 3.
2. MiniLM (6 × 12 heads) over the first N EWT dev sentences: zero and mean sweeps and the importance
   scores (½‖∂e/∂m_h‖², forward mode) as `headspec ablate --config=configs/ablate.py:minilm` runs them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np


def _best(fn, repeats=3) -> float:
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return min(times)


def sweep_vs_loop() -> dict:
  from flax import nnx

  from headspec.ablation import core
  from headspec.model.config import ModelConfig
  from headspec.model.transformer import Transformer
  from headspec.words import evalset

  L, H = 6, 8
  cfg = ModelConfig(
    kind="decoder", vocab_size=8000, num_layers=L, num_heads=H, d_model=256, d_head=32, d_ff=1024, max_len=128
  )
  model = Transformer(cfg, rngs=nnx.Rngs(params=0))
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 8000, (16, 128)).astype(np.int32)

  class Tok:
    mask_id, unk_id, vocab_size = 1, 0, 8000

  es = evalset.lm_eval_set(
    tokens, np.ones_like(tokens, bool), model_kind="decoder", tokenizer=Tok(), batch_size=8, seed=0
  )
  zero = core.zero_replacement(model)
  drop = np.broadcast_to(1 - np.eye(H, dtype=np.float32), (L, H, H))
  masks = []
  for l in range(L):
    for h in range(H):
      m = np.ones((L, H), np.float32)
      m[l, h] = 0
      masks.append(m)

  t0 = time.perf_counter()
  core.run_sweep(model, es, drop, zero)
  sweep_first = time.perf_counter() - t0
  t0 = time.perf_counter()
  core.run_one(model, es, masks[0], zero)
  loop_compile = time.perf_counter() - t0
  sweep = _best(lambda: core.run_sweep(model, es, drop, zero))
  loop = _best(lambda: [core.run_one(model, es, m, zero) for m in masks])
  _, swept = core.run_sweep(model, es, drop, zero)
  looped = np.stack([core.run_one(model, es, m, zero) for m in masks])
  return dict(
    model="decoder 6x8, d_model 256, 16 rows x 128 tokens, 48 single-head zero ablations",
    sweep_seconds=round(sweep, 3),
    loop_seconds=round(loop, 3),
    speedup=round(loop / sweep, 2),
    sweep_first_call_seconds_incl_compile=round(sweep_first, 2),
    loop_first_call_seconds_incl_compile=round(loop_compile, 2),
    max_abs_difference=float(np.abs(swept.reshape(looped.shape) - looped).max()),
  )


def minilm(num_sentences: int) -> dict:
  from headspec.ablation import core, metrics, run
  from headspec.ablation.config import ablate_config
  from headspec.runs.targets import pretrained_target

  config = ablate_config()
  config.model.pretrained = "minilm"
  config.num_sentences = num_sentences
  job = pretrained_target("minilm")
  model, tokenizer = job.load()
  es = run.evaluation_set(config, "", job, tokenizer, model.cfg)
  L, H = model.cfg.num_layers, model.cfg.num_heads
  drop = np.broadcast_to(1 - np.eye(H, dtype=np.float32), (L, H, H))
  out = dict(sentences=num_sentences, tokens=es.num_tokens, batches=len(es.batches))
  t0 = time.perf_counter()
  mean_z, _ = core.head_statistics(model, es)
  out["statistics_seconds"] = round(time.perf_counter() - t0, 1)
  for name, repl in (("zero", core.zero_replacement(model)), ("mean", mean_z)):
    t0 = time.perf_counter()
    core.run_sweep(model, es, drop, repl)
    out[f"{name}_sweep_seconds"] = round(time.perf_counter() - t0, 1)
  t0 = time.perf_counter()
  metrics.raw_importance(model, es)
  out["importance_seconds"] = round(time.perf_counter() - t0, 1)
  out["total_seconds"] = round(
    out["statistics_seconds"] + out["zero_sweep_seconds"] + out["mean_sweep_seconds"] + out["importance_seconds"], 1
  )
  return out


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--minilm_sentences", type=int, default=500)
  parser.add_argument("--skip_minilm", action="store_true")
  args = parser.parse_args()
  import jax

  result = dict(
    machine=dict(
      processor=platform.processor() or platform.machine(), nproc=os.cpu_count(), devices=str(jax.devices())
    ),
    sweep_vs_loop=sweep_vs_loop(),
  )
  print(json.dumps(result, indent=1), flush=True)
  if not args.skip_minilm:
    result["minilm"] = minilm(args.minilm_sentences)
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  main()
