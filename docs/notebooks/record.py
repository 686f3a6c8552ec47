"""Re-executes docs/notebooks top to bottom and saves them with their outputs (what tests/test_notebooks.py
compares a fresh run against), with no trace of the machine they ran on.

  HEADSPEC_DATA_DIR=... python docs/notebooks/record.py [NOTEBOOK.ipynb ...]   (default: every notebook)

Each notebook runs on a Jupyter kernel (nbclient) in a temporary folder of its own, which is also the
kernel's TMPDIR. In the saved outputs that folder reads `$TMPDIR`, this checkout `.`, the data directory
`$HEADSPEC_DATA_DIR` and the Python environment's folders `$PYTHON`; stream lines that are a library's notes about itself (absl WARNING lines,
TqdmWarning) are dropped. tests/test_notebooks.py checks that no stored output carries a path of a machine.
"""

from __future__ import annotations

import os
import pathlib
import re
import sys
import sysconfig
import tempfile
import time

import nbclient
import nbformat

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
NOISE = re.compile(r"^(WARNING:absl:|.*TqdmWarning|\s*from \.autonotebook import tqdm)")


def _places(tmp: pathlib.Path) -> list[tuple[str, str]]:
  """(path, placeholder), longest first, each as given and resolved."""
  python = {sysconfig.get_paths()[k] for k in ("purelib", "platlib", "stdlib")} | {sys.prefix}
  pairs = [(str(tmp), "$TMPDIR"), (str(ROOT), ".")] + [(p, "$PYTHON") for p in python]
  if os.environ.get("HEADSPEC_DATA_DIR"):
    pairs.append((os.environ["HEADSPEC_DATA_DIR"], "$HEADSPEC_DATA_DIR"))
  pairs += [(os.path.realpath(p), name) for p, name in pairs]
  return sorted(set(pairs), key=lambda pair: -len(pair[0]))


def clean_text(text: str, places: list[tuple[str, str]], stream: bool) -> str:
  """`text` with every place replaced by its placeholder (and, in a stream, the noise lines dropped)."""
  for path, name in places:
    text = text.replace(path, name)
  if stream:
    text = "".join(line for line in text.splitlines(keepends=True) if not NOISE.match(line))
  return text


def clean(notebook, places) -> None:
  for cell in notebook.cells:
    outputs = []
    for output in cell.get("outputs", []):
      if output["output_type"] == "stream":
        output["text"] = clean_text(output["text"], places, stream=True)
        if not output["text"]:
          continue
      for kind, value in output.get("data", {}).items():
        if kind.startswith("text/") or kind.endswith("json"):
          output["data"][kind] = clean_text(value, places, stream=False) if isinstance(value, str) else value
      outputs.append(output)
    if cell.cell_type == "code":
      cell.outputs = outputs


def record(path: pathlib.Path) -> float:
  notebook = nbformat.read(path, as_version=4)
  with tempfile.TemporaryDirectory(prefix="headspec-notebook-") as tmp:
    os.environ["TMPDIR"] = tmp  # the kernel inherits it: the notebook's scratch folders go here
    t0 = time.perf_counter()
    client = nbclient.NotebookClient(
      notebook, timeout=900, kernel_name="python3", resources={"metadata": {"path": tmp}}
    )
    client.execute()
    seconds = time.perf_counter() - t0
    clean(notebook, _places(pathlib.Path(tmp)))
  nbformat.write(notebook, path)
  return seconds


def main(argv: list[str]) -> None:
  paths = [pathlib.Path(a) for a in argv] or sorted(HERE.glob("*.ipynb"))
  for path in paths:
    print(f"{path.name}: {record(path):.0f} s", flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])
