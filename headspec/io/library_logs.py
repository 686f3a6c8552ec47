"""The lines headspec's libraries log about what headspec does on purpose, and the filter that drops them.

orbax warns (absl WARNING) each time a CheckpointManager opens read-only, which is how every analysis loads a
checkpoint; TFDS warns each time a builder config is made at run time, which is how headspec builds its text
corpora. Neither says anything to the user. The places that cause them drop them around the call (`quiet()`),
so a notebook using the Python API sees none; the CLI's log handler drops them too (cli._drop_library_chatter).
"""

from __future__ import annotations

import contextlib
import logging

NOTES = (
  "Using custom data configuration",
  "Variant folder",
  "CheckpointManagerOptions.read_only=True",
  "Given directory is read only",
)


def is_note(record: logging.LogRecord) -> bool:
  """Whether `record` is one of NOTES (by the start of its message)."""
  return str(record.msg).startswith(NOTES)


def _keep(record: logging.LogRecord) -> bool:
  return not is_note(record)


@contextlib.contextmanager
def quiet():
  """Drops NOTES logged through absl (orbax's and TFDS's logger) while the block runs; every other record,
  and every error, passes."""
  logger = logging.getLogger("absl")
  logger.addFilter(_keep)
  try:
    yield
  finally:
    logger.removeFilter(_keep)
