"""The one rule that turns a user-given name into part of a file name: `component(name)` (issue 62).

A model's name (`--config.model_name`, `probe.model_name`, a run folder's or a pretrained model's name)
goes into figure names, picture folders, the feature cache and the probe's part folders. Used as it is,
an absolute path or `../` writes outside the run directory, and a `/` names a folder that does not
exist, which fails only when the figure is saved, after the computing. `component` keeps letters, digits
and `-_.`, and replaces every other character (path separators, spaces, control characters, a lone
surrogate) and a leading dot (`..`, a hidden file) by `_`; a name it changed or cut (at MAX_BYTES of
UTF-8) ends in 8 hex digits of its SHA-256, so two names never share a file. Tables keep the name as given.
"""

from __future__ import annotations

import hashlib

MAX_BYTES = 80
"""The longest component kept whole (UTF-8 bytes), far below a file system's 255 with the suffixes added."""


def component(name: str) -> str:
  """`name` as one file-name component: itself when it is already safe, else a safe form plus a digest."""
  text = str(name)
  safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in text)
  if safe.startswith("."):
    safe = "_" + safe[1:]
  while len(safe.encode("utf-8")) > MAX_BYTES:
    safe = safe[:-1]
  if safe and safe == text:
    return safe
  digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
  return f"{safe or '_'}-{digest}"
