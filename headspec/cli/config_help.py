"""`headspec <command> --help`: a command's config keys, their defaults and one-line meanings.

Keys and defaults come from the command's default config (its entry of headspec/cli/commands.py COMMANDS); meanings from the
comments beside each key where the default config function declares it (`c.probe.tol = 1e-5  # ...`, a
comment line just above, or indented comment lines just below), read with `ast` and `tokenize`, so each
key is documented once, in its defaults file.

List-valued keys follow one rule on the command line (`normalize_lists`): a comma text `a,b` or a
tuple/list literal `(a, b)` / `[a, b]`, one item as `a`, none as `()` or an empty value. A key is
list-valued when its default is a tuple or list, or a text whose default holds a comma or whose meaning
says "comma-separated" (`sites`, `methods`, `steps`); each keeps its default's form, so the analyses
read what they always read. `override_problem` names a mistyped `--config.KEY` in one plain line.
"""

from __future__ import annotations

import ast
import difflib
import importlib
import inspect
import io
import numbers
import textwrap
import tokenize

from headspec.errors import UserError


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
  following `c.x.y = other_factory()` into that factory (same module or imported), or into the dataclass its
  `fields_of` names (each field's comment: ModelConfig's for the `model` section), and `adder(c, ...)` into the
  function that adds keys to the config (headspec/runs/target_config.py)."""
  lines, _ = inspect.getsourcelines(function)
  source = textwrap.dedent("".join(lines))
  comments = {}  # line -> (comment text, whether the line is only a comment)
  for tok in tokenize.generate_tokens(io.StringIO(source).readline):
    if tok.type == tokenize.COMMENT:
      comments[tok.start[0]] = (tok.string[1:], not tok.line[: tok.start[1]].strip())
  out = {}
  for node in sorted(ast.walk(ast.parse(source)), key=lambda n: getattr(n, "lineno", 0)):
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name):
      adder = inspect.getmodule(function).__dict__.get(node.value.func.id)  # `add_target_keys(c)`: keys it adds
      if inspect.isfunction(adder):
        out.update(meanings(adder))
      continue
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):  # a dataclass field
      if text := _comment_of(node, comments):
        out[node.target.id] = text
      continue
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
      continue
    key = _dotted(node.targets[0])
    if key is None:
      continue
    if isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name):
      factory = inspect.getmodule(function).__dict__.get(node.value.func.id)
      if callable(factory) and factory.__name__ != "ConfigDict":
        source = getattr(factory, "fields_of", factory)  # a section made from a dataclass: its fields' comments
        out.update({f"{key}.{k}": v for k, v in meanings(source).items()})
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
      f"list-valued keys ({', '.join(list_keys(factory_spec))}): a comma text a,b or a literal (a, b); "
      "one item as a, none as ()",
    ]
  )


# ------------------------------------------------------------------------------------ list-valued keys


def _defaults(factory_spec):
  module, name = factory_spec.split(":")
  function = getattr(importlib.import_module(module), name)
  return function, function()


def list_keys(factory_spec: str) -> dict[str, str]:
  """{dotted key: 'tuple' | 'text'} of the list-valued keys of a command's default config (module
  docstring): 'tuple' keys hold a tuple or list, 'text' keys a comma-separated text."""
  function, defaults = _defaults(factory_spec)
  meaning = meanings(function)
  out = {}
  for key, value in flat_items(defaults):
    if isinstance(value, tuple | list):
      out[key] = "tuple"
    elif isinstance(value, str) and ("," in value or "comma-separated" in meaning.get(key, "")):
      out[key] = "text"
  return out


def _items(value) -> list:
  """The items of a list-valued key's value: a comma text split (a tuple or list literal read as one),
  a tuple's comma texts split too (how ml_collections passes `--config.k=a,b` to a tuple key: ('a,b',))."""
  if isinstance(value, str):
    text = value.strip()
    if text[:1] in "([" and text[-1:] in ")]":
      try:
        value = ast.literal_eval(text)
      except (SyntaxError, ValueError):
        value = text[1:-1]
    if isinstance(value, str):
      return [item.strip() for item in value.split(",") if item.strip()]
  if not isinstance(value, tuple | list):
    return [value]
  items = []
  for item in value:
    items += _items(item) if isinstance(item, str) else [item]
  return items


def _number(item, key: str, where) -> numbers.Number:
  if isinstance(item, numbers.Number) and not isinstance(item, bool):
    return item
  try:
    number = ast.literal_eval(str(item))
  except (SyntaxError, ValueError):
    number = None
  if not isinstance(number, numbers.Number) or isinstance(number, bool):
    raise UserError(f"{where}: {key}: {item} is not a number (give numbers as a comma text, e.g. 1e-4,1e-3)")
  return number


def normalize_lists(config, factory_spec: str, where="--config") -> None:
  """Every list-valued key of `config` (those of `list_keys`) in its default's form, whichever spelling
  it was given in: a tuple key gets a tuple (numbers where its default holds numbers), a text key the
  comma text `a,b`. A non-number given to a key of numbers is a UserError naming `where` and the key."""
  _, defaults = _defaults(factory_spec)
  for key, kind in list_keys(factory_spec).items():
    *parents, leaf = key.split(".")
    section, default = config, defaults
    for part in parents:
      section, default = section[part], default[part]
    if leaf not in section:
      continue
    value, items = section[leaf], _items(section[leaf])
    if kind == "text":
      section[leaf] = ",".join(str(item) for item in items)
      continue
    numeric = default[leaf] and all(isinstance(v, numbers.Number) for v in default[leaf])
    if numeric:
      items = [_number(item, key, where) for item in items]
    section[leaf] = type(value)(items) if isinstance(value, tuple | list) else tuple(items)


def override_problem(config, overrides: list[str], where) -> str | None:
  """The one line for the first `--config.KEY=VALUE` of `overrides` whose KEY is not a key of `config`
  (the config file as loaded, before overrides), naming the file and the close matches; None when every
  KEY exists (the value is what is wrong)."""
  for override in overrides:
    key = override.split("=", 1)[0].removeprefix("--config.")
    section, walked = config, []
    for part in key.split("."):
      if not hasattr(section, "keys"):
        return f"{override}: {'.'.join(walked)} is a value ({type(section).__name__}), not a section, in {where}"
      if part not in section:
        prefix = ".".join(walked) + "." if walked else ""
        close = difflib.get_close_matches(part, [str(k) for k in section.keys()], n=3)
        hint = f"; did you mean {' or '.join(prefix + c for c in close)}?" if close else ""
        return f"--config.{key}: no config key {prefix}{part} in {where}{hint}"
      section = section[part]
      walked.append(part)
  return None
