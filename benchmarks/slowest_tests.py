"""The suite's slowest tests and its time per tier, from the JUnit record every pytest run leaves.

  python -m benchmarks.slowest_tests [.pytest-record.xml] [--top=20] [--compiles=FILE]

pytest.ini passes `--junitxml=.pytest-record.xml`, so each run (CI's included) leaves every test's time;
this prints the `--top` slowest as a Markdown table (docs/testing.md keeps the one of its last full run),
then the summed test time of the `e2e` tier and of the rest. The record has no markers, so the tier is
read from the tests themselves: pytest collects them again (no test runs) with `-m e2e`.
`--compiles=FILE` reads the compile record a run with HEADSPEC_COMPILE_RECORD=FILE left (tests/conftest.py:
one JSON line per test and worker, in FILE.gw0, FILE.gw1, ...) and prints the programs compiled in all, per
tier, and the `--top` test modules by programs.
"""

from __future__ import annotations

import argparse
import collections
import glob
import json
import subprocess
import sys
import xml.etree.ElementTree as ET


def durations(record: str) -> dict[str, float]:
  """Seconds per test id (`tests/test_x.py::test_y[...]`), setup and teardown included; a rerun test
  keeps its last run."""
  out = {}
  for case in ET.parse(record).getroot().iter("testcase"):
    module = case.get("classname", "").replace(".", "/")
    out[f"{module}.py::{case.get('name')}"] = float(case.get("time", 0.0))
  return out


def e2e_ids() -> set[str]:
  listing = subprocess.run(
    [sys.executable, "-m", "pytest", "--collect-only", "-q", "-m", "e2e", "-p", "no:cacheprovider", "-o", "addopts="],
    capture_output=True,
    text=True,
    check=False,
  ).stdout
  return {line.strip() for line in listing.splitlines() if "::" in line}


def compiles(record: str) -> dict[str, tuple[int, float]]:
  """(programs, compile seconds) per test id, summed over the workers' files `record.*` (a rerun test
  counts both runs: both compiled)."""
  out = collections.defaultdict(lambda: (0, 0.0))
  for path in sorted(glob.glob(f"{glob.escape(record)}.*")):
    with open(path) as f:
      for line in f:
        row = json.loads(line)
        programs, seconds = out[row["test"]]
        out[row["test"]] = (programs + row["programs"], seconds + row["seconds"])
  return dict(out)


def print_compiles(record: str, e2e: set[str], top: int) -> None:
  per_test = compiles(record)
  if not per_test:
    raise SystemExit(f"--compiles: no files {record}.* (run pytest with HEADSPEC_COMPILE_RECORD={record})")
  per_module = collections.Counter()
  for test, (programs, _) in per_test.items():
    per_module[test.split("::")[0]] += programs
  total = sum(p for p, _ in per_test.values())
  tier = sum(p for t, (p, _) in per_test.items() if t in e2e)
  seconds = sum(s for _, s in per_test.values())
  print(f"\n{total} programs compiled in the pytest workers ({seconds:.0f} s): e2e {tier}, the rest {total - tier}")
  print("| programs | module |\n| ---: | --- |")
  for module, programs in per_module.most_common(top):
    print(f"| {programs} | `{module}` |")


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("record", nargs="?", default=".pytest-record.xml")
  parser.add_argument("--top", type=int, default=20)
  parser.add_argument("--compiles", help="the HEADSPEC_COMPILE_RECORD file prefix of the same run")
  args = parser.parse_args()
  times = durations(args.record)
  print("| seconds | test |\n| ---: | --- |")
  for test, seconds in sorted(times.items(), key=lambda kv: -kv[1])[: args.top]:
    print(f"| {seconds:.1f} | `{test}` |")
  e2e = e2e_ids()
  tier = sum(s for t, s in times.items() if t in e2e)
  print(
    f"\n{len(times)} tests, {sum(times.values()):.0f} s of test time: e2e {tier:.0f} s, the rest {sum(times.values()) - tier:.0f} s"
  )
  if args.compiles:
    print_compiles(args.compiles, e2e, args.top)


if __name__ == "__main__":
  main()
