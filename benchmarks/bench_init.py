"""Benchmark: drawing a model's initial weights three ways, each in a fresh process without a compilation cache.

  python -m benchmarks.bench_init [--sizes=quickstart,minilm]

- `bucketed`: `Transformer(cfg, rngs=nnx.Rngs(params=0))` as headspec draws it (headspec/model/layers.py `normal_param`
  through headspec/model/draws.py: each parameter the first |shape| values of a power-of-two draw, one compiled program per size bucket);
- `per_shape`: the same draws with `jax.random.normal(key, shape)` per parameter, op by op (one compiled
  threefry program per parameter shape);
- `one_jit`: the whole initialisation under one `jax.jit` (one program per architecture).
Every weight of `bucketed` must equal `per_shape`'s bit for bit (a SHA-256 over them); `one_jit`'s fused
multiply may differ in the last bit, which is reported. Prints one JSON object: seconds per size and way
(the process's first model, so compiling included) and the ratios per_shape / bucketed and one_jit / bucketed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

from benchmarks import uncached_environment

SIZES = {  # name -> ModelConfig keywords ("quickstart": the quickstart decoder's own config)
  "tiny": dict(kind="decoder", vocab_size=50, num_layers=1, num_heads=2, d_model=8, d_head=4, d_ff=16, max_len=8),
  "quickstart": None,
  "minilm": dict(
    kind="encoder", vocab_size=30522, num_layers=6, num_heads=12, d_model=384, d_head=32, d_ff=1536, max_len=512
  ),
}
WAYS = ("bucketed", "per_shape", "one_jit")


def _draw(size: str, way: str) -> dict:
  """In this process: draw `size`'s weights `way`; seconds and the SHA-256 of every weight's bytes."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from headspec.cli.quickstart import quickstart_config
  from headspec.model import layers, transformer
  from headspec.model.config import ModelConfig, from_section

  if SIZES[size] is None:
    c = quickstart_config("decoder")
    cfg = from_section(c.model, vocab_size=c.data.vocab_size, max_len=c.train.seq_len)
  else:
    cfg = ModelConfig(**SIZES[size])
  if way == "per_shape":

    def per_shape(rngs, shape, std=0.02):
      return nnx.Param(std * jax.random.normal(rngs.params(), shape, jnp.float32))

    layers.normal_param = transformer.normal_param = per_shape  # the layers' and the embeddings' draws
  start = time.perf_counter()
  if way == "one_jit":
    state = jax.jit(lambda key: nnx.split(transformer.Transformer(cfg, rngs=nnx.Rngs(params=key)))[1])(
      jax.random.key(0)
    )
  else:
    state = nnx.state(transformer.Transformer(cfg, rngs=nnx.Rngs(params=0)))
  leaves = jax.block_until_ready(jax.tree.leaves(state))
  seconds = time.perf_counter() - start
  digest = hashlib.sha256(b"".join(np.asarray(a).tobytes() for a in leaves)).hexdigest()
  return {"seconds": round(seconds, 2), "sha256": digest}


def run(sizes: list[str]) -> dict:
  from benchmarks.__main__ import last_json

  env, out = uncached_environment(), {}
  for size in sizes:
    ways = {}
    for way in WAYS:
      done = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_init", f"--child={size}:{way}"],
        env=env,
        capture_output=True,
        text=True,
      )
      if done.returncode != 0:
        raise SystemExit(f"bench_init {size} {way} failed: {done.stderr[-2000:]}")
      ways[way] = last_json(done.stdout)
    out[size] = {
      "seconds": {way: ways[way]["seconds"] for way in WAYS},
      "bucketed_equals_per_shape": ways["bucketed"]["sha256"] == ways["per_shape"]["sha256"],
      "one_jit_equals_per_shape": ways["one_jit"]["sha256"] == ways["per_shape"]["sha256"],
      "ratio_per_shape_over_bucketed": round(ways["per_shape"]["seconds"] / ways["bucketed"]["seconds"], 2),
      "ratio_one_jit_over_bucketed": round(ways["one_jit"]["seconds"] / ways["bucketed"]["seconds"], 2),
    }
  return {
    "what": "a model's initial weights drawn three ways, each the first model of a fresh process, no compilation cache",
    "sizes": out,
    "machine": {"cores": os.cpu_count(), "load_average_end": [round(v, 2) for v in os.getloadavg()]},
  }


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_init", description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="quickstart,minilm", help=f"comma-separated, of {', '.join(SIZES)}")
  parser.add_argument("--child", default="", help=argparse.SUPPRESS)  # SIZE:WAY, run in a fresh process
  args = parser.parse_args(argv)
  if args.child:
    size, way = args.child.split(":")
    print(json.dumps(_draw(size, way)))
    return
  sizes = [s for s in args.sizes.split(",") if s]
  if unknown := [s for s in sizes if s not in SIZES]:
    raise SystemExit(f"--sizes: unknown size {unknown[0]!r} (use {', '.join(SIZES)})")
  print(json.dumps(run(sizes), indent=1))


if __name__ == "__main__":
  main()
