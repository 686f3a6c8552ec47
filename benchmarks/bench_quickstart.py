"""Benchmark: README command 1's `headspec quickstart`, install excluded, timed stage by stage (issue 33).

  python -m benchmarks.bench_quickstart [--keep=DIR]

Runs `python -m headspec quickstart` in a fresh temporary work directory, in a subprocess whose JAX
compilation cache is a new empty folder (as on a fresh machine: every program is compiled), and reads its
output line by line: a stage starts at the line the quickstart prints for it ("training the decoder",
"probing every head of the encoder", ...), so each stage's seconds are the time between two such lines.
From each run's probes/run_info.json it adds the XLA compilations and compile seconds of every probed model
step. Prints one JSON object: total wall and CPU seconds (the subprocess's user + system), the stages, the
compilations, the probe tables' first lines (so a speed-up that changed the results shows), and the load
average before and after. The issue's target is 4 minutes on the 2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

# the quickstart's own progress lines (headspec/quickstart.py) -> stage name
STAGES = (
  ("synthetic treebank and text", "data"),
  ("training the decoder", "train decoder"),
  ("training the encoder", "train encoder"),
  ("probing every head of the decoder", "probe decoder + random copy"),
  ("probing every head of the encoder", "probe encoder + random copy"),
  ("what the decoder's heads attend to", "attention"),
  ("ablating every head of the decoder", "ablation"),
  ("wrote:", "atlas and listing"),
)


def _stage(line: str) -> str | None:
  return next((name for start, name in STAGES if line.startswith(start)), None)


def time_quickstart(workdir: str) -> dict:
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=os.path.join(workdir, "jax-cache"))
  env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  cmd = [sys.executable, "-m", "headspec", "quickstart", f"--workdir={workdir}/runs"]
  usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
  t0 = time.perf_counter()
  stages, current, started, tail = {}, "start-up", t0, []
  with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
    for line in proc.stdout:
      tail = (tail + [line.rstrip()])[-20:]
      name = _stage(line)
      if name:
        now = time.perf_counter()
        stages[current] = round(now - started, 1)
        current, started = name, now
  wall = time.perf_counter() - t0
  if proc.returncode:
    raise SystemExit(f"headspec quickstart exited {proc.returncode}:\n" + "\n".join(tail))
  stages[current] = round(time.perf_counter() - started, 1)
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  cpu = usage.ru_utime - usage0.ru_utime + usage.ru_stime - usage0.ru_stime
  return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "stages_s": stages}


def _probe_facts(runs: str) -> dict:
  out = {}
  for kind in ("decoder", "encoder"):
    with open(os.path.join(runs, kind, "probes", "run_info.json")) as f:
      info = json.load(f)
    out[kind] = {"xla_compilations": info["xla_compilations"], "xla_compile_seconds": info["xla_compile_seconds"]}
    with open(os.path.join(runs, kind, "probes", "summary.md")) as f:  # its first table's UPOS row
      upos = next(line for line in f.read().splitlines() if line.startswith("| upos |"))
    out[kind]["summary_upos_row"] = " ; ".join(cell.strip() for cell in upos.strip("|").split("|"))
  return out


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--keep", default="", help="work directory to keep (default: a temporary one, removed)")
  args = parser.parse_args()
  workdir = args.keep or tempfile.mkdtemp(prefix="headspec-bench-quickstart-")
  load_before = os.getloadavg()
  timing = time_quickstart(workdir)
  result = {
    "command": "headspec quickstart --workdir=DIR (install excluded, empty JAX compilation cache)",
    **timing,
    "target_s": 240,
    "probes": _probe_facts(os.path.join(workdir, "runs")),
    "machine": {"cores": os.cpu_count(), "load_average_before": [round(v, 2) for v in load_before],
                "load_average_after": [round(v, 2) for v in os.getloadavg()]},
  }  # fmt: skip
  if not args.keep:
    shutil.rmtree(workdir, ignore_errors=True)
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  main()
