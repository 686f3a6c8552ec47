"""Every ```python block of README.md and docs/*.md runs as pasted: a page's blocks run in order in one
fresh namespace, in a temporary working directory, offline (docs/testing.md, "Snippets in the docs").

Two markers, on the line before a block, say otherwise, visibly on the page:
- `<!-- not run: REASON -->`: the block cannot run here by nature (it downloads a Hub model, needs a TPU
  or a run of your own). The test lists every such block and checks their count per page (NOT_RUN), so
  none is skipped silently and a new one is a deliberate change of this file.
- `<!-- needs: headspec.NAME -->`: the block runs once headspec has NAME (until then it is skipped, and
  the test says so).
A page's set-up is a visible block on the page itself, never hidden here. A failure names the page and
the block's first line; the traceback's lines are the page's lines.
"""

import dataclasses
import os
import pathlib
import re
import textwrap

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import headspec  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# The blocks marked `not run` per page: change a count only together with the page's marker.
NOT_RUN = {"docs/api.md": 1, "docs/atlas.md": 1, "docs/pretrained.md": 2}
# Pages whose blocks read the development treebanks (HEADSPEC_DATA_DIR; tests/conftest.py's data_dir).
NEEDS_DATA = {"README.md", "docs/api.md"}

FENCE = re.compile(
  r"^(?P<marker>[ \t]*<!-- (?P<kind>not run|needs): (?P<what>.+?) -->[ \t]*\n)?"
  r"(?P<indent>[ \t]*)```python[ \t]*\n(?P<code>.*?)^(?P=indent)```",
  re.S | re.M,
)


@dataclasses.dataclass(frozen=True)
class Block:
  page: str  # relative to the repository: docs/api.md
  line: int  # the page's line of the block's first code line
  code: str
  not_run: str | None = None  # the reason
  needs: str | None = None  # a headspec name

  @property
  def where(self) -> str:
    return f"{self.page}:{self.line}"


def blocks(path: pathlib.Path) -> list[Block]:
  """The page's ```python blocks in order (indented fences, e.g. in a list, dedented)."""
  text = path.read_text()
  found = []
  for m in FENCE.finditer(text):
    line = text.count("\n", 0, m.start("code")) + 1
    kind, what = m.group("kind"), m.group("what")
    if kind == "needs":
      assert what.startswith("headspec."), f"{path.name}:{line}: write <!-- needs: headspec.NAME -->"
    found.append(
      Block(
        _name(path),
        line,
        textwrap.dedent(m.group("code")),
        what.strip() if kind == "not run" else None,
        what.removeprefix("headspec.") if kind == "needs" else None,
      )
    )
  return found


def _name(path: pathlib.Path) -> str:
  return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def pages_with_blocks() -> list[str]:
  return [str(p.relative_to(ROOT)) for p in PAGES if blocks(p)]


def test_every_python_fence_is_a_block():
  """No ```python fence escapes the pattern (one that did would never run)."""
  for path in PAGES:
    fences = len(re.findall(r"^[ \t]*```python[ \t]*$", path.read_text(), re.M))
    assert fences == len(blocks(path)), f"{path.relative_to(ROOT)}: {fences} ```python fences, {len(blocks(path))} read"


def test_blocks_not_run_are_listed_and_counted(capsys):
  """Each `not run` block has a reason, and their count per page is NOT_RUN's (no block skipped silently)."""
  marked = [b for path in PAGES for b in blocks(path) if b.not_run is not None]
  counts = {}
  for b in marked:
    assert len(b.not_run) > 10, f"{b.where}: say why the block cannot run"
    counts[b.page] = counts.get(b.page, 0) + 1
  with capsys.disabled():
    print(f"\n{len(marked)} documentation blocks not run:")
    for b in marked:
      print(f"  {b.where}: {b.not_run}")
  assert counts == NOT_RUN


def test_the_pages_link_and_the_transformerlens_page_has_its_blocks():
  found = blocks(ROOT / "docs" / "transformerlens.md")
  assert len(found) >= 7 and any(b.needs == "generate" and "headspec.generate" in b.code for b in found)
  for name in ("to_tokens", "to_str_tokens", "to_single_token", "capture", "decompose_resid", "accumulated_resid"):
    assert any(name in b.code for b in found), name
  assert "docs/transformerlens.md" in (ROOT / "README.md").read_text()
  assert "transformerlens.md" in (ROOT / "docs" / "api.md").read_text()


def test_a_failing_block_names_its_page_and_line(tmp_path):
  """The runner reports the page and line of the block that failed, and the line inside it."""
  page = tmp_path / "page.md"
  page.write_text("# A page\n\n```python\nx = 1\n```\ntext\n```python\ny = x + 1\nz = undefined_name\n```\n")
  with pytest.raises(AssertionError, match=r"page\.md:8: NameError.*undefined_name") as error:
    run_page(page, tmp_path)
  assert f"{page}:9" in str(error.value)  # the failing line, as the page numbers it


def run_page(path: pathlib.Path, cwd: pathlib.Path) -> dict:
  """Runs the page's blocks in order in one namespace, in `cwd`; the namespace after the last block."""
  namespace = {"__name__": "__main__"}
  here = os.getcwd()
  os.chdir(cwd)
  try:
    for b in blocks(path):
      if b.not_run is not None:
        continue
      if b.needs and not hasattr(headspec, b.needs):
        print(f"{b.where}: skipped until headspec has {b.needs}")
        continue
      try:
        exec(compile("\n" * (b.line - 1) + b.code, str(path), "exec"), namespace)
      except Exception as e:
        import traceback

        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == str(path)]
        at = f" (at {path}:{frames[-1].lineno})" if frames else ""
        raise AssertionError(f"{b.where}: {type(e).__name__}: {e}{at}") from e
  finally:
    os.chdir(here)
  return namespace


@pytest.mark.slow
@pytest.mark.parametrize("page", pages_with_blocks())
def test_the_page_runs(page, tmp_path, request, monkeypatch):
  pytest.importorskip("transformers")
  monkeypatch.setenv("MPLBACKEND", "Agg")  # a page's plt.show() draws nowhere (set for this test only: the
  # notebooks' kernels, started from the same worker, must draw inline)
  if page in NEEDS_DATA:
    monkeypatch.setenv("HEADSPEC_DATA_DIR", str(request.getfixturevalue("data_dir")))
  namespace = run_page(ROOT / page, tmp_path)
  if page == "docs/transformerlens.md":  # the page's last results, as it describes them
    assert namespace["frame"].shape[1] == 4 and len(namespace["per_layer"]) == namespace["L"] + 1
