"""Every relative link in README.md, docs/*.md and docs/notes/*.md names a file that exists, and an anchor a heading.

The README is a map of docs/: a page renamed or a heading reworded must not leave a dead pointer.
"""

import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "notes").glob("*.md"))]
# [text](target) and ![alt](target); the target stops at whitespace or ')'.
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE = re.compile(r"`[^`\n]*`")


def _links(text: str) -> list[str]:
  """Link targets outside code blocks and inline code."""
  text = CODE.sub("", FENCE.sub("", text))
  return LINK.findall(text)


def _slug(heading: str) -> str:
  """GitHub's anchor for a heading: lowercase, punctuation dropped, spaces to hyphens."""
  text = CODE.sub(lambda m: m.group(0)[1:-1], heading.strip()).lower()
  kept = (c for c in text if c in " -_" or unicodedata.category(c)[0] in "LN")
  return "".join(kept).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
  """Every heading anchor of a Markdown page (repeats get GitHub's -1, -2 suffixes)."""
  seen: dict[str, int] = {}
  out = set()
  for line in FENCE.sub("", page.read_text(encoding="utf-8")).splitlines():
    m = re.match(r"#{1,6}\s+(.*)", line)
    if m:
      slug = _slug(m.group(1))
      n = seen.get(slug, 0)
      seen[slug] = n + 1
      out.add(slug if n == 0 else f"{slug}-{n}")
  return out


def test_slug_follows_github():
  assert _slug("all-MiniLM-L6-v2 on UD English EWT") == "all-minilm-l6-v2-on-ud-english-ewt"
  assert _slug("The study: when does it matter?") == "the-study-when-does-it-matter"
  assert _slug("`headspec train` options") == "headspec-train-options"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
  bad = []
  for target in _links(page.read_text(encoding="utf-8")):
    if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:, data: ...
      continue
    path, _, anchor = target.partition("#")
    dest = (page.parent / path).resolve() if path else page
    if not dest.exists():
      bad.append(f"{target} (no file {dest.relative_to(ROOT)})")
    elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
      bad.append(f"{target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
  assert not bad, f"{page.relative_to(ROOT)}: dead links: " + "; ".join(bad)
