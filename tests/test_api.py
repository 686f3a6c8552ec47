"""The notebook API (headspec/api/): every function against the command-line path it fronts.

Known answers: `probe` rows = probes/results.csv rows of `headspec probe` with the same config; `ablate`
= ablation/heads.csv rows of `headspec ablate`; `run`'s word-level attention = the attention analyses'
`sentence_maps`, its word vectors = probing's cached features; `read_table` DataFrames write back to
the exact bytes of the CSVs. Plus every bad input: one clear ValueError (UserError) naming it.
"""

import os
import pathlib
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest

import headspec
from headspec.errors import UserError
from headspec.io import tables
from headspec.runs import directory as runs
from headspec.runs import targets

REPO = pathlib.Path(__file__).resolve().parents[1]
L, H = 2, 4
STEPS = [2, 4]


@pytest.fixture(scope="module")
def run_dir(train_tiny_decoder):
  """A tiny decoder trained 4 steps on the synthetic text, checkpoints at steps 2 and 4."""
  workdir = train_tiny_decoder(4, (2,), name="tiny")
  assert runs.resolve_steps(workdir, "all") == STEPS
  return workdir


def probe_config(data_dir):
  from headspec.probing.config import synthetic_probe_config

  c = synthetic_probe_config(str(data_dir))
  c.probe.update(
    tasks=("upos",), eval_splits=("dev",), random_baseline=False, max_train_words=2000, refine_samples=4096
  )
  c.probe.update(l2_grid=(1e-4, 1e-2), bootstrap_resamples=100, batch_tokens=1024)
  return c


# --------------------------------------------------------------------------------------------- load


def test_load_run_and_steps(run_dir):
  loaded = headspec.load(run_dir)
  assert (loaded.name, loaded.step, loaded.lm_head) == ("tiny", 4, True)
  model, tokenizer = loaded  # unpacks
  assert model.cfg.num_layers == L and tokenizer.vocab_size == model.cfg.vocab_size
  assert headspec.load(str(run_dir), step=2).step == 2
  (target,) = targets.run_targets(run_dir, "2")
  assert headspec.load(run_dir, step=2).target.identity == target.identity  # the commands' planner


@pytest.mark.parametrize(
  "source,step,message",
  [
    ("run", 3, r"step\(s\) \[3\] not saved"),
    ("run", "last", "must be an int"),
    ("/nonexistent/model", None, "no such directory"),
    ("minilm", 5, "only step 0"),
    ("empty", None, "config.json"),
  ],
)
def test_load_bad_input(run_dir, tmp_path, source, step, message):
  (tmp_path / "empty").mkdir()
  source = {"run": run_dir, "empty": tmp_path / "empty"}.get(source, source)
  with pytest.raises(UserError, match=message) as e:
    headspec.load(source, step)
  assert isinstance(e.value, ValueError) and "\n" not in str(e.value)


def test_load_minilm():
  loaded = headspec.load("minilm")
  assert (loaded.name, loaded.step, loaded.lm_head, loaded.target.kind) == ("minilm", 0, False, "encoder")
  assert (loaded.cfg.num_layers, loaded.cfg.num_heads) == (6, 12)


# ---------------------------------------------------------------------------------------------- run


def test_run_matches_the_analyses(run_dir, tmp_path):
  from headspec.attention.words import sentence_maps
  from headspec.probing.features import extract_features

  loaded = headspec.load(run_dir)
  model, tokenizer = loaded
  sentences = [["the", "dog", "saw", "a", "cat", "."], "a cat saw the dog."]
  out = headspec.run(loaded, sentences)
  assert [c.words for c in out] == [sentences[0], ["a", "cat", "saw", "the", "dog", "."]]  # text split into words
  c = out[0]
  N, T = len(c.words), len(c.pieces)
  assert c.z_NLHK.shape == (N, L, H, 8) and c.resid_post_NLD.shape == (N, L, 32) and c.embeddings_ND.shape == (N, 32)
  assert c.attention_LHNN.shape == (L, H, N, N) and c.pattern_LHTS.shape == (L, H, T, T)
  assert c.logits_TV.shape == (T, model.cfg.vocab_size) and c.z_LTHK.shape == (L, T, H, 8)

  # A text is tokenized as written (docs/api.md), a word list word by word as the analyses read treebanks.
  assert out[1].tokens_T.tolist() == headspec.to_tokens(loaded, sentences[1])[0].tolist()
  # Word-level attention of a word list: exactly the attention analyses' pooling.
  for captured, (attn_LHNN, special_LHN) in zip(out[:1], sentence_maps(model, tokenizer, [out[0].words])):
    np.testing.assert_array_equal(captured.attention_LHNN, attn_LHNN)
    np.testing.assert_array_equal(captured.special_LHN, special_LHN)
  np.testing.assert_allclose(c.attention_LHNN.sum(-1) + c.special_LHN, 1.0, atol=1e-5)
  np.testing.assert_array_equal(c.head_attention(1, 3), c.attention_LHNN[1, 3])

  # Word vectors: probing's features (float32 cache), first piece of each word.
  feats = extract_features(
    model, tokenizer, [c.words], cache_dir=tmp_path, identity={"t": 1}, pooling="last", dtype="float32", log=None
  )
  assert c.pooling == "last"  # 'auto' is probing's: the last piece for a decoder
  for l in range(L):
    np.testing.assert_allclose(c.z_NLHK[:, l], feats.z(l), atol=1e-5)
    np.testing.assert_allclose(c.resid_post_NLD[:, l], feats.residual(l), atol=1e-5)
  np.testing.assert_allclose(c.embeddings_ND, feats.residual(-1), atol=1e-5)

  # Pieces: the model's own forward pass.
  logits, inter = model(jnp.asarray(c.tokens_T)[None], capture=("pattern", "z"))
  np.testing.assert_allclose(c.logits_TV, np.asarray(logits[0]), atol=1e-4)
  np.testing.assert_allclose(c.pattern_LHTS, np.asarray(inter.pattern_LBHTS[:, 0]), atol=1e-6)
  assert c.tokens_T[c.piece_start_N[1]] == tokenizer.word_pieces(c.words)[1][0]

  # A head mask as (layer, head) pairs = the model's head_mask: layer 0 unchanged, layer 1 changed.
  masked = headspec.run(loaded, [c.words], head_mask=[(0, 1)])[0]
  mask = np.ones((L, H), np.float32)
  mask[0, 1] = 0
  np.testing.assert_array_equal(masked.pattern_LHTS, headspec.run(loaded, [c.words], head_mask=mask)[0].pattern_LHTS)
  np.testing.assert_allclose(masked.pattern_LHTS[0], c.pattern_LHTS[0], atol=1e-6)
  assert np.abs(masked.pattern_LHTS[1] - c.pattern_LHTS[1]).max() > 1e-4
  # Mean pooling goes through the same word layer (headspec/words/batches.py) as probing's mean-pooled features.
  meaned = headspec.run(loaded, [c.words], pooling="mean")[0]
  feats = extract_features(
    model, tokenizer, [c.words], cache_dir=tmp_path, identity={"t": 2}, pooling="mean", dtype="float32", log=None
  )
  np.testing.assert_allclose(meaned.z_NLHK[:, 1], feats.z(1), atol=1e-5)
  assert np.abs(meaned.z_NLHK - c.z_NLHK).max() > 1e-4  # the pieces of a multi-piece word differ


@pytest.mark.parametrize(
  "sentences,kwargs,message",
  [
    ([["the", "", "dog"]], {}, r"run: sentences\[0\]\[1\]='': every word must be a non-empty text"),
    (["the dog", ["a", "  "]], {}, r"sentences\[1\]\[1\]"),
    (["the dog", "   "], {}, r"sentences\[1\]='   ' has no words"),
    ([], {}, "is empty"),
    (["the dog"], {"head_mask": [(2, 0)]}, r"layer 2 of \(2, 0\) is out of range"),
    (["the dog"], {"head_mask": [(0, 4)]}, r"head 4 of \(0, 4\) is out of range"),
    (["the dog"], {"head_mask": np.ones((3, 4))}, r"head_mask of shape \(3, 4\)"),
    (["the dog"], {"pooling": "max"}, "pooling"),
    ([" ".join(["dog"] * 40)], {}, r"sentences\[0\]: 40 words, .* do not fit the model's context of 32"),
  ],
)
def test_run_bad_input(run_dir, sentences, kwargs, message):
  loaded = headspec.load(run_dir)
  with pytest.raises(UserError, match=message):
    headspec.run(loaded, sentences, **kwargs)


def test_head_attention_out_of_range(run_dir):
  c = headspec.run(headspec.load(run_dir), "the dog")[0]
  with pytest.raises(ValueError, match="head 4"):
    c.head_attention(0, 4)
  with pytest.raises(ValueError, match="expected headspec.load"):
    headspec.run(headspec.load(run_dir).model, "the dog")


# -------------------------------------------------------------------------------------------- probe


@pytest.fixture(scope="module")
def cli_tables(run_dir, synthetic_data_dir):
  """The command-line path on run_dir: `headspec probe` and `headspec ablate` (zero, mean) tables, written
  once for every test that compares with them (whichever xdist worker runs it)."""
  from headspec.ablation.config import ablate_config
  from headspec.ablation.run import run as run_ablation
  from headspec.probing.run import run as run_probe_suite

  run_probe_suite(probe_config(synthetic_data_dir), run_dir)
  config = ablate_config()
  config.update(steps="last", methods="zero,mean", num_tokens=300, batch_size=4, bootstrap_resamples=100)
  config.data_dir = str(synthetic_data_dir)
  run_ablation(config, run_dir)
  return config


def test_probe_equals_the_cli_row(run_dir, synthetic_data_dir, tmp_path, cli_tables):
  """api.probe's rows are results.csv's rows of the same config, to the written digit, from a fresh
  feature cache (recomputed, not read back)."""
  config = probe_config(synthetic_data_dir)
  results = tables.path_of(run_dir, tables.PROBES)
  csv_rows = tables.read(results, tables.PROBES)
  frame = headspec.probe(headspec.load(run_dir), "upos", heads=[(1, 2), (0, 0)], layer=0, config=config,
                         cache_dir=tmp_path)  # fmt: skip
  assert list(frame.columns) == list(tables.PROBES.columns)
  assert [(r.layer, r.head) for r in frame.itertuples()] == [(0, 0), (1, 2), (0, -1)]  # results.csv's order
  for row in frame.to_dict("records"):
    written = tables.format_row(row, tables.PROBES)
    match = [r for r in csv_rows if (r["layer"], r["head"]) == (written["layer"], written["head"])]
    assert match == [written]
  # The DataFrame equals read_table's rows, dtypes included.
  table = headspec.read_table(run_dir, "probes")
  wanted = [(0, 0), (1, 2), (0, -1)]
  picked = table[[(l, h) in wanted for l, h in zip(table.layer, table["head"])]]
  by_source = lambda f: f.sort_values(["layer", "head"]).reset_index(drop=True)  # read_table: the table's key order
  pd.testing.assert_frame_equal(by_source(frame.round(6)), by_source(picked), check_exact=False, atol=5e-7)
  assert frame.attrs["baselines"][0]["baseline"] == "majority"


def test_probe_options_and_bad_input(run_dir, synthetic_data_dir, capsys):
  loaded = headspec.load(run_dir)
  config = probe_config(synthetic_data_dir)
  frame = headspec.probe(loaded, "upos", layer=-1, config=config, max_train_words=300, bootstrap_resamples=50)
  assert frame["head"].tolist() == [-1] and frame.layer.tolist() == [-1] and frame.attrs["train_words"] <= 400
  err = capsys.readouterr().err  # not silent: progress bars over the features and the probe groups
  assert "tiny step 4: features" in err and "tiny step 4: probes: 100%" in err
  for kwargs, message in [
    ({}, "give heads"),
    ({"heads": [(2, 0)]}, r"layer 2 of \(2, 0\) is out of range"),
    ({"heads": [(0, -1)]}, r"head -1 of \(0, -1\) is out of range"),
    ({"heads": [0]}, "not a \\(layer, head\\) pair"),
    ({"layer": 2}, "layer 2 is out of range"),
    ({"layer": 0, "treebank": "en_nope"}, "en_nope"),
    ({"layer": 0, "colour": 1}, "unknown option 'colour'"),
    ({"layer": 0, "pooling": "max"}, "pooling"),
  ]:
    with pytest.raises(ValueError, match=message):
      headspec.probe(loaded, "upos", config=config, **kwargs)
  with pytest.raises(ValueError, match="unknown task"):
    headspec.probe(loaded, "ner", layer=0, config=config)


# ------------------------------------------------------------------------------------------- ablate


def test_ablate_equals_the_cli_row(run_dir, cli_tables):
  config = cli_tables
  heads = headspec.read_table(run_dir, "ablation_heads")
  loaded = headspec.load(run_dir)
  for method, (l, h) in (("zero", (1, 2)), ("mean", (0, 3))):
    result = headspec.ablate(loaded, [(l, h)], method=method, config=config)
    assert result.metric == "loss_delta" and result.heads == ((l, h),)
    for metric, (value, low, high) in result.deltas.items():
      row = heads[(heads.method == method) & (heads.layer == l) & (heads["head"] == h) & (heads.metric == metric)]
      assert len(row) == 1
      # heads.csv is written to 6 decimals; the command's sweep reruns the layers above from a cache.
      np.testing.assert_allclose([value, low, high], row[["value", "ci_low", "ci_high"]].to_numpy()[0], atol=2e-6)
    assert result.after["loss"] - result.before["loss"] == pytest.approx(result.value, abs=1e-9)
  both = headspec.ablate(loaded, [(0, 0), (1, 1)], config=config)
  assert both.value != 0 and "scored tokens" in both.evaluation
  for kwargs, message in [
    ({"heads": [(0, 9)]}, r"head 9 of \(0, 9\) is out of range"),
    ({"heads": [(5, 0)]}, r"layer 5 of \(5, 0\) is out of range"),
    ({"heads": []}, "no heads"),
    ({"heads": [(0, 0)], "method": "mode"}, "method='mode'"),
    ({"heads": [(0, 0)], "colour": 1}, "unknown option 'colour'"),
  ]:
    with pytest.raises(ValueError, match=message):
      headspec.ablate(loaded, config=config, **kwargs)
  with pytest.raises(ValueError, match="needs headspec.load"):
    headspec.ablate(tuple(loaded), [(0, 0)])


# ------------------------------------------------------------------------------------------- tables


def test_tables_round_trip_exactly(run_dir, tmp_path, cli_tables):
  """read_table's DataFrame, written back by the table writer, is the CSV byte for byte; read_tables
  stacks runs with a `run` column; a missing table or run is one UserError."""
  from headspec.diversity.run import run as run_diversity

  sys.path.insert(0, str(REPO / "configs"))
  import diversity as diversity_config  # configs/diversity.py

  dconfig = diversity_config.get_config(None)
  dconfig.update(num_tokens=64, batch_size=4, steps="all")
  run_diversity(dconfig, run_dir)
  written = [n for n, t in tables.TABLES.items() if tables.path_of(run_dir, t).exists()]
  assert {"probes", "probes_baselines", "ablation_heads", "diversity"} <= set(written)
  for name in written:
    table = tables.TABLES[name]
    frame = headspec.read_table(run_dir, name)
    tables.write(tmp_path / "copy.csv", frame.to_dict("records"), table)
    assert (tmp_path / "copy.csv").read_bytes() == tables.path_of(run_dir, table).read_bytes(), name

  other = tmp_path / "other"
  (other / "probes").mkdir(parents=True)
  (other / "probes/results.csv").write_bytes((run_dir / "probes/results.csv").read_bytes())
  both = headspec.read_tables([run_dir, other], "probes")
  one = headspec.read_table(run_dir, "probes")
  assert list(both.columns) == ["run", *tables.PROBES.columns] and len(both) == 2 * len(one)
  assert both.run.tolist() == ["tiny"] * len(one) + ["other"] * len(one)
  pd.testing.assert_frame_equal(both[both.run == "other"].drop(columns="run").reset_index(drop=True), one)
  assert headspec.read_tables({"a": run_dir}, "probes").run.unique().tolist() == ["a"]
  with pytest.raises(UserError, match=f"{other}/ablation/heads.csv: no such table"):
    headspec.read_tables([run_dir, other], "ablation_heads")
  with pytest.raises(UserError, match="no table 'probe'"):
    headspec.read_tables([run_dir], "probe")
  with pytest.raises(UserError, match="no run directories"):
    headspec.read_tables([], "probes")

  # Reading tables needs no JAX.
  code = (
    "import sys, headspec\n"
    "frame = headspec.read_tables([sys.argv[1], sys.argv[2]], 'probes')\n"
    "assert len(frame) > 0 and 'jax' not in sys.modules and 'flax' not in sys.modules\n"
  )
  subprocess.run([sys.executable, "-c", code, str(run_dir), str(other)], check=True, env=dict(os.environ))


def test_public_names():
  assert {"load", "run", "probe", "ablate", "read_table", "read_tables"} <= set(headspec.__all__)
  for name in headspec.__all__:
    assert getattr(headspec, name) is not None
  code = "import sys, headspec; headspec.read_table; headspec.TABLES; assert 'jax' not in sys.modules"
  subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("task", ["distance", "depth"])
def test_probe_refuses_structural_tasks_in_one_line(run_dir, task):
  """headspec.probe returns per-word accuracies; the structural probes' tree metrics come from the command."""
  with pytest.raises(ValueError, match=f"'{task}' is a structural probe") as e:
    headspec.probe(headspec.load(run_dir), task, layer=0)
  assert "\n" not in str(e.value)


def test_temporary_feature_cache_is_removed_at_exit(tmp_path):
  """A pretrained model's features (~250 MB of MiniLM's on a treebank) in the per-process temporary
  cache must not outlive the process."""
  code = "from headspec.api import probe; p = probe._temporary_cache(); (p / 'x').write_text('1'); print(p)"
  env = dict(os.environ, TMPDIR=str(tmp_path))
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
  path = pathlib.Path(done.stdout.strip())
  assert path.parent == tmp_path and path.name.startswith("headspec-features-")
  assert not path.exists()
