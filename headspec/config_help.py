"""`headspec <command> --help`: a command's config keys, their defaults and one-line meanings.

Keys and defaults come from the command's default config (headspec/cli.py DEFAULTS); meanings from the
comments beside each key where the default config function declares it (`c.probe.tol = 1e-5  # ...`, a
comment line just above, or indented comment lines just below), read with `ast` and `tokenize`, so each
key is documented once, in its defaults file.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import io
import textwrap
import tokenize


def flat_items(config, prefix: str = "") -> list[tuple[str, object]]:
  """(dotted key, value) of every leaf of a ConfigDict, in declaration order."""
  items = []
  for key, value in config.items():
    if hasattr(value, "items"):
      items += flat_items(value, f"{prefix}{key}.")
    else:
      items.append((prefix + key, value))
  return items


def meanings(function) -> dict[str, str]:
  """{dotted key: meaning} from the comments in the source of `function` (a default-config factory),
  following `c.x.y = other_factory()` into that factory (same module or imported)."""
  lines, _ = inspect.getsourcelines(function)
  source = textwrap.dedent("".join(lines))
  comments = {}  # line -> (comment text, whether the line is only a comment)
  for tok in tokenize.generate_tokens(io.StringIO(source).readline):
    if tok.type == tokenize.COMMENT:
      comments[tok.start[0]] = (tok.string[1:], not tok.line[: tok.start[1]].strip())
  out = {}
  for node in sorted(ast.walk(ast.parse(source)), key=lambda n: getattr(n, "lineno", 0)):
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
      continue
    key = _dotted(node.targets[0])
    if key is None:
      continue
    if isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name):
      factory = inspect.getmodule(function).__dict__.get(node.value.func.id)
      if callable(factory) and factory.__name__ != "ConfigDict":
        out.update({f"{key}.{k}": v for k, v in meanings(factory).items()})
    text = _comment_of(node, comments)
    if text:
      out[key] = text
  return out


def _dotted(target) -> str | None:
  """'probe.tol' for `c.probe.tol` (the root variable dropped); None for anything else."""
  names = []
  while isinstance(target, ast.Attribute):
    names.append(target.attr)
    target = target.value
  return ".".join(reversed(names)) if names and isinstance(target, ast.Name) else None


def _comment_of(node, comments) -> str:
  """The comments on the statement's lines and the indented comment lines after it; else the
  comment lines just above it."""
  parts = [comments[i][0] for i in range(node.lineno, node.end_lineno + 1) if i in comments]
  line = node.end_lineno + 1
  while line in comments and comments[line][1] and comments[line][0].startswith("  "):
    parts.append(comments[line][0].strip().lstrip("^").strip())  # a continuation, or a `^ note` under the value
    line += 1
  if not parts:
    line = node.lineno - 1
    while line in comments and comments[line][1]:
      parts.insert(0, comments[line][0])
      line -= 1
  return " ".join(p.strip() for p in parts if p.strip())


def describe(factory_spec: str) -> list[tuple[str, str, str]]:
  """(key, default as Python writes it, meaning) of every key of the config `module:function` makes."""
  module, name = factory_spec.split(":")
  function = getattr(importlib.import_module(module), name)
  meaning = meanings(function)
  return [(key, repr(value), meaning.get(key, "")) for key, value in flat_items(function())]


def help_text(command: str, factory_spec: str, summary: str) -> str:
  """The text `headspec COMMAND --help` prints."""
  from headspec import configs

  rows = describe(factory_spec)
  width = min(48, max(len(f"{k} = {v}") for k, v, _ in rows))
  keys = [f"  {f'{k} = {v}':<{width}}  {m}".rstrip() for k, v, m in rows]
  return "\n".join(
    [
      f"usage: headspec {command} --config=NAME[:ARG] --workdir=DIR [--config.KEY=VALUE ...]",
      summary,
      f"--config: a packaged config by name ({', '.join(configs.names())}) or a config file FILE.py[:ARG]",
      f"config keys (--config.KEY=VALUE), their defaults ({factory_spec.replace(':', '.')}) and meanings:",
      *keys,
    ]
  )
