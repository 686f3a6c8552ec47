"""Config values a user can get wrong are one-line errors."""

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


def test_structural_fits_converged_means_patience_epochs_without_improvement():
  """probes/fits.csv `converged` of a structural probe (docs/outputs.md): the group went `patience` epochs
  without a better dev loss, not merely 'its best epoch was not the last one'."""
  import numpy as np

  from headspec.probing import structural, tasks

  rng = np.random.default_rng(0)
  trees = [structural.Tree(np.array([0, 1, 2, 2]), np.zeros(4, bool)) for _ in range(6)]
  x = rng.normal(size=(24, 2, 4)).astype(np.float32)
  fitted = structural.fit_structural_probes(x, trees, x, trees, kind="depth", rank=2, epochs=3, patience=5)
  assert fitted.epochs_run == 3 and not fitted.converged_G.any()  # 3 epochs cannot hold 5 without improvement
  one = structural.FittedStructural(
    "depth", *np.zeros((2, 1, 4)), np.zeros((1, 4, 2)), np.zeros(2), np.array([39, 10]), np.array([False, True]),
    40, 2,
  )  # fmt: skip
  rows = tasks.fit_rows("depth", (one, one))
  assert [bool(r["converged"]) for r in rows if r["probe"] == "task"] == [False, True]
