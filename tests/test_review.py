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
