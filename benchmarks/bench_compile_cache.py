"""Benchmark: what JAX's persistent compilation cache saves a second `headspec probe` command.

  python -m benchmarks.bench_compile_cache [--steps=20] [--train_words=5000] [--tasks=upos,xpos,deprel,arc,distance,depth]
      [--treebank_sentences=4000,500,500]

Each `headspec` command is a new process, and jit's in-memory cache dies with it: before the persistent
cache every command compiled its programs again (the probe suite's ~95 on a small model). In one run,
on the synthetic treebank (`headspec data synthetic`'s, written to a temporary folder) and a small
decoder trained for --steps steps (the quickstart's architecture), three `headspec probe` commands on
copies of the same run, each as a user runs it:
  - `off`: HEADSPEC_COMPILATION_CACHE=0, no persistent cache (every program compiled);
  - `cold`: a fresh cache folder (every program compiled and written);
  - `warm`: the same folder again (every program loaded).
Prints one JSON object: per command its wall seconds, its XLA programs and the seconds run_info.json
records for them (compiled or loaded), and the ratios warm / off and cold / off (wall), with the load
average before each.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

from benchmarks import uncached_environment


def _headspec(args: list[str], env: dict) -> None:
  done = subprocess.run([sys.executable, "-m", "headspec", *args], env=env, capture_output=True, text=True)
  if done.returncode != 0:
    raise SystemExit(f"headspec {' '.join(args[:2])} failed: {done.stderr[-2000:]}")


def _probe(run: pathlib.Path, data: pathlib.Path, args, env: dict) -> dict:
  """One `headspec probe` on `run`: wall seconds, XLA programs and their seconds (run_info.json)."""
  load = [round(v, 2) for v in os.getloadavg()]
  start = time.perf_counter()
  _headspec(
    [
      "probe",
      f"--config=probe_synthetic:{data}",
      f"--workdir={run}",
      "--config.probe.random_baseline=False",
      f"--config.probe.max_train_words={args.train_words}",
      f"--config.probe.tasks=({','.join(repr(t) for t in args.tasks.split(','))},)",
    ],
    env,
  )
  wall = time.perf_counter() - start
  info = json.loads((run / "probes" / "run_info.json").read_text())
  return {
    "wall_s": round(wall, 1),
    "xla_programs": sum(info["xla_compilations"].values()),
    "xla_seconds": round(sum(info["xla_compile_seconds"].values()), 1),
    "load_average_before": load,
  }


def run(args) -> dict:
  env = uncached_environment()
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    _headspec(
      [
        "data",
        "synthetic",
        f"--out={tmp / 'data'}",
        "--text-sentences=8000",
        f"--treebank-sentences={args.treebank_sentences}",
      ],
      dict(env, HEADSPEC_COMPILATION_CACHE="0"),
    )
    trained = tmp / "trained"
    _headspec(
      [
        "train",
        "--config=quickstart:decoder",
        f"--workdir={trained}",
        f"--config.data_dir={tmp / 'data'}",
        f"--config.train.steps={args.steps}",
        f"--config.train.checkpoint_every={args.steps}",
        "--config.train.eval_every=0",  # the probe reads only the checkpoint: no evaluation programs
        "--config.train.diversity_every=0",
        "--config.train.keep_steps=()",
      ],
      dict(env, HEADSPEC_COMPILATION_CACHE="0"),
    )
    out = {}
    cached = {"JAX_COMPILATION_CACHE_DIR": str(tmp / "cache"), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
    for name, extra in (("off", {"HEADSPEC_COMPILATION_CACHE": "0"}), ("cold", cached), ("warm", cached)):
      copy = tmp / f"run_{name}"
      shutil.copytree(trained, copy, ignore=shutil.ignore_patterns("probes"))
      out[name] = _probe(copy, tmp / "data", args, dict(env, **extra))
    entries = list((tmp / "cache").glob("*-cache"))  # beside them: -atime stamps and the lock
    cache_mb = sum(p.stat().st_size for p in entries) / 2**20
  return {
    "what": f"headspec probe (probe_synthetic, {args.train_words} train words, tasks {args.tasks}) "
    f"on a quickstart decoder after {args.steps} steps, three commands",
    "commands": out,
    "cache_entries": len(entries),
    "cache_mb": round(cache_mb, 1),
    "ratio_wall_warm_over_off": round(out["warm"]["wall_s"] / out["off"]["wall_s"], 2),
    "ratio_wall_cold_over_off": round(out["cold"]["wall_s"] / out["off"]["wall_s"], 2),
    "machine": {"cores": os.cpu_count(), "load_average_end": [round(v, 2) for v in os.getloadavg()]},
  }


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_compile_cache", description=__doc__.splitlines()[0])
  parser.add_argument("--steps", type=int, default=20, help="training steps of the probed decoder")
  parser.add_argument("--train_words", type=int, default=5000, help="probe.max_train_words")
  parser.add_argument("--tasks", default="upos,xpos,deprel,arc,distance,depth", help="probe.tasks")
  parser.add_argument("--treebank_sentences", default="4000,500,500", help="the synthetic treebank's train,dev,test")
  print(json.dumps(run(parser.parse_args(argv)), indent=1))


if __name__ == "__main__":
  main()
