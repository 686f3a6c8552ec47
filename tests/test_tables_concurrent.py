"""headspec.io.tables under faults: concurrent writers, bad rows, files that are not tables."""

import multiprocessing
import time

import pytest

from headspec.errors import UserError
from headspec.io import tables

HEADER = ",".join(tables.ABLATION_CAUSAL.columns)
GOOD = "m,1,probe_selective,upos,0,selective,-1,probe_accuracy,0.5,0.4,0.6"


def _causal(model, step):
  return dict(
    model=model, step=step, kind="probe_selective", task="upos", k=0, selection="selective", seed=-1,
    metric="probe_accuracy", value=0.5, ci_low=0.4, ci_high=0.6,
  )  # fmt: skip


def _merge_many(path, writer, count):
  for step in range(count):
    tables.merge(path, [_causal(f"writer{writer}", step)], tables.ABLATION_CAUSAL)


def test_concurrent_writers_lose_no_rows(tmp_path):
  # Two processes merge different keys into one table (as `attention` and `ablate` do into causal.csv).
  path = tmp_path / "ablation" / "causal.csv"
  count = 60
  ctx = multiprocessing.get_context("spawn")
  procs = [ctx.Process(target=_merge_many, args=(path, w, count)) for w in range(2)]
  for p in procs:
    p.start()
  for p in procs:
    p.join(120)
  assert [p.exitcode for p in procs] == [0, 0]
  keys = {(r["model"], r["step"]) for r in tables.read(path, tables.ABLATION_CAUSAL)}
  assert keys == {(f"writer{w}", str(s)) for w in range(2) for s in range(count)}
  assert sorted(p.name for p in path.parent.iterdir()) == ["causal.csv"]  # no lock or temporary file left


@pytest.mark.parametrize(
  "row, message",
  [
    ("m,1,probe_selective,upos,0,selective,-1,probe_accuracy,0.5", r":3: 9 fields, expected 11"),
    (GOOD + ",extra", r":3: 12 fields, expected 11"),
    (GOOD, r":3: duplicate row \(model=m, step=1, kind=probe_selective, .*metric=probe_accuracy\) first on line 2"),
    (GOOD.replace(",0,selective", ",zero,selective"), r":3: k 'zero' is not an integer"),
    (GOOD.replace("0.5,", "high,"), r":3: value 'high' is not a number"),
  ],
)
def test_a_bad_row_is_one_line_naming_file_and_line(tmp_path, row, message):
  path = tmp_path / "causal.csv"
  text = f"{HEADER}\n{GOOD}\n{row}\n"
  path.write_text(text)
  for reader in (tables.read, tables.read_frame):
    with pytest.raises(UserError, match=r"causal.csv" + message) as e:
      reader(path, tables.ABLATION_CAUSAL)
    assert "\n" not in str(e.value)
  with pytest.raises(UserError, match=message):  # a merge neither crashes nor rewrites the bad file
    tables.merge(path, [_causal("other", 2)], tables.ABLATION_CAUSAL)
  assert path.read_text() == text


def test_empty_values_nan_and_a_final_blank_line_are_fine(tmp_path):
  path = tmp_path / "causal.csv"
  path.write_text(f"{HEADER}\n{GOOD}\nm,2,probe_selective,upos,0,selective,-1,loss_delta,nan,,\n\n")
  assert [r["ci_low"] for r in tables.read(path, tables.ABLATION_CAUSAL)] == ["0.4", ""]
  assert tables.read_frame(path, tables.ABLATION_CAUSAL)["k"].tolist() == [0, 0]


def test_a_folder_or_non_utf8_bytes_at_a_table_path_are_one_line(tmp_path):
  folder = tmp_path / "causal.csv"
  folder.mkdir()
  for call in (
    lambda: tables.read(folder, tables.ABLATION_CAUSAL),
    lambda: tables.read_frame(folder, tables.ABLATION_CAUSAL),
    lambda: tables.merge(folder, [_causal("m", 1)], tables.ABLATION_CAUSAL),
    lambda: tables.write(folder, [_causal("m", 1)], tables.ABLATION_CAUSAL),
  ):
    with pytest.raises(UserError, match=r"causal.csv: is a folder, not a table"):
      call()
  assert folder.is_dir() and not list(folder.iterdir())
  binary = tmp_path / "b.csv"
  binary.write_bytes(f"{HEADER}\n".encode() + b"m\xff,1\n")
  with pytest.raises(UserError, match=r"b.csv: not UTF-8 text \(byte \d+: invalid start byte\)"):
    tables.read(binary, tables.ABLATION_CAUSAL)
  with pytest.raises(UserError, match="not UTF-8"):
    tables.read_frame(binary, tables.ABLATION_CAUSAL)


@pytest.fixture()
def object_store(monkeypatch):
  """Local paths take the object-store branch (no flock: a lease object names the writer)."""
  monkeypatch.setattr(tables.remote, "is_remote", lambda path: True)


def test_object_store_lease_refuses_a_second_writer(tmp_path, object_store):
  path = tmp_path / "causal.csv"
  tables.merge(path, [_causal("m", 1)], tables.ABLATION_CAUSAL)
  assert sorted(p.name for p in tmp_path.iterdir()) == ["causal.csv"]  # the lease is gone after the write
  before = path.read_text()
  lease = tmp_path / ".causal.csv.lock"
  lease.write_text(f"host:1:abc {time.time():.3f}\n")
  with pytest.raises(UserError, match=r"causal.csv: host:1:abc is writing this table .*one writer per table"):
    tables.merge(path, [_causal("m", 2)], tables.ABLATION_CAUSAL)
  assert path.read_text() == before and lease.read_text().startswith("host:1:abc")
  # A lease older than LEASE_SECONDS is a writer that died: taken over.
  lease.write_text(f"host:1:abc {time.time() - tables.LEASE_SECONDS - 1:.3f}\n")
  tables.merge(path, [_causal("m", 2)], tables.ABLATION_CAUSAL)
  assert len(tables.read(path, tables.ABLATION_CAUSAL)) == 2 and not lease.exists()
  lease.write_text("not a lease")  # unreadable: not a live writer
  tables.merge(path, [_causal("m", 3)], tables.ABLATION_CAUSAL)
  assert len(tables.read(path, tables.ABLATION_CAUSAL)) == 3 and not lease.exists()


def test_object_store_writer_whose_lease_was_taken_writes_nothing(tmp_path, object_store):
  path = tmp_path / "causal.csv"
  tables.merge(path, [_causal("m", 1)], tables.ABLATION_CAUSAL)
  before = path.read_text()
  lease = tmp_path / ".causal.csv.lock"

  def intruder(row):  # another writer takes the lease while this one merges
    lease.write_text(f"other:2:def {time.time():.3f}\n")
    return False

  with pytest.raises(UserError, match=r"another writer \(other:2:def\) took .*nothing written"):
    tables.merge(path, [_causal("m", 1)], tables.ABLATION_CAUSAL, others=intruder)
  assert path.read_text() == before
  assert sorted(p.name for p in tmp_path.iterdir()) == [".causal.csv.lock", "causal.csv"]  # its lease is kept


def _row_of(table, change: str = ""):
  """One row of `table` (ints 1, floats 0.5, strings 'a'), with column `change` given another value."""
  row = {}
  for c in table.columns:
    value = 1 if c in table.int_columns else 0.5 if c in table.float_columns else "a"
    if c == change:
      value = 2 if c in table.int_columns else 0.75 if c in table.float_columns else "b"
    row[c] = value
  return row


def test_every_table_with_a_step_names_its_model():
  """A step is one model's (two pretrained models are both at step 0), so every table with a
  `step` column keys it by `model` too; diversity/results.csv had none, and a second model analysed into
  the workdir replaced the first's rows. Only tables no model computes (metric descriptions, a task's
  majority baselines) lack it. The study's tables name the model by its `run` (an experiment's run is one
  model); those over seeds (per condition) have no step."""
  no_model = sorted(name for name, table in tables.TABLES.items() if not {"model", "run"} & set(table.key))
  assert all("step" not in tables.TABLES[name].columns for name in no_model), no_model
  over_seeds = ["study_causal_seeds", "study_conditions", "study_formation_tests"]
  assert no_model == ["diversity_metrics", "probes_baselines", *over_seeds]
  assert all("model" in t.key for n, t in tables.TABLES.items() if "run" not in t.key and n not in no_model)
  assert tables.DIVERSITY.key[:2] == ("model", "step")


def test_a_diversity_table_from_before_its_model_column_is_refused_in_one_line(tmp_path):
  """A diversity/results.csv written before the `model` column is refused before any computation (docs/
  outputs.md), naming the file, both headers and what to do; the file is left as it was."""
  path = tmp_path / "diversity" / "results.csv"
  path.parent.mkdir()
  path.write_text("step,layer,head_i,head_j,metric,value\n0,0,0,-1,attention_entropy,0.5\n")
  with pytest.raises(UserError) as e:
    tables.check_writable(tmp_path, tables.DIVERSITY)
  message = str(e.value)
  assert "\n" not in message and message.startswith(f"{path}: columns step,layer,head_i,head_j,metric,value ")
  assert "are not model,step,layer,head_i,head_j,metric,value; move the file away" in message
  assert path.read_text().startswith("step,layer")


@pytest.mark.parametrize("name", sorted(tables.TABLES))
def test_a_later_run_differing_in_any_identifying_column_drops_no_row(tmp_path, name):
  """A run that differs from an earlier one in any column that identifies a row (direction,
  site, task, split, seed, ...; every column but the measured values) adds its rows beside the earlier
  ones. The only exceptions are a `together` table's columns, whose rows of one key are always written
  whole by one job (labels of a (model, step), baselines of a task and split, a pruning curve's random
  orders, a causal test's random head sets, a circuit's faithfulness curve, an SAE's rows: test_faults_rows.py)."""
  table = tables.TABLES[name]
  together = set(getattr(table, "together", ()))
  from test_faults_rows import WHOLE  # which columns one job writes whole, table by table

  assert together == set(filter(None, WHOLE[name].split(","))), name
  identifying = [c for c in table.columns if c not in table.values]
  assert identifying and set(table.key) == set(identifying) - together, name
  for column in identifying:
    if column in together:
      continue
    path = tmp_path / f"{column}.csv"
    first, second = _row_of(table), _row_of(table, column)
    tables.merge(path, [first], table)
    tables.merge(path, [second], table)
    kept = tables.read(path, table)
    assert len(kept) == 2, f"{name}: a run with another {column} dropped the earlier run's row"
    # ... and re-running the first replaces exactly its own row (a new value), keeping the second's
    again = first | {v: (7 if v in table.int_columns else 0.25) for v in table.values if v in table.int_columns
                     or v in table.float_columns}  # fmt: skip
    tables.merge(path, [again], table)
    assert len(tables.read(path, table)) == 2, name


def test_attention_without_its_induction_step_keeps_the_induction_labels(tmp_path):
  """labels.csv, written whole per (model, step): `headspec attention` with the
  induction step off kept no induction label of an earlier run (its roles.csv rows stayed)."""
  from headspec.attention import induction_run

  label = lambda l, h, name: dict(model="m", step=1, layer=l, head=h, label=name, rule=f"{name} rule")
  role = lambda data, name: dict(model="m", step=1, data=data, layer=0, head=0, role=name, score=0.9, ci_low=0.8,
                                 ci_high=1.0)  # fmt: skip
  induction = dict(roles=[role("repeated_random", "induction")], labels=[label(0, 0, "induction")])
  induction_run.write(tmp_path, induction, 1, 2, "m", 1)  # the induction step alone
  treebank = dict(roles=[role("treebank", "positional")], labels=[label(0, 1, "positional")])
  induction_run.write(tmp_path, {}, 1, 2, "m", 1, with_treebank_rows=treebank)  # then treebank only
  labels = {(r["head"], r["label"]) for r in tables.read(tmp_path / tables.LABELS.path, tables.LABELS)}
  assert labels == {("0", "induction"), ("1", "positional")}
  roles = {r["data"] for r in tables.read(tmp_path / tables.ROLES.path, tables.ROLES)}
  assert roles == {"repeated_random", "treebank"}
  induction_run.write(tmp_path, {"labels": []}, 1, 2, "m", 1)  # the induction step again, now labelling nothing
  labels = {(r["head"], r["label"]) for r in tables.read(tmp_path / tables.LABELS.path, tables.LABELS)}
  assert labels == {("0", "none"), ("1", "positional")}  # its own stale label replaced, the treebank's kept


@pytest.mark.parametrize("name,column", [("ablation_causal", "seed"), ("ablation_pruning", "seed")])
def test_a_rerun_with_fewer_random_draws_leaves_no_stale_draw(tmp_path, name, column):
  """A re-run whose test draws fewer random head sets (or pruning orders) replaces the test's rows whole:
  the earlier run's extra draws would otherwise sit beside the new ones and mix two configurations."""
  table = tables.TABLES[name]
  path = tmp_path / "t.csv"
  rows = [_row_of(table) | {column: s} for s in range(5)]
  tables.merge(path, rows, table)
  tables.merge(path, rows[:3], table)
  assert sorted(int(r[column]) for r in tables.read(path, table)) == [0, 1, 2]
