"""docs/patching.md's site table is the contract of headspec.model.sites.SITES: every site a user may capture or edit
has its row there (name and axes), and the table names no site the model lacks."""

import pathlib
import re

from headspec.model.sites import SITES

DOC = pathlib.Path(__file__).resolve().parents[1] / "docs" / "patching.md"


def test_the_site_table_lists_every_site_with_its_axes():
  rows = dict(re.findall(r"^\| `(\w+)` \| ([A-Z ]+) \|", DOC.read_text(), flags=re.M))
  assert {name: axes.replace(" ", "") for name, axes in rows.items()} == SITES
