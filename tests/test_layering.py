"""The package's layers, read from the source with `ast` (no import runs, no JAX).

The analyses (probing/, diversity/, ablation/, attention/, patching/, atlas/, sae/) sit side by side on one
shared layer (objectives, alignment, resampling, evaluation text, head utilities, tables, targets, the data
layer, ...): none imports another, except the links in ALLOWED, which are research rather than plumbing. The
trainer, below the analyses too, imports only the one link of TRAINER_ALLOWED. And module-level imports
among headspec's modules form no cycle.
"""

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "headspec"
ANALYSES = ("probing", "diversity", "ablation", "attention", "patching", "atlas", "sae")
# (importing analysis, imported module), exactly: the causal probe test fits probing's probes, on probing's
# registered label tasks, labelled under the probe stage's config, with its subsampler; the induction causal
# check runs ablation's causal test (the same test, on induction heads).
ALLOWED = {
  ("ablation", "headspec.probing.probe"),
  ("ablation", "headspec.probing.tasks"),
  ("ablation", "headspec.probing.stats"),
  ("ablation", "headspec.probing.config"),
  ("attention", "headspec.ablation.causal"),
}
# The trainer's one link to an analysis: it logs the head-diversity metrics while training (train.diversity_every)
# with diversity's own code, so they are the numbers `headspec diversity` writes.
TRAINER_ALLOWED = {"headspec.diversity.metrics"}
# The shared layer: below every analysis, so it imports none.
SHARED = (
  "model.objectives", "model.heads", "model.edits", "words", "runs.evaltext", "runs.targets", "train.regularizers",
  "io", "data",
)  # fmt: skip


def _modules() -> dict[str, pathlib.Path]:
  """{dotted module name: file} of every module of headspec/."""
  found = {}
  for path in sorted(PACKAGE.rglob("*.py")):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  return found


MODULES = _modules()


def _imports(name: str, *, module_level: bool) -> set[str]:
  """The headspec modules `name` imports (`from a import b` counts as a.b when that is a module, else a).

  module_level: only statements run on import (not inside functions, nor under `if TYPE_CHECKING`).
  """
  path = MODULES[name]
  package = name if path.name == "__init__.py" else name.rpartition(".")[0]
  tree = ast.parse(path.read_text(), str(path))
  nodes = []

  def visit(node, top: bool):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, ast.Import | ast.ImportFrom) and (top or not module_level):
        nodes.append(child)
      inner = top and not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda)
      if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
        inner = False
      visit(child, inner)

  visit(tree, True)
  out = set()
  for node in nodes:
    if isinstance(node, ast.Import):
      bases = [alias.name for alias in node.names]
    else:
      base = node.module or ""
      if node.level:
        base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else []))
      bases = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
    out.update(b for b in bases if b in MODULES and b != name)
  return out


def _analysis(module: str) -> str | None:
  parts = module.split(".")
  return parts[1] if len(parts) > 1 and parts[1] in ANALYSES else None


def test_modules_found():
  assert {f"headspec.{a}" for a in ANALYSES} <= set(MODULES)
  assert all(f"headspec.{s}" in MODULES for s in SHARED)


@pytest.mark.parametrize("analysis", ANALYSES)
def test_no_analysis_imports_another(analysis):
  crossing = sorted(
    f"{name} imports {imported}"
    for name in MODULES
    if _analysis(name) == analysis
    for imported in _imports(name, module_level=False)
    if _analysis(imported) not in (None, analysis) and (analysis, imported) not in ALLOWED
  )
  assert not crossing, "\n".join(crossing)


def test_the_allowed_links_are_exactly_the_ones_there():
  """ALLOWED lists links that exist: one no longer needed is taken off the list, not left to allow it again."""
  links = {
    (_analysis(name), imported)
    for name in MODULES
    if _analysis(name)
    for imported in _imports(name, module_level=False)
    if _analysis(imported) not in (None, _analysis(name))
  }
  assert links == ALLOWED
  assert {m for m in _imports("headspec.train.loop", module_level=False) if _analysis(m)} == TRAINER_ALLOWED


def _shared(name: str) -> bool:
  return any(name == f"headspec.{s}" or name.startswith(f"headspec.{s}.") for s in SHARED)


def test_shared_layer_imports_no_analysis():
  upward = sorted(
    f"{name} imports {imported}"
    for name in MODULES
    if _shared(name)
    for imported in _imports(name, module_level=False)
    if _analysis(imported)
  )
  assert not upward, "\n".join(upward)


def test_the_trainer_imports_no_analysis_but_its_one_link():
  """train.py takes its token helpers (special ids, the opening token) from the data layer, not from an analysis."""
  upward = sorted(
    m for m in _imports("headspec.train.loop", module_level=False) if _analysis(m) and m not in TRAINER_ALLOWED
  )
  assert not upward, upward


def test_token_cross_entropy_is_written_once():
  """headspec/model/objectives.py token_nll is the one token loss: no other module computes softmax cross-entropy
  itself (training, evaluation, ablation, in-context learning and patching's 'loss' all call it)."""
  writers = sorted(
    name
    for name, path in MODULES.items()
    if "softmax_cross_entropy" in path.read_text() and name != "headspec.model.objectives"
  )
  assert not writers, writers


def test_analyses_do_not_import_the_trainer():
  """Scoring a model needs its objective (headspec.model.objectives), not the training loop."""
  training = sorted(
    f"{name} imports headspec.train.loop"
    for name in MODULES
    if _analysis(name) and "headspec.train.loop" in _imports(name, module_level=False)
  )
  assert not training, "\n".join(training)


def test_no_import_cycle():
  """No circle in the import graph, imports inside functions included (a lazy import still ties the two
  modules: neither can be understood, moved or tested without the other)."""
  graph = {name: _imports(name, module_level=False) for name in MODULES}
  state, cycles = {}, []

  def visit(node, stack):
    state[node] = "open"
    stack.append(node)
    for nxt in sorted(graph[node]):
      if state.get(nxt) == "open":
        cycles.append(" -> ".join(stack[stack.index(nxt) :] + [nxt]))
      elif nxt not in state:
        visit(nxt, stack)
    stack.pop()
    state[node] = "done"

  for name in sorted(graph):
    if name not in state:
      visit(name, [])
  assert not cycles, "\n".join(cycles)


LAUNCHER = sorted(m for m in MODULES if m == "headspec.launch" or m.startswith("headspec.launch."))


def test_launcher_is_a_package_of_modules():
  assert {"headspec.launch.args", "headspec.launch.plan", "headspec.launch.tpu"} <= set(LAUNCHER)


def test_launcher_and_experiments_do_not_import_the_cli():
  """cli -> launch -> experiments, and not back (even inside a function): a stage runs the CLI through its
  own entry point, headspec/cli/stage.py."""
  back = sorted(
    f"{name} imports headspec.cli.main"
    for name in (*LAUNCHER, "headspec.launch.experiments", "headspec.launch.sweeps")
    if "headspec.cli.main" in _imports(name, module_level=False)
  )
  assert not back, "\n".join(back)


def test_no_circle_cli_launch_cli():
  """Nothing the launcher reaches, through any chain of imports (inside functions too), imports the CLI: no
  circle cli -> launch -> experiments -> cli."""
  reached, todo = set(), list(LAUNCHER)
  while todo:
    name = todo.pop()
    if name not in reached:
      reached.add(name)
      todo += _imports(name, module_level=False)
  assert "headspec.launch.experiments" in reached and "headspec.cli.main" not in reached, sorted(reached)


def test_the_lbfgs_engine_and_the_device_fan_out_know_nothing_of_probes():
  """probing/lbfgs.py is a general batched L-BFGS engine (a loss, batched parameters) and probing/fanout.py
  a general split of groups over devices: neither imports any headspec module (inside functions too)."""
  assert _imports("headspec.probing.lbfgs", module_level=False) == set()
  assert _imports("headspec.probing.fanout", module_level=False) == set()


def test_the_io_layer_stands_on_errors_alone():
  """headspec/io (paths, tables, locks, metrics.jsonl, provenance: no JAX) imports nothing of headspec but
  itself and headspec.errors, inside functions too: every layer above may read and write through it."""
  io_modules = [m for m in MODULES if m == "headspec.io" or m.startswith("headspec.io.")]
  assert {"headspec.io.tables", "headspec.io.remote", "headspec.io.locks"} <= set(io_modules)
  upward = sorted(
    f"{name} imports {imported}"
    for name in io_modules
    for imported in _imports(name, module_level=False)
    if not (imported == "headspec.errors" or imported.startswith("headspec.io"))
  )
  assert not upward, "\n".join(upward)


ARCHITECTURE = PACKAGE.parent / "docs" / "architecture.md"
BASE = {"headspec", "headspec.errors", "headspec.arguments", "headspec.bounds"}


def layer_table() -> dict[str, set[str]]:
  """docs/architecture.md's layer table: package -> the packages (or modules) it names under "may import"."""
  text = ARCHITECTURE.read_text()
  rows = text[text.index("<!-- layers:") :].split("\n\n")[0].splitlines()[3:]
  table = {}
  for row in rows:
    cells = [c.strip() for c in row.strip("|").split("|")]
    table[cells[0].strip("`")] = {name.strip().strip("`") for name in cells[2].split(",") if name.strip()}
  return table


def _allowed(table: dict[str, set[str]], package: str) -> set[str]:
  """What `package` may import: its row's names and, through each, what that one may (a module named, as
  `cli.commands`, is allowed alone)."""
  out, todo = set(), list(table[package])
  while todo:
    name = todo.pop()
    if name not in out:
      out.add(name)
      todo += table.get(name, set())
  return out


def test_every_import_follows_the_layer_table():
  """Each module of a package imports (inside functions too) only its own package, the base modules, and
  what its package's row of docs/architecture.md allows; every package has its row."""
  table = layer_table()
  packages = {name.split(".")[1] for name in MODULES if name.count(".") >= 2}
  assert packages <= set(table), f"no row in docs/architecture.md for {sorted(packages - set(table))}"
  wrong = []
  for name in sorted(MODULES):
    if name.count(".") < 2:
      continue
    package = name.split(".")[1]
    allowed = _allowed(table, package)
    for imported in _imports(name, module_level=False):
      if imported in BASE or imported.split(".")[1] == package:
        continue
      if not any(imported == f"headspec.{a}" or imported.startswith(f"headspec.{a}.") for a in allowed):
        wrong.append(f"{name} imports {imported}")
  assert not wrong, "\n".join(wrong)


def test_the_top_of_the_package_is_the_public_face_and_the_base():
  """At most six modules at headspec/'s top: the lazy public names, `python -m headspec`, and the base."""
  top = sorted(p.name for p in PACKAGE.glob("*.py"))
  assert top == ["__init__.py", "__main__.py", "arguments.py", "bounds.py", "errors.py"], top


def test_one_lock_implementation():
  """Every lock of a file (a table's writer lock, a stage's, a shared folder's) goes through
  headspec/io/locks.py: no other module calls fcntl.flock itself."""
  flockers = sorted(name for name, path in MODULES.items() if "fcntl.flock(" in path.read_text())
  assert flockers == ["headspec.io.locks"], flockers
