"""Training throughput (tokens/s) and model FLOPs utilisation for a few model sizes; prints JSON.

  python -m benchmarks.bench_train [--sizes=tiny,small,base] [--steps=10] [--dtype=float32] [--mesh=fsdp=8]

Runs the real step function (headspec.train.loop.train_step, jit on the `--mesh`: headspec/parallel/mesh.py) on random tokens.
FLOPs per token follow Chowdhery et al. 2022 (PaLM), appendix B: 6·N + 12·L·T·H·K, where N counts the
matmul parameters (blocks and the unembedding) and the second term is attention's QK^T and AV.
MFU = achieved FLOP/s / peak FLOP/s of the device (a table of known peaks; null where unknown, e.g. CPUs).
"""

from __future__ import annotations

import functools
import json
import platform
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags
from flax import nnx

from headspec.model.config import ModelConfig
from headspec.model.layers import attention_implementation
from headspec.model.objectives import Objective
from headspec.model.transformer import Transformer
from headspec.parallel import distributed as parallel
from headspec.parallel import mesh
from headspec.train.config import train_config
from headspec.train.loop import TrainState, jit_step, make_optimizer, train_step

SIZES = {  # layers, heads, d_model, d_head, d_ff, vocab, seq_len, batch
  "tiny": (2, 4, 64, 16, 256, 1000, 64, 32),
  "small": (4, 8, 256, 32, 1024, 8000, 128, 32),
  "base": (6, 12, 384, 32, 1536, 8000, 128, 32),
  # The GPU sizes of the speed issue (BERT-base and -large shapes; nanoGPT's benchmark has no dropout either).
  "gpu_base": (12, 12, 768, 64, 3072, 32000, 512, 32),
  "gpu_large": (24, 16, 1024, 64, 4096, 32000, 512, 32),
  "llama_1b": (16, 32, 2048, 64, 5632, 32000, 1024, 16),  # TinyLlama-1.1B's shape (with LLAMA below)
}
# Llama-family sizes: rotary positions, RMSNorm, SwiGLU, grouped-query K/V, no biases, untied unembedding.
LLAMA = dict(
  positions="rotary", norm="rmsnorm", gated_mlp=True, activation="silu", num_kv_heads=4, attention_bias=False,
  attention_out_bias=False, mlp_bias=False, tie_embeddings=False,
)  # fmt: skip
OPTIONS = {"llama_1b": LLAMA}
# Dense peak FLOP/s by device kind and compute dtype (vendor datasheets; bf16 tensor cores, fp32 = TF32).
PEAK_FLOPS = {
  ("NVIDIA H100 80GB HBM3", "bfloat16"): 989e12,
  ("NVIDIA H100 80GB HBM3", "float32"): 494e12,
  ("NVIDIA H200", "bfloat16"): 989e12,
  ("NVIDIA H200", "float32"): 494e12,
  ("NVIDIA A100-SXM4-80GB", "bfloat16"): 312e12,
  ("NVIDIA A100-SXM4-80GB", "float32"): 156e12,
  ("TPU v4", "bfloat16"): 275e12,
  ("TPU v5 lite", "bfloat16"): 197e12,
}

_SIZES = flags.DEFINE_list("sizes", ["tiny", "small", "base"], "model sizes to run")
_STEPS = flags.DEFINE_integer("steps", 10, "timed steps per size (after 2 warm-up steps)")
_DTYPE = flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "compute dtype")
_MESH = flags.DEFINE_string("mesh", "", "the device mesh, as config.mesh: data=N,fsdp=N,tensor=N ('': all on data)")


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
  L, H, D, K, F, V = cfg.num_layers, cfg.num_heads, cfg.d_model, cfg.d_head, cfg.d_ff, cfg.vocab_size
  mlp = (3 if cfg.gated_mlp else 2) * D * F if cfg.mlp else 0
  matmul_params = L * (2 * D * H * K + 2 * D * cfg.kv_heads * K + mlp) + D * V
  return 6.0 * matmul_params + 12.0 * L * seq_len * H * K


def bench(size: str, steps: int, dtype: str, mesh_spec: str = "") -> dict:
  layers, heads, d_model, d_head, d_ff, vocab, seq_len, batch = SIZES[size]
  batch = max(batch, jax.device_count()) // jax.device_count() * jax.device_count()
  grid = mesh.parse(mesh_spec, key="--mesh")
  cfg = ModelConfig(
    kind="decoder",
    vocab_size=vocab,
    num_layers=layers,
    num_heads=heads,
    d_model=d_model,
    d_head=d_head,
    d_ff=d_ff,
    max_len=seq_len,
    dtype=dtype,
    **OPTIONS.get(size, {}),
  )
  train = train_config().train
  train.steps, train.warmup_steps = 1000, 10
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))
  tx = make_optimizer(train)
  obj = Objective(kind="decoder", vocab_size=vocab, mask_id=0, num_layers=layers, num_heads=heads)
  state = mesh.place(TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params)), grid)
  step = jit_step(functools.partial(train_step, graphdef=graphdef, tx=tx, obj=obj), state, grid)
  rng = np.random.default_rng(0)
  batches = [
    parallel.global_batch(
      {
        "tokens": rng.integers(0, vocab, (batch, seq_len), dtype=np.int32),
        "example_id": np.arange(batch, dtype=np.int32),
      },
      grid,
    )
    for _ in range(2)
  ]
  key = jax.random.key(0)
  with mesh.using(grid):  # the model's activation constraints read it
    for i in range(2):  # compile and warm up
      state, metrics = step(state, batches[i % 2], key)
    jax.block_until_ready(metrics)
    t0 = time.perf_counter()
    for i in range(steps):
      state, metrics = step(state, batches[i % 2], key)
    jax.block_until_ready(metrics)
    seconds = time.perf_counter() - t0
  path, why = attention_implementation(
    cfg, need_pattern=False, platform=jax.default_backend(), dtype=jnp.dtype(dtype), dropout=False,
    lengths=(seq_len, seq_len),
  )  # fmt: skip
  tokens_per_second = steps * batch * seq_len / seconds
  fpt = flops_per_token(cfg, seq_len)
  device = jax.devices()[0]
  peak = PEAK_FLOPS.get((device.device_kind, dtype))
  return {
    "size": size,
    "layers": layers,
    "heads": heads,
    "d_model": d_model,
    "d_head": d_head,
    "seq_len": seq_len,
    "batch": batch,
    "dtype": dtype,
    "mesh": mesh.describe(grid),
    "attention_path": path,
    "attention_path_reason": why,
    "params": int(sum(x.size for x in jax.tree.leaves(params))),
    "tokens_per_second": round(tokens_per_second, 1),
    "flops_per_token": fpt,
    "achieved_tflops": round(tokens_per_second * fpt / 1e12, 4),
    "mfu": None if peak is None else round(tokens_per_second * fpt / (peak * jax.device_count()), 4),
  }


def main(argv):
  device = jax.devices()[0]
  machine = {
    "backend": jax.default_backend(),
    "device_kind": device.device_kind,
    "devices": jax.device_count(),
    "cpu": platform.processor() or platform.machine(),
  }
  results = [bench(size, _STEPS.value, _DTYPE.value, _MESH.value) for size in _SIZES.value]
  print(json.dumps({"machine": machine, "results": results}, indent=1))


if __name__ == "__main__":
  app.run(main)
