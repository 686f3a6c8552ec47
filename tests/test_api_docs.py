"""docs/transformerlens.md's code blocks run, in order, in one namespace (the page's promise). A block
after `<!-- needs: headspec.NAME -->` runs once headspec has NAME (until then it is skipped, and the
test says so)."""

import os
import pathlib
import re

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import headspec  # noqa: E402

PAGE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "transformerlens.md"
BLOCK = re.compile(r"(?:<!-- needs: headspec\.(\w+) -->\n)?```python\n(.*?)```", re.S)


def blocks() -> list[tuple[str | None, str]]:
  """(the headspec name a block needs or None, its code), in the page's order."""
  return [(m.group(1), m.group(2)) for m in BLOCK.finditer(PAGE.read_text())]


def test_the_page_has_its_blocks():
  found = blocks()
  assert len(found) >= 7 and ("generate", found[-2][1]) == found[-2]  # the generate block is marked
  for name in ("to_tokens", "to_str_tokens", "to_single_token", "capture", "decompose_resid", "accumulated_resid"):
    assert any(name in code for _, code in found), name
  links = (PAGE.parents[1] / "README.md").read_text()
  assert "docs/transformerlens.md" in links and "transformerlens.md" in (PAGE.parent / "api.md").read_text()


@pytest.mark.slow
def test_the_snippets_run(capsys):
  pytest.importorskip("transformers")
  namespace = {}
  for needs, code in blocks():
    assert not needs or hasattr(headspec, needs), f"docs/transformerlens.md uses headspec.{needs}, which is gone"
    exec(compile(code, f"{PAGE}:{needs or 'block'}", "exec"), namespace)
  assert namespace["frame"].shape[1] == 4 and len(namespace["per_layer"]) == namespace["L"] + 1
