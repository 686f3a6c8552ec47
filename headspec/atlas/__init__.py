"""The atlas: one self-contained HTML page per run (RUN/atlas.html) to browse every head's numbers.

`build_atlas(workdir, compare=())` reads the run's tables (headspec.io.tables; no JAX) and writes the page, and
a page per live SAE feature under RUN/atlas_features/ (headspec/atlas/features.py);
`headspec atlas --workdir=RUN [--compare=RUN_B]` calls it. See docs/atlas.md.
"""

from headspec.atlas.build import build_atlas
from headspec.atlas.data import atlas_data, run_data
from headspec.atlas.page import PAGE_NAME, render, write_page

__all__ = ["PAGE_NAME", "atlas_data", "build_atlas", "render", "run_data", "write_page"]
