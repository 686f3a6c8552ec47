"""`build_atlas`: a run's atlas page (headspec/atlas/page.py) and its SAE feature pages
(headspec/atlas/features.py), which link to each other, written together.
"""

from __future__ import annotations

import os
import pathlib

from etils import epath

from headspec import arguments as args
from headspec.atlas.data import atlas_data
from headspec.atlas.features import write_feature_pages
from headspec.atlas.page import PAGE_NAME, render, write_page
from headspec.io import provenance, remote, tables


@provenance.recorded("", "atlas.run_info.json")
@args.arguments(workdir=args.path, compare=args.paths)
def build_atlas(workdir, compare=()) -> pathlib.Path | epath.Path:
  """Writes WORKDIR/atlas.html (with the runs in `compare` side by side) and WORKDIR's SAE feature pages
  (headspec/atlas/features.py) and returns the atlas's path.

  Raises headspec.errors.UserError if WORKDIR has no results table, or a compared run does not exist
  or has none.
  """
  if isinstance(compare, (str, os.PathLike)):
    compare = [compare]
  tables.check_writable(remote.run_path(workdir))  # a run directory we cannot write to: before reading it
  data = atlas_data(workdir, compare)
  write_feature_pages(workdir)  # the pages the cards link to, before the page that links them
  return write_page(remote.run_path(workdir) / PAGE_NAME, render(data))
