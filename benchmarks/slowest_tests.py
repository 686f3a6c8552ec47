"""The suite's slowest tests and its time per tier, from the JUnit record every pytest run leaves.

  python -m benchmarks.slowest_tests [.pytest-record.xml] [--top=20]

pytest.ini passes `--junitxml=.pytest-record.xml`, so each run (CI's included) leaves every test's time;
this prints the `--top` slowest as a Markdown table (docs/testing.md keeps the one of its last full run),
then the summed test time of the `e2e` tier and of the rest. The record has no markers, so the tier is
read from the tests themselves: pytest collects them again (no test runs) with `-m e2e`.
"""

from __future__ import annotations

import argparse
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


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("record", nargs="?", default=".pytest-record.xml")
  parser.add_argument("--top", type=int, default=20)
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


if __name__ == "__main__":
  main()
