"""docs/notebooks re-executed top to bottom on a real Jupyter kernel (nbclient + ipykernel).

A notebook fails when a cell raises, or when its outputs no longer match the recorded ones in kind:
per code cell, whether it shows a figure, the columns of each table it shows, and whether it has a
result at all (text, timings and numbers may change; streams are ignored). The notebooks are kept with
their outputs so they render as pages; re-record them after an intended change with
`python docs/notebooks/record.py [NOTEBOOK]`, which also takes the machine's paths out of the outputs.
"""

import html.parser
import os
import pathlib
import time

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOKS = sorted((pathlib.Path(__file__).resolve().parents[1] / "docs" / "notebooks").glob("*.ipynb"))


class _Columns(html.parser.HTMLParser):
  """The header cells of a pandas DataFrame's HTML (its columns, and the index name if any)."""

  def __init__(self):
    super().__init__()
    self.columns, self._in_head, self._in_th = [], False, False

  def handle_starttag(self, tag, attrs):
    self._in_head |= tag == "thead"
    self._in_th = self._in_head and tag == "th"
    if self._in_th:
      self.columns.append("")

  def handle_endtag(self, tag):
    self._in_head &= tag != "thead"
    self._in_th &= tag != "th"

  def handle_data(self, data):
    if self._in_th:
      self.columns[-1] += data.strip()


def kinds(cell) -> list:
  """What a code cell shows, in kind: ('figure',), ('table', columns) or ('result',) per output."""
  out = []
  for output in cell.get("outputs", []):
    if output["output_type"] == "error":
      out.append(("error", output["ename"]))
    if output["output_type"] not in ("display_data", "execute_result"):
      continue  # streams: logs and timings
    data = output.get("data", {})
    if "image/png" in data or "image/svg+xml" in data:
      out.append(("figure",))
    elif "dataframe" in data.get("text/html", ""):
      parser = _Columns()
      parser.feed(data["text/html"])
      out.append(("table", tuple(parser.columns)))
    else:
      out.append(("result",))
  return out


def test_notebooks_are_kept_with_outputs():
  assert len(NOTEBOOKS) == 8  # 06_induction_circuit, 07_sae, 08_saelens beside 01-05
  for path in NOTEBOOKS:
    cells = [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]
    assert all(c.get("execution_count") for c in cells), f"{path.name}: execute and save it with its outputs"
    shown = [k[0] for c in cells for k in kinds(c)]
    assert "figure" in shown or "table" in shown, f"{path.name}: no figure or table recorded"


# What a stored output must not carry: a path of the machine it ran on, a library's notes about itself.
MACHINE = ("/tmp/", "/work/", "/home/", "/Users/", "site-packages", "WARNING:absl", "TqdmWarning", "IProgress")


def test_stored_outputs_carry_no_machine():
  for path in NOTEBOOKS:
    for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
      for output in cell.get("outputs", []):
        texts = [output.get("text", "")] + [v for v in output.get("data", {}).values() if isinstance(v, str)]
        found = [m for m in MACHINE for t in texts if m in t]
        assert not found, (
          f"{path.name}, cell {i}: {found[0]!r} in a stored output; record it with docs/notebooks/record.py"
        )


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_and_outputs_match(path, tmp_path, monkeypatch):
  if not os.environ.get("HEADSPEC_DATA_DIR"):
    pytest.fail("HEADSPEC_DATA_DIR is unset: the notebooks read the treebanks from it", pytrace=False)
  # the kernel inherits it: the notebooks' scratch folders (tempfile.mkdtemp, ~40 MB of runs each) go
  # into pytest's temporary folder, not the system's
  monkeypatch.setenv("TMPDIR", str(tmp_path))
  monkeypatch.delenv("MPLBACKEND", raising=False)  # the kernel draws inline, as a user's Jupyter does
  recorded = nbformat.read(path, as_version=4)
  fresh = nbformat.read(path, as_version=4)
  t0 = time.perf_counter()
  client = nbclient.NotebookClient(
    fresh, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
  )
  client.execute()  # raises CellExecutionError when a cell raises
  seconds = time.perf_counter() - t0
  print(f"{path.name}: {seconds:.0f} s")
  for i, (old, new) in enumerate(zip(recorded.cells, fresh.cells)):
    if old.cell_type == "code":
      assert kinds(new) == kinds(old), f"{path.name}, cell {i}: outputs {kinds(new)}, recorded {kinds(old)}"
