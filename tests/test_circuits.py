"""Edges and circuits (headspec/patching/edges.py, docs/circuits.md): the per-head input sites they edit, the
graph's edge count, EAP and EAP-IG against exact edge patching, faithfulness's end points and its agreement
with a direct patched run, and the known answer on the induction model."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from headspec.errors import UserError
from headspec.model.config import ModelConfig
from headspec.model.sites import Edit
from headspec.model.transformer import Transformer
from headspec.patching import core, edges
from headspec.patching import patch as patch_lib

jax.config.update("jax_default_matmul_precision", "highest")


def tiny(**options):
  """A random 2-layer decoder with MLPs and grouped-query attention (4 query heads, 2 K/V groups), weights
  large enough (std 0.2) that the prompts' metric differs."""
  sizes = dict(kind="decoder", vocab_size=40, num_layers=2, num_heads=4, num_kv_heads=2, d_model=32, d_head=8)
  cfg = ModelConfig(**(sizes | dict(d_ff=64, max_len=16) | options))
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(params=0)))
  return nnx.merge(graphdef, jax.tree.map(lambda a: a * 10 if a.ndim > 1 else a, params))


def tiny_prompts(cfg):
  rng = np.random.default_rng(0)
  clean = rng.integers(3, 40, (4, 7)).tolist()
  corrupt = [row[:2] + rng.integers(3, 40, 5).tolist() for row in clean]
  return patch_lib.prompts(cfg, clean, corrupt, [(5, 6), (7, 8), (9, 10), (11, 12)], "logit_diff")


@pytest.fixture(scope="module")
def model():
  return tiny()


# ------------------------------------------------------------------------------ the per-head input sites


def test_input_sites_reach_one_head_or_the_mlp_only():
  """Zero additions at q_in, k_in, v_in, mlp_in leave the logits as unedited (to rounding: the per-head
  projection sums in another order); an addition at one head's k_in changes that head's keys only, and one
  at mlp_in changes the MLP's output but not the residual stream it was read from."""
  model = tiny(positions="rotary", norm="rmsnorm", qk_norm="head")
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 40, (2, 7)), jnp.int32)
  base, inter = model(tokens, capture=("k", "q_in", "resid_pre", "resid_mid", "mlp_out"))
  zero = {name: Edit(add=jnp.zeros((2, 2, 7, 4, 32))) for name in ("q_in", "k_in", "v_in")}
  same, _ = model(tokens, interventions=zero | {"mlp_in": Edit(add=jnp.zeros((2, 2, 7, 32)))})
  np.testing.assert_allclose(same, base, atol=1e-5)
  np.testing.assert_array_equal(
    inter.q_in_LBTHD, jnp.broadcast_to(inter.resid_pre_LBTD[:, :, :, None], (2, 2, 7, 4, 32))
  )
  add = jnp.zeros((2, 2, 7, 4, 32)).at[1, :, :, 3].set(1.0)
  _, edited = model(tokens, interventions={"k_in": Edit(add=add)}, capture=("k",))
  changed_H = np.abs(np.asarray(edited.k_LBTHK - inter.k_LBTHK)).max(axis=(0, 1, 2, 4))
  assert changed_H[3] > 1e-2 and changed_H[:3].max() < 1e-5, changed_H  # head 3 only, not its group's head 2
  add = jnp.zeros((2, 2, 7, 32)).at[0].set(1.0)
  _, edited = model(tokens, interventions={"mlp_in": Edit(add=add)}, capture=("resid_mid", "mlp_out"))
  np.testing.assert_allclose(edited.resid_mid_LBTD[0], inter.resid_mid_LBTD[0], atol=1e-5)
  assert np.abs(np.asarray(edited.mlp_out_LBTD[0] - inter.mlp_out_LBTD[0])).max() > 1e-2


# ------------------------------------------------------------------------------ the graph


@pytest.mark.parametrize(
  "options", [{"mlp": False, "num_kv_heads": 0}, {}, {"parallel_residual": True}, {"num_layers": 3, "num_heads": 6}]
)
def test_edge_count_matches_the_formula(options):
  """E = Σ_l (H + 2G)(1 + l(H + M)) + M Σ_l (1 + l(H + 1) + H·[serial]) + 1 + L(H + M); K/V inputs are per group."""
  cfg = tiny(**options).cfg
  L, H, G, M = cfg.num_layers, cfg.num_heads, cfg.kv_heads, int(cfg.mlp)
  serial = 0 if cfg.parallel_residual else 1
  expected = sum((H + 2 * G) * (1 + layer * (H + M)) for layer in range(L))
  expected += M * sum(1 + layer * (H + 1) + H * serial for layer in range(L)) + 1 + L * (H + M)
  g = edges.graph(cfg)
  assert g.E == expected and len(g.edges_E2) == expected
  assert g.I == L * (H + 2 * G) + L * M + 1 and g.N == 1 + L * (H + M)
  names = {g.input_name(i) for i in range(g.I) if g.input_kind_I[i] == "k"}
  assert names == (
    {f"L{a}G{b}" for a in range(L) for b in range(G)} if G < H else {f"L{a}H{b}" for a in range(L) for b in range(H)}
  )


def test_models_that_are_not_sums_are_refused_in_one_line():
  with pytest.raises(UserError, match="post-LN"):
    edges.graph(tiny(pre_layernorm=False).cfg)
  with pytest.raises(UserError, match="sublayer-output norms"):
    edges.graph(tiny(sublayer_norm=True).cfg)


# ------------------------------------------------------------------------------ scores and exact patching


@pytest.mark.slow  # four compiled programs (about 15 s unloaded), shared by both directions
@pytest.mark.parametrize("direction", ["noising", "denoising"])
def test_eap_is_exact_patching_to_first_order_and_eap_ig_of_one_step_is_eap(model, direction):
  """In each direction, exact(scale=ε)/ε (the base run, clean for noising, with ε of the edge's difference
  a_other − a_base patched in) → the EAP score, every edge at once; EAP-IG with steps=1 interpolates at the
  base point only (k = 0), so it equals EAP; scores over two prompt batches equal those of one. The two
  directions' scores differ (the gradient is taken at another run)."""
  suffix = "" if direction == "noising" else "_denoising"
  p = tiny_prompts(model.cfg)
  eap, clean, corrupt = edges.scores(model, p, method="eap" + suffix)
  assert abs(clean - corrupt) > 0.1 and np.abs(eap).max() > 0.1
  small, clean_x, corrupt_x = edges.exact(model, p, scale=1e-3, direction=direction)
  assert (clean_x, corrupt_x) == pytest.approx((clean, corrupt), rel=1e-6)  # always (clean, corrupt), in order
  np.testing.assert_allclose(small / 1e-3, eap, atol=3e-3 * np.abs(eap).max())
  one, _, _ = edges.scores(model, p, method="eap_ig" + suffix, steps=1)
  np.testing.assert_allclose(one, eap, atol=1e-5)
  halves, _, _ = edges.scores(model, p, method="eap" + suffix, batch_size=2)  # rows 0-1, then 2-3
  np.testing.assert_allclose(halves, eap, atol=1e-5)
  other, _, _ = edges.scores(model, p, method="eap_denoising" if direction == "noising" else "eap")
  assert np.abs(other + eap).max() > 0.05 * np.abs(eap).max()  # not merely the other's sign flipped


def test_eap_and_exact_noise_from_the_clean_run_as_the_papers(model):
  """The papers' convention (Syed et al. 2023, Hanna et al. 2024; hannamw/EAP-IG attribute.py), checked through
  public sites only, on the edges into the logits: a node's output a(u) captured (embeddings, head_out,
  mlp_out) in both runs; the clean run with resid_post of the last layer given + (a_corrupt(u) − a_clean(u))
  is the exact score m(...) − m(clean), and ε of it, divided by ε, the EAP score (the gradient at the clean
  run, not the corrupted one)."""
  p = tiny_prompts(model.cfg)
  g = edges.graph(model.cfg)
  into_logits = np.flatnonzero(g.edges_E2[:, 0] == g.I - 1)
  eap, clean, corrupt = edges.scores(model, p, method="eap")
  exact, _, _ = edges.exact(model, p, edges=into_logits)
  tokens = [jnp.asarray(a) for a in (p.clean_BT, p.corrupt_BT, p.valid_BT)]
  value = lambda logits: float(
    core.metric_value("logit_diff", logits, jnp.asarray(p.last_B), jnp.asarray(p.answers_B2))
  )
  nodes = []
  for run in tokens[:2]:
    _, inter = model(run, valid_BT=tokens[2], capture=("embeddings", "head_out", "mlp_out"))
    per_layer = [[inter.head_out_LBTHD[a, :, :, h] for h in range(g.H)] + [inter.mlp_out_LBTD[a]] for a in range(g.L)]
    nodes.append([inter.embeddings_BTD] + [n for layer in per_layer for n in layer])  # edges.graph's node order
  last = model.cfg.num_layers - 1
  patched = lambda add: value(
    model(tokens[0], valid_BT=tokens[2], interventions={"resid_post": Edit(add=add, at=last)})[0]
  )
  for j, e in enumerate(into_logits):
    delta = nodes[1][g.edges_E2[e, 1]] - nodes[0][g.edges_E2[e, 1]]  # a_corrupt(u) − a_clean(u)
    assert patched(delta) - clean == pytest.approx(exact[j], abs=1e-4)
    assert (patched(1e-3 * delta) - clean) / 1e-3 == pytest.approx(eap[e], abs=3e-3 * np.abs(eap[into_logits]).max())


def spearman(a, b) -> float:
  import pandas as pd

  return float(pd.Series(a).rank().corr(pd.Series(b).rank()))


@pytest.mark.slow  # three compiled programs
def test_agreement_with_exact_edge_patching_on_a_random_model(model):
  """The issue's check on the random model with MLPs and grouped-query attention, noising (the papers'
  convention): both estimates rank the 82 edges as exact edge patching does (Spearman EAP 0.86, EAP-IG 0.88
  measured) and EAP-IG is at least as close as EAP, in rank and in value (Pearson 0.76, 0.86)."""
  p = tiny_prompts(model.cfg)
  exact, _, _ = edges.exact(model, p)
  eap, _, _ = edges.scores(model, p, method="eap")
  eap_ig, _, _ = edges.scores(model, p, method="eap_ig", steps=5)
  assert spearman(eap, exact) > 0.7 and spearman(eap_ig, exact) >= spearman(eap, exact)
  assert np.corrcoef(eap_ig, exact)[0, 1] >= np.corrcoef(eap, exact)[0, 1]


def test_exact_edges_are_data(model):
  """Different edges of the same count reuse one compiled sweep, and each equals its own one-edge sweep."""
  p = tiny_prompts(model.cfg)
  before = edges.TRACES["exact"]
  a, _, _ = edges.exact(model, p, edges=[0, 5, 40])
  b, _, _ = edges.exact(model, p, edges=[81, 5, 7])
  assert edges.TRACES["exact"] - before <= 1
  np.testing.assert_allclose(a[1], b[1], atol=1e-6)


def test_bad_scores_input_is_one_line(model):
  p = tiny_prompts(model.cfg)
  with pytest.raises(UserError, match="steps=0 must be an integer of at least 1"):
    edges.scores(model, p, method="eap_ig", steps=0)
  with pytest.raises(UserError, match="method='acdc'"):
    edges.scores(model, p, method="acdc")
  with pytest.raises(UserError, match="ig_from='clean': choose 'base'"):
    edges.scores(model, p, method="eap_ig", ig_from="clean")
  with pytest.raises(UserError, match="direction='forward': choose one of noising, denoising"):
    edges.exact(model, p, direction="forward")
  with pytest.raises(UserError, match="clean has 3 tokens and corrupt 2"):
    patch_lib.prompts(model.cfg, [[3, 4, 5]], [[3, 4]], [(5, 6)], "logit_diff")
  with pytest.raises(UserError, match="top_n=0 must be an integer in 1..82"):
    edges.circuit(np.ones(82), top_n=0)
  with pytest.raises(UserError, match="keeps no edge"):
    edges.circuit(np.ones(82), threshold=2.0)
  with pytest.raises(UserError, match=r"edges=\[3, 82\]; give edge indices in 0..81"):
    edges.exact(model, p, edges=[3, 82])


# ------------------------------------------------------------------------------ circuits


@pytest.mark.slow  # 29 s at load average ~8 on 2 cores (compiling the iterated circuit run)
def test_faithfulness_end_points_and_a_direct_run(model):
  """The full graph's faithfulness is 1 and the empty circuit's 0. Every edge but embeddings → L0H1's query
  input kept: the clean run with that head's q_in given the corrupted embeddings (the rest recomputing, so the
  change travels on through every kept edge), which is that edge's exact noising patch; only the embeddings →
  logits edge kept: the corrupted run with the logits' input given the clean embeddings, that edge's exact
  denoising patch."""
  p = tiny_prompts(model.cfg)
  g = edges.graph(model.cfg)
  one_q = int(np.flatnonzero((g.edges_E2[:, 0] == 1) & (g.edges_E2[:, 1] == 0))[0])  # input 1: layer 0 head 1's q
  direct = int(np.flatnonzero((g.edges_E2[:, 0] == g.I - 1) & (g.edges_E2[:, 1] == 0))[0])
  masks = np.ones((4, g.E), bool)
  masks[1], masks[2, one_q] = False, False
  masks[3] = np.arange(g.E) == direct
  faith, clean, corrupt = edges.faithfulness(model, p, masks)
  np.testing.assert_allclose(faith[:2], [1.0, 0.0], atol=1e-4)
  tokens = [jnp.asarray(a) for a in (p.clean_BT, p.corrupt_BT, p.valid_BT)]
  embed_clean, embed_corrupt = model.embed(tokens[0]), model.embed(tokens[1])
  add = jnp.zeros((2, 4, 7, 4, 32)).at[0, :, :, 1].set(embed_corrupt - embed_clean)
  logits, _ = model(tokens[0], valid_BT=tokens[2], interventions={"q_in": Edit(add=add)})
  m = float(core.metric_value("logit_diff", logits, jnp.asarray(p.last_B), jnp.asarray(p.answers_B2)))
  assert abs(m - clean) > 1e-3  # the edge matters, so the check below can fail
  np.testing.assert_allclose(faith[2], (m - corrupt) / (clean - corrupt), atol=1e-4)
  noised, _, _ = edges.exact(model, p, edges=[one_q])
  np.testing.assert_allclose(noised[0], m - clean, atol=1e-4)
  change, _, _ = edges.exact_denoising(model, p, edges=[direct])
  np.testing.assert_allclose(faith[3], change[0] / (clean - corrupt), atol=1e-4)


def test_a_small_gap_is_named_in_a_warning_and_in_the_rows(model, monkeypatch):
  """m(clean) − m(corrupt) = 4e-4 (seen on a quickstart prompt pair, faithfulness −2.29..1.43): faithfulness
  warns naming the gap, and the curve's rows say small_gap; a gap of 7.75 neither warns nor flags."""
  import warnings

  g = edges.graph(model.cfg)
  p = tiny_prompts(model.cfg)
  masks = np.ones((3, g.E), bool)
  masks[0], masks[2, : g.E // 2] = False, False
  for clean, corrupt, small in ((3.2004, 3.2, True), (7.8, 0.05, False)):

    def run(fn, model, p, metric, keep_CE, clean=clean, corrupt=corrupt, **options):  # m(C): the kept fraction
      return corrupt + keep_CE.mean(1) * (clean - corrupt), clean, corrupt

    monkeypatch.setattr(edges, "_call", run)
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      faith, _, _ = edges.faithfulness(model, p, masks)
      curve = edges.curve(model, p, {"eap": np.arange(g.E)}, [1, 2], random_sets=1)
    np.testing.assert_allclose(faith, [0.0, 1.0, (g.E - g.E // 2) / g.E], atol=1e-6)
    assert curve["small_gap"].tolist() == [small] * 4 and set(curve["direction"]) == {"noising"}
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(messages) == (2 if small else 0), messages
    assert not small or "m(clean) − m(corrupt) = 0.0004" in messages[0]
  assert edges.small_gap(1e-3, 0.0) and not edges.small_gap(0.5, 0.0) and edges.small_gap(200.0, 199.0)


# ------------------------------------------------------------------------------ known answer: the induction circuit


@pytest.mark.slow
def test_induction_circuit(attention_only_decoder):
  """On tests/induction_recipe.py's two-layer attention-only decoder (seed 0; its layer-0 partner is a
  duplicate-token head that the induction heads' queries compose with, tests/test_patching_known.py), exact
  edge patching (noising: the clean run with one edge corrupted) ranks first the embeddings → partner's key
  input, with partner → an induction head's query input (Q-composition) among its top 6. EAP-IG ranks that
  edge first with exact's sign, EAP (saturated: the gradient at the clean run) gives it the wrong sign and
  ranks it lower; EAP-IG agrees with exact in value (Pearson) more than EAP does and shares more of exact's
  top 5. The 20 edges EAP-IG ranks first keep most of the behaviour, random sets of 20 next to none
  (docs/circuits.md, `python -m benchmarks.bench_circuit --model=induction`)."""
  from induction_recipe import INDUCTION_N, INDUCTION_SPECIALS, INDUCTION_VOCAB

  from headspec.attention import induction as ind
  from headspec.patching import tasks

  model = attention_only_decoder(2)
  x = ind.repeated_random_tokens(INDUCTION_VOCAB, INDUCTION_SPECIALS, n=INDUCTION_N, count=100, seed=1, bos=(2,))
  found = ind.attention_scores(
    ind.run(model, x, np.ones(x.shape, bool), np.array(INDUCTION_SPECIALS)), resamples=2, seed=0
  )
  induction_H = np.asarray(found["induction"][0][1])
  partner = int(np.argmax(np.maximum(found["previous_token"][0][0], found["duplicate_token"][0][0])))
  clean, corrupt, answers = tasks.induction_pairs(INDUCTION_VOCAB, INDUCTION_SPECIALS, n=INDUCTION_N, count=32,
                                                  seed=2, bos=(2,))  # fmt: skip
  p = patch_lib.prompts(model.cfg, clean, corrupt, answers, "logit_diff")
  g = edges.graph(model.cfg)
  exact, clean_m, corrupt_m = edges.exact(model, p)
  assert clean_m - corrupt_m > 2.0
  frame = edges.edge_frame(g, {"exact": exact})
  top = frame.loc[np.argsort(-np.abs(exact))[:6]]
  ranked = list(zip(top["upstream"], top["downstream"], top["input"]))
  assert ranked[0] == ("embed", f"L0H{partner}", "k"), top
  q_composition = [(u, v) for u, v, i in ranked if u == f"L0H{partner}" and i == "q"]
  assert q_composition and all(induction_H[int(v[3:])] > 0.3 for _, v in q_composition), (top, induction_H)
  eap, _, _ = edges.scores(model, p, method="eap")
  eap_ig, _, _ = edges.scores(model, p, method="eap_ig", steps=5)
  # agreement with exact noising (docs/circuits.md; measured Spearman EAP 0.57, EAP-IG 0.54, Pearson 0.32,
  # 0.74; top 5 shared 2, 4): in rank over all 81 edges, most near zero, the two are alike (not asserted
  # apart); EAP-IG is closer in value and on the edges that matter
  by_size = lambda values: list(np.argsort(-np.abs(values)))
  assert spearman(eap, exact) > 0.4 and spearman(eap_ig, exact) > 0.4
  assert np.corrcoef(eap_ig, exact)[0, 1] >= np.corrcoef(eap, exact)[0, 1] + 0.2
  top_exact = by_size(exact)[0]
  assert by_size(eap_ig)[0] == top_exact and np.sign(eap_ig[top_exact]) == np.sign(exact[top_exact])
  assert by_size(eap).index(top_exact) > 0 and np.sign(eap[top_exact]) != np.sign(exact[top_exact])
  shared = lambda values: len(set(by_size(values)[:5]) & set(by_size(exact)[:5]))
  assert shared(eap_ig) > shared(eap)
  curve = edges.curve(model, p, {"eap": eap, "eap_ig": eap_ig}, [10, 20, 40], random_sets=3)
  at = curve.groupby(["method", "edges"])["faithfulness"].max()
  assert at[("eap_ig", 20)] > 0.5 and at[("random", 20)] < 0.1 and not curve["small_gap"].any(), curve
  assert set(curve["direction"]) == {"noising"}


# ------------------------------------------------------------------------------ the graph figure


def test_figure_draws_the_top_edges_by_layer(model, tmp_path):
  """`circuit.figure`: every node drawn, by layer (embeddings lowest, logits highest), one arrow per kept edge
  (an edge into a K/V group one per head of the group), the widest the largest |score|; saved whole."""
  from matplotlib.patches import FancyArrowPatch

  from headspec.patching import circuit

  g = edges.graph(model.cfg)
  scores_E = np.zeros(g.E)
  q_edge = int(np.flatnonzero((g.edges_E2[:, 0] == g.H + 1) & (g.edges_E2[:, 1] == 1))[0])  # L0H0 → L1H1's q
  k_edge = int(np.flatnonzero((g.edges_E2[:, 0] == 2 * g.H + g.G + 1) & (g.edges_E2[:, 1] == 0))[0])  # → L1G1's k
  logits_edge = int(np.flatnonzero((g.edges_E2[:, 0] == g.I - 1) & (g.edges_E2[:, 1] == g.N - 1))[0])
  scores_E[[q_edge, k_edge, logits_edge]] = [3.0, -2.0, 1.0]
  fig = circuit.figure(g, scores_E, top_n=3, path=tmp_path / "circuit.png")
  assert (tmp_path / "circuit.png").stat().st_size > 1000
  ax = fig.axes[0]
  arrows = [a for a in ax.patches if isinstance(a, FancyArrowPatch)]
  assert len(arrows) == 1 + 2 + 1  # q, k into the group's two heads (L1H2, L1H3), MLP1 → logits
  assert max(a.get_linewidth() for a in arrows) == pytest.approx(4.6)
  labels = {t.get_text(): t.get_position() for t in ax.texts}
  assert set(labels) == {"embed", "logits", "MLP0", "MLP1"} | {f"L{a}H{b}" for a in range(2) for b in range(4)}
  y = {name: xy[1] for name, xy in labels.items()}
  assert y["embed"] < y["L0H0"] < y["MLP0"] < y["L1H3"] < y["MLP1"] < y["logits"]
  attention_only = edges.graph(tiny(mlp=False, num_kv_heads=0).cfg)  # networkx's multipartite_layout shuffled its heads
  for drawn in (ax, circuit.figure(attention_only, np.linspace(-1, 1, attention_only.E), top_n=5).axes[0]):
    x = {t.get_text(): t.get_position()[0] for t in drawn.texts}
    assert all([x[f"L{a}H{b}"] for b in range(4)] == sorted(x[f"L{a}H{b}"] for b in range(4)) for a in range(2))


@pytest.mark.slow  # compiles EAP, exact edge patching and the circuit run (shared with the tests above)
def test_the_notebook_function_returns_the_modules_scores(model):
  """headspec.circuit: one score column per method, equal to edges.scores / edges.exact; the curve's full
  circuit at 1; 'eap-ig' spelled as the paper does; the figure of a method it did not score is one line."""
  import headspec

  p = tiny_prompts(model.cfg)
  clean, corrupt, answers = p.clean_BT.tolist(), p.corrupt_BT.tolist(), p.answers_B2.tolist()
  g = edges.graph(model.cfg)
  found = headspec.circuit(model, clean, corrupt, answers=answers, methods=["eap", "exact"], sizes=[g.E], random_sets=1)
  np.testing.assert_allclose(found.edges["eap"], edges.scores(model, p, method="eap")[0], atol=1e-6)
  np.testing.assert_allclose(found.edges["exact"], edges.exact(model, p)[0], atol=1e-6)
  assert found.edges.attrs["direction"] == {"eap": "noising", "exact": "noising"}
  assert set(found.faithfulness["direction"]) == {"noising"} and not found.faithfulness["small_gap"].any()
  assert list(found.edges.columns[:3]) == ["upstream", "downstream", "input"] and len(found.edges) == g.E
  np.testing.assert_allclose(found.faithfulness["faithfulness"], 1.0, atol=1e-4)  # eap, exact, random: all edges
  assert found.figure("exact", top_n=5).axes[0].get_title() == "top 5 by exact"
  with pytest.raises(UserError, match="method='eap_ig'; this circuit has eap, exact"):
    found.figure("eap_ig")
  with pytest.raises(UserError, match=r"circuit: sizes=\[0\]; give edge counts in 1..82"):
    headspec.circuit(model, clean, corrupt, answers=answers, methods=["eap-ig"], sizes=[0])
  with pytest.raises(UserError, match="prompt pair 0: clean has 7 tokens and corrupt 6"):
    headspec.circuit(model, clean, [row[:-1] for row in corrupt], answers=answers)


# ------------------------------------------------------------------------------ prompt pairs from a file


class WordTokenizer:
  """One token per space-separated word (ids by first appearance), BOS id 1 prefixed."""

  prefix_ids = (1,)

  def __init__(self):
    self.ids = {}

  def encode(self, text):
    return [self.ids.setdefault(w, 2 + len(self.ids)) for w in text.split()]


def write_pairs(path, *lines):
  import json

  path.write_text("\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines) + "\n")
  return path


def test_pairs_from_a_file(tmp_path):
  """Texts encoded after the prefix, an answer text the one token it adds; token-id lists taken as they are."""
  from headspec.patching import circuit

  path = write_pairs(
    tmp_path / "pairs.jsonl",
    dict(clean="when mary and john left john gave it to", corrupt="when anna and tom left paul gave it to",
         answer=" mary", wrong=" john"),
    "",
    dict(clean=[1, 5, 6, 7], corrupt=[1, 8, 9, 7], answer=6, wrong=9),
  )  # fmt: skip
  rows = circuit.read_pairs(path)
  assert [r["line"] for r in rows] == [1, 3]
  tok = WordTokenizer()
  clean, corrupt, answers = circuit.pair_ids(rows, tok, path, vocab_size=40)
  assert clean[0][0] == 1 and len(clean[0]) == len(corrupt[0]) == 10 and clean[1] == [1, 5, 6, 7]
  assert answers == [(tok.ids["mary"], tok.ids["john"]), (6, 9)]


@pytest.mark.parametrize(
  "line, message",
  [
    ("{not json", r"pairs.jsonl:2: not JSON"),
    (dict(clean="a b", corrupt="c d"), r"pairs.jsonl:2: give an object with keys clean, corrupt, answer, wrong"),
    (dict(clean="", corrupt="c", answer="x", wrong="y"), r"pairs.jsonl:2: clean must be a non-empty text"),
    (dict(clean="a b", corrupt="c d", answer=True, wrong="y"), r"pairs.jsonl:2: answer must be a text"),
  ],
)
def test_bad_pair_files_are_one_line(tmp_path, line, message):
  from headspec.patching import circuit

  good = dict(clean="a b", corrupt="c d", answer=" e", wrong=" f")
  with pytest.raises(UserError, match=message):
    circuit.read_pairs(write_pairs(tmp_path / "pairs.jsonl", good, line))


def test_bad_pairs_after_tokenizing_are_one_line(tmp_path):
  """Clean and corrupted of different token counts, an answer of two tokens, an id outside the vocabulary:
  one line naming file:line each."""
  from headspec.patching import circuit

  cases = [
    (dict(clean="a b c", corrupt="d e", answer=" x", wrong=" y"), r"pairs.jsonl:1: clean has 4 tokens and corrupt 3"),
    (dict(clean="a b", corrupt="d e", answer=" x z", wrong=" y"), r"pairs.jsonl:1: answer=' x z' is 2 tokens"),
    (dict(clean=[1, 2], corrupt=[1, 3], answer=4, wrong=99), r"pairs.jsonl:1: wrong=99 is outside the vocabulary"),
  ]
  for line, message in cases:
    path = write_pairs(tmp_path / "pairs.jsonl", line)
    with pytest.raises(UserError, match=message):
      circuit.pair_ids(circuit.read_pairs(path), WordTokenizer(), path, vocab_size=40)


def test_bad_circuit_keys_are_one_line(tmp_path):
  """check_config (the command's plan, before anything is written): steps < 1, an empty circuit, a missing
  pairs file, pairs without task='pairs'."""
  from headspec.patching import circuit

  cases = [
    (dict(ig_steps=0), r"ig_steps=0 must be a whole number in \[1, 10000\]"),
    (dict(seed=-1), r"seed=-1 must be a whole number in \[0, "),
    (dict(sizes="0,5"), "an empty circuit has nothing"),
    (dict(task="pairs"), "task='pairs' needs pairs=FILE.jsonl"),
    (dict(task="pairs", pairs=str(tmp_path / "none.jsonl")), "none.jsonl' is not a file"),
    (dict(pairs="p.jsonl"), "pairs='p.jsonl' is read only with task='pairs'"),
    (dict(figure_edges=-1), r"figure_edges=-1 must be a whole number in \[0, 10000\]"),
    (dict(metric="kl"), "metric='kl'; choose one of logit_diff, prob, loss"),
  ]
  for options, message in cases:
    c = circuit.circuit_config()
    c.update(options)
    with pytest.raises(UserError, match=message):
      circuit.check_config(c)


# ------------------------------------------------------------------------------ the command


@pytest.mark.slow  # trains the tiny decoder (shared with other modules) and compiles three programs
def test_circuit_command_writes_its_tables(train_tiny_decoder, capsys):
  """`headspec circuit` on a tiny trained decoder: one edges.csv row per (edge, method), the faithfulness
  curve's rows per (method, size, set), the full-size circuit at 1; a bad key is one line before any work."""
  from headspec.cli import main as cli
  from headspec.io import tables
  from headspec.patching import circuit as circuit_run

  run_dir = train_tiny_decoder(2, name="circuit")
  capsys.readouterr()  # the training's own progress lines
  argv = ["headspec", "circuit", "--config=circuit", f"--workdir={run_dir}", "--config.sizes=0,5"]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err
  assert "sizes='0,5'" in err and err.count("\n") == 1 and not (run_dir / "circuit").exists()
  c = circuit_run.circuit_config()
  c.count, c.induction_n, c.methods, c.ig_steps, c.sizes, c.random_sets = 4, 3, "eap,eap_ig", 2, "5,110", 1
  out = circuit_run.run(c, run_dir)
  rows = tables.read_frame(out.parent / "edges.csv", tables.CIRCUIT_EDGES)
  E = 12 * (1 + 0) + 12 * (1 + 5) + (1 + 4) + (1 + 5 + 4) + (1 + 10)  # 2 layers, 4 heads, MLPs: 110
  assert len(rows) == 2 * E and set(rows["method"]) == {"eap", "eap_ig"}
  assert set(rows[rows["method"] == "eap_ig"]["steps"]) == {2} and np.isfinite(rows["score"]).all()
  assert set(rows["direction"]) == {"noising"}
  faith = tables.read_frame(out, tables.CIRCUIT_FAITHFULNESS)
  assert set(faith["direction"]) == {"noising"} and set(faith["small_gap"]) == {0}
  expected = sorted((m, n) for m in ("eap", "eap_ig", "random") for n in (5, E))
  assert sorted(zip(faith["method"], faith["edges"])) == expected
  np.testing.assert_allclose(faith[faith["edges"] == E]["faithfulness"], 1.0, atol=1e-3)
  assert sorted(p.name for p in (run_dir / "circuit").glob("*.png")) == [
    f"induction_{m}_circuit_step{rows['step'][0]}.png" for m in ("eap", "eap_ig")
  ]
  # prompt pairs from a file: token ids here (the run's tokenizer has no words of ours), task `pairs:<stem>`
  rng = np.random.default_rng(0)
  lines = []
  for _ in range(3):
    a = rng.choice(np.arange(10, 500), 8, replace=False).tolist()
    lines.append(dict(clean=a[:5] + a[:4], corrupt=a[5:8] + a[3:5] + a[:4], answer=a[4], wrong=a[7]))
  c.task, c.pairs = "pairs", str(write_pairs(run_dir / "mine.jsonl", *lines))
  c.methods, c.sizes, c.figure_edges, c.metric = "eap", "5", 0, "prob"  # the patching registry's metrics
  with pytest.warns(RuntimeWarning, match=r"m\(clean\) − m\(corrupt\) = .* is a small gap"):
    circuit_run.run(c, run_dir)  # random pairs: the answer's probability barely moves (a gap of ~1e-5)
  rows = tables.read_frame(out.parent / "edges.csv", tables.CIRCUIT_EDGES)
  assert (rows["task"] == "pairs:mine_prob").sum() == E
  faith = tables.read_frame(out, tables.CIRCUIT_FAITHFULNESS)
  mine = faith[faith["task"] == "pairs:mine_prob"]
  assert mine["clean_metric"].between(0, 1).all() and set(mine["small_gap"]) == {1}  # a probability; noise
  assert not list((run_dir / "circuit").glob("pairs*.png"))  # figure_edges=0


def test_exact_patching_and_faithfulness_split_over_a_data_mesh_give_the_one_device_values(model):
  """Under a mesh of the suite's 2 devices on `data`, each device runs its share of the edges and of the
  circuits (odd counts: padded, the padding dropped); every value equals one device's to float32 rounding."""
  from headspec.parallel import mesh

  p = tiny_prompts(model.cfg)
  g = edges.graph(model.cfg)
  asked = np.arange(0, g.E, 4)[:7]
  keep_CE = np.random.default_rng(0).random((3, g.E)) < 0.5
  alone = edges.exact(model, p, edges=asked), edges.faithfulness(model, p, keep_CE)
  assert jax.device_count() == 2 and len(asked) % 2 and len(keep_CE) % 2
  with mesh.using(mesh.parse("data=2")):
    split = edges.exact(model, p, edges=asked), edges.faithfulness(model, p, keep_CE)
  for one, two in zip(alone, split):
    assert one[0].shape == two[0].shape and one[1:] == pytest.approx(two[1:], rel=1e-6)
    np.testing.assert_allclose(two[0], one[0], rtol=1e-5, atol=1e-6)
