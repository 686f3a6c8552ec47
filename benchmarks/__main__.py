"""Every benchmark in one command; rewrites BENCHMARKS.md with the machine and each benchmark's figures.

  python -m benchmarks [--only=train,probe] [--full] [--out=BENCHMARKS.md]

Runs each `benchmarks.bench_*` module in its own process (so one's compilation cache or memory does not
flatter the next), reads the JSON object it prints last, and writes one section per benchmark: the exact
command, its wall time and every number it reported, flattened (`results.0.tokens_per_second`). The
ratios are the benchmarks' own (headspec against scikit-learn, the compiled sweep against a per-mask
loop, ...), measured in the same process run. Default arguments are sized for a 2-core CPU; `--full`
uses each benchmark's own defaults plus the GPU training sizes (bfloat16). Benchmarks that need the
development data (MiniLM × EWT) read HEADSPEC_DATA_DIR and are skipped with the reason when it is unset.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata

# the probe fit before its words-last pass (issue 33; bench_probe --before times it beside today's, same load)
PROBE_BEFORE = "4747a52"
PROBE_EWT = ["--heads=12", "--train=200000", "--dev=25000", "--sklearn_heads=1", "--scaling_heads="]
STRUCTURAL_EWT = ["--train_words=0", "--dev_sentences=0", "--layers=0"]
# name -> (CPU-sized arguments, --full arguments, needs HEADSPEC_DATA_DIR)
BENCHMARKS = {
  "train": (
    ["--sizes=tiny,small", "--steps=5"],
    ["--sizes=tiny,small,base,gpu_base,gpu_large", "--dtype=bfloat16"],
    False,
  ),
  "probe": (
    [
      "--heads=12",
      "--train=20000",
      "--dev=5000",
      "--sklearn_heads=1",
      "--scaling_heads=4",
      "--scaling_train=47600",
      f"--before={PROBE_BEFORE}",
    ],
    [],
    False,
  ),
  # issue 33's bench_probe at all of EWT's size (200k training words), 12 heads, scikit-learn on one
  "probe_ewt": (PROBE_EWT, PROBE_EWT, False),
  "diversity": (["--sequences=16", "--repeats=2"], [], False),
  "induction": ([], [], False),
  "ablation": (["--skip_minilm"], [], False),
  "patching": ([], [], False),
  "attention": (["--max_sentences=200"], [], True),
  "extract": (["--split=dev"], ["--split=train"], True),
  "structural": ([], ["--all"], True),
  # issue 36's bar at full size: layer 0's 12 heads and its residual stream on all of EWT (~40 min, 2 cores)
  "structural_ewt": (STRUCTURAL_EWT, STRUCTURAL_EWT, True),  # --full: "structural" already runs --all
  "compile_cache": ([], [], False),
  "init": ([], [], False),  # model initialisation: bucketed draws against per-shape and one jit
  # issue 33's 40k MiniLM run; --full: the reference config on all of EWT train (MDL off in both)
  "probe_minilm": (["--max_train_words=40000"], ["--max_train_words=0"], True),
  "quickstart": ([], [], False),  # README command 1 stage by stage, empty compilation cache (~11 min, 2 cores)
}
# a benchmark run by another's module, with other arguments
MODULES = {"structural_ewt": "structural", "probe_ewt": "probe"}
VERSIONS = ("jax", "jaxlib", "flax", "optax", "numpy", "scikit-learn", "torch", "transformers")


def last_json(stdout: str) -> dict:
  """The last JSON object a benchmark printed (they print one, indented, at the end)."""
  lines = stdout.splitlines()
  for i in range(len(lines) - 1, -1, -1):
    if lines[i].startswith("{"):
      try:
        return json.loads("\n".join(lines[i:]))
      except json.JSONDecodeError:
        continue
  raise ValueError("no JSON object in the benchmark's output")


def flatten(value, prefix: str = "") -> list[tuple[str, object]]:
  if isinstance(value, dict):
    return [item for k, v in value.items() for item in flatten(v, f"{prefix}.{k}" if prefix else str(k))]
  if isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
    return [item for i, v in enumerate(value) for item in flatten(v, f"{prefix}.{i}")]
  return [(prefix, value)]


def machine() -> dict:
  import jax

  devices = jax.devices()
  versions = {}
  for name in VERSIONS:
    try:
      versions[name] = metadata.version(name)
    except metadata.PackageNotFoundError:
      pass
  return {
    "device": f"{len(devices)} × {devices[0].device_kind} ({devices[0].platform})",
    "host": f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.system()} {platform.release()}",
    "python": platform.python_version(),
    "versions": versions,
  }


def python_args(name: str, args: list[str]) -> list[str]:
  return ["-m", f"benchmarks.bench_{MODULES.get(name, name)}", *args]


def command(name: str, args: list[str]) -> str:
  return " ".join(["python", *python_args(name, args)])


def run(name: str, args: list[str]) -> dict:
  t0 = time.perf_counter()
  done = subprocess.run([sys.executable, *python_args(name, args)], capture_output=True, text=True)
  wall = time.perf_counter() - t0
  entry = {"command": command(name, args), "wall_s": round(wall, 1)}
  if done.returncode != 0:
    entry["error"] = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
    return entry
  try:
    entry["result"] = last_json(done.stdout)
  except ValueError as e:  # a benchmark that printed no JSON: recorded, the others still run
    entry["error"] = str(e)
  return entry


def kept_sections(path: str, rerun) -> dict:
  """The `## name` sections of an existing report that this run does not redo (so --only=probe keeps
  the other benchmarks' figures, each still headed by its own command and date line)."""
  try:
    with open(path) as f:
      text = f.read()
  except OSError:
    return {}
  sections, name = {}, None
  for line in text.splitlines():
    if line.startswith("## "):
      name = line[3:].strip()
      sections[name] = []
    elif name is not None:
      sections[name].append(line)
  return {k: "\n".join(v).strip("\n") for k, v in sections.items() if k not in rerun and k in BENCHMARKS}


def markdown(info: dict, entries: dict, full: bool, kept: dict | None = None) -> str:
  out = [
    "# Benchmarks",
    "",
    f"Written by `python -m benchmarks{' --full' if full else ''}` on {info['date']}. Every figure below was",
    "measured in that run on this machine; rerun the command to refresh it (see benchmarks/__main__.py).",
    "",
    f"- device: {info['device']}",
    f"- host: {info['host']}; Python {info['python']}",
    "- versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()),
    "",
  ]
  kept = kept or {}
  if kept:
    out += [f"Sections not rerun on {info['date']} ({', '.join(kept)}) are kept from the previous report.", ""]
  for name in [n for n in BENCHMARKS if n in entries or n in kept]:
    if name in kept:
      out += [f"## {name}", "", kept[name], ""]
      continue
    entry = entries[name]
    out += [f"## {name}", "", f"`{entry['command']}` — {entry['wall_s']} s wall", ""]
    if "skipped" in entry:
      out += [f"Skipped: {entry['skipped']}", ""]
      continue
    if "error" in entry:
      out += [f"Failed: {entry['error']}", ""]
      continue
    out += ["| figure | value |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in flatten(entry["result"])]
    out.append("")
  return "\n".join(out)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
  parser.add_argument("--only", default="", help=f"comma-separated subset of {','.join(BENCHMARKS)}")
  parser.add_argument("--full", action="store_true", help="each benchmark's full size (a GPU machine)")
  parser.add_argument("--out", default="BENCHMARKS.md")
  args = parser.parse_args(argv)
  names = [n for n in args.only.split(",") if n] or list(BENCHMARKS)
  unknown = sorted(set(names) - set(BENCHMARKS))
  if unknown:
    print(f"python -m benchmarks: error: unknown benchmark(s) {', '.join(unknown)}; known: {', '.join(BENCHMARKS)}")
    return 2
  info = {**machine(), "date": datetime.date.today().isoformat()}
  entries = {}
  for name in names:
    quick, full_args, needs_data = BENCHMARKS[name]
    chosen = full_args if args.full else quick
    if needs_data and not os.environ.get("HEADSPEC_DATA_DIR"):
      entries[name] = {
        "command": command(name, chosen),
        "wall_s": 0.0,
        "skipped": "needs HEADSPEC_DATA_DIR (the EWT treebank: `headspec data download ud en_ewt`)",
      }
      continue
    print(f"benchmark {name} ...", flush=True)
    entries[name] = run(name, chosen)
    print(
      f"  {entries[name]['wall_s']} s" + (f"  FAILED: {entries[name]['error']}" if "error" in entries[name] else "")
    )
  kept = kept_sections(args.out, entries) if args.only else {}
  with open(args.out, "w") as f:  # a local report file, not a run directory
    f.write(markdown(info, entries, args.full, kept))
  print(f"wrote {args.out}")
  return 1 if any("error" in e for e in entries.values()) else 0


if __name__ == "__main__":
  sys.exit(main())
