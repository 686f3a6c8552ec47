"""Skip and count, don't abort: a sentence the model cannot represent (a word of more pieces than its
context holds) is left out of every treebank reader and counted; only a split with nothing left is refused.

The real-data tests run a tiny decoder (context 32 tokens, a 512-piece vocabulary trained on the synthetic
text) over slices of UD English EWT, in which URLs and e-mail addresses need more than 32 pieces.
"""

import csv
import dataclasses
import logging
import pathlib

import numpy as np
import pytest

from headspec.errors import UserError
from headspec.model.config import from_section
from headspec.runs import directory as runs
from headspec.words import alignment as align

TRAIN, DEV, TEST = 300, 330, 340  # first sentences of each EWT split: train 90-110, dev 325/329, test 48/334-338 fail


@dataclasses.dataclass
class CharPieces:
  """One piece per character, with a one-token prefix: a word of n letters needs n pieces."""

  prefix_ids: tuple = (1,)
  suffix_ids: tuple = ()

  def word_pieces(self, words):
    return [[ord(c) for c in w] for w in words]


def test_representable_keeps_counts_and_refuses_only_when_nothing_is_left():
  sentences = [("a", "cat"), ("extraordinary", "cat"), (), ("the", "dog", "ran")]
  kept = align.representable(sentences, CharPieces(), 6, where="x/dev", names=["s1", "s2", "s3", "s4"])
  assert kept.context == 5 and list(kept.index_U) == [0, 3]
  assert (kept.num_skipped, kept.skipped_words) == (2, 2)
  assert kept.select(sentences) == [sentences[0], sentences[3]]
  assert kept.summary() == (
    "x/dev: skipped 2 of 4 sentences (2 of 7 words) the model cannot represent: 1 with a word of more sub-word "
    "pieces than the model's context holds (5 tokens after special tokens), 1 with no words"
  )
  assert list(align.align(sentences[:2], CharPieces(), 6).representable_U) == [True, False]
  logged = []
  align.representable(sentences[:1], CharPieces(), 6, where="x/dev", log=logged.append)
  assert logged == []  # nothing skipped: nothing said
  align.representable(sentences, CharPieces(), 6, where="x/dev", log=logged.append)
  assert logged == ["  " + kept.summary()]
  with pytest.raises(UserError) as e:
    align.representable(sentences[1:3], CharPieces(), 6, where="x/dev", names=["s2", "s3"])
  message = str(e.value)
  assert "\n" not in message and message.startswith("x/dev: none of the 2 sentences")
  assert "sentence s2, word 0 'extraordinary' of 13 pieces" in message
  assert not len(align.representable(sentences[1:3], CharPieces(), 6, where="x", required=False).index_U)


def _blocks(path):
  return [b for b in pathlib.Path(path).read_text(encoding="utf-8").split("\n\n") if b.strip()]


def _write(folder: pathlib.Path, split: str, blocks) -> None:
  folder.mkdir(parents=True, exist_ok=True)
  (folder / f"en_ewt-ud-{split}.conllu").write_text("\n\n".join(blocks) + "\n\n", encoding="utf-8")


@pytest.fixture(scope="module")
def decoder(train_tiny_decoder):
  """A tiny decoder run (context 32) and its tokenizer."""
  workdir = train_tiny_decoder(2, name="skip")
  _, tokenizer = runs.load_run_model(workdir, 2)
  return workdir, tokenizer


@pytest.fixture(scope="module")
def ewt_slice(data_dir, decoder, tmp_path_factory):
  """(data dir with the first TRAIN/DEV/TEST sentences of EWT, data dir with only those of them the decoder
  can represent, the kept blocks per split)."""
  _, tokenizer = decoder
  whole, kept_dir = tmp_path_factory.mktemp("ewt_slice"), tmp_path_factory.mktemp("ewt_kept")
  kept = {}
  for split, n in (("train", TRAIN), ("dev", DEV), ("test", TEST)):
    blocks = _blocks(data_dir / f"ud/en_ewt/en_ewt-ud-{split}.conllu")[:n]
    _write(whole / "ud/en_ewt", split, blocks)
    ok = align.align([_words(b) for b in blocks], tokenizer, 32).representable_U
    assert 0 < (~ok).sum() < len(blocks)  # the slice has sentences of both kinds
    kept[split] = [b for b, good in zip(blocks, ok) if good]
    _write(kept_dir / "ud/en_ewt", split, kept[split] if split != "train" else blocks)  # same frequencies
  return whole, kept_dir, kept


def _read(path):
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def _attention_config(data):
  from headspec.attention.config import attention_config

  c = attention_config()
  c.data_dir = str(data)
  c.clark.min_count, c.clark.relations = 5, ("det", "nsubj", "amod", "case")
  c.roles.bootstrap_resamples, c.roles.frequency_corpus = 20, "treebank"
  c.induction.enabled = "off"
  c.pictures.sentences = ()
  return c


def test_attention_skips_counts_and_scores_the_rest(decoder, ewt_slice, caplog):
  from headspec.attention.run import run as run_attention

  workdir, _ = decoder
  whole, kept_dir, kept = ewt_slice
  caplog.set_level(logging.INFO)  # the skip lines are absl INFO logs
  summary = run_attention(_attention_config(whole), workdir).read_text()
  out = caplog.text
  skipped_dev, skipped_test = DEV - len(kept["dev"]), TEST - len(kept["test"])
  assert f"en_ewt/dev: skipped {skipped_dev} of {DEV} sentences" in out
  assert f"en_ewt/test: skipped {skipped_test} of {TEST} sentences" in out
  assert (
    "Skipped (the model cannot represent them; scores are over the other sentences): en_ewt/dev: skipped " in summary
  )
  assert f"en_ewt/test: skipped {skipped_test} of {TEST}" in summary
  tables = {name: _read(workdir / "attention" / f"{name}.csv") for name in ("clark", "clark_baselines", "roles")}
  assert tables["clark"]
  # The same command on a treebank of only the kept sentences writes the same rows.
  again = run_attention(_attention_config(kept_dir), workdir).read_text()
  assert "Skipped" not in again
  for name, rows in tables.items():
    assert _read(workdir / "attention" / f"{name}.csv") == rows, name


def test_attention_refuses_when_no_sentence_fits(decoder, ewt_slice, tmp_path):
  from headspec.attention.run import run as run_attention

  workdir, tokenizer = decoder
  whole, _, kept = ewt_slice
  blocks = [b for b in _blocks(whole / "ud/en_ewt/en_ewt-ud-dev.conllu") if b not in kept["dev"]]
  _write(tmp_path / "ud/en_ewt", "dev", blocks)
  _write(tmp_path / "ud/en_ewt", "train", kept["train"])  # word frequencies
  config = _attention_config(tmp_path)
  config.report_split, config.clark.relations, config.clark.min_count = "", (), 1
  before = {p: p.read_bytes() for p in workdir.rglob("*") if p.is_file()}
  with pytest.raises(UserError) as e:
    run_attention(config, workdir)
  assert "\n" not in str(e.value) and str(e.value).startswith(f"en_ewt/dev: none of the {len(blocks)} sentences")
  assert {p: p.read_bytes() for p in workdir.rglob("*") if p.is_file()} == before  # nothing written


def _probe_config(data):
  from headspec.probing.config import probe_config

  c = probe_config()
  c.data_dir = str(data)
  c.probe.tasks = ("upos",)
  c.probe.residuals = False
  c.probe.bootstrap_resamples = 50
  c.probe.l2_grid = (1e-3,)
  c.probe.refine_samples = 1024
  c.probe.batch_tokens = 1024
  return c


def test_probe_skips_counts_and_scores_the_rest(decoder, ewt_slice, tmp_path, caplog):
  from headspec.probing import run as probe_run

  workdir, _ = decoder
  whole, _, kept = ewt_slice
  config = _probe_config(whole)
  caplog.set_level(logging.INFO)
  results = probe_run.run(config, workdir)
  out = caplog.text
  skipped = {s: n - len(kept[s]) for s, n in (("train", TRAIN), ("dev", DEV), ("test", TEST))}
  for split, n in (("train", TRAIN), ("dev", DEV), ("test", TEST)):
    assert f"en_ewt/{split}: skipped {skipped[split]} of {n} sentences" in out
  words = {s: sum(len(_words(b)) for b in kept[s]) for s in ("dev", "test")}
  rows = _read(results)
  assert rows and {int(r["n"]) for r in rows if r["split"] == "en_ewt/test"} == {words["test"]}
  assert {int(r["n"]) for r in rows if r["split"] == "en_ewt/dev"} == {words["dev"]}
  summary = (results.parent / "summary.md").read_text()
  assert "## Skipped sentences" in summary and f"- en_ewt/test: skipped {skipped['test']} of {TEST}" in summary


def test_probe_refuses_when_no_train_sentence_fits(decoder, ewt_slice, tmp_path):
  from headspec.probing import run as probe_run

  workdir, _ = decoder
  whole, _, kept = ewt_slice
  for split in ("dev", "test"):
    _write(tmp_path / "ud/en_ewt", split, kept[split])
  train = [b for b in _blocks(whole / "ud/en_ewt/en_ewt-ud-train.conllu") if b not in kept["train"]]
  _write(tmp_path / "ud/en_ewt", "train", train)
  with pytest.raises(UserError) as e:
    probe_run.run(_probe_config(tmp_path), workdir)
  assert "\n" not in str(e.value) and str(e.value).startswith("en_ewt/train: none of")


def test_ablation_readers_skip_and_count(decoder, ewt_slice, capsys, caplog):
  """The causal test's splits and MiniLM's sentence evaluation set keep only representable sentences."""
  from headspec.ablation import causal
  from headspec.ablation import run as ablation_run
  from headspec.ablation.config import ablate_config

  workdir, tokenizer = decoder
  whole, _, kept = ewt_slice
  model_cfg = from_section(runs.read_config(workdir).model, tokenizer.vocab_size, 32)
  config = ablate_config()
  config.causal.max_train_words = config.causal.max_eval_words = 0  # every kept sentence
  (data,) = causal.load_task_data(whole, "en_ewt", ("upos",), tokenizer, model_cfg, config)
  assert len(data.test.words) == len(kept["test"]) and len(data.train.words) == len(kept["train"])
  assert f"causal test: en_ewt/test: skipped {TEST - len(kept['test'])} of {TEST}" in capsys.readouterr().out
  config.data_dir, config.treebank, config.split, config.num_sentences = str(whole), "en_ewt", "dev", DEV
  caplog.set_level(logging.INFO)
  windows = ablation_run._sentence_windows(config, tokenizer, 32, "decoder")
  assert f"en_ewt/dev: skipped {DEV - len(kept['dev'])} of {DEV}" in caplog.text
  assert max(len(w) for w in windows) <= 32
  expected = align.align([_words(b) for b in kept["dev"]], tokenizer, 32, causal=True).windows
  assert len(windows) == len(expected) and all(np.array_equal(a, b) for a, b in zip(windows, expected))


def _words(block):
  return [l.split("\t")[1] for l in block.splitlines() if l[:1].isdigit() and l.split("\t")[0].isdigit()]
