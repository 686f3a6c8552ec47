"""`headspec patch` end to end on a tiny trained decoder: the tables' columns and rows, the heatmaps, the
built-in tasks, and one-line errors for a bad config."""

import numpy as np
import pandas as pd
import pytest

from headspec import cli, tables
from headspec.data.tokenizer import load_tokenizer
from headspec.errors import UserError
from headspec.patching import run as patch_run
from headspec.patching import tasks
from headspec.patching.config import patch_config


@pytest.fixture(scope="module")
def run_dir(train_tiny_decoder):
  return train_tiny_decoder(2, name="patch")


def test_patch_command_writes_tables_and_heatmaps(run_dir):
  c = patch_config()
  c.count, c.induction_n, c.sites = 4, 3, "z,resid_pre"
  out = patch_run.run(c, run_dir)
  frame = pd.DataFrame(tables.read(out, patch_run.RESULTS))
  assert list(frame.columns) == list(patch_run.RESULTS.columns)
  T = 1 + 2 * 3 - 1  # [BOS] r_1..r_3 r_1..r_2
  counts = frame.groupby(["method", "site"]).size().to_dict()
  assert counts == {("activation", "resid_pre"): 2 * T, ("activation", "z"): 2 * 4 * T,
                    ("attribution", "resid_pre"): 2 * T, ("attribution", "z"): 2 * 4 * T,
                    ("path_logits", "z"): 2 * 4}  # fmt: skip
  summary = pd.DataFrame(tables.read(out.parent / "summary.csv", patch_run.SUMMARY))
  assert sorted(summary["metric"].unique()) == ["agreement", "base", "source"]
  assert np.isfinite(frame["value"].astype(float)).all()
  assert sorted(p.name for p in out.parent.glob("*.png")) == [
    "induction_resid_pre_patch_step2.png",
    "induction_z_patch_step2.png",
  ]


def test_ioi_pairs_are_aligned_single_token_names(run_dir):
  tokenizer = load_tokenizer(run_dir / "tokenizer")
  try:
    clean, corrupt, answers = tasks.ioi_pairs(tokenizer, count=6, seed=0)
  except UserError as e:  # the synthetic vocabulary may lack the names: then the refusal is one line
    assert "single tokens" in str(e) and "\n" not in str(e)
    return
  for c, x, (a, b) in zip(clean, corrupt, answers):
    assert len(c) == len(x) and a != b and a in c and c.count(b) == 2 and x.count(b) == 1


@pytest.mark.parametrize(
  "flag,message",
  [("--config.sites=z,hook_z", "unknown site 'hook_z'"), ("--config.task=copy", "task='copy'")],
)
def test_bad_config_is_one_line(run_dir, flag, message, capsys):
  argv = ["headspec", "patch", "--config=patch_induction", f"--workdir={run_dir}", flag]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err
  assert message in err and err.count("\n") == 1
