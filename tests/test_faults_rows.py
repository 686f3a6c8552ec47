"""Rows lost or wrong on a rerun: a rerun that replaces a table's group (an SAE of the same name, a
circuit's faithfulness curve) replaces all of that group's rows together, and keeps every other group."""

import math

import pytest

from headspec.io import tables

WHOLE = {  # per table, the identifying columns one job writes whole (the audit behind `Table.together`)
  "probes": "",  # every (task, layer, head, split) its own row
  "probes_baselines": "baseline",  # a task and split's baselines, whose names carry a fitted value
  "probes_selectivity": "",
  "probes_fits": "",
  "probes_structural": "",
  "patching": "layer,head,position",  # a site's whole grid, by position or not
  "patching_summary": "",
  "circuit_edges": "upstream,downstream,input,upstream_layer,upstream_head,downstream_layer,downstream_head",
  "circuit_faithfulness": "edges,set",  # a method's curve: every size and random set
  "probes_mdl": "",
  "probes_complexity": "",
  "diversity": "",
  "diversity_metrics": "",
  "ablation_heads": "",
  "ablation_pruning": "seed,heads_pruned",  # a ranking's curve over every random order
  "ablation_gates": "",
  "ablation_causal": "seed",  # every random head set of a test
  "ablation_interactions": "layer_a,head_a,layer_b,head_b",  # the pairs of the top heads
  "attention_clark": "",
  "attention_clark_baselines": "",
  "attention_roles": "",
  "attention_labels": "layer,head,label",  # every head's labels, combined by their writer
  "attention_icl": "position",  # the loss at every position of the text
  "sae_metrics": "metric",  # sae/: every row of one SAE (model, step, site, layer, sae)
  "sae_features": "feature",
  "sae_heads": "head,metric",
  "sae_contexts": "feature,rank",
  "sae_labels": "feature,label_set,label",
  "sae_histograms": "feature,bin",  # a feature's non-empty bins only
  "sae_shares": "feature,head",
  "sae_logits": "feature,direction,rank",
  # study/: every table written whole by `headspec study` (tables.write), so a group is one row
  **{f"study_{name}": "" for name in tables.STUDY},
}


def _value(table: tables.Table, column: str, i: int):
  if column in table.int_columns:
    return i
  if column in table.float_columns:
    return 0.5 + i
  return f"{column}{i}"


def _row(table: tables.Table, whole: set, group: dict, member: int, run: int) -> dict:
  """A row of `group` (column -> index of its value), the `member`-th of the group's whole columns, with
  measured values of `run`."""
  return {
    c: _value(table, c, run if c in table.values else member if c in whole else group.get(c, 0)) for c in table.columns
  }


@pytest.mark.parametrize("name", sorted(tables.TABLES))
def test_a_rerun_replaces_its_group_whole_and_keeps_every_other(tmp_path, name):
  """Run 1 writes a group of two rows and, for each other identifying column, a neighbour group differing only
  there; run 2 (other options: other rows) writes the group again with one other row. Read back: exactly run
  2's row in the group, every neighbour as it was. A table missing from WHOLE fails: say which columns one
  job writes whole."""
  assert name in WHOLE, f"{name}: add it to WHOLE (which of its columns does one job write whole?)"
  table, whole = tables.TABLES[name], set(filter(None, WHOLE[name].split(",")))
  assert whole <= set(table.row_key), name
  path = tables.path_of(tmp_path, table)
  neighbours = [{c: 1} for c in table.row_key if c not in whole]
  kept = [_row(table, whole, g, 0, run=1) for g in neighbours]
  tables.merge(path, [_row(table, whole, {}, m, run=1) for m in ((0, 1) if whole else (0,))] + kept, table)
  second = [_row(table, whole, {}, 2, run=2)]
  tables.merge(path, second, table)
  got = tables.read(path, table)
  formatted = lambda rows: sorted(tuple(tables.format_row(r, table).values()) for r in rows)
  assert formatted(got) == formatted(second + kept), name


def test_a_group_with_no_new_rows_is_replaced_too(tmp_path):
  """An SAE rerun without a treebank writes no labels: the earlier SAE's labels of that name go."""
  table = tables.SAE_LABELS
  path = tables.path_of(tmp_path, table)
  key = dict(model="m", step=2, site="z", layer=0, sae="topk-f8-k2")
  row = lambda layer: key | dict(layer=layer, feature=1, label_set="upos", label="NOUN", count=3, fraction=1.0)
  tables.merge(path, [row(0), row(1)], table)
  tables.merge(path, [], table, groups=[key])
  assert [r["layer"] for r in tables.read(path, table)] == ["1"]


# --- options: finite and within bounds, one mechanism (headspec/bounds.py) for every user --------------------


def _declared():
  from headspec import bounds
  from headspec.patching import circuit  # noqa: F401  (declares 'circuit')
  from headspec.sae import run  # noqa: F401  (declares 'sae' and 'fit_sae')

  return [(d.where, b) for d in bounds.DECLARED.values() for b in d.bounds]


def _bad_values(b) -> list:
  """NaN, ±inf, a fraction where a whole number goes, and just past either end of the range."""
  out = [math.nan, math.inf, -math.inf] + ([1.5] if b.kind == "int" else [])
  if b.high is not None:
    out.append(int(b.high) + 1 if b.kind == "int" else b.high * 2 + 1)
  if b.low is not None:
    out.append(b.low if b.above else (int(b.low) - 1 if b.kind == "int" else b.low - 1))
  return out


def _set(values, key: str, value):
  """`values` (a config or a dict of arguments) with `key` set to `value`, whatever its type."""
  *parents, leaf = key.split(".")
  holder = values
  for part in parents:
    holder = holder[part]
  if isinstance(holder, dict):
    holder[leaf] = value
  else:
    with holder.ignore_type():
      holder[leaf] = value
  return values


@pytest.mark.parametrize("where, bound", _declared(), ids=lambda x: getattr(x, "key", x))
def test_every_declared_option_refuses_nonfinite_and_absurd_values_in_one_line(where, bound):
  """Each declared option of each user (a command's config, fit_sae's arguments): NaN, inf, out of range are
  one UserError line naming the key, before any computation; its default passes."""
  from headspec import bounds
  from headspec.errors import UserError

  declared = bounds.DECLARED[where]
  assert bound.fits(bounds.value_of(declared.defaults(), bound.key)), f"{where}: the default of {bound.key}"
  for value in _bad_values(bound):
    with pytest.raises(UserError) as e:
      declared.check(_set(declared.defaults(), bound.key, value))
    line = str(e.value)
    assert f"{bound.key}=" in line and "\n" not in line, (value, line)
