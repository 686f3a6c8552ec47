"""A run's per-head tables read and checked against its layer × head grid (`RunData`), and what the readers
(head_data.py, sae_data.py, circuit_data.py) fill for the page: its metrics, the heads' cards and the notes beside
the grid. Pure Python: no JAX.

The grid's shape is the run's (config.json: model.num_layers × model.num_heads); without one (a folder of
a pretrained model's analyses) it is the largest layer and head in the tables, up to tables.MAX_GRID. Rows
outside the grid, or whose cells are not what the table's contract says, are left out with one warning per
file on stderr: the page is still written.

Metric ids are shared across runs so `--compare` can show the same metric side by side: the run's own
model (its primary model) has plain ids, its random-weights control (`<model>-random`) gets the suffix
`@random`, any other model `@<name>` (`RunData.suffix`).
"""

from __future__ import annotations

import collections
import math
import sys

from etils import epath

from headspec.io import tables

# Per-head tables the atlas draws (the others are per-run curves, drawn by analysis/ scripts).
HEAD_TABLES = (
  tables.PROBES,
  tables.MDL,
  tables.DIVERSITY,
  tables.ABLATION_HEADS,
  tables.ABLATION_GATES,
  tables.ABLATION_INTERACTIONS,
  tables.CLARK,
  tables.ROLES,
  tables.LABELS,
  tables.PROBE_STRUCTURAL,
  tables.PATCHING,
  tables.SAE_HEADS,
  tables.SAE_FEATURES,
  tables.CIRCUIT_EDGES,
)
# headspec/patching/edges.py: what an edge enters (JAX-free copy); a circuit edge into anything else is a bad row.
EDGE_INPUTS = ("q", "k", "v", "mlp", "logits")
# tables.MAX_GRID, the largest grid inferred from tables alone (no config.json): above any published model
# (Llama 3 405B: 126 layers × 128 heads), far below what a stray row (layer=100000) would allocate.
# The layer and head columns of each per-head table, with their smallest value: -1 marks the embedding
# output / residual stream (probes, mdl), a per-head metric (diversity head_j), a per-λ row (gates), a site
# without heads (sae top_head) or a node that is no head (circuit: the embeddings, MLPs, logits). A pair
# (smallest, past) lets the column go `past` beyond the grid's last: the logits are circuit layer L.
_GRID_COLUMNS = {
  tables.PROBES.path: {"layer": -1, "head": -1},
  tables.MDL.path: {"layer": -1, "head": -1},
  tables.DIVERSITY.path: {"layer": 0, "head_i": 0, "head_j": -1},
  tables.ABLATION_HEADS.path: {"layer": 0, "head": 0},
  tables.ABLATION_GATES.path: {"layer": -1, "head": -1},
  tables.ABLATION_INTERACTIONS.path: {"layer_a": 0, "head_a": 0, "layer_b": 0, "head_b": 0},
  tables.CLARK.path: {"layer": 0, "head": 0},
  tables.ROLES.path: {"layer": 0, "head": 0},
  tables.LABELS.path: {"layer": 0, "head": 0},
  tables.PROBE_STRUCTURAL.path: {"layer": -1, "head": -1},
  tables.PATCHING.path: {"layer": 0, "head": -1},
  tables.SAE_HEADS.path: {"layer": 0, "head": 0},
  tables.SAE_FEATURES.path: {"layer": 0, "top_head": -1},
  tables.SAE_METRICS.path: {"layer": 0},
  tables.SAE_CONTEXTS.path: {"layer": 0},
  tables.SAE_LABELS.path: {"layer": 0},
  tables.SAE_HISTOGRAMS.path: {"layer": 0},
  tables.SAE_SHARES.path: {"layer": 0, "head": 0},
  tables.SAE_LOGITS.path: {"layer": 0},
  tables.CIRCUIT_EDGES.path: {
    "upstream_layer": -1,
    "upstream_head": -1,
    "downstream_layer": (0, 1),
    "downstream_head": -1,
  },
}

_DIVERGING = {"selectivity", "loss_delta", "accuracy_delta", "interaction"}


def warn(message: str) -> None:
  """One line on stderr for something the page leaves out (the page is still written)."""
  print(f"headspec: warning: {message}", file=sys.stderr, flush=True)


def _int(value) -> int | None:
  """A CSV cell or JSON value as an int; None for anything else (1.5, 'x', '', true)."""
  if isinstance(value, bool):
    return None
  if isinstance(value, float):
    return int(value) if value.is_integer() else None
  try:
    return int(value)
  except (TypeError, ValueError):
    return None


def num(value: str):
  """A CSV cell as a JSON number; NaN and empty cells as None (JSON has no NaN)."""
  try:
    x = float(value)
  except (TypeError, ValueError):
    return None
  return x if math.isfinite(x) else None


def _bounds(table: tables.Table, column: str) -> tuple[int, int, int]:
  """(axis, smallest, past) of a grid column of `table` (`_GRID_COLUMNS`): axis 0 for layers, 1 for heads."""
  spec = _GRID_COLUMNS[table.path][column]
  low, past = spec if isinstance(spec, tuple) else (spec, 0)
  return (0 if "layer" in column else 1), low, past


def feature_heads(cell: str) -> list[int] | None:
  """sae/features.csv's `heads` cell ('2;0', '' for none) as head numbers; None if it is not that."""
  try:
    return [int(h) for h in cell.split(";")] if cell else []
  except ValueError:
    return None


def short_split(split: str) -> str:
  return split.rsplit("/", 1)[-1]


class _Metric:
  """One colourable quantity: value (and CI, notes) per (step, layer, head)."""

  def __init__(
    self, mid: str, group: str, label: str, description: str, *, diverging=False, categorical=False, integer=False
  ):
    self.spec = {
      "id": mid,
      "group": group,
      "label": label,
      "description": description,
      "diverging": diverging or any(k in mid for k in _DIVERGING),
      "categorical": categorical,
      "integer": integer,  # a count: written without decimals
    }
    self.cells: dict[int, dict[tuple[int, int], dict]] = collections.defaultdict(dict)

  def set(self, step: int, layer: int, head: int, value, ci=None, note: str = "") -> None:
    cell = {"v": value}
    if ci is not None and ci[0] is not None and ci[1] is not None:
      cell["ci"] = list(ci)
    if note:
      cell["note"] = note
    self.cells[step][(layer, head)] = cell

  def to_json(self, num_layers: int, num_heads: int) -> dict:
    steps = sorted(self.cells)
    grids = {}
    for step in steps:
      grid = [[None] * num_heads for _ in range(num_layers)]
      for (layer, head), cell in self.cells[step].items():
        grid[layer][head] = cell
      grids[str(step)] = grid
    return dict(self.spec, steps=steps, grids=grids)


class RunData:
  """One run's per-head tables, their rows checked against its grid, and the page's parts the readers fill:
  `metrics` (id -> metric), `extras` (a head's card) and `layer_notes` (the residual stream, the embeddings)."""

  def __init__(self, workdir: epath.Path, pages: bool = False, quiet: bool = False):
    self.workdir = workdir
    self.pages = pages  # link the SAE features on the cards to their pages (written for the page's own run)
    self.quiet = quiet  # leave bad rows out without a warning (a second reader of the same tables)
    self.rows = {t.path: tables.read(tables.path_of(workdir, t), t) for t in HEAD_TABLES}
    self.shape, self.source = self._grid_shape()
    self.rows = {t.path: self._in_grid(t, self.source) for t in HEAD_TABLES}
    self.primary = self._primary_model()
    self.metrics: dict[str, _Metric] = {}
    self.extras: dict[str, dict] = {}  # "layer,head" -> {role, relations, interactions, images}
    self.layer_notes: dict[str, dict] = {}  # metric id -> {"residual": {step: [L]}, "embedding": {step: x}}

  def _grid_shape(self) -> tuple[tuple[int, int], str]:
    """(layers, heads) of the run's config.json; without one, 1 + the largest layer and head of the tables
    the grid colours (at most tables.MAX_GRID). Also says where the shape comes from, for warnings."""
    shape = tables.grid_shape(self.workdir)
    if shape is not None:
      return shape, str(self.workdir / "config.json")
    most = [0, 0]
    for table in (t for t in HEAD_TABLES if t is not tables.ABLATION_INTERACTIONS):  # the tables the grid colours
      for r in self.rows[table.path]:
        for column in _GRID_COLUMNS[table.path]:
          axis, _, past = _bounds(table, column)
          value = _int(r[column])
          if value is not None and value - past < tables.MAX_GRID[axis]:
            most[axis] = max(most[axis], value + 1 - past)
    return (max(most[0], 1), max(most[1], 1)), "the tables (no config.json)"

  def _in_grid(self, table: tables.Table, source: str, rows: list[dict] | None = None) -> list[dict]:
    """The rows of `table` (read by __init__, or `rows`) whose integer columns hold integers, whose layers
    and heads lie in the grid and whose cells the atlas reads are what the contract says; the others are
    left out with one warning naming the table's file, its first such line and why."""
    kept, bad, why = [], 0, ""
    for line, r in enumerate(self.rows[table.path] if rows is None else rows, start=2):  # line 1 is the header
      wrong = [f"{c}={r[c]!r} is not an integer" for c in table.int_columns if _int(r[c]) is None]
      for c in _GRID_COLUMNS[table.path]:
        axis, low, past = _bounds(table, c)
        if not wrong and not low <= int(r[c]) < self.shape[axis] + past:
          wrong.append(f"{c}={r[c]} is outside the {self.shape[axis]} {('layers', 'heads')[axis]} of {source}")
      if not wrong:
        wrong = self._cells(table, r, source)
      if not wrong:
        kept.append(r)
        continue
      bad += 1
      why = why or f"{tables.path_of(self.workdir, table)}:{line}: {wrong[0]}"
    if bad and not self.quiet:
      warn(f"{why}; left out {bad} row(s) of this table")
    return kept

  def _cells(self, table: tables.Table, r: dict, source: str) -> list[str]:
    """What is wrong with the text cells of row `r` that the atlas reads (sae/features.csv's `heads`, a
    circuit edge's `input`); [] for a good row or another table."""
    if table is tables.SAE_FEATURES:
      heads = feature_heads(r["heads"])
      if heads is None:
        return [f"heads={r['heads']!r} is not ';'-separated head numbers"]
      if any(not 0 <= h < self.shape[1] for h in heads):
        return [f"heads={r['heads']!r} names a head outside the {self.shape[1]} heads of {source}"]
    if table is tables.CIRCUIT_EDGES and r["input"] not in EDGE_INPUTS:
      return [f"input={r['input']!r} is not one of {', '.join(EDGE_INPUTS)}"]
    return []

  def aux(self, table: tables.Table) -> list[dict]:
    """A table read beside the per-head ones (sae/metrics.csv, contexts.csv, labels.csv), checked as they are."""
    return self._in_grid(table, self.source, tables.read(tables.path_of(self.workdir, table), table))

  def _primary_model(self) -> str:
    counts = collections.Counter(
      r["model"] for rows in self.rows.values() for r in rows if "model" in r and not r["model"].endswith("-random")
    )
    return counts.most_common(1)[0][0] if counts else self.workdir.name

  def suffix(self, model: str) -> str:
    if model == self.primary:
      return ""
    if model == f"{self.primary}-random":
      return "@random"
    return f"@{model}"

  def model_label(self, model: str) -> str:
    suffix = self.suffix(model)
    return "" if not suffix else " — random-weights control" if suffix == "@random" else f" — model {model}"

  def metric(self, mid: str, group: str, label: str, description: str, **kw) -> _Metric:
    if mid not in self.metrics:
      self.metrics[mid] = _Metric(mid, group, label, description, **kw)
    return self.metrics[mid]

  def extra(self, layer: int, head: int) -> dict:
    return self.extras.setdefault(f"{layer},{head}", {})

  def layer_note(self, m: _Metric, step: int, layer: int, value) -> None:
    """A value of the embedding output (layer −1) or of layer `layer`'s residual stream: beside the grid."""
    notes = self.layer_notes.setdefault(m.spec["id"], {"residual": {}, "embedding": {}})
    if layer < 0:
      notes["embedding"][str(step)] = value
    else:
      notes["residual"].setdefault(str(step), {})[str(layer)] = value
