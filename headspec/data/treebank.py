"""Universal Dependencies treebanks: read CoNLL-U into validated `Sentence`s.

Fields are split and IDs parsed by the `conllu` library. What it does not do, and we add here
(because probes silently go wrong on broken trees): line numbers in errors, the 10-column check,
HEAD in ASCII digits and in range, exactly one root and no cycles. Multiword-token ranges (`3-4`) and
empty nodes (`5.1`) are dropped, as UD defines the syntactic words to be the integer-ID lines.
"""

import dataclasses
import pathlib
import re

import conllu
import conllu.exceptions
import conllu.parser

from headspec.errors import UserError
from headspec.io import provenance, textfiles

SPLITS = ("train", "dev", "test")
# HEAD as CoNLL-U writes it: ASCII digits (IDs are read by conllu's own [0-9] patterns, ASCII too).
_ASCII_INTEGER = re.compile(r"-?[0-9]+", re.ASCII)


@dataclasses.dataclass(frozen=True)
class Sentence:
  """One UD sentence, syntactic words only; `heads` are 1-based with 0 for the root."""

  sent_id: str
  words: tuple[str, ...]
  upos: tuple[str, ...]
  xpos: tuple[str, ...]
  heads: tuple[int, ...]
  deprels: tuple[str, ...]


def _raw(line, i):
  return line[i]


# Keep these columns as raw strings: faster (no dict parsing of FEATS/MISC/DEPS), and HEAD gets our
# own integer check with a line number. XPOS stays '_' rather than conllu's None.
_FIELD_PARSERS = {"xpos": _raw, "feats": _raw, "head": _raw, "deps": _raw, "misc": _raw}


def _blocks(text):
  """Yields (first line number, [(line number, line)]) for each blank-line-separated block."""
  block = []
  for lineno, line in enumerate(text.split("\n"), start=1):
    if line.strip():
      block.append((lineno, line.rstrip("\r")))
    elif block:
      yield block[0][0], block
      block = []
  if block:
    yield block[0][0], block


def _parse_block(where, block):
  """conllu's TokenList for one block; a ParseException is pinned to its line."""
  token_lines = [(n, line) for n, line in block if not line.startswith("#")]
  for n, line in token_lines:
    columns = line.count("\t") + 1
    if columns != 10:
      raise UserError(f"{where}:{n}: expected 10 tab-separated columns, found {columns}")
  try:
    return conllu.parse_token_and_metadata(
      "\n".join(line for _, line in block), field_parsers=_FIELD_PARSERS
    ), token_lines
  except conllu.exceptions.ParseException as e:
    for n, line in token_lines:
      try:
        conllu.parser.parse_line(
          line, conllu.parser.DEFAULT_FIELDS, dict(_FIELD_PARSERS, id=conllu.parser.DEFAULT_FIELD_PARSERS["id"])
        )
      except conllu.exceptions.ParseException as line_error:
        raise UserError(f"{where}:{n}: {line_error}") from None
    raise UserError(f"{where}:{block[0][0]}: {e}") from None


def _find_cycle(heads):
  """Returns the 1-based words of a cycle in `heads`, or None. heads[i] is word i+1's head."""
  state = [0] * (len(heads) + 1)  # 0 unseen, 1 on the current path, 2 reaches the root
  state[0] = 2
  for start in range(1, len(heads) + 1):
    path = []
    node = start
    while state[node] == 0:
      state[node] = 1
      path.append(node)
      node = heads[node - 1]
    if state[node] == 1:
      return path[path.index(node) :]
    for n in path:
      state[n] = 2
  return None


def _sentence(where, start, block, index, default_id):
  tokens, token_lines = _parse_block(where, block)
  words, lines = [], []
  for token, (n, _) in zip(tokens, token_lines):
    if isinstance(token["id"], int):
      words.append(token)
      lines.append(n)
  if not words:
    raise UserError(f"{where}:{start}: sentence has no words (only comments, ranges or empty nodes)")
  heads = []
  for i, (token, n) in enumerate(zip(words, lines), start=1):
    if token["id"] != i:
      raise UserError(f"{where}:{n}: word ID {token['id']} out of order (expected {i})")
    if not _ASCII_INTEGER.fullmatch(token["head"] or ""):  # int() also reads '٣', ' 3', '+3' and '3_0'
      raise UserError(f"{where}:{n}: HEAD {token['head']!r} is not an integer (ASCII digits 0-9)")
    head = int(token["head"])
    if not 0 <= head <= len(words):
      raise UserError(f"{where}:{n}: HEAD {head} is out of range (sentence has {len(words)} words)")
    heads.append(head)
  roots = [i for i, h in enumerate(heads, start=1) if h == 0]
  if not roots:
    raise UserError(f"{where}:{start}: sentence has no root (no word with HEAD 0)")
  if len(roots) > 1:
    raise UserError(f"{where}:{lines[roots[1] - 1]}: several roots (words {roots[0]} and {roots[1]} have HEAD 0)")
  cycle = _find_cycle(heads)
  if cycle:
    chain = " -> ".join(str(w) for w in cycle + cycle[:1])
    raise UserError(f"{where}:{lines[cycle[0] - 1]}: HEAD cycle {chain}")
  return Sentence(
    sent_id=tokens.metadata.get("sent_id") or f"{default_id}-{index}",
    words=tuple(t["form"] for t in words),
    upos=tuple(t["upos"] for t in words),
    xpos=tuple(t["xpos"] for t in words),
    heads=tuple(heads),
    deprels=tuple(t["deprel"] for t in words),
  )


def read_conllu(path) -> list[Sentence]:
  """All sentences of one CoNLL-U file (UTF-8, with or without a byte-order mark); any malformed line
  raises UserError naming file:line."""
  path = pathlib.Path(path)
  if not path.is_file():
    raise UserError(f"{path}: no such CoNLL-U file")
  text = textfiles.read_text(path)  # with or without a byte-order mark; not UTF-8: one line naming file:line
  sentences = [
    _sentence(path, start, block, i, path.stem)
    for i, (start, block) in enumerate(_blocks(text), start=1)
    if any(not line.startswith("#") for _, line in block)
  ]
  if not sentences:
    raise UserError(f"{path}: no sentences (empty CoNLL-U file)")
  return sentences


def split_path(data_dir, treebank: str, split: str) -> pathlib.Path:
  """data_dir/ud/<treebank>/<treebank>-ud-<split>.conllu, the UD release naming."""
  if split not in SPLITS:
    raise UserError(f"unknown split {split!r} for treebank {treebank!r} (expected one of {', '.join(SPLITS)})")
  return pathlib.Path(data_dir) / "ud" / treebank / f"{treebank}-ud-{split}.conllu"


def available_splits(data_dir, treebank: str) -> list[str]:
  """The splits of `treebank` present under data_dir, in train, dev, test order."""
  folder = pathlib.Path(data_dir) / "ud" / treebank
  if not folder.is_dir():
    raise UserError(f"no treebank folder {folder} (get it with `headspec data download ud {treebank}`)")
  return [s for s in SPLITS if split_path(data_dir, treebank, s).is_file()]


def load_split(data_dir, treebank: str, split: str) -> list[Sentence]:
  """Reads data_dir/ud/<treebank>/<treebank>-ud-<split>.conllu."""
  path = split_path(data_dir, treebank, split)
  present = available_splits(data_dir, treebank)
  if split not in present:
    raise UserError(f"{path} not found (splits present for {treebank}: {', '.join(present) or 'none'})")
  provenance.note_read(path)
  return read_conllu(path)
