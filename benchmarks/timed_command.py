"""Running a headspec command as a benchmark: in a subprocess whose JAX compilation cache is a new empty
folder (as on a fresh machine: every program is compiled), reading its output line by line as it comes.

Shared by bench_quickstart (stages by the lines the quickstart prints) and bench_probe_minilm (fit times
by the lines the probe suite logs), with what both read back and how both end.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from collections.abc import Callable


def run(args: list[str], workdir: str, on_line: Callable[[str, float], None] = lambda line, now: None) -> dict:
  """`python -m headspec ARGS`, its output merged and passed line by line to `on_line(line, perf_counter)`.
  Returns {'wall_s', 'cpu_s'} (CPU: the subprocess's user + system seconds); exits with the output's last
  lines when the command fails."""
  env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=os.path.join(workdir, "jax-cache"))
  env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
  usage0 = resource.getrusage(resource.RUSAGE_CHILDREN)
  t0 = time.perf_counter()
  tail: list[str] = []
  cmd = [sys.executable, "-m", "headspec", *args]
  with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
    for line in proc.stdout:
      tail = (tail + [line.rstrip()])[-20:]
      on_line(line, time.perf_counter())
  wall = time.perf_counter() - t0
  if proc.returncode:
    raise SystemExit(f"headspec {args[0]} exited {proc.returncode}:\n" + "\n".join(tail))
  usage = resource.getrusage(resource.RUSAGE_CHILDREN)
  cpu = usage.ru_utime - usage0.ru_utime + usage.ru_stime - usage0.ru_stime
  return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}


def machine(load_before) -> dict:
  """The cores and the load average before and after (a figure taken under load is an upper bound)."""
  return {
    "cores": os.cpu_count(),
    "load_average_before": [round(v, 2) for v in load_before],
    "load_average_after": [round(v, 2) for v in os.getloadavg()],
  }


def upos_row(summary_md: str) -> str:
  """The first '| upos |' row of a probe run's summary.md, cells joined by ' ; ' ('' when absent), so a
  speed-up that changed the results shows in the benchmark's output."""
  with open(summary_md) as f:
    row = next((line for line in f.read().splitlines() if line.startswith("| upos |")), "")
  return " ; ".join(cell.strip() for cell in row.strip("|").split("|")) if row else ""


def finish(result: dict, workdir: str, keep: str) -> None:
  """Removes the temporary work directory (unless --keep named it) and prints the result as JSON."""
  if not keep:
    shutil.rmtree(workdir, ignore_errors=True)
  print(json.dumps(result, indent=1))
