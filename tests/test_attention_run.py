"""`headspec attention` end to end: a tiny trained decoder on the synthetic treebank, MiniLM on a few EWT
sentences, and bad input through the CLI (one line, exit 2, nothing already written changed)."""

import csv
import pathlib

import numpy as np
import pytest

from headspec.attention import attention_quickstart
from headspec.attention.config import attention_config
from headspec.attention.roles import ROLES
from headspec.attention.run import run as run_attention
from headspec.cli import main as cli
from headspec.io import tables
from headspec.runs import directory as runs

L, H = 2, 4
CONFIG = str(pathlib.Path(__file__).resolve().parents[1] / "configs" / "attention_ewt.py")


@pytest.fixture(scope="module")
def run_dir(train_tiny_decoder):
  """A tiny decoder (context 32 tokens: long synthetic sentences are split into windows), steps 2 and 4."""
  workdir = train_tiny_decoder(4, (2,))
  assert runs.resolve_steps(workdir, "all") == [2, 4]
  return workdir


def read(path):
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def snapshot(path: pathlib.Path) -> dict:
  return {p: p.read_bytes() for p in path.rglob("*") if p.is_file()}


def test_quickstart_decoder_end_to_end(run_dir, synthetic_data_dir):
  summary = attention_quickstart(run_dir, synthetic_data_dir)
  out = run_dir / "attention"
  assert "reachable" in summary and "step 4 (decoder)" in summary
  for table in (tables.CLARK, tables.CLARK_BASELINES, tables.ROLES, tables.LABELS):
    with open(tables.path_of(run_dir, table), newline="") as f:
      assert tuple(next(csv.reader(f))) == table.columns
  clark = read(out / "clark.csv")
  assert {r["step"] for r in clark} == {"4"} and {r["model"] for r in clark} == {run_dir.name}
  assert {r["split"] for r in clark} == {"synthetic/dev", "synthetic/test"}
  assert {r["direction"] for r in clark} == {"dependent_to_head", "head_to_dependent"}
  assert all(0.0 <= float(r["accuracy"]) <= 1.0 for r in clark if r["accuracy"] != "nan")
  keys = [(r["split"], r["relation"], r["direction"]) for r in clark]
  assert all(keys.count(k) == L * H for k in set(keys))
  baselines = read(out / "clark_baselines.csv")
  assert {(r["split"], r["relation"], r["direction"]) for r in baselines} == set(keys)
  assert all(-5 <= int(r["offset"]) < 0 for r in baselines)  # a decoder: only leftward offsets
  roles = [r for r in read(out / "roles.csv") if r["role"] in ROLES]  # the induction step adds its own roles
  assert len(roles) == len(ROLES) * L * H and {r["data"] for r in roles} == {"treebank"}
  for r in roles:
    score, low, high = (float(r[k]) for k in ("score", "ci_low", "ci_high"))
    assert np.isnan(score) or low - 1e-9 <= score <= high + 1e-9, r
  assert all(float(r["score"]) == 0.0 for r in roles if r["role"] == "argmax_next")  # never sees the next word
  labels = read(out / "labels.csv")
  assert {(int(r["layer"]), int(r["head"])) for r in labels} == {(l, h) for l in range(L) for h in range(H)}
  assert all(r["rule"] for r in labels)
  pictures = out / "pictures" / f"{run_dir.name}-step4"
  names = {p.name for p in pictures.iterdir()}
  assert {f"L{l}H{h}.png" for l in range(L) for h in range(H)} <= names
  assert {"lines_sentence0_layer1.png", "lines_sentence1_layer1.png", "maps.npz"} <= names
  assert len([n for n in names if n.startswith("rollout_flow_sentence")]) == 1 and len(names) == L * H + 4
  maps = np.load(pictures / "maps.npz")
  attn, special = maps["attn_0"], maps["special_0"]
  n = len(maps["words_0"])
  assert attn.shape == (L, H, n, n)
  np.testing.assert_allclose(attn.sum(-1) + special, 1.0, atol=1e-5)  # no specials: rows sum to 1
  assert np.all(np.triu(attn, 1) == 0)  # a decoder attends left only

  # Another step joins the tables; the step already there is replaced, not duplicated.
  config = attention_config()
  config.update(
    dict(data_dir=str(synthetic_data_dir), treebank="synthetic", steps="2", max_sentences=30, report_split="")
  )
  config.clark.min_count, config.roles.bootstrap_resamples, config.pictures.sentences = 5, 20, ()
  run_attention(config, run_dir)
  again = read(out / "clark.csv")
  assert [r for r in again if r["step"] == "4"] == clark
  assert {r["split"] for r in again if r["step"] == "2"} == {"synthetic/dev"}


def attention_cli(tmp_path, workdir, **overrides) -> int:
  """`headspec attention` in process, with a config file that is configs/attention_ewt.py plus `overrides`
  (key path with '__' for '.' -> value): in-process cli.main does not apply --config.key=value overrides."""
  name = tmp_path / f"cfg_{len(list(tmp_path.glob('cfg_*.py')))}.py"
  lines = [f"import sys\nsys.path.insert(0, {str(pathlib.Path(CONFIG).parent)!r})\nimport attention_ewt\n"]
  lines += ["def get_config(a=None):", "  c = attention_ewt.get_config(None)"]
  lines += [f"  c.{key.replace('__', '.')} = {value!r}" for key, value in overrides.items()]
  name.write_text("\n".join(lines + ["  return c\n"]))
  cli.FLAGS.unparse_flags()  # absl keeps flag values between in-process calls
  return cli.main(["headspec", "attention", f"--config={name}", f"--workdir={workdir}"])


@pytest.mark.parametrize(
  "overrides, message",
  [
    (dict(clark__relations=("nosuch",)), "clark.relations"),
    (dict(roles__labels=("positional", "induction")), "unknown role"),
    (dict(clark__arcs="all"), "cannot score a decoder"),
  ],
)
def test_bad_input_is_one_line_and_changes_nothing(run_dir, synthetic_data_dir, tmp_path, capsys, overrides, message):
  before = snapshot(run_dir)
  common = dict(data_dir=str(synthetic_data_dir), treebank="synthetic", clark__min_count=5)
  assert attention_cli(tmp_path, run_dir, **common, **overrides) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("headspec: error:") and message in err and "\n" not in err
  assert snapshot(run_dir) == before


def test_a_sentence_no_window_can_hold_is_one_line(run_dir, tmp_path, capsys):
  folder = tmp_path / "ud" / "long"
  folder.mkdir(parents=True)
  word = "".join("xqzj"[i % 4] + "kv"[i % 2] for i in range(100))  # far more pieces than 32 tokens
  (folder / "long-ud-dev.conllu").write_text(
    f"# sent_id = long-1\n1\tThe\tthe\tDET\t_\t_\t2\tdet\t_\t_\n2\t{word}\t_\tNOUN\t_\t_\t0\troot\t_\t_\n\n"
  )
  before = snapshot(run_dir)
  overrides = dict(data_dir=str(tmp_path), treebank="long", report_split="", pictures__sentences=())
  assert attention_cli(tmp_path, run_dir, **overrides) == 2
  err = capsys.readouterr().err.strip()
  assert "no window can hold them" in err and "long-1" in err and "\n" not in err
  assert snapshot(run_dir) == before


def test_minilm_on_a_few_ewt_sentences(data_dir, tmp_path):
  config = attention_config()
  config.model.pretrained = "minilm"
  config.data_dir = str(data_dir)
  config.max_sentences = 12
  config.clark.min_count = 5
  config.roles.bootstrap_resamples = 50
  config.pictures.sentences = (0,)
  summary = run_attention(config, tmp_path).read_text()
  assert "## minilm, step 0 (encoder)" in summary
  clark = read(tmp_path / "attention" / "clark.csv")
  det = [float(r["accuracy"]) for r in clark if r["relation"] == "det" and r["direction"] == "dependent_to_head"]
  assert len(det) == 2 * 6 * 12 and max(det) > 0.6  # some head finds determiners' nouns (Clark et al.: 94%)
  offsets = {int(r["offset"]) for r in read(tmp_path / "attention" / "clark_baselines.csv")}
  assert any(k > 0 for k in offsets)  # an encoder may look right
  labels = read(tmp_path / "attention" / "labels.csv")
  assert "delimiter" in {r["label"] for r in labels}  # BERT-style heads park attention on [SEP] (Clark et al. §3)
  assert len(list((tmp_path / "attention" / "pictures" / "minilm-step0").glob("L*H*.png"))) == 72


def test_split_sentences_take_each_row_from_its_window(data_dir):
  """MiniLM with its context cut to 16 tokens: long sentences are split into windows; the per-word
  numbers of a split equal those of the sentences' own word maps, and a row is 0 outside its window."""
  import dataclasses

  import jax.numpy as jnp

  from headspec.attention import words
  from headspec.data.treebank import load_split
  from headspec.pretrained import load_pretrained

  model, tokenizer = load_pretrained("minilm")
  model.cfg = dataclasses.replace(model.cfg, max_len=16)
  sentences = load_split(data_dir, "en_ewt", "dev")[:4]
  word_lists = [s.words for s in sentences]
  punct = np.array([u == "PUNCT" for s in sentences for u in s.upos])
  stats = words.word_stats(model, tokenizer, word_lists, punct, batch_tokens=64)
  assert stats.num_split_sentences >= 2
  maps = words.sentence_maps(model, tokenizer, word_lists)
  again = words.stats_from_maps(maps, punct)
  assert np.mean(stats.argmax_other_LHN == again.argmax_other_LHN) > 0.99  # float ties aside
  # Columns (who attends to a word most) combine the rows of every window that holds the word.
  assert np.mean(stats.argmax_col_other_LHN == again.argmax_col_other_LHN) > 0.99
  np.testing.assert_allclose(stats.values["prev"], again.values["prev"], atol=1e-5)
  u = int(np.argmax([len(w) for w in word_lists]))  # a split sentence
  offset = int(stats.sentence_first_U[u])
  first, end = stats.window_first_N - offset, stats.window_end_N - offset
  attn_LHNN = maps[u][0]
  assert len({(first[offset + n], end[offset + n]) for n in range(len(word_lists[u]))}) >= 2  # rows from 2+ windows
  for n in range(len(word_lists[u])):
    outside = np.ones(len(word_lists[u]), bool)
    outside[first[offset + n] : end[offset + n]] = False
    assert outside.any() and np.all(attn_LHNN[:, :, n, outside] == 0)
  np.testing.assert_allclose(jnp.asarray(attn_LHNN.sum(-1) + maps[u][1]), 1.0, atol=1e-5)
