"""headspec.attention on hand-built maps: word pooling, Clark accuracy, baselines, rollout, flow, roles."""

import types

import jax.numpy as jnp
import numpy as np
import pytest

from headspec.attention import clark, flow, roles, words
from headspec.attention.config import attention_config
from headspec.data.treebank import Sentence
from headspec.errors import UserError


def sentence(heads, deprels, upos=None):
  n = len(heads)
  return Sentence(
    "s", tuple(f"w{i}" for i in range(n)), tuple(upos or ["NOUN"] * n), ("_",) * n, tuple(heads), tuple(deprels)
  )


# Two sentences: "w0 w1 w2 w3" with w1 root; "w0 w1 w2 w3 w4" with w2 root.
SENTENCES = [
  sentence([2, 0, 2, 3], ["det", "root", "obj", "nmod:poss"]),
  sentence([3, 3, 0, 5, 3], ["det", "amod", "root", "det", "obj"]),
]


def one_hot_maps(target_of, special_share=0.0, L=1, H=1):
  """Word maps where word j of each sentence puts all its attention on target_of(sentence, j) (None: a special)."""
  maps = []
  for u, s in enumerate(SENTENCES):
    n = len(s.words)
    attn, special = np.zeros((L, H, n, n)), np.zeros((L, H, n))
    for j in range(n):
      t = target_of(u, j, n)
      if t is None:
        special[..., j] = 1.0
      else:
        attn[..., j, t] = 1.0 - special_share
        special[..., j] = special_share
    maps.append((attn, special))
  return maps


def stats_of(maps, causal=False, num_specials=2):
  punct = np.zeros(sum(len(s.words) for s in SENTENCES), bool)
  return words.stats_from_maps(maps, punct, causal=causal, num_specials=num_specials)


def test_pooling_sums_columns_and_averages_rows():
  # Tokens: [CLS] a b1 b2 [SEP]; word 0 = a (token 1), word 1 = b (tokens 2, 3).
  rng = np.random.default_rng(0)
  probs_TS = rng.random((5, 5))
  probs_TS /= probs_TS.sum(-1, keepdims=True)
  to_WT = np.zeros((5, 5), np.float32)
  to_WT[0, 1] = to_WT[1, 2] = to_WT[1, 3] = 1.0
  special_T = np.array([1, 0, 0, 0, 1], bool)
  attn, special, _, special_max = (
    np.asarray(x) for x in words.pool_words(jnp.asarray(probs_TS)[None, None, None], to_WT[None], special_T[None])
  )
  attn_WW = attn[0, 0, 0]
  np.testing.assert_allclose(attn_WW[0, 0], probs_TS[1, 1], rtol=1e-6)
  np.testing.assert_allclose(attn_WW[0, 1], probs_TS[1, 2] + probs_TS[1, 3], rtol=1e-6)  # TO a word: sum
  np.testing.assert_allclose(attn_WW[1, 0], (probs_TS[2, 1] + probs_TS[3, 1]) / 2, rtol=1e-6)  # FROM: mean
  np.testing.assert_allclose(attn_WW[1, 1], (probs_TS[2, 2:4].sum() + probs_TS[3, 2:4].sum()) / 2, rtol=1e-6)
  np.testing.assert_allclose(
    special[0, 0, 0, 1], (probs_TS[2, [0, 4]].sum() + probs_TS[3, [0, 4]].sum()) / 2, rtol=1e-6
  )
  np.testing.assert_allclose(attn_WW[:2].sum(-1) + special[0, 0, 0, :2], 1.0, rtol=1e-6)  # rows still sum to 1
  assert special_max.shape == (1, 1, 1, 5)
  assert np.all(attn_WW[2:] == 0) and np.all(attn_WW[:, 2:] == 0)  # padding words


def gold_head(u, j, n):
  h = SENTENCES[u].heads[j]
  return None if h == 0 else h - 1


def test_gold_map_scores_one_and_next_word_map_equals_offset_baseline():
  arcs = clark.split_arcs(SENTENCES)
  relations = clark.relation_set(arcs, min_count=1)
  assert "root" not in relations and relations[-1] == "all" and "nmod" in relations  # subtype stripped
  gold = clark.score_split(
    stats_of(one_hot_maps(gold_head)), arcs, relations, causal=False, arc_set="auto", max_offset=5
  )
  for r in relations:
    assert gold.accuracy[(r, "dependent_to_head")][0, 0] == 1.0

  nxt = clark.score_split(
    stats_of(one_hot_maps(lambda u, j, n: j + 1 if j + 1 < n else None)),
    arcs,
    relations,
    causal=False,
    arc_set="auto",
    max_offset=5,
  )
  for key, acc in nxt.accuracy.items():
    assert acc[0, 0] == pytest.approx(nxt.baseline[key][1])  # the +1 offset baseline
  assert nxt.n[("all", "dependent_to_head")] == 7  # every non-root arc


def test_head_to_dependent_is_clarks_column_argmax_and_decoders_score_reachable_arcs():
  """head_to_dependent (Clark et al.'s `attn_head_predictor(mode="transpose")`): each dependent predicts the word
  that attends to it most. A head word spreading its attention evenly over its dependents is right on every arc
  (the row argmax of the head word would be right on one dependent per head word: 4 of 7 arcs)."""
  arcs = clark.split_arcs(SENTENCES)
  relations = clark.relation_set(arcs, min_count=1)
  maps = []
  for s in SENTENCES:
    n = len(s.words)
    attn, special = np.zeros((1, 1, n, n)), np.zeros((1, 1, n))
    for j in range(n):
      deps = [k for k, h in enumerate(s.heads) if h == j + 1]
      attn[0, 0, j, deps] = 1.0 / len(deps) if deps else 0.0
      special[0, 0, j] = 0.0 if deps else 1.0
    maps.append((attn, special))
  s = clark.score_split(stats_of(maps), arcs, relations, causal=False, arc_set="auto", max_offset=5)
  for r in relations:
    assert s.accuracy[(r, "head_to_dependent")][0, 0] == 1.0
    assert s.accuracy[(r, "dependent_to_head")][0, 0] == 0.0  # nobody attends to its own head
  # Every word attends to its head: then the word that attends to a dependent most is one of ITS dependents.
  g = clark.score_split(stats_of(one_hot_maps(gold_head)), arcs, relations, causal=False, arc_set="auto", max_offset=5)
  assert g.accuracy[("all", "dependent_to_head")][0, 0] == 1.0
  assert g.accuracy[("all", "head_to_dependent")][0, 0] == 0.0
  dec = clark.score_split(stats_of(one_hot_maps(gold_head)), arcs, relations, causal=True, arc_set="auto", max_offset=5)
  assert dec.n[("all", "dependent_to_head")] == 3  # head precedes the dependent: obj, nmod of sentence 1, obj of 2
  assert dec.total[("all", "dependent_to_head")] == 7
  assert set(dec.baseline[("all", "dependent_to_head")]) == {-5, -4, -3, -2, -1}
  with pytest.raises(UserError, match="decoder"):
    clark.scored_arcs(arcs, "dependent_to_head", "all", causal=True)


def test_relation_filter_matching_nothing_is_a_user_error():
  arcs = clark.split_arcs(SENTENCES)
  assert clark.relation_set(arcs, min_count=1, wanted=("obj", "nmod:poss")) == ["obj", "nmod", "all"]
  with pytest.raises(UserError, match="none occurs"):
    clark.relation_set(arcs, min_count=1, wanted=("nsubj",))


def test_rollout_of_identity_is_identity_and_flow_matches_hand_max_flow():
  eye = np.broadcast_to(np.eye(4), (3, 2, 4, 4))
  np.testing.assert_allclose(flow.rollout(eye), eye[:, 0])
  # 2 layers, 2 tokens, 1 head. Ã_0 = [[1, 0], [.5, .5]], Ã_1 = [[.5, .5], [0, 1]].
  probs = np.array([[[[1.0, 0.0], [1.0, 0.0]]], [[[0.0, 1.0], [0.0, 1.0]]]])
  np.testing.assert_allclose(flow.rollout(probs)[-1], [[0.75, 0.25], [0.5, 0.5]])
  # By hand: output 0 -> input 0 through middle 0 (min(.5, 1)) and middle 1 (min(.5, .5)) = 1; output 0 ->
  # input 1 only through middle 1 = .5; output 1 -> either input only through middle 1 (cap .5 each).
  np.testing.assert_allclose(flow.flow(probs, normalize=False), [[1.0, 0.5], [0.5, 0.5]])
  np.testing.assert_allclose(flow.flow(probs), [[2 / 3, 1 / 3], [0.5, 0.5]])


def role_outputs(maps, causal=False, num_specials=2):
  ws = stats_of(maps, causal=causal, num_specials=num_specials)
  arcs = clark.split_arcs(SENTENCES)
  scores = clark.score_split(
    ws, arcs, clark.relation_set(arcs, min_count=1), causal=causal, arc_set="auto", max_offset=5
  )
  freq = np.arange(ws.num_words, 0, -1).astype(float)  # the last word of each sentence is the rarest
  out, info = roles.role_scores(ws, freq, scores, arcs, min_count=1, num_resamples=50, seed=0)
  return out, roles.label_rows(out, info, attention_config().roles, model="m", step=0, frequency_source="test")


def test_roles_of_hand_built_heads():
  out, labels = role_outputs(one_hot_maps(lambda u, j, n: j - 1 if j else None))  # all on the previous word
  assert out["argmax_prev"][0][0, 0] == 1.0 and out["attend_prev"][0][0, 0] == pytest.approx(7 / 9)
  assert {r["label"] for r in labels} >= {"positional", "focused"} and "delimiter" not in {r["label"] for r in labels}
  assert "relative position -1" in next(r["rule"] for r in labels if r["label"] == "positional")

  out, labels = role_outputs(one_hot_maps(lambda u, j, n: None))  # all on [SEP]
  assert out["attend_special"][0][0, 0] == 1.0
  assert out["positional"][0][0, 0] == pytest.approx(2 / 9)  # the first words: the special is the token before
  assert {r["label"] for r in labels} == {"delimiter", "focused"}

  out, labels = role_outputs(one_hot_maps(lambda u, j, n: n - 1))  # the rarest word
  assert out["rare_word"][0][0, 0] == 1.0 and "rare_word" in {r["label"] for r in labels}

  n = [len(s.words) for s in SENTENCES]
  uniform = [(np.full((1, 1, k, k), 1 / k), np.zeros((1, 1, k))) for k in n]  # no special tokens
  out, labels = role_outputs(uniform, num_specials=0)
  assert out["entropy_ratio"][0][0, 0] == pytest.approx(1.0) and "broad" in {r["label"] for r in labels}
  low, high = out["entropy"][1][0, 0], out["entropy"][2][0, 0]
  assert low <= out["entropy"][0][0, 0] <= high


def test_unknown_role_label_is_a_user_error():
  with pytest.raises(UserError, match="unknown role"):
    roles.check_labels(("positional", "induction"))


def test_a_word_longer_than_every_window_is_a_user_error():
  tok = types.SimpleNamespace(prefix_ids=(1,), suffix_ids=(2,), word_pieces=lambda ws: [[5] * len(w) for w in ws])
  with pytest.raises(UserError, match="no window can hold it"):
    words._align([["ab", "abcdefghij"]], tok, max_len=8, causal=False, names=["s-1"])


def test_positional_is_scored_on_tokens():
  """A perfect previous-TOKEN head over words of two pieces: Voita et al.'s rule holds for every query token
  (score 1), while the word-level map of the same head never peaks at the previous word."""
  T = 6  # [BOS] a1 a2 b1 b2 b3
  probs_TT = np.zeros((T, T), np.float32)
  probs_TT[0, 0] = 1.0
  for t in range(1, T):
    probs_TT[t, t - 1] = 1.0
  probs = jnp.asarray(probs_TT)[None, None, None]  # [L=1, B=1, H=1, T, T]
  to_WT = np.zeros((1, 2, T), np.float32)
  to_WT[0, 0, 1:3] = to_WT[0, 1, 3:6] = 1.0
  out = words.token_positional(probs, jnp.ones((1, T), bool), jnp.asarray(to_WT), causal=True)
  np.testing.assert_array_equal(np.asarray(out["token_prev"])[0, 0, 0], [2, 3])
  np.testing.assert_array_equal(np.asarray(out["token_prev_n"])[0, 0, 0], [2, 3])
  assert np.asarray(out["token_next_n"]).sum() == 0  # a decoder never sees the next token
  special = np.array([[True, False, False, False, False, False]])
  stats = words.query_stats(
    *words.pool_words(probs, jnp.asarray(to_WT), jnp.asarray(special)),
    jnp.zeros((1, 2), bool),
    jnp.ones((1, 2), bool),
    jnp.ones((1, 2), bool),
    True,
  )
  np.testing.assert_array_equal(np.asarray(stats["argmax_any"])[0, 0, 0], [0, 1])  # word level: each word itself


def test_syntactic_label_is_chosen_on_dev_and_kept_only_if_it_holds_on_the_report_split():
  arcs = clark.split_arcs(SENTENCES)
  relations = clark.relation_set(arcs, min_count=1)
  score = lambda maps: clark.score_split(stats_of(maps), arcs, relations, causal=False, arc_set="auto", max_offset=5)
  gold = one_hot_maps(gold_head)
  ws = stats_of(gold)
  freq = np.arange(ws.num_words, 0, -1).astype(float)
  out, info = roles.role_scores(ws, freq, score(gold), arcs, min_count=1, num_resamples=50, seed=0)
  cfg = attention_config().roles
  label = lambda confirmed: {
    r["label"]
    for r in roles.label_rows(
      out, info, cfg, model="m", step=0, frequency_source="t", confirmed=confirmed, report_split="x/test"
    )
  }
  assert "syntactic" in label(None)  # no report split: chosen on dev, said to be unconfirmed
  assert "syntactic" in label(roles.confirm_syntactic(info, score(gold)))  # holds on the report split
  elsewhere = one_hot_maps(lambda u, j, n: None)  # on the report split the head attends only to [SEP]
  assert "syntactic" not in label(roles.confirm_syntactic(info, score(elsewhere)))
