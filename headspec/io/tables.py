"""Tidy results tables: every CSV an analysis writes, its columns, and one way to read, merge and write it.

Every analysis (probe, diversity, ablate, attention, patch) writes its rows through `merge`: a row just
computed replaces the row with the same key (`Table.key`: every column that identifies a row — model,
step, task, site, direction, split, ... — but a few written whole, `Table.together`), every other row is
kept, and the file is replaced atomically (written beside, then renamed), so an interrupted run never
leaves a half-written table, re-running one step keeps the others and a run with another task, site or
direction adds its rows beside the earlier run's. The
columns of every table are the contracts in docs/outputs.md; a file with other columns is refused with
one line rather than overwritten.

Writers are serialised per table (two commands can write one table: `attention` and `ablate` both write
ablation/causal.csv): on local disk an flock on `.<table>.lock` beside it is held across read, merge and
rename; object stores have no locks, so a lease object `.<table>.lock` names the writer and a second
writer is refused with one line (one writer per table there). Readers check every row (field count,
duplicate rows, numbers where numbers belong) and refuse a bad one as `file:line: what is wrong`.

No JAX here: the figures, the atlas, analysis/ scripts and `headspec.read_table` read tables with only
the standard library (and pandas for DataFrames).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import fcntl
import io
import json
import math
import os
import socket
import time
import uuid

from etils import epath

from headspec.errors import UserError
from headspec.io import locks, remote


@dataclasses.dataclass(frozen=True)
class Table:
  """A results table: its path under the run directory, its columns in order, and the key columns whose
  values identify the rows one analysis job writes (re-running that job replaces exactly those rows).

  `float_format`: how floats are written ('.6f' for accuracies and CIs, 'r' for the shortest exact repr).
  `int_columns` / `float_columns`: dtypes for DataFrames (every other column is a string).
  `values`: the measured columns (and the settings recorded beside them, such as `n`); the others identify
  a row, which a table holds at most once.
  `key`: every identifying column but `together` — so a later run that differs in any of them (another
  task, direction, site, split, seed) adds its rows beside the earlier run's and deletes none.
  `together`: identifying columns left out of the key because one job always writes every row of its key
  at once, so a re-run replaces them whole (labels.csv: every head's labels of a (model, step), combined
  from every analysis by its writer; baselines.csv: every baseline row of a task and split, whose names
  carry a fitted value, such as `offset-1`; pruning.csv: a ranking's curve over every random order;
  causal.csv: every random head set of a test, so fewer sets on a re-run leave no stale draws; the
  faithfulness curve and edges of a circuit, the patching grid of a site, the ICL loss by position, the
  interactions of the top heads; every row of one SAE in the sae/ tables). tests/test_faults_rows.py
  says, for every table, which columns one job writes whole.
  `missing`: how a NaN or None is written where it is not 'nan' (the study's tables leave the cell empty).
  """

  path: str
  columns: tuple[str, ...]
  key: tuple[str, ...]
  int_columns: tuple[str, ...] = ()
  float_columns: tuple[str, ...] = ()
  float_format: str = ".6f"
  values: tuple[str, ...] = ()
  together: tuple[str, ...] = ()
  missing: str | None = None

  def __post_init__(self):
    if set(self.key) | set(self.together) != set(self.row_key) or set(self.key) & set(self.together):
      raise ValueError(f"{self.path}: key {self.key} + together {self.together} must be the row key {self.row_key}")

  @property
  def row_key(self) -> tuple[str, ...]:
    """The columns that identify one row (every column but the measured ones)."""
    return tuple(c for c in self.columns if c not in self.values)


def _table(path, columns: str, ints="", floats="", float_format=".6f", values=None, together="") -> Table:
  """`values` defaults to the float columns and `n` (a count that goes with them); the key is every other
  column but `together` (`Table`)."""
  split = lambda s: tuple(c for c in s.split(",") if c)
  cols, floats, together = split(columns), split(floats), split(together)
  values = split(values) if values is not None else (*floats, *(["n"] if "n" in cols else []))
  key = tuple(c for c in cols if c not in values and c not in together)
  return Table(path, cols, key, split(ints), floats, float_format, values, together)


# The contracts (docs/outputs.md says what each value means).
PROBES = _table(
  "probes/results.csv",
  "model,step,task,layer,head,split,accuracy,ci_low,ci_high,control_accuracy,selectivity,n",
  ints="step,layer,head,n",
  floats="accuracy,ci_low,ci_high,control_accuracy,selectivity",
)
PROBE_SELECTIVITY = _table(
  "probes/selectivity.csv",
  "model,step,task,layer,head,split,selectivity,selectivity_ci_low,selectivity_ci_high,"
  "dev_rank,delta_next,delta_next_ci_low,delta_next_ci_high,n",
  ints="step,layer,head,dev_rank,n",
  floats="selectivity,selectivity_ci_low,selectivity_ci_high,delta_next,delta_next_ci_low,delta_next_ci_high",
  values="selectivity,selectivity_ci_low,selectivity_ci_high,dev_rank,delta_next,delta_next_ci_low,delta_next_ci_high,n",
)
PROBE_FITS = _table(
  "probes/fits.csv",
  "model,step,task,layer,head,probe,l2,train_objective,iterations,converged,start,train_accuracy,dev_accuracy,dev_loss",
  ints="step,layer,head,iterations,converged",
  floats="l2,train_objective,train_accuracy,dev_accuracy,dev_loss",
  float_format="r",
  values="l2,train_objective,iterations,converged,start,train_accuracy,dev_accuracy,dev_loss",
)
PROBE_STRUCTURAL = _table(
  "probes/structural.csv",
  "model,step,task,layer,head,split,metric,value,ci_low,ci_high,control_value,selectivity,rank,n",
  ints="step,layer,head,rank,n",
  floats="value,ci_low,ci_high,control_value,selectivity",
  values="value,ci_low,ci_high,control_value,selectivity,rank,n",  # rank: B's, the setting beside the value
)
PROBE_BASELINES = _table("probes/baselines.csv", "task,split,baseline,accuracy,n", "n", "accuracy", together="baseline")
MDL = _table(
  "probes/mdl.csv",
  "model,step,task,layer,head,codelength_bits,uniform_bits,compression,control_codelength_bits,control_compression,n",
  ints="step,layer,head,n",
  floats="codelength_bits,uniform_bits,compression,control_codelength_bits,control_compression",
)
COMPLEXITY = _table(
  "probes/complexity.csv",
  "model,step,task,layer,head,split,l2,accuracy,control_accuracy,selectivity,n",
  ints="step,layer,head,n",
  floats="l2,accuracy,control_accuracy,selectivity",
  float_format="r",
  values="accuracy,control_accuracy,selectivity,n",
)
DIVERSITY = _table(
  "diversity/results.csv",
  "model,step,layer,head_i,head_j,metric,value",
  ints="step,layer,head_i,head_j",
  floats="value",
  float_format="r",
)
DIVERSITY_METRICS = _table(
  "diversity/metrics.csv",
  "metric,kind,basis_dependent,doc",
  ints="basis_dependent",
  values="kind,basis_dependent,doc",
)
ABLATION_HEADS = _table(
  "ablation/heads.csv",
  "model,step,method,layer,head,metric,value,ci_low,ci_high",
  ints="step,layer,head",
  floats="value,ci_low,ci_high",
)
ABLATION_PRUNING = _table(
  "ablation/pruning.csv",
  "model,step,ranking,seed,heads_pruned,fraction_pruned,metric,value",
  ints="step,seed,heads_pruned",
  floats="fraction_pruned,value",
  together="seed,heads_pruned",  # a ranking's whole curve (every random order) comes from one job
)
ABLATION_GATES = _table(
  "ablation/gates.csv",
  "model,step,penalty,layer,head,gate_open_probability,heads_kept,metric,value",
  ints="step,layer,head,heads_kept",
  floats="penalty,gate_open_probability,value",
  values="gate_open_probability,heads_kept,value",
)
ABLATION_CAUSAL = _table(
  "ablation/causal.csv",
  "model,step,kind,task,k,selection,seed,metric,value,ci_low,ci_high",
  ints="step,k,seed",
  floats="value,ci_low,ci_high",
  together="seed",  # every random head set of a (kind, task, k, selection) comes from one job
)
ABLATION_INTERACTIONS = _table(
  "ablation/interactions.csv",
  "model,step,metric,layer_a,head_a,layer_b,head_b,joint,sum_of_singles,interaction",
  ints="step,layer_a,head_a,layer_b,head_b",
  floats="joint,sum_of_singles,interaction",
  together="layer_a,head_a,layer_b,head_b",  # every pair of the top heads (interactions.top) from one job
)
CLARK = _table(
  "attention/clark.csv",
  "model,step,split,relation,direction,layer,head,accuracy,n",
  ints="step,layer,head,n",
  floats="accuracy",
)
CLARK_BASELINES = _table(
  "attention/clark_baselines.csv",
  "model,step,split,relation,direction,offset,accuracy,n",
  ints="step,offset,n",
  floats="accuracy",
  values="offset,accuracy,n",
)
ROLES = _table(
  "attention/roles.csv",
  "model,step,data,layer,head,role,score,ci_low,ci_high",
  ints="step,layer,head",
  floats="score,ci_low,ci_high",
)
LABELS = _table(
  "attention/labels.csv",
  "model,step,layer,head,label,rule",
  ints="step,layer,head",
  values="rule",
  together="layer,head,label",
)
ICL = _table(
  "attention/icl.csv",
  "model,step,kind,position,value,ci_low,ci_high",
  ints="step",
  floats="value,ci_low,ci_high",
  together="position",  # the loss at every position of the text, one job's
)

PATCHING = _table(
  "patching/results.csv",
  "model,step,task,method,site,direction,layer,head,position,value",
  ints="step,layer,head,position",
  floats="value",
  together="layer,head,position",  # a site's whole grid (by position or not) from one job
)
PATCHING_SUMMARY = _table(
  "patching/summary.csv",
  "model,step,task,site,direction,metric,value",
  ints="step",
  floats="value",
)
CIRCUIT_EDGES = _table(
  "circuit/edges.csv",
  "model,step,task,upstream,downstream,input,upstream_layer,upstream_head,downstream_layer,downstream_head,"
  "method,direction,steps,score",
  ints="step,upstream_layer,upstream_head,downstream_layer,downstream_head,steps",
  floats="score",
  float_format="r",  # scores span orders of magnitude: six decimals zeroed the small ones, and their sign
  together="upstream,downstream,input,upstream_layer,upstream_head,downstream_layer,downstream_head",  # the graph
)
CIRCUIT_FAITHFULNESS = _table(
  "circuit/faithfulness.csv",
  "model,step,task,method,direction,steps,edges,set,faithfulness,clean_metric,corrupt_metric,small_gap",
  ints="step,steps,edges,set,small_gap",
  floats="faithfulness,clean_metric,corrupt_metric",
  values="faithfulness,clean_metric,corrupt_metric,small_gap",  # small_gap 1: edges.small_gap, the values noise
  together="edges,set",  # a method's whole curve (every size, every random set) comes from one job
)


def _sae_table(path: str, columns: str, ints: str, floats: str, values: str) -> Table:
  """An `headspec sae` table (docs/outputs.md): (model, step, site, layer, sae) is the key, so SAEs of another
  site, layer or configuration (`sae`) add rows beside the earlier ones; the identifying columns after them
  (feature, head, metric, ...) are `together`: a rerun of one SAE (another seed, lr, ...) replaces all its rows."""
  split = lambda s: tuple(c for c in s.split(",") if c)
  cols, measured = split(columns), split(values)
  key = split(_SAE)
  together = tuple(c for c in cols if c not in measured and c not in key)
  return Table(path, cols, key, split(ints), split(floats), "r", measured, together)


_SAE = "model,step,site,layer,sae,"
SAE_METRICS = _sae_table("sae/metrics.csv", _SAE + "metric,value", "step,layer", "value", "value")
SAE_FEATURES = _sae_table(
  "sae/features.csv",
  _SAE + "feature,firing_rate,mean_activation,top_head,top_head_fraction,entropy_bits,heads,treebank_fires,"
  "upos,upos_selectivity,deprel,deprel_selectivity,head_distance,head_distance_selectivity",
  "step,layer,feature,top_head,treebank_fires",
  "firing_rate,mean_activation,top_head_fraction,entropy_bits,upos_selectivity,deprel_selectivity,"
  "head_distance_selectivity",
  "firing_rate,mean_activation,top_head,top_head_fraction,entropy_bits,heads,treebank_fires,upos,upos_selectivity,"
  "deprel,deprel_selectivity,head_distance,head_distance_selectivity",
)
SAE_HEADS = _sae_table("sae/heads.csv", _SAE + "head,metric,value", "step,layer,head", "value", "value")
SAE_CONTEXTS = _sae_table(
  "sae/contexts.csv",
  _SAE + "feature,rank,split,sentence,word_index,word,context,activation",
  "step,layer,feature,rank,sentence,word_index",
  "activation",
  "split,sentence,word_index,word,context,activation",
)
SAE_LABELS = _sae_table(
  "sae/labels.csv",
  _SAE + "feature,label_set,label,count,fraction",
  "step,layer,feature,count",
  "fraction",
  "count,fraction",
)
# Per feature, for the atlas's feature pages (headspec/sae/feature_data.py): the histogram of its nonzero
# activations on the evaluation tokens (non-empty bins only), its decoder direction's share a_fh in each head,
# and its direct-path logit effect (the most promoted and suppressed tokens).
SAE_HISTOGRAMS = _sae_table(
  "sae/histograms.csv",
  _SAE + "feature,bin,low,high,count",
  "step,layer,feature,bin,count",
  "low,high",
  "low,high,count",
)
SAE_SHARES = _sae_table("sae/shares.csv", _SAE + "feature,head,share", "step,layer,feature,head", "share", "share")
SAE_LOGITS = _sae_table(
  "sae/logits.csv",
  _SAE + "feature,direction,rank,token_id,token,value",
  "step,layer,feature,rank,token_id",
  "value",
  "token_id,token,value",
)


def _study_table(name: str, identifying: str, values: str) -> Table:
  """ROOT/study/NAME.csv of `headspec study` (headspec/study/): the rows `identifying` names (a run, or a
  condition over seeds, and what was measured) and their `values`; floats as '%.6g', missing values empty."""
  split = lambda s: tuple(c for c in s.split(",") if c)
  key, measured = split(identifying), split(values)
  ints = tuple(c for c in ("seed", "step") if c in key)
  return Table(f"study/{name}.csv", key + measured, key, ints, (), ".6g", measured, (), "")


_RUN = "run,condition,seed,"
STUDY = {  # every study table, in the order `headspec study` collects them (docs/outputs.md, study/)
  t.path.removeprefix("study/").removesuffix(".csv"): t
  for t in (
    _study_table("training", _RUN + "step", "loss,eval_loss"),
    _study_table(
      "emergence",
      _RUN + "step,task",
      "best_layer,best_head,selectivity,ci_low,ci_high,median_selectivity,selective_heads,above_init_heads,"
      "init_best,heads,residual_layer,residual_selectivity",
    ),
    _study_table("layers", _RUN + "task,layer", "first_step"),
    _study_table(
      "structural",
      _RUN + "step,task,metric,source,choice",
      "layer,head,value,ci_low,ci_high,control_value,selectivity,linear,n",
    ),
    _study_table("diversity", _RUN + "step,metric", "value"),
    _study_table("roles", _RUN + "step,role", "layer,head,score,median_score"),
    _study_table("causal", _RUN + "step,task,k,metric", "value,ci_low,ci_high,mde"),
    _study_table("induction", _RUN + "step,measure,k", "value,ci_low,ci_high,mde"),
    _study_table("formation", _RUN + "source,task,layer,head", "init_best,formation_step"),
    _study_table(
      "causal_seeds",
      "condition,task,k,metric",
      "mean,t_low,t_high,min,max,seeds,p_value,family,p_holm,mde,below_0,above_0,tost_margin,tost_p,tost_p_holm",
    ),
    _study_table(
      "formation_tests",
      "quantity,condition_a,condition_b",
      "formed_a,seeds_a,formed_b,seeds_b,median_step_a,median_step_b,fisher_p,fisher_p_holm,mannwhitney_u,"
      "mannwhitney_p,mannwhitney_p_holm",
    ),
    _study_table(
      "conditions",
      "condition,task,measure,k",
      "difference,ci_low,ci_high,seeds,baseline_seeds,test,p_value,family,p_holm",
    ),
    _study_table(
      "rankings",
      _RUN + "step,task,measure",
      "spearman,p_value,p_holm,within_layer_spearman,within_layer_p,within_layer_p_holm,heads",
    ),
    _study_table("reference", "run,condition,kind,what", "layer,head,value,baseline,n"),
    _study_table("sae_heads", _RUN + "step,sae,layer,head", "specialization,exclusive_features,features_carried,z_rms"),
    _study_table("sae", _RUN + "step,sae,measure,task", "value,p_value,p_holm,heads"),
  )
}
"""The study's tables by name ('training', 'emergence', ...; in `TABLES` as 'study_training', ...)."""


TABLES: dict[str, Table] = {
  t.path.removesuffix(".csv").replace("/results", "").replace("/", "_"): t
  for t in (
    PROBES,
    PROBE_BASELINES,
    PROBE_SELECTIVITY,
    PROBE_FITS,
    PROBE_STRUCTURAL,
    PATCHING,
    PATCHING_SUMMARY,
    CIRCUIT_EDGES,
    CIRCUIT_FAITHFULNESS,
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
    SAE_METRICS,
    SAE_FEATURES,
    SAE_HEADS,
    SAE_CONTEXTS,
    SAE_LABELS,
    SAE_HISTOGRAMS,
    SAE_SHARES,
    SAE_LOGITS,
    *STUDY.values(),
  )
}
"""Every table by its short name: 'probes', 'probes_baselines', 'probes_mdl', 'diversity', 'ablation_heads', ..."""


def path_of(workdir, table: Table) -> epath.Path:
  return epath.Path(workdir) / table.path


def _text(path: epath.Path) -> str | None:
  """The file's text; None if there is none; one line for a folder or a file that is not UTF-8."""
  if not path.exists():
    return None
  if path.is_dir():
    raise UserError(f"{path}: is a folder, not a table; move it away")
  try:
    return path.read_bytes().decode("utf-8")
  except UnicodeDecodeError as e:
    raise UserError(f"{path}: not UTF-8 text (byte {e.start}: {e.reason}); not a table headspec wrote") from None


def _parse(path, text: str, table: Table) -> list[dict[str, str]]:
  """Rows of `text`, each checked: the header, the field count, ints and floats where the table has
  them, and no row twice (by `table.row_key`). A bad row is one UserError line `file:line: what`."""
  reader = csv.reader(io.StringIO(text, newline=""))
  header = tuple(next(reader, ()))
  if header != table.columns:
    raise UserError(
      f"{path}: columns {','.join(header) or '(none)'} are not {','.join(table.columns)}; move the file away"
    )
  ints = [(i, c) for i, c in enumerate(table.columns) if c in table.int_columns]
  floats = [(i, c) for i, c in enumerate(table.columns) if c in table.float_columns]
  where = [table.columns.index(c) for c in table.row_key]
  seen: dict[tuple[str, ...], int] = {}
  rows = []
  for fields in reader:
    line = reader.line_num
    if not fields:
      continue  # a blank line (csv writes none; an editor may add one at the end)
    if len(fields) != len(table.columns):
      raise UserError(f"{path}:{line}: {len(fields)} fields, expected {len(table.columns)} ({table.path} columns)")
    for i, c in ints:
      try:
        int(fields[i])
      except ValueError:
        raise UserError(f"{path}:{line}: {c} {fields[i]!r} is not an integer") from None
    for i, c in floats:
      try:
        fields[i] == "" or float(fields[i])
      except ValueError:
        raise UserError(f"{path}:{line}: {c} {fields[i]!r} is not a number") from None
    key = tuple(fields[i] for i in where)
    if key in seen:
      named = ", ".join(f"{c}={v}" for c, v in zip(table.row_key, key))
      raise UserError(f"{path}:{line}: duplicate row ({named}) first on line {seen[key]}")
    seen[key] = line
    rows.append(dict(zip(table.columns, fields)))
  return rows


def read(path, table: Table) -> list[dict[str, str]]:
  """Rows of a table file as dicts of strings; [] if the file does not exist.

  A file whose header is not the table's columns raises UserError naming the file, so that a foreign
  or older file is never silently merged into (or overwritten by) new results; so does a bad row
  (`file:line: what is wrong`, see `_parse`), a folder at the path or a file that is not UTF-8.
  """
  path = epath.Path(path)
  text = _text(path)
  return [] if text is None else _parse(path, text, table)


def _cell(value, float_format: str, missing: str | None = None) -> str:
  if missing is not None and (value is None or (isinstance(value, float) and math.isnan(value))):
    return missing
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
  return {c: _cell(row[c], table.float_format, table.missing) for c in table.columns}


LEASE_SECONDS = 600
"""An object-store lease older than this is a writer that died: the next writer takes it over."""


def _lock_path(path: epath.Path) -> epath.Path:
  return path.parent / f".{path.name}.lock"


@contextlib.contextmanager
def locked(path):
  """Holds the table's writer lock: read, merge and write inside it lose no other writer's rows.

  Local disk: fcntl.flock on `.<name>.lock` beside the table (waits for the other writer; the file is
  removed when done). Object
  stores (gs://, s3://, az://) have no lock and epath no write preconditions, so the lock file is a
  lease naming its writer: a live lease of another writer is refused with one line (one writer per
  table there), and `check()` (called before the rename) refuses if another writer took it meanwhile.
  Yields `check`.
  """
  path = epath.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  lock = _lock_path(path)
  if not remote.is_remote(path):
    fd = locks.open_locked(os.fspath(lock), fcntl.LOCK_EX)
    try:
      yield lambda: None
    finally:
      with contextlib.suppress(FileNotFoundError):
        os.unlink(lock)  # before the flock goes: a writer waiting on this file sees it gone and locks anew
      os.close(fd)
    return
  me = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
  held = lock.read_text().split() if lock.exists() else []
  age = time.time() - (float(held[1]) if len(held) == 2 and held[1].replace(".", "", 1).isdigit() else 0.0)
  if held and age < LEASE_SECONDS:  # an unreadable lease counts as old: only headspec writes these
    raise UserError(
      f"{path}: {held[0]} is writing this table ({lock} is {age:.0f} s old); one writer per table on "
      f"object storage: wait for it, or delete the lease if no writer is running"
    )
  lock.write_text(f"{me} {time.time():.3f}\n")

  def check():
    holder = lock.read_text().split()[:1] if lock.exists() else []
    if holder != [me]:
      raise UserError(
        f"{path}: another writer ({holder[0] if holder else 'unknown'}) took {lock} during this write; nothing written "
        f"(one writer per table on object storage): run this command again when it is done"
      )

  try:
    yield check
  finally:
    if lock.exists() and lock.read_text().split()[:1] == [me]:
      lock.unlink()


def _write(path: epath.Path, rows: list[dict], table: Table, check) -> None:
  """Writes the whole table beside it, then renames it into place (the caller holds the lock). A write
  that fails (a full disk, a quota) leaves the table as it was and no temporary, and its OSError names the
  table (the CLI prints it as one line)."""
  out = io.StringIO()
  writer = csv.DictWriter(out, fieldnames=table.columns, lineterminator="\n")
  writer.writeheader()
  writer.writerows(format_row(r, table) for r in rows)
  if path.is_dir():
    raise UserError(f"{path}: is a folder, not a table; move it away")
  tmp = remote.temp_beside(path)  # removes the temporaries of killed writers of this folder
  try:
    tmp.write_text(out.getvalue())
    check()
    tmp.replace(path)
  except OSError as e:  # a full disk or quota: the table as it was, no temporary left, the table named
    tmp.unlink(missing_ok=True)
    raise OSError(e.errno, e.strerror, str(path)) from None
  except BaseException:
    tmp.unlink(missing_ok=True)
    raise


def write(path, rows: list[dict], table: Table) -> None:
  """Writes `rows` (already-formatted strings, or values) as the whole table, atomically, under its lock."""
  path = epath.Path(path)
  if not remote.is_writer():  # a multi-process command: process 0 writes
    return
  with locked(path) as check:
    _write(path, rows, table, check)


def _key_of(row: dict, table: Table) -> tuple[str, ...]:
  return tuple(_cell(row[c], table.float_format, table.missing) for c in table.key)


def _sort_value(value: str):
  try:
    return (0, int(value), "")
  except ValueError:
    return (1, 0, value)


def merge(path, new_rows, table: Table, *, others=None, groups=()) -> list[dict[str, str]]:
  """Replaces the rows whose key (`table.key`) matches any new row's, keeps the others; rows are
  ordered by key (numbers numerically), each key's rows (several only in a `together` table) in the order
  they were written. Returns the table as written.

  `new_rows`: the rows, or a function of the table's current rows returning them, for new rows computed
  from old ones (attention/labels.csv combines every analysis's labels of a head): it is called under
  the lock, so no other writer's rows are lost in between.
  `others(row) -> bool`, for a table two analyses write (ablation/causal.csv, attention/roles.csv): the
  existing rows of a replaced key for which it is true belong to the other analysis and are kept.
  `groups`: keys (dicts of `table.key`'s columns) whose rows this job replaces even where it writes none
  of them (an SAE rerun without a treebank: the earlier SAE's labels of that name go).
  Holds the table's lock (`locked`) from reading to renaming. A process other than the writer of a
  multi-process command (`remote.is_writer`) writes nothing and returns `new_rows` alone.
  """
  path = epath.Path(path)
  if not remote.is_writer():
    return [format_row(r, table) for r in (new_rows([]) if callable(new_rows) else new_rows)]
  with locked(path) as check:  # read, merge and rename as one: a concurrent writer's rows are not lost
    old = read(path, table)
    new = [format_row(r, table) for r in (new_rows(old) if callable(new_rows) else new_rows)]
    replaced = {_key_of(r, table) for r in new} | {_key_of(g, table) for g in groups}
    kept = [r for r in old if _key_of(r, table) not in replaced or (others is not None and others(r))]
    rows = sorted(kept + new, key=lambda r: [_sort_value(v) for v in _key_of(r, table)])
    _write(path, rows, table, check)
  return rows


def check_writable(workdir, *tables: Table) -> None:
  """Fails (UserError, one line) before any computation if `workdir` or a table's folder cannot be written
  (a file, under a file, not writable) or one of `tables` in `workdir` exists with other columns."""
  for folder in dict.fromkeys([epath.Path(workdir), *(path_of(workdir, t).parent for t in tables)]):
    remote.check_folder(folder)
  for table in tables:
    read(path_of(workdir, table), table)


MAX_GRID = (512, 512)
"""The largest (layers, heads) grid sized from a table's rows, when a run has no config.json to say: above
any published model (Llama 3 405B: 126 × 128), far below what a stray row (layer=100000) would allocate."""


def grid_shape(workdir) -> tuple[int, int] | None:
  """(layers, heads) of the run's model (RUN/config.json: model.num_layers × model.num_heads), the shape of
  per-head arrays drawn from its tables, which are never sized by a table's largest layer or head (one
  stray row, layer=100000, would allocate 10^10 cells). None without a config.json that says (a folder
  of a pretrained model's analyses): then size by the rows, at most MAX_GRID."""
  path = epath.Path(workdir) / "config.json"
  try:
    model = json.loads(path.read_bytes())["model"]
    shape = (model["num_layers"], model["num_heads"])
    pretrained = model.get("pretrained")
  except (OSError, ValueError, KeyError, TypeError, AttributeError):  # none, not JSON, no model section
    return None
  whole = all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in shape)
  return shape if whole and not pretrained else None


def read_frame(path, table: Table):
  """A table as a pandas DataFrame with the documented dtypes (ints, floats, the rest strings)."""
  import pandas as pd  # only for DataFrames; the writers need no pandas

  path = epath.Path(path)
  text = _text(path)
  if text is None:
    raise UserError(f"{path}: no such table (run the command that writes {table.path} first)")
  _parse(path, text, table)  # every row checked first: a bad one is file:line, not a pandas traceback
  dtypes = {c: "string" for c in table.columns}
  dtypes.update({c: "float64" for c in table.float_columns})
  frame = pd.read_csv(
    io.StringIO(text),
    dtype={c: d for c, d in dtypes.items() if c not in table.int_columns},
    keep_default_na=False,
    na_values={c: ["nan", "NaN", ""] for c in table.float_columns},
  )
  for c in table.int_columns:
    frame[c] = frame[c].astype("int64")
  return frame
