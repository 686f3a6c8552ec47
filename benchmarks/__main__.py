"""Every benchmark in one command; rewrites BENCHMARKS.md with the machine and each benchmark's figures.

  python -m benchmarks [--only=train,probe] [--full] [--out=BENCHMARKS.md]
  python -m benchmarks --summary [--out=BENCHMARKS.md]   # only the table at the top, from the sections; runs nothing

The report opens with one table (`summary`): per benchmark its headline figure (`HEADLINES`), headspec's
value, the reference it is measured against and its value, the ratio and the machine and date, read from
the sections below it, which keep every figure as key-value rows.

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
import re
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
  "circuit": ([], [], False),  # EAP / EAP-IG edge scores of every edge against exact edge patching
  "attention": (["--max_sentences=200"], [], True),
  "extract": (["--split=dev"], ["--split=train"], True),
  "structural": ([], ["--all"], True),
  # issue 36's bar at full size: layer 0's 12 heads and its residual stream on all of EWT (~40 min, 2 cores)
  "structural_ewt": (STRUCTURAL_EWT, STRUCTURAL_EWT, True),  # --full: "structural" already runs --all
  "compile_cache": ([], [], False),
  "depth": ([], [], False),  # issue 64: first-call seconds of the forward and sweeps at 4 and 16 layers (scan)
  "init": ([], [], False),  # model initialisation: bucketed draws against per-shape and one jit
  # issue 33's 40k MiniLM run; --full: the reference config on all of EWT train (MDL off in both)
  "probe_minilm": (["--max_train_words=40000"], ["--max_train_words=0"], True),
  "quickstart": ([], [], False),  # README command 1 stage by stage, empty compilation cache (~11 min, 2 cores)
}
# name -> (figure, headspec's key, its unit, the reference, the reference's key): the row of the summary
# table. Both keys are flattened figures of the benchmark's section; a reference in seconds gives the
# ratio reference / headspec (above 1: headspec is faster, or within a target); None: no reference.
HEADLINES = {
  "train": ("training throughput, small decoder (4 layers × 8 heads)", "results.1.tokens_per_second", "tokens/s",
            None, None),
  "probe": ("softmax probes: 12 heads × 3 tasks × 3 λ, 20k words", "jax_seconds", "s",
            "scikit-learn LogisticRegression, same grid (extrapolated from 1 head)", "sklearn_seconds"),
  "probe_ewt": ("softmax probes: 12 heads × 3 tasks × 3 λ, 200k words (EWT)", "jax_seconds", "s",
                "scikit-learn LogisticRegression, same grid (extrapolated from 1 head)", "sklearn_seconds"),
  "diversity": ("head-diversity metrics, streamed", "streamed_s", "s", "one pass over the captured maps",
                "metrics_s"),
  "induction": ("induction and copying scores, random weights (cold)", "cold.total_s", "s", "target", "target_s"),
  "ablation": ("48 single-head ablations, compiled sweep", "sweep_vs_loop.sweep_seconds", "s",
               "a loop of masked forwards", "sweep_vs_loop.loop_seconds"),
  "patching": ("512 activation patches of z, compiled sweep", "sweep_seconds", "s", "a per-patch loop",
               "loop_seconds"),
  "circuit": ("EAP scores of all 479 edges, 4-layer decoder", "seconds.eap", "s",
              "exact edge patching of every edge", "seconds.exact"),
  "attention": ("attention analysis, MiniLM × EWT dev, end to end (cold)", "end_to_end_cold_s", "s", None, None),
  "extract": ("MiniLM features of EWT dev (every head's Z_h and residual)", "headspec_s", "s",
              "transformers on torch (hidden states only)", "torch_s"),
  "structural": ("structural probes, MiniLM layer 0, 2k words", "total.structural.fit_s", "s",
                 "softmax probes on the same sources", "total.softmax.fit_s"),
  "structural_ewt": ("structural probes, MiniLM layer 0, all of EWT", "total.structural.fit_s", "s",
                     "softmax probes on the same sources", "total.softmax.fit_s"),
  "compile_cache": ("headspec probe with a warm compilation cache", "commands.warm.wall_s", "s",
                    "the same command without the cache", "commands.off.wall_s"),
  "depth": ("z patching sweep, 16-layer decoder, first call (compile + run)",
            "depths.16.patching_sweep_z_by_position.seconds", "s", "the 4-layer decoder's (target: within 2×)",
            "depths.4.patching_sweep_z_by_position.seconds"),
  "init": ("MiniLM's initial weights, bucketed draws", "sizes.minilm.seconds.bucketed", "s",
           "one draw per shape", "sizes.minilm.seconds.per_shape"),
  "probe_minilm": ("headspec probe, MiniLM × EWT, 40k words (empty cache)", "wall_s", "s", "target", "target_s"),
  "quickstart": ("headspec quickstart (empty cache, install excluded)", "wall_s", "s", "target", "target_s"),
  "sae": ("TopK SAE training (1,024 features, k 32)", "headspec_steps_per_second", "steps/s",
          "the same SAE in an eager PyTorch loop", "torch_steps_per_second"),
}  # fmt: skip
SUMMARY_START = "<!-- summary: written by `python -m benchmarks` from the sections below; edit those, not this -->"
SUMMARY_END = "<!-- end of summary -->"
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


def sections(text: str) -> dict[str, str]:
  """{name: body} of a report's `## name` sections, in order."""
  out, name = {}, None
  for line in text.splitlines():
    if line.startswith("## "):
      name = line[3:].strip()
      out[name] = []
    elif name is not None:
      out[name].append(line)
  return {k: "\n".join(v).strip("\n") for k, v in out.items()}


def kept_sections(path: str, rerun) -> dict:
  """The `## name` sections of an existing report that this run does not redo (so --only=probe keeps
  the other benchmarks' figures, each still headed by its own command and date line), a section this
  runner does not know (written by hand or by another script) included."""
  try:
    with open(path) as f:
      text = f.read()
  except OSError:
    return {}
  return {k: v for k, v in sections(text).items() if k not in rerun}


def recorded(body: str) -> dict:
  """What a section records: {'figures': {key: value}, 'date': 'YYYY-MM-DD' or None, 'command': ...}; a
  figure's text read back as a number where it is one."""
  figures, date, command = {}, None, None
  for line in body.splitlines():
    if command is None and line.startswith("`"):  # the command line: `python -m ...` — 12.3 s wall[, date]
      command = line.split("`")[1]
      stated = re.search(r"\b(\d{4}-\d\d-\d\d)\b", line.split("`", 2)[2])
      date = stated.group(1) if stated else None
    cells = [c.strip() for c in line.strip().strip("|").split(" | ")] if line.startswith("| ") else []
    if len(cells) == 2 and cells != ["figure", "value"]:
      try:
        figures[cells[0]] = float(cells[1])
      except ValueError:
        figures[cells[0]] = cells[1]
  return {"figures": figures, "date": date, "command": command}


def line_dates(path: str) -> dict[str, str]:
  """{line: the date of the commit that last wrote it} for a report under git (the sections written
  before each carried its own date); {} without git."""
  try:
    done = subprocess.run(
      ["git", "blame", "--line-porcelain", "--", os.path.basename(path)],
      capture_output=True,
      text=True,
      cwd=os.path.dirname(os.path.abspath(path)),
      check=True,
    )
  except (OSError, subprocess.CalledProcessError):
    return {}
  dates, when = {}, None
  for line in done.stdout.splitlines():
    if line.startswith("committer-time "):
      when = datetime.datetime.fromtimestamp(int(line.split()[1]), datetime.UTC).date().isoformat()
    elif line.startswith("\t"):
      dates[line[1:]] = when
  return dates


def _machine_of(info: dict) -> str:
  """'2-core x86_64 CPU' (or the accelerator) from the report's device and host lines."""
  device, host = info.get("device", ""), info.get("host", "")
  cores = re.search(r"(\d+) CPU cores", host)
  arch = host.split(",")[0].strip()
  if "(cpu)" not in device and device:
    return device
  return f"{cores.group(1)}-core {arch} CPU" if cores else host or "unknown machine"


def _value(value, unit: str) -> str:
  if not isinstance(value, float):
    return "not recorded" if value is None else str(value)
  if unit == "s":
    return f"{value:.2f} s" if value < 10 else f"{value:,.1f} s" if value < 1000 else f"{value:,.0f} s"
  return f"{value:.2f} {unit}" if value < 10 else f"{value:,.0f} {unit}"


def summary(info: dict, records: dict[str, dict], default_date: str) -> list[str]:
  """The report's opening table: one row per benchmark of `HEADLINES` that has a record."""
  out = [
    SUMMARY_START,
    "| figure | headspec | reference it is measured against | ratio | machine and date |",
    "|---|---|---|---|---|",
  ]
  for name, (figure, key, unit, reference, reference_key) in HEADLINES.items():
    record = records.get(name)
    if record is None or key not in record["figures"]:
      continue
    cpu = record["figures"].get("machine.cpu")  # the section's own machine where it names one
    machine_name = _machine_of(info)
    if isinstance(cpu, str) and cpu not in info.get("host", "") and machine_name.endswith(" CPU"):
      machine_name = f"{machine_name.split('-core')[0]}-core {cpu} CPU"
    value = record["figures"][key]
    other = record["figures"].get(reference_key) if reference_key else None
    ratio = "—"
    if isinstance(value, float) and isinstance(other, float) and value and other:
      ratio = f"{other / value if unit == 's' else value / other:.2f}×"  # times: theirs / ours; rates: ours / theirs
    against = f"{reference}: {_value(other, unit)}" if reference else "—"
    when = record["date"] or default_date
    load = re.match(r"\[([0-9.]+)", str(record["figures"].get("load_average", "")))  # a section that records it
    when += f", load {float(load.group(1)):.1f}" if load else ""
    out.append(f"| [{figure}](#{name}) | {_value(value, unit)} | {against} | {ratio} | {machine_name}, {when} |")
  out += [
    "",
    "Ratio: the reference's time over headspec's, or headspec's rate over the reference's (above 1: headspec",
    "is faster, or within the target). Each row is its section's figures below (load: the load average its",
    "section records); the section holds the command and every number it reported.",
    SUMMARY_END,
  ]
  return out


def with_summary(text: str, info: dict, default_date: str, dates: dict | None = None) -> str:
  """`text` (a report) with its summary table, read from its own sections, right under its title (an
  earlier summary replaced); nothing else changes. A section without its own date takes its command
  line's date in `dates` (git blame), else `default_date`."""
  if SUMMARY_START in text and SUMMARY_END in text:
    head, rest = text.split(SUMMARY_START, 1)
    text = head.rstrip("\n") + "\n" + rest.split(SUMMARY_END, 1)[1].lstrip("\n")
  records = {}
  for name, body in sections(text).items():
    record = recorded(body)
    if record["date"] is None and dates:
      line = next((x for x in body.splitlines() if x.startswith("`")), None)
      record["date"] = dates.get(line)
    records[name] = record
  title, _, rest = text.partition("\n")
  return "\n".join([title, "", *summary(info, records, default_date), "", rest.lstrip("\n")])


def report_info(text: str) -> dict:
  """The machine lines and the date of an existing report's header."""
  info = {}
  for line in text.splitlines():
    if line.startswith("- device: "):
      info["device"] = line[len("- device: ") :]
    elif line.startswith("- host: "):
      info["host"] = line[len("- host: ") :]
    elif line.startswith("## "):
      break
  date = re.search(r"on (\d{4}-\d\d-\d\d)", text)
  info["date"] = date.group(1) if date else "undated"
  return info


def rewrite_summary(path: str) -> str:
  """`--summary`: the report at `path` with its summary table written from its own sections (read right
  before writing, so sections others added meanwhile are kept); runs no benchmark."""
  with open(path) as f:
    text = f.read()
  info = report_info(text)
  new = with_summary(text, info, f"≤ {info['date']}", line_dates(path))
  with open(path, "w") as f:  # a local report file, not a run directory
    f.write(new)
  return path


ACCELERATOR_FIGURES = (
  "GPU and TPU figures (`python -m benchmarks.gpu_scale`, docs/scale.md): training MFU of the 12×768 decoder\n"
  "and of a 1.1B Llama-like decoder on `data` and `fsdp` meshes: **not measured**; the MiniLM probe suite's wall\n"
  "and host CPU seconds on an accelerator: **not measured**; the attention path on a GPU (cuDNN expected in\n"
  "bfloat16): **not measured**. No accelerator was lent to this project when the script was written; it runs\n"
  "unchanged on one (checked on CPU with `--smoke`)."
)
"""What the report says of the accelerator figures until `benchmarks.gpu_scale` has run on one (then its own
record replaces this)."""


def markdown(info: dict, entries: dict, full: bool, kept: dict | None = None, dates: dict | None = None) -> str:
  out = [
    "# Benchmarks",
    "",
    ACCELERATOR_FIGURES,
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
  for name in [n for n in BENCHMARKS if n in entries or n in kept] + [n for n in kept if n not in BENCHMARKS]:
    if name in kept:
      out += [f"## {name}", "", kept[name], ""]
      continue
    entry = entries[name]
    out += [f"## {name}", "", f"`{entry['command']}` — {entry['wall_s']} s wall, measured {info['date']}", ""]
    if "skipped" in entry:
      out += [f"Skipped: {entry['skipped']}", ""]
      continue
    if "error" in entry:
      out += [f"Failed: {entry['error']}", ""]
      continue
    out += ["| figure | value |", "|---|---|"]
    out += [f"| {k} | {v} |" for k, v in flatten(entry["result"])]
    out.append("")
  return with_summary("\n".join(out), info, f"≤ {info['date']}", dates)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
  parser.add_argument("--only", default="", help=f"comma-separated subset of {','.join(BENCHMARKS)}")
  parser.add_argument("--full", action="store_true", help="each benchmark's full size (a GPU machine)")
  parser.add_argument("--out", default="BENCHMARKS.md")
  parser.add_argument("--summary", action="store_true", help="only rewrite the table at the top; runs nothing")
  args = parser.parse_args(argv)
  if args.summary:
    print(f"wrote {rewrite_summary(args.out)}")
    return 0
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
  kept = kept_sections(args.out, entries) if args.only else {}  # read right before writing
  with open(args.out, "w") as f:  # a local report file, not a run directory
    f.write(markdown(info, entries, args.full, kept, line_dates(args.out) if kept else None))
  print(f"wrote {args.out}")
  return 1 if any("error" in e for e in entries.values()) else 0


if __name__ == "__main__":
  sys.exit(main())
