"""headspec.io.tables: the one reader, merger and atomic writer of results tables."""

import pytest

from headspec.errors import UserError
from headspec.io import tables


def _row(model, step, acc):
  return dict(
    model=model,
    step=step,
    task="upos",
    layer=0,
    head=1,
    split="x/dev",
    accuracy=acc,
    ci_low=acc,
    ci_high=acc,
    control_accuracy=0.1,
    selectivity=acc - 0.1,
    n=7,
  )


def test_merge_replaces_the_rows_of_the_same_key_and_keeps_the_others(tmp_path):
  path = tmp_path / "probes" / "results.csv"
  tables.merge(path, [_row("m", 10, 0.5), _row("m", 2, 0.6)], tables.PROBES)
  tables.merge(path, [_row("m", 2, 0.9), _row("m-random", 0, 0.3)], tables.PROBES)
  rows = tables.read(path, tables.PROBES)
  # ordered by key, steps numerically (2 before 10); step 2 replaced, step 10 kept
  assert [(r["model"], r["step"], r["accuracy"]) for r in rows] == [
    ("m", "2", "0.900000"),
    ("m", "10", "0.500000"),
    ("m-random", "0", "0.300000"),
  ]
  assert path.read_text().splitlines()[0] == ",".join(tables.PROBES.columns)
  assert not [p for p in path.parent.iterdir() if p.name != "results.csv"]  # no temporary file left


def test_a_foreign_file_is_refused_and_kept(tmp_path):
  path = tmp_path / "results.csv"
  path.write_text("a,b\n1,2\n")
  with pytest.raises(UserError, match="results.csv: columns a,b are not model,step"):
    tables.merge(path, [_row("m", 1, 0.5)], tables.PROBES)
  (tmp_path / "probes").mkdir()
  (tmp_path / "probes" / "results.csv").write_text("a,b\n1,2\n")
  with pytest.raises(UserError, match="move the file away"):
    tables.check_writable(tmp_path, tables.PROBES)
  assert path.read_text() == "a,b\n1,2\n"


def test_float_formats_and_missing_columns(tmp_path):
  path = tmp_path / "d.csv"
  row = dict(model="m", step=0, layer=1, head_i=0, head_j=-1, metric="entropy", value=0.1 + 0.2)
  tables.merge(path, [row], tables.DIVERSITY)
  assert path.read_text().splitlines()[1] == "m,0,1,0,-1,entropy,0.30000000000000004"  # 'r': exact repr
  with pytest.raises(KeyError, match="lacks column"):
    tables.merge(path, [dict(step=0)], tables.DIVERSITY)


def test_edge_scores_keep_their_small_values(tmp_path):
  """circuit/edges.csv: an edge score of 3e-9 (a tiny model's) keeps its value and sign (six decimals wrote 0)."""
  path = tmp_path / "edges.csv"
  row = dict(model="m", step=0, task="t", upstream="L0H1", downstream="L1H0", input="k", upstream_layer=0,
             upstream_head=1, downstream_layer=1, downstream_head=0, method="eap", direction="noising", steps=1,
             score=-3.25e-9)  # fmt: skip
  tables.merge(path, [row], tables.CIRCUIT_EDGES)
  (written,) = tables.read(path, tables.CIRCUIT_EDGES)
  assert float(written["score"]) == -3.25e-9


def test_read_frame_round_trips_with_dtypes(tmp_path):
  path = tmp_path / "results.csv"
  tables.merge(path, [_row("m", 3, 0.25), _row("m", 4, float("nan"))], tables.PROBES)
  frame = tables.read_frame(path, tables.PROBES)
  assert list(frame.columns) == list(tables.PROBES.columns)
  assert str(frame["step"].dtype) == "int64" and str(frame["accuracy"].dtype) == "float64"
  assert frame["accuracy"].iloc[0] == 0.25 and frame["accuracy"].isna().iloc[1]
  with pytest.raises(UserError, match="no such table"):
    tables.read_frame(tmp_path / "absent.csv", tables.PROBES)


def test_every_table_has_unique_columns_and_its_key_among_them():
  for name, table in tables.TABLES.items():
    assert len(set(table.columns)) == len(table.columns), name
    assert set(table.key) <= set(table.columns), name
    assert set(table.int_columns) | set(table.float_columns) <= set(table.columns), name


def test_merge_keeps_the_rows_another_analysis_wrote_for_the_same_key(tmp_path):
  path = tmp_path / "causal.csv"
  row = lambda kind, value: dict(
    model="m",
    step=1,
    kind=kind,
    task="upos",
    k=1,
    selection="selective",
    seed=-1,
    metric="loss_delta",
    value=value,
    ci_low=value,
    ci_high=value,
  )
  tables.merge(path, [row("induction", 0.5)], tables.ABLATION_CAUSAL)
  tables.merge(
    path, [row("probe_selective", 0.1)], tables.ABLATION_CAUSAL, others=lambda r: r["kind"] != "probe_selective"
  )
  assert sorted(r["kind"] for r in tables.read(path, tables.ABLATION_CAUSAL)) == ["induction", "probe_selective"]
  tables.merge(path, [row("probe_selective", 0.2)], tables.ABLATION_CAUSAL)  # `kind` is in the key: kept anyway
  assert [(r["kind"], r["value"]) for r in tables.read(path, tables.ABLATION_CAUSAL)] == [
    ("induction", "0.500000"),
    ("probe_selective", "0.200000"),
  ]
