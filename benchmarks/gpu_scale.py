"""The accelerator figures of docs/scale.md in one command (a few minutes on one GPU or TPU host); prints JSON.

  python -m benchmarks.gpu_scale [--smoke] [--skip_minilm]

1. Training MFU (benchmarks/bench_train.py: the real jitted step, PaLM's FLOPs per token) of the 12×768
   decoder (`gpu_base`) and a 1.1B Llama-like decoder (`llama_1b`, TinyLlama's shape) in bfloat16, on a
   `data` mesh (all devices on data) and an `fsdp` mesh (all devices on fsdp), each with the attention
   path its forward took (headspec.model.layers.attention_implementation: cudnn on GPUs in bf16).
2. The MiniLM probe suite (benchmarks/bench_probe_minilm.py at its defaults: 40k EWT training words,
   every head, all tasks): wall seconds and the host CPU seconds (user + system) of its process.
Each figure comes with the device kind and count. `--smoke` runs the `tiny` size for 3 steps and a
2,000-word suite so the script itself is checked on CPU (tests/test_benchmarks.py); its figures mean
nothing. It runs unchanged on an accelerator: nothing in it names a platform.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import jax


def training(sizes: list[str], steps: int, dtype: str) -> list[dict]:
  from benchmarks import bench_train

  n = jax.device_count()
  rows = []
  for size in sizes:
    for spec in (f"data={n}", f"fsdp={n}"):
      row = bench_train.bench(size, steps, dtype, spec)
      rows.append(
        {k: row[k] for k in ("size", "params", "dtype", "mesh", "tokens_per_second", "mfu", "attention_path")}
      )
  return rows


def minilm_suite(max_train_words: int) -> dict:
  """Wall and host CPU seconds of the MiniLM probe benchmark, run as a child process."""
  before = resource.getrusage(resource.RUSAGE_CHILDREN)
  t0 = time.perf_counter()
  done = subprocess.run(
    [sys.executable, "-m", "benchmarks.bench_probe_minilm", f"--max_train_words={max_train_words}"],
    capture_output=True, text=True,
  )  # fmt: skip
  wall = time.perf_counter() - t0
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  if done.returncode:
    return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
  cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
  return {"max_train_words": max_train_words, "wall_seconds": round(wall, 1), "host_cpu_seconds": round(cpu, 1)}


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the script, not the hardware")
  parser.add_argument("--skip_minilm", action="store_true", help="training figures only")
  args = parser.parse_args(argv)
  device = jax.devices()[0]
  out = {
    "machine": {"backend": jax.default_backend(), "device_kind": device.device_kind, "devices": jax.device_count()},
    "training": training(
      ["tiny"] if args.smoke else ["gpu_base", "llama_1b"],
      3 if args.smoke else 20,
      "float32" if args.smoke else "bfloat16",
    ),  # fmt: skip
  }
  if not args.skip_minilm:
    out["minilm_suite"] = minilm_suite(2000 if args.smoke else 40000)
  print(json.dumps(out, indent=1))


if __name__ == "__main__":
  main()
