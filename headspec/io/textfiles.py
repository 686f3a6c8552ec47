"""Reading a user's text files (a treebank, a prompt-pairs file): UTF-8 with or without a byte-order mark
(Notepad writes one), and a byte that is not UTF-8 one UserError line naming the file and the line."""

from __future__ import annotations

from etils import epath

from headspec.errors import UserError


def read_text(path) -> str:
  """The text of `path` (a local path or a URL); a leading byte-order mark is not part of the first line."""
  data = epath.Path(path).read_bytes()
  try:
    return data.decode("utf-8-sig")
  except UnicodeDecodeError as e:
    start = e.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)
    line = data.count(b"\n", 0, start) + 1
    column = start - (data.rfind(b"\n", 0, start) + 1) + 1
    raise UserError(f"{path}:{line}: not UTF-8 ({e.reason} at byte {column} of the line)") from None
