"""Control tasks (Hewitt & Liang 2019): fixed per lowercased type, distributed like the task labels."""

import numpy as np
import pytest

from headspec.errors import UserError
from headspec.probing import controls


def test_same_label_for_every_occurrence_and_case_and_split():
  train = ["The", "dog", "saw", "the", "cat", "."]
  dev = ["THE", "cat", "ran", "."]
  counts = [5, 3, 2]
  y_train = controls.control_labels_N(train, counts, seed=0)
  y_dev = controls.control_labels_N(dev, counts, seed=0)
  assert y_train[0] == y_train[3] == y_dev[0]
  assert y_train[4] == y_dev[1]
  assert y_train[5] == y_dev[3]
  # the mapping does not depend on which other types are passed alongside
  assert (
    controls.control_labels(["cat"], counts, seed=0)["cat"]
    == controls.control_labels(train + dev, counts, seed=0)["cat"]
  )


def test_follows_label_distribution_over_types():
  counts = np.array([60, 25, 10, 5, 0])
  table = controls.control_labels([f"w{i}" for i in range(20000)], counts, seed=3)
  freq = np.bincount(list(table.values()), minlength=5) / len(table)
  np.testing.assert_allclose(freq, counts / counts.sum(), atol=0.012)
  assert freq[4] == 0  # a label never seen in train is never drawn


def test_seed_changes_labels_deterministically():
  words = [f"w{i}" for i in range(500)]
  a = controls.control_labels(words, [1, 1, 1, 1], seed=0)
  assert a == controls.control_labels(words, [1, 1, 1, 1], seed=0)
  b = controls.control_labels(words, [1, 1, 1, 1], seed=1)
  assert 0.6 < np.mean([a[w] != b[w] for w in words]) < 0.9  # about 3/4 differ


def test_mapping_counts_and_bad_counts():
  assert set(controls.control_labels(["a", "b", "c"], {2: 5}, seed=0).values()) == {2}
  with pytest.raises(UserError):
    controls.control_labels(["a"], [0, 0], seed=0)


def test_arc_control_heads():
  sents = [["A", "b", "c", "a"], ["b", "x"]]
  heads = controls.control_heads(sents, seed=0, control="four_behaviours")
  table = controls.arc_behaviours([w for s in sents for w in s], seed=0, control="four_behaviours")
  for words, h in zip(sents, heads):
    n = len(words)
    for i, w in enumerate(words):
      expected = {controls.ARC_ROOT: 0, controls.ARC_SELF: i + 1, controls.ARC_FIRST: 1, controls.ARC_LAST: n}
      assert h[i] == expected[table[w.lower()]]
  behaviours = controls.arc_behaviours([f"w{i}" for i in range(8000)], seed=1, control="four_behaviours")
  freq = np.bincount(list(behaviours.values()), minlength=4) / 8000
  np.testing.assert_allclose(freq, 0.25, atol=0.02)


def test_hewitt_liang_arc_control_three_behaviours_case_kept_and_ignore():
  words = [f"w{i}" for i in range(600)] + [f"W{i}" for i in range(600)]
  table = controls.arc_behaviours(words, seed=0, control="hewitt_liang")
  values = np.array(list(table.values()))
  assert set(values) == {controls.ARC_SELF, controls.ARC_FIRST, controls.ARC_LAST}  # never ROOT
  for b in (controls.ARC_SELF, controls.ARC_FIRST, controls.ARC_LAST):
    assert abs((values == b).mean() - 1 / 3) < 0.06
  differs = np.mean([table[f"w{i}"] != table[f"W{i}"] for i in range(600)])
  assert 0.55 < differs < 0.78  # 'W' and 'w' are different types (2/3 expected to differ)
  sentences = [["The", "dog", ",", "the", "cat"], ["dog", "runs", "."]]
  heads = controls.control_heads(sentences, 0, ignore=[[0, 0, 1, 0, 0], [0, 0, 1]])
  assert heads[0][2] == -1 and heads[1][2] == -1
  for sentence, h in zip(sentences, heads):
    for i, (w, head) in enumerate(zip(sentence, h)):
      if head >= 0:
        assert head == {controls.ARC_SELF: i + 1, controls.ARC_FIRST: 1, controls.ARC_LAST: len(sentence)}[table_of(w)]


def table_of(word):
  return controls.arc_behaviours([word], 0, control="hewitt_liang")[word]


def test_four_behaviour_arc_control_is_kept_as_an_option():
  table = controls.arc_behaviours([f"w{i}" for i in range(400)], 0, control="four_behaviours")
  assert controls.ARC_ROOT in set(table.values())
  assert controls.arc_behaviours(["The"], 0, control="four_behaviours") == controls.arc_behaviours(
    ["the"], 0, control="four_behaviours"
  )
