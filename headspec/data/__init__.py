"""Data: corpora (fetch: download, verify, install once), treebanks, tokenizers, the synthetic treebank.

Everything is read from one data directory, HEADSPEC_DATA_DIR or a command's `data_dir` key (docs/data.md).
"""

import os


def data_dir_default() -> str:
  """HEADSPEC_DATA_DIR, or '' (then a command that needs data says so): every command's `data_dir` default."""
  return os.environ.get("HEADSPEC_DATA_DIR", "")
