"""Cost of the induction step's scores (prints JSON): all four scores (previous_token, duplicate_token,
induction on 200 repeated random sequences [BOS] r_1..r_50 r_1..r_50, with 1,000-resample bootstrap CIs,
and copying from the weights) for every head of a 6-layer, 8-head decoder (d_model 256, the default
training config's) at one step, random weights. One compiled function per model structure and batch
shape (`headspec.attention.induction._scorer`); the first call (cold) includes compiling it.
Target: under 30 s on a 2-core CPU.

  python -m benchmarks.bench_induction
"""

from __future__ import annotations

import json
import os
import platform
import time

import numpy as np


def main() -> None:
  from headspec.attention import induction as ind
  from headspec.model.config import ModelConfig
  from headspec.model.transformer import random_like

  cfg = ModelConfig(kind="decoder", vocab_size=8000, num_layers=6, num_heads=8, d_model=256, d_head=32, d_ff=1024,
                    max_len=128)  # fmt: skip
  model = random_like(cfg, 0)
  specials = np.array([0, 1, 2])
  tokens = ind.repeated_random_tokens(cfg.vocab_size, specials, n=50, count=200, seed=0, bos=(2,))
  valid = np.ones(tokens.shape, bool)
  out = {"platform": platform.platform(), "cpus": os.cpu_count(), "sequences": len(tokens), "tokens": tokens.shape[1]}
  for label in ("cold", "warm"):
    t0 = time.perf_counter()
    p = ind.run(model, tokens, valid, specials, batch_size=50)
    t1 = time.perf_counter()
    scores = ind.attention_scores(p, resamples=1000, seed=0)
    t2 = time.perf_counter()
    copying = ind.copying_scores(model)
    t3 = time.perf_counter()
    out[label] = dict(forward_s=round(t1 - t0, 2), bootstrap_s=round(t2 - t1, 2), copying_s=round(t3 - t2, 2),
                      total_s=round(t3 - t0, 2))  # fmt: skip
  out["compiled_functions"] = ind._scorer.cache_info().currsize
  out["best_induction_random_weights"] = float(np.nanmax(scores["induction"][0]))
  out["copying_mean_random_weights"] = float(copying.mean())
  out["target_s"] = 30
  print(json.dumps(out, indent=1))


if __name__ == "__main__":
  main()
