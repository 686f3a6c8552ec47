"""Hewitt & Manning's structural probes (headspec/probing/structural.py): trees, MST decoding, metrics, and
recovery of known trees from features whose squared distances are tree distances under a known map."""

import networkx as nx
import numpy as np
import pytest
import test_probe_suite

from headspec.errors import UserError
from headspec.probing import structural


def _random_tree(rng, n: int) -> np.ndarray:
  """heads (1-based, 0 = ROOT) of a random tree: word 1..n-1 attach to an earlier-built word."""
  order = rng.permutation(n)
  heads = np.zeros(n, np.int64)
  for k in range(1, n):
    heads[order[k]] = order[rng.integers(0, k)] + 1
  return heads


def _trees(rng, num: int, lengths=(3, 14), punct_rate=0.0) -> list[structural.Tree]:
  out = []
  for _ in range(num):
    heads = _random_tree(rng, int(rng.integers(*lengths)))
    leaf = ~np.isin(np.arange(1, len(heads) + 1), heads)
    out.append(structural.Tree(heads, leaf & (heads != 0) & (rng.random(len(heads)) < punct_rate)))
  return out


def _embed(trees, mix) -> np.ndarray:
  """x_N1K with ‖y_i − y_j‖² = tree distance and ‖y_i‖² = depth (y_i: the sum of one orthonormal vector
  per word on the path from the root to word i, root excluded), then mixed by a known full-rank map."""
  dim = mix.shape[0]
  xs = []
  for t in trees:
    n = len(t.heads)
    y = np.zeros((n, dim))
    for i in range(n):
      j = i
      while t.heads[j] != 0:
        y[i, j] = 1.0
        j = t.heads[j] - 1
    xs.append(y @ mix)
  return np.concatenate(xs)[:, None, :].astype(np.float32)


def test_tree_distances_and_depths():
  t = structural.Tree(np.array([2, 0, 2, 3]), np.zeros(4, bool))  # 1 <- 2 -> 3 -> 4
  np.testing.assert_array_equal(t.distances(), [[0, 1, 2, 3], [1, 0, 1, 2], [2, 1, 0, 1], [3, 2, 1, 0]])
  np.testing.assert_array_equal(t.depths(), [1, 0, 1, 2])


def test_tree_distances_match_scipy_shortest_paths():
  import scipy.sparse
  import scipy.sparse.csgraph

  rng = np.random.default_rng(2)
  for t in _trees(rng, 50, lengths=(1, 30)):
    n, child = len(t.heads), np.flatnonzero(t.heads > 0)
    graph = scipy.sparse.csr_matrix((np.ones(len(child)), (child, t.heads[child] - 1)), shape=(n, n))
    np.testing.assert_array_equal(t.distances(), scipy.sparse.csgraph.shortest_path(graph, directed=False))


@pytest.mark.parametrize("heads", [[0, 0], [1, 0], [2, 3, 1], [0, 5], [0, 3, 2], [0, 1, 4, 3]])
def test_not_a_tree_is_one_line(heads):
  with pytest.raises(UserError, match="structural probe"):
    structural.Tree(np.array(heads), np.zeros(len(heads), bool)).distances()


def test_mst_matches_networkx():
  rng = np.random.default_rng(0)
  for n in (2, 3, 7, 15):
    d_GNN = rng.random((4, n, n))
    d_GNN = d_GNN + d_GNN.transpose(0, 2, 1)
    parent = structural.mst_parents(d_GNN)
    for g in range(4):
      graph = nx.Graph()
      graph.add_weighted_edges_from((i, j, d_GNN[g, i, j]) for i in range(n) for j in range(i + 1, n))
      want = {tuple(sorted(e)) for e in nx.minimum_spanning_tree(graph).edges()}
      assert structural._edges(parent[g]) == want


def test_linear_baseline_scores_a_chain_perfectly_and_a_star_poorly():
  chain = structural.Tree(np.array([0, 1, 2, 3, 4, 5]), np.zeros(6, bool))
  star = structural.Tree(np.array([0, 1, 1, 1, 1, 1]), np.zeros(6, bool))
  for trees, uuas in (([chain], 1.0), ([star], 0.2)):
    scores = structural.score_sentences(structural.linear_predictions(trees, "distance"), trees, "distance")
    assert structural.metrics(scores, num_resamples=10)["uuas"][0][0] == pytest.approx(uuas)
  scores = structural.score_sentences(structural.linear_predictions([chain], "depth"), [chain], "depth")
  out = structural.metrics(scores, num_resamples=10)
  assert out["root_acc"][0][0] == 1.0 and out["nspr"][0][0] == pytest.approx(1.0)


def test_punctuation_is_left_out_of_uuas_and_root_accuracy():
  tree = structural.Tree(np.array([2, 0, 2, 2, 2, 2]), np.array([0, 0, 0, 0, 0, 1], bool))
  pred = tree.distances()[None].copy()
  pred[0, 5, :] = pred[0, :, 5] = 0.01  # the punctuation word looks central: would steal every edge
  pred[0, 5, 5] = 0
  scores = structural.score_sentences([pred], [tree], "distance")
  assert scores.total_U[0] == 4 and scores.correct_UG[0, 0] == 4
  depth = tree.depths()[None].copy()
  depth[0, 5] = -1.0  # the least deep word is punctuation: skipped
  assert structural.score_sentences([depth], [tree], "depth").correct_UG[0, 0] == 1


def test_hewitt_manning_ptb_punctuation_is_an_option_beside_upos_punct():
  """H&M leave out the words whose XPOS is one of 7 PTB tags (reporter.py: '' , . : `` -LRB- -RRB-),
  not UD's UPOS PUNCT: with probe.structural_punctuation='ptb' a hyphen (HYPH, UPOS PUNCT) and a '$' (UPOS
  SYM) stay in UUAS's trees while brackets and the full stop are left out; 'upos' (the default) is unchanged,
  and a third value is one line before any model runs."""
  from headspec.probing import plan, tasks
  from headspec.probing.config import probe_config

  assert structural.PTB_PUNCTUATION_TAGS == ("''", ",", ".", ":", "``", "-LRB-", "-RRB-")
  upos = ("PRON", "PUNCT", "VERB", "SYM", "NUM", "PUNCT", "INTJ", "PUNCT", "PUNCT")
  xpos = ("PRP", "HYPH", "VBD", "$", "CD", "-LRB-", "UH", "-RRB-", ".")
  ud = structural.punctuation(upos, xpos)
  ptb = structural.punctuation(upos, xpos, "ptb")
  assert ud.tolist() == [0, 1, 0, 0, 0, 1, 0, 1, 1] and ptb.tolist() == [0, 0, 0, 0, 0, 1, 0, 1, 1]
  heads = np.array([3, 3, 0, 5, 3, 7, 3, 7, 3])
  pred = structural.Tree(heads, ud).distances()[None].astype(float)
  totals = [structural.score_sentences([pred], [structural.Tree(heads, f)], "distance").total_U[0] for f in (ud, ptb)]
  assert totals == [4, 5]  # UUAS's gold edges: over 5 and over 6 kept words
  with pytest.raises(UserError, match="punctuation"):
    structural.punctuation(upos, xpos, "both")
  from headspec.data.treebank import Sentence

  sentence = Sentence("s1", ("He", "-", "said", "$", "5", "(", "ok", ")", "."), upos, xpos, tuple(heads), ("x",) * 9)
  config = probe_config()
  assert config.probe.structural_punctuation == "upos"
  task = tasks.StructuralTask("distance")
  assert task.labels([sentence], None, config)[0].punct.tolist() == ud.tolist()
  config.probe.structural_punctuation = "ptb"
  assert task.labels([sentence], None, config)[0].punct.tolist() == ptb.tolist()
  assert task.control([sentence], None, config)[0].punct.tolist() == ptb.tolist()
  config.probe.structural_punctuation = "PUNCT"
  with pytest.raises(UserError, match="structural_punctuation"):
    plan.check_config(config)


def _scores_one_by_one(pred, trees, kind):
  """The metrics' sums sentence by sentence, with networkx's MST and scipy's spearmanr: what the stacked
  scoring must reproduce."""
  import scipy.stats

  out = []
  for p, t in zip(pred, trees):
    keep = np.flatnonzero(~t.punct)
    n = len(t.heads)
    if kind == "distance":

      def mst(d, keep=keep):
        graph = nx.Graph()
        graph.add_weighted_edges_from((int(keep[i]), int(keep[j]), d[i, j]) for i in range(len(keep)) for j in range(i))
        return {tuple(sorted(e)) for e in nx.minimum_spanning_tree(graph).edges()}

      gold = mst(t.distances()[np.ix_(keep, keep)]) if len(keep) > 1 else set()
      shared = [len(gold & mst(pg[np.ix_(keep, keep)])) if len(keep) > 1 else 0 for pg in p]
      rho = [sum(np.nan_to_num(scipy.stats.spearmanr(pg[i], t.distances()[i])[0]) for i in range(n)) for pg in p]
      out.append((shared, len(gold), rho, n))
    else:
      root = int(np.flatnonzero(t.heads == 0)[0])
      hit = [int(np.argmin(np.where(t.punct, np.inf, pg)) == root) if not t.punct.all() else 0 for pg in p]
      rho = [np.nan_to_num(scipy.stats.spearmanr(pg, t.depths())[0]) for pg in p]
      out.append((hit, int(not t.punct.all()), rho, 1))
  return out


@pytest.mark.parametrize("kind", structural.KINDS)
def test_stacked_scoring_matches_sentence_by_sentence(kind):
  rng = np.random.default_rng(4)
  trees = _trees(rng, 60, lengths=(1, 9), punct_rate=0.3)  # many sentences per length, some all punctuation
  pred = [
    (3 * rng.random((3, len(t.heads), len(t.heads))) + t.distances())
    if kind == "distance"
    else rng.random((3, len(t.heads)))
    for t in trees
  ]
  pred = [(p + p.transpose(0, 2, 1)) / 2 if kind == "distance" else p for p in pred]
  for p in pred:
    if kind == "distance":
      p[:, np.arange(p.shape[1]), np.arange(p.shape[1])] = 0
  got = structural.score_sentences(pred, trees, kind)
  want = _scores_one_by_one(pred, trees, kind)
  np.testing.assert_array_equal(got.correct_UG, [w[0] for w in want])
  np.testing.assert_array_equal(got.total_U, [w[1] for w in want])
  np.testing.assert_allclose(got.spearman_UG, [w[2] for w in want], atol=1e-12)
  np.testing.assert_array_equal(got.count_U, [w[3] for w in want])
  assert got.correct_UG.sum() > 0 and (got.correct_UG < got.total_U[:, None]).any()  # neither all nor none


@pytest.mark.parametrize("kind", structural.KINDS)
@pytest.mark.parametrize("scale", structural.SCALES)
def test_recovers_known_trees(kind, scale):
  """Raw features (the default, as H&M) mixed by a map with orthonormal rows, so they keep the tree's scale;
  standardised ones (scale='std') mixed by a map whose dimensions differ in scale by 10^±1.5, which the
  standardisation removes."""
  rng = np.random.default_rng(1)
  train, dev = _trees(rng, 200, lengths=(3, 12)), _trees(rng, 40, lengths=(5, 12), punct_rate=0.2)
  mix = np.linalg.qr(rng.normal(size=(24, 16)))[0].T
  if scale == "std":
    mix = mix * 10.0 ** rng.uniform(-1.5, 1.5, size=24)
  x_train, x_dev = _embed(train, mix), _embed(dev, mix)
  noise = np.concatenate([x_train, rng.normal(size=x_train.shape).astype(np.float32)], axis=1)  # group 2: noise
  noise_dev = np.concatenate([x_dev, rng.normal(size=x_dev.shape).astype(np.float32)], axis=1)
  fitted = structural.fit_structural_probes(
    noise, train, noise_dev, dev, kind=kind, rank=16, epochs=40, learning_rate=1e-2, batch_words=64, seed=0,
    scale=scale,
  )  # fmt: skip
  out = structural.metrics(structural.score_sentences(structural.predictions(fitted, noise_dev, dev), dev, kind))
  names = ("uuas", "dspr") if kind == "distance" else ("root_acc", "nspr")
  assert out[names[0]][0][0] == 1.0 and out[names[1]][0][0] > 0.9  # < 1: gold values tie, predictions do not
  assert out[names[0]][0][1] < 0.6 and out[names[1]][0][1] < 0.6  # features of noise: no tree
  value, low, high = out[names[1]]
  assert (low <= value).all() and (value <= high).all()


def test_control_trees_are_trees_fixed_by_word_type():
  from headspec.probing import controls

  sentences = [("The", "cat", "sat", ".", "the", "dog"), ("Dogs", "sat", "the", "cat")]
  heads = controls.control_tree_heads(sentences, seed=3)
  for h in heads:
    structural.Tree(h, np.zeros(len(h), bool)).distances()  # a tree: raises otherwise
    assert h[0] == 0 and all(x in (1, i) for i, x in enumerate(h[1:], start=1))
  attach_first = {w.lower(): h[i] == 1 for words, h in zip(sentences, heads) for i, w in enumerate(words) if i > 1}
  assert attach_first["cat"] == (heads[0][1] == 1)  # the same type, the same behaviour
  assert any(controls.control_tree_heads(sentences, seed=s)[0].tolist() != heads[0].tolist() for s in range(4, 9))
  assert controls.control_tree_heads(sentences, seed=3)[0].tolist() == heads[0].tolist()


ewt_part = test_probe_suite.ewt_part  # the fixture: 300/80/80 sentences of EWT dev, 40 of GUM dev


def test_probe_command_writes_structural_rows(ewt_part, tmp_path):
  """`headspec probe` with the distance and depth tasks: probes/structural.csv per group, metric and split,
  the linear baselines in baselines.csv, a summary.md section and per-head heatmaps."""
  from headspec.io import tables
  from headspec.probing import run as probe_run

  data, texts = ewt_part
  workdir = test_probe_suite._make_run(tmp_path / "run", texts)
  config = test_probe_suite._config(data)
  config.probe.tasks = ("distance", "depth")
  config.probe.structural_epochs = 3
  config.probe.eval_splits, config.probe.extra_treebanks = ("test",), ()
  probe_run.run(config, workdir)
  rows = tables.read(workdir / "probes/structural.csv", tables.PROBE_STRUCTURAL)
  splits = {"en_ewt/dev", "en_ewt/test"}  # dev: scored for the rankings
  groups = 2 * 2 + 2 + 1
  assert len(rows) == 2 * 2 * groups * len(splits)  # tasks x metrics x groups x splits
  assert {(r["task"], r["metric"]) for r in rows} == {
    ("distance", "uuas"), ("distance", "dspr"), ("depth", "root_acc"), ("depth", "nspr")
  }  # fmt: skip
  for r in rows:
    assert r["split"] in splits and int(r["rank"]) == (8 if int(r["head"]) >= 0 else 16)  # capped at the width
    assert float(r["ci_low"]) <= float(r["value"]) <= float(r["ci_high"])
    assert float(r["selectivity"]) == pytest.approx(float(r["value"]) - float(r["control_value"]), abs=2e-6)
  base = tables.read(workdir / "probes/baselines.csv", tables.PROBE_BASELINES)
  assert {b["baseline"] for b in base} == {"linear_uuas", "linear_dspr", "linear_root_acc", "linear_nspr"}
  assert "## Structural probes" in (workdir / "probes/summary.md").read_text()
  assert (workdir / "probes/heatmap_uuas.png").is_file() and (workdir / "probes/heatmap_nspr.png").is_file()
