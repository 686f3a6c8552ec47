"""Tidy results tables: every CSV an analysis writes, its columns, and one way to read, merge and write it.

Every analysis (probe, diversity, ablate, attention) writes its rows through `merge`: rows of the
(model, step) — or whatever `Table.key` names — that were just computed replace the rows with the same
key, every other row is kept, and the file is replaced atomically (written beside, then renamed), so
an interrupted run never leaves a half-written table and re-running one step keeps the others. The
columns of every table are the contracts in docs/outputs.md; a file with other columns is refused with
one line rather than overwritten.

No JAX here: the figures, the atlas, analysis/ scripts and `headspec.read_table` read tables with only
the standard library (and pandas for DataFrames).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import os

from etils import epath

from headspec.errors import UserError


@dataclasses.dataclass(frozen=True)
class Table:
  """A results table: its path under the run directory, its columns in order, and the key columns whose
  values identify the rows one analysis job writes (re-running that job replaces exactly those rows).

  `float_format`: how floats are written ('.6f' for accuracies and CIs, 'r' for the shortest exact repr).
  `int_columns` / `float_columns`: dtypes for DataFrames (every other column is a string).
  """

  path: str
  columns: tuple[str, ...]
  key: tuple[str, ...]
  int_columns: tuple[str, ...] = ()
  float_columns: tuple[str, ...] = ()
  float_format: str = ".6f"


def _table(path, columns: str, key: str, ints: str = "", floats: str = "", float_format=".6f") -> Table:
  split = lambda s: tuple(c for c in s.split(",") if c)
  return Table(path, split(columns), split(key), split(ints), split(floats), float_format)


# The contracts (docs/outputs.md says what each value means).
PROBES = _table(
  "probes/results.csv",
  "model,step,task,layer,head,split,accuracy,ci_low,ci_high,control_accuracy,selectivity,n",
  "model,step",
  ints="step,layer,head,n",
  floats="accuracy,ci_low,ci_high,control_accuracy,selectivity",
)
PROBE_SELECTIVITY = _table(
  "probes/selectivity.csv",
  "model,step,task,layer,head,split,selectivity,selectivity_ci_low,selectivity_ci_high,"
  "dev_rank,delta_next,delta_next_ci_low,delta_next_ci_high,n",
  "model,step",
  ints="step,layer,head,dev_rank,n",
  floats="selectivity,selectivity_ci_low,selectivity_ci_high,delta_next,delta_next_ci_low,delta_next_ci_high",
)
PROBE_FITS = _table(
  "probes/fits.csv",
  "model,step,task,layer,head,probe,l2,train_objective,iterations,converged,start,train_accuracy,dev_accuracy,dev_loss",
  "model,step",
  ints="step,layer,head,iterations,converged",
  floats="l2,train_objective,train_accuracy,dev_accuracy,dev_loss",
  float_format="r",
)
PROBE_BASELINES = _table("probes/baselines.csv", "task,split,baseline,accuracy,n", "task,split", "n", "accuracy")
MDL = _table(
  "probes/mdl.csv",
  "model,step,task,layer,head,codelength_bits,uniform_bits,compression,control_codelength_bits,control_compression,n",
  "model,step",
  ints="step,layer,head,n",
  floats="codelength_bits,uniform_bits,compression,control_codelength_bits,control_compression",
)
COMPLEXITY = _table(
  "probes/complexity.csv",
  "model,step,task,layer,head,split,l2,accuracy,control_accuracy,selectivity,n",
  "model,step",
  ints="step,layer,head,n",
  floats="l2,accuracy,control_accuracy,selectivity",
  float_format="r",
)
DIVERSITY = _table(
  "diversity/results.csv",
  "step,layer,head_i,head_j,metric,value",
  "step",
  ints="step,layer,head_i,head_j",
  floats="value",
  float_format="r",
)
DIVERSITY_METRICS = _table("diversity/metrics.csv", "metric,kind,basis_dependent,doc", "metric", ints="basis_dependent")
ABLATION_HEADS = _table(
  "ablation/heads.csv",
  "model,step,method,layer,head,metric,value,ci_low,ci_high",
  "model,step",
  ints="step,layer,head",
  floats="value,ci_low,ci_high",
)
ABLATION_PRUNING = _table(
  "ablation/pruning.csv",
  "model,step,ranking,seed,heads_pruned,fraction_pruned,metric,value",
  "model,step",
  ints="step,seed,heads_pruned",
  floats="fraction_pruned,value",
)
ABLATION_GATES = _table(
  "ablation/gates.csv",
  "model,step,penalty,layer,head,gate_open_probability,heads_kept,metric,value",
  "model,step",
  ints="step,layer,head,heads_kept",
  floats="penalty,gate_open_probability,value",
)
ABLATION_CAUSAL = _table(
  "ablation/causal.csv",
  "model,step,kind,task,k,selection,seed,metric,value,ci_low,ci_high",
  "model,step",
  ints="step,k,seed",
  floats="value,ci_low,ci_high",
)
ABLATION_INTERACTIONS = _table(
  "ablation/interactions.csv",
  "model,step,metric,layer_a,head_a,layer_b,head_b,joint,sum_of_singles,interaction",
  "model,step",
  ints="step,layer_a,head_a,layer_b,head_b",
  floats="joint,sum_of_singles,interaction",
)
CLARK = _table(
  "attention/clark.csv",
  "model,step,split,relation,direction,layer,head,accuracy,n",
  "model,step",
  ints="step,layer,head,n",
  floats="accuracy",
)
CLARK_BASELINES = _table(
  "attention/clark_baselines.csv",
  "model,step,split,relation,direction,offset,accuracy,n",
  "model,step",
  ints="step,offset,n",
  floats="accuracy",
)
ROLES = _table(
  "attention/roles.csv",
  "model,step,data,layer,head,role,score,ci_low,ci_high",
  "model,step",
  ints="step,layer,head",
  floats="score,ci_low,ci_high",
)
LABELS = _table("attention/labels.csv", "model,step,layer,head,label,rule", "model,step", ints="step,layer,head")
ICL = _table(
  "attention/icl.csv",
  "model,step,kind,position,value,ci_low,ci_high",
  "model,step",
  ints="step",
  floats="value,ci_low,ci_high",
)

TABLES: dict[str, Table] = {
  t.path.removesuffix(".csv").replace("/results", "").replace("/", "_"): t
  for t in (
    PROBES,
    PROBE_BASELINES,
    PROBE_SELECTIVITY,
    PROBE_FITS,
    MDL,
    COMPLEXITY,
    DIVERSITY,
    DIVERSITY_METRICS,
    ABLATION_HEADS,
    ABLATION_PRUNING,
    ABLATION_GATES,
    ABLATION_CAUSAL,
    ABLATION_INTERACTIONS,
    CLARK,
    CLARK_BASELINES,
    ROLES,
    LABELS,
    ICL,
  )
}
"""Every table by its short name: 'probes', 'probes_baselines', 'probes_mdl', 'diversity', 'ablation_heads', ..."""


def path_of(workdir, table: Table) -> epath.Path:
  return epath.Path(workdir) / table.path


def read(path, table: Table) -> list[dict[str, str]]:
  """Rows of a table file as dicts of strings; [] if the file does not exist.

  A file whose header is not the table's columns raises UserError naming the file, so that a foreign
  or older file is never silently merged into (or overwritten by) new results.
  """
  path = epath.Path(path)
  if not path.exists():
    return []
  reader = csv.DictReader(io.StringIO(path.read_text()))
  header = tuple(reader.fieldnames or ())
  if header != table.columns:
    raise UserError(
      f"{path}: columns {','.join(header) or '(none)'} are not {','.join(table.columns)}; move the file away"
    )
  return list(reader)


def _cell(value, float_format: str) -> str:
  if isinstance(value, bool):
    return str(value)
  if isinstance(value, float) or (hasattr(value, "dtype") and getattr(value.dtype, "kind", "") == "f"):
    value = float(value)
    return repr(value) if float_format == "r" or not math.isfinite(value) else format(value, float_format)
  if hasattr(value, "item"):  # a NumPy integer
    value = value.item()
  return str(value)


def format_row(row: dict, table: Table) -> dict[str, str]:
  """One row as the strings written to disk (floats per `table.float_format`); missing columns are an error."""
  missing = [c for c in table.columns if c not in row]
  if missing:
    raise KeyError(f"{table.path}: row lacks column(s) {', '.join(missing)}")  # a bug in the analysis
  return {c: _cell(row[c], table.float_format) for c in table.columns}


def write(path, rows: list[dict], table: Table) -> None:
  """Writes `rows` (already-formatted strings, or values) as the whole table, atomically."""
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  out = io.StringIO()
  writer = csv.DictWriter(out, fieldnames=table.columns, lineterminator="\n")
  writer.writeheader()
  writer.writerows(format_row(r, table) for r in rows)
  tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
  tmp.write_text(out.getvalue())
  tmp.replace(path)


def _key_of(row: dict, table: Table) -> tuple[str, ...]:
  return tuple(_cell(row[c], table.float_format) for c in table.key)


def _sort_value(value: str):
  try:
    return (0, int(value), "")
  except ValueError:
    return (1, 0, value)


def merge(path, new_rows: list[dict], table: Table, *, others=None) -> list[dict[str, str]]:
  """Replaces the rows whose key (`table.key`) matches any new row's, keeps the others; rows are
  ordered by key (numbers numerically), each key's rows in the order they were written. Returns the
  table as written.

  `others(row) -> bool`, for a table two analyses write (ablation/causal.csv, attention/roles.csv): the
  existing rows of a replaced key for which it is true belong to the other analysis and are kept.
  """
  new = [format_row(r, table) for r in new_rows]
  replaced = {_key_of(r, table) for r in new}
  kept = [r for r in read(path, table) if _key_of(r, table) not in replaced or (others is not None and others(r))]
  rows = sorted(kept + new, key=lambda r: [_sort_value(v) for v in _key_of(r, table)])
  write(path, rows, table)
  return rows


def check_writable(workdir, *tables: Table) -> None:
  """Fails (UserError) before any computation if one of `tables` in `workdir` exists with other columns."""
  for table in tables:
    read(path_of(workdir, table), table)


def read_frame(path, table: Table):
  """A table as a pandas DataFrame with the documented dtypes (ints, floats, the rest strings)."""
  import pandas as pd  # only for DataFrames; the writers need no pandas

  path = epath.Path(path)
  if not path.exists():
    raise UserError(f"{path}: no such table (run the command that writes {table.path} first)")
  dtypes = {c: "string" for c in table.columns}
  dtypes.update({c: "float64" for c in table.float_columns})
  with path.open() as f:
    frame = pd.read_csv(
      f,
      dtype={c: d for c, d in dtypes.items() if c not in table.int_columns},
      keep_default_na=False,
      na_values={c: ["nan", "NaN", ""] for c in table.float_columns},
    )
  if tuple(frame.columns) != table.columns:
    raise UserError(f"{path}: columns {','.join(frame.columns)} are not {','.join(table.columns)}")
  for c in table.int_columns:
    frame[c] = frame[c].astype("int64")
  return frame
