"""Checks added in the release review: config values a user can get wrong are one-line errors."""

import pytest

from headspec.errors import UserError
from headspec.probing import plan
from headspec.probing.config import probe_config


@pytest.mark.parametrize(
  "key, value",
  [
    ("structural_rank", 0),
    ("structural_epochs", 0),
    ("structural_patience", 0),
    ("structural_max_train_words", -1),
    ("structural_learning_rate", 0.0),
  ],
)
def test_bad_structural_probe_values_are_one_line(key, value):
  config = probe_config()
  plan.check_config(config)  # the defaults pass
  config.probe[key] = value
  with pytest.raises(UserError, match=f"probe.*{key.removeprefix('structural_')}") as e:
    plan.check_config(config)
  assert "\n" not in str(e.value)


def test_a_structural_jobs_partial_folder_is_the_same_in_every_process(tmp_path):
  """The resume key hashes the trees' heads and punctuation, not the Tree objects' addresses (which made
  every rerun of a structural probe job start over)."""
  import types

  import numpy as np

  from headspec.probing import structural, suite

  def data(heads):
    trees = [structural.Tree(np.array(heads), np.zeros(len(heads), bool))]
    split = types.SimpleNamespace(labels={"distance": trees}, controls={"distance": list(trees)})
    return types.SimpleNamespace(train=split, tune=split, evals=[])

  job, config, wants = types.SimpleNamespace(name="m", step=1), probe_config(), {}
  first, second = data([0, 1, 2]), data([0, 1, 2])  # both alive: distinct objects, equal trees
  one, again = (suite._partial_dir(tmp_path, job, d, {}, config, wants) for d in (first, second))
  assert one == again
  assert suite._partial_dir(tmp_path, job, data([2, 0, 2]), {}, config, wants) != one
