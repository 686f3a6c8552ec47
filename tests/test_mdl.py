"""MDL probing (online code, Voita & Titov 2020): known answers on synthetic features.

Fits are compiled per portion size, so the fitting tests share one shape (N, G, D, two label sets of K
classes) and a short portion schedule; the paper's schedule is checked on the cut points alone.
"""

import math

import numpy as np
import pytest

from headspec.errors import UserError
from headspec.io import tables
from headspec.probing import mdl

N, K, D = 2000, 5, 8
SNRS = (0.0, 0.3, 0.7, 1.5, 12.0)  # group 0: features independent of the labels; group 4: separable clusters
FRACTIONS = (0.005, 0.025, 0.1, 0.3, 1.0)  # cut points 10, 50, 200, 600, 2000
# one device: one compilation per shape; L-BFGS from the LDA start, at most 30 iterations
FIT = dict(max_devices=1, refine_samples=0, max_iter=30)


def _problem(seed=0):
  """Uniform labels over K classes, features = snr·(class mean) + unit noise per group; random control labels."""
  rng = np.random.default_rng(seed)
  y = rng.integers(0, K, N).astype(np.int32)
  control = rng.integers(0, K, N).astype(np.int32)
  mu = rng.standard_normal((K, D))
  x = np.stack([snr * mu[y] + rng.standard_normal((N, D)) for snr in SNRS], 1).astype(np.float32)
  return x, y, control


@pytest.fixture(scope="module")
def problem_and_codes():
  x, y, control = _problem()
  codes = mdl.online_codelengths(
    x, {"task": (y, K), "control": (control, K)}, fractions=FRACTIONS, seed=0, fit_options=FIT
  )
  return (x, y, control), codes


def test_paper_portions():
  """The reference schedule: t_i = int(f_i·N) for 0.1% .. 100%; the first block at least MIN_FIRST_BLOCK."""
  n = 204_585
  cuts = mdl.block_boundaries(n)
  assert cuts == (0,) + tuple(int(f * n) for f in mdl.DEFAULT_FRACTIONS)
  assert mdl.block_boundaries(2000) == (0, 10, 16, 32, 64, 125, 250, 500, 1000, 2000)
  assert mdl.block_boundaries(5) == (0, 5)
  assert mdl.block_boundaries(2000, FRACTIONS) == (0, 10, 50, 200, 600, 2000)
  for bad in ((0.5, 0.25, 1.0), (0.1, 0.5), (0.0, 1.0)):
    with pytest.raises(UserError):
      mdl.block_boundaries(100, bad)


def test_known_answers(problem_and_codes):
  _, codes = problem_and_codes
  task, control = codes["task"], codes["control"]
  for code in (task, control):
    assert code.n == N and code.uniform_bits == pytest.approx(N * math.log2(K))
    assert np.isfinite(code.block_bits_GB).all() and (code.block_bits_GB > 0).all()
    assert np.allclose(code.codelength_bits_G, code.block_bits_GB.sum(1))
    assert np.allclose(code.compression_G, code.uniform_bits / code.codelength_bits_G)
  # labels independent of the features: about the uniform code, a little worse: learning (D + 1)(K − 1)
  # weights from noise costs about ½·36·log2 N ≈ 200 bits (4 %) here, the price MDL puts on a probe's size
  assert 0.92 < task.compression_G[0] < 1.0, task.compression_G
  # separable, well-clustered classes: after the first blocks almost nothing is left to send
  assert task.compression_G[4] > 5, task.compression_G
  assert task.block_accuracy_GB[4, -1] > 0.99
  # more signal, shorter code
  assert (np.diff(task.codelength_bits_G) < 0).all(), task.codelength_bits_G
  # random control labels: about the uniform code on every group, below the task wherever there is signal
  assert ((0.92 < control.compression_G) & (control.compression_G < 1.0)).all(), control.compression_G
  assert (task.compression_G[2:] > control.compression_G[2:] + 0.05).all()


def test_first_block_is_uniform(problem_and_codes):
  _, codes = problem_and_codes
  for code in codes.values():
    t1 = code.boundaries[1]
    assert code.boundaries == (0, 10, 50, 200, 600, 2000)
    assert (code.block_bits_GB[:, 0] == t1 * math.log2(K)).all()  # exactly t_1·log2 K, every group
    assert np.isnan(code.block_accuracy_GB[:, 0]).all()
    # every later block costs at most its uniform code plus the mixture's −log2(1 − ε) per word ... and
    # at least 0; with no signal it is close to the uniform code
    sizes = np.diff(code.boundaries)[1:]
    assert (code.block_bits_GB[:, 1:] <= sizes * (math.log2(K / mdl.DEFAULT_UNIFORM_MIX))).all()


def test_rows_fill_the_mdl_table_and_are_deterministic(problem_and_codes, tmp_path):
  (x, y, control), codes = problem_and_codes
  heads = [0, 1, 2, 3, 4]
  rows = mdl.mdl_rows("tiny", 100, 2, heads, x, {"upos": (y, control, K)}, fractions=FRACTIONS, seed=0, fit_options=FIT)
  assert len(rows) == len(heads)
  for g, r in enumerate(rows):
    assert tuple(r) == tables.MDL.columns
    assert (r["model"], r["step"], r["task"], r["layer"], r["head"], r["n"]) == ("tiny", 100, "upos", 2, g, N)
    for c in tables.MDL.int_columns:
      assert type(r[c]) is int
    for c in tables.MDL.float_columns:
      assert type(r[c]) is float and math.isfinite(r[c]) and r[c] > 0
    # the same seed, words and labels: the same code as the fixture's, bit for bit
    assert r["codelength_bits"] == codes["task"].codelength_bits_G[g]
    assert r["control_codelength_bits"] == codes["control"].codelength_bits_G[g]
    assert r["compression"] == r["uniform_bits"] / r["codelength_bits"]
    assert r["control_compression"] == r["uniform_bits"] / r["control_codelength_bits"]
  path = tmp_path / "probes" / "mdl.csv"
  path.parent.mkdir()
  tables.write(path, rows, tables.MDL)
  back = tables.read(path, tables.MDL)
  assert [int(r["head"]) for r in back] == heads
  assert float(back[4]["compression"]) == pytest.approx(rows[4]["compression"], rel=1e-5)


def test_single_group_unseen_class_is_finite():
  """A class seen once, in the last block, is coded with finite bits: the escape gives it 1/(n + K)
  (n the words before its block), with or without the uniform floor."""
  rng = np.random.default_rng(3)
  n = 200
  y = rng.integers(0, K - 1, n).astype(np.int32)
  x = (3.0 * rng.standard_normal((K, D))[y] + rng.standard_normal((n, D))).astype(np.float32)
  order = np.random.default_rng(0).permutation(n)  # the shuffle online_codelength makes with seed 0
  y[order[-1]] = K - 1  # the last word sent: its class is in no training portion
  out = {}
  for mix in (mdl.DEFAULT_UNIFORM_MIX, 0.0):
    r = out[mix] = mdl.online_codelength(x, y, K, fractions=(0.1, 1.0), uniform_mix=mix, seed=0, fit_options=FIT)
    assert r["boundaries"] == (0, 20, 200) and r["n"] == n
    assert r["first_block_bits"] == r["block_bits"][0] == 20 * math.log2(K)
    assert np.isfinite(r["block_bits"]).all() and math.isfinite(r["codelength_bits"])
    assert r["compression"] > 2
    # the rare word costs about log2(20 + K) bits (the escape), the other 179 words little
    assert math.log2(20 + K) < r["block_bits"][1] < math.log2(20 + K) + 0.1 + 179 * 0.5, (mix, r["block_bits"])
  assert out[0.0]["codelength_bits"] < out[mdl.DEFAULT_UNIFORM_MIX]["codelength_bits"]  # the floor's small cost


def test_bad_input():
  x = np.zeros((20, 1, 3), np.float32)
  with pytest.raises(UserError):
    mdl.online_codelengths(x, {"a": (np.zeros(19, np.int32), 3)})
  with pytest.raises(UserError):
    mdl.online_codelengths(x, {"a": (np.full(20, 3, np.int32), 3)})
  with pytest.raises(UserError):
    mdl.online_codelengths(x, {"a": (np.zeros(20, np.int32), 1)})
  with pytest.raises(UserError):
    mdl.online_codelengths(x, {"a": (np.zeros(20, np.int32), 3)}, fit_options={"l2_grid": (1.0,)})
  with pytest.raises(UserError):
    mdl.mdl_rows("m", 0, 0, [0, 1], x, {"a": (np.zeros(20, np.int32), np.zeros(20, np.int32), 3)})


def test_portions_are_whole_sentences():
  """Voita & Titov portion examples (sentences), not words. With each word's sentence given, the
  sentences are shuffled whole and every block boundary falls between sentences, at t_i = the words of the
  first ⌊f_i·S⌋ shuffled sentences; the old word rule cut sentences apart (checked on the same words)."""
  rng = np.random.default_rng(1)
  lengths = rng.integers(1, 25, 400)
  sentence_N = np.repeat(rng.permutation(10_000)[:400], lengths)  # ids need not be 0..S-1
  order, words_S = mdl.sentence_order(sentence_N, seed=3)
  assert sorted(order) == list(range(len(sentence_N))) and words_S.sum() == len(sentence_N)
  sent = sentence_N[order]
  starts = {0, len(sent)} | {t for t in range(1, len(sent)) if sent[t] != sent[t - 1]}
  assert len(starts) == 401  # each sentence's words are sent together
  cuts = mdl.sentence_block_boundaries(words_S)
  ends = np.cumsum(words_S)
  assert set(cuts) <= starts and cuts[-1] == len(sent)
  want = [int(ends[int(f * 400) - 1]) for f in mdl.DEFAULT_FRACTIONS if int(f * 400) >= 1]
  assert list(cuts[2:]) == sorted(set(t for t in want if t > cuts[1]))
  assert cuts[1] >= mdl.MIN_FIRST_BLOCK and len(set(sent[: cuts[1]])) == int(np.searchsorted(ends, cuts[1])) + 1
  word_cuts = mdl.block_boundaries(len(sent))
  assert not set(word_cuts) <= starts  # the word rule splits sentences between blocks
  x, y, control = _problem()
  n = N
  sentence_N = np.repeat(np.arange(N), 5)[:N]  # 400 sentences of 5 words
  codes = mdl.online_codelengths(
    x[:, 4:], {"task": (y, K)}, fractions=FRACTIONS, seed=0, fit_options=FIT, sentence_N=sentence_N
  )
  assert codes["task"].boundaries == (0, 10, 50, 200, 600, n)  # 2, 10, 40, 120, 400 sentences of 5 words
  assert codes["task"].block_bits_GB[0, 0] == pytest.approx(10 * math.log2(K))
  assert codes["task"].compression_G[0] > 2  # separable clusters still compress
  with pytest.raises(UserError, match="sentence_N"):
    mdl.online_codelengths(x, {"task": (y, K)}, fractions=FRACTIONS, fit_options=FIT, sentence_N=sentence_N[:-1])
