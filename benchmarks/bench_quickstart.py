"""Benchmark: README command 1's `headspec quickstart`, install excluded, timed stage by stage (issue 33).

  python -m benchmarks.bench_quickstart [--keep=DIR]

Runs `python -m headspec quickstart` in a fresh temporary work directory through benchmarks/timed_command.py
(a subprocess with a new, empty JAX compilation cache) and reads its output line by line: a stage starts at
the line the quickstart prints for it ("training the decoder", "probing every head of the encoder", ...), so
each stage's seconds are the time between two such lines. From each run's probes/run_info.json it adds the
XLA compilations and compile seconds of every probed model step, and its softmax fits' L-BFGS passes beside
their arithmetic floor (benchmarks/plain_matmul.py). Prints one JSON object: total wall and CPU seconds (the
subprocess's user + system), the stages, the compilations, the probe tables' first lines (so a speed-up that
changed the results shows), and the load average before and after. The issue's target is 4 minutes on the
2-core CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

from benchmarks import plain_matmul, timed_command

# the quickstart's own progress lines (headspec/cli/quickstart.py) -> stage name
STAGES = (
  ("synthetic treebank and text", "data"),
  ("training the decoder", "train decoder"),
  ("training the encoder", "train encoder"),
  ("probing every head of the decoder", "probe decoder + random copy"),
  ("probing every head of the encoder", "probe encoder"),
  ("what the decoder's heads attend to", "attention"),
  ("ablating every head of the decoder", "ablation"),
  ("wrote:", "atlas and listing"),
)


def _stage(line: str) -> str | None:
  return next((name for start, name in STAGES if line.startswith(start)), None)


def time_quickstart(workdir: str) -> dict:
  stages, current, started = {}, "start-up", time.perf_counter()

  def on_line(line: str, now: float) -> None:
    nonlocal current, started
    name = _stage(line)
    if name:
      stages[current] = round(now - started, 1)
      current, started = name, now

  timing = timed_command.run(["quickstart", f"--workdir={workdir}/runs"], workdir, on_line)
  stages[current] = round(time.perf_counter() - started, 1)
  return {**timing, "stages_s": stages}


def _probe_facts(runs: str) -> dict:
  out = {}
  for kind in ("decoder", "encoder"):
    with open(os.path.join(runs, kind, "probes", "run_info.json")) as f:
      info = json.load(f)
    out[kind] = {"xla_compilations": info["xla_compilations"], "xla_compile_seconds": info["xla_compile_seconds"]}
    out[kind]["summary_upos_row"] = timed_command.upos_row(os.path.join(runs, kind, "probes", "summary.md"))
    out[kind]["lbfgs_floor"] = plain_matmul.floor(info.get("lbfgs_passes", {}))
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
    "machine": timed_command.machine(load_before),
  }
  timed_command.finish(result, workdir, args.keep)


if __name__ == "__main__":
  main()
