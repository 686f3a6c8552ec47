"""Induction-head scores with known answers: hand-built attention maps, OV circuits with known eigenvalues,
the ICL positions, the formation window, the attention-only model option, and `headspec attention`'s
induction step end to end on a tiny decoder (tables, labels, ICL, causal rows, encoder refusal)."""

import csv
import logging

import jax
import numpy as np
import pytest
from flax import nnx
from induction_recipe import INDUCTION_N, INDUCTION_SPECIALS, INDUCTION_VOCAB

from headspec.attention import induction as ind
from headspec.attention import induction_run
from headspec.attention.config import attention_config
from headspec.attention.run import run as run_attention
from headspec.cli.quickstart import quickstart_config
from headspec.errors import UserError
from headspec.io import tables
from headspec.model.config import ModelConfig
from headspec.model.transformer import Transformer
from headspec.runs import directory as runs
from headspec.train.loop import train_and_evaluate

N_REP, COUNT, V = 6, 4, 40


def _tokens():
  return ind.repeated_random_tokens(V, [0, 1, 2], n=N_REP, count=COUNT, seed=0, bos=(2,))


def _map(offset_of_query) -> np.ndarray:
  """[B, T, T] attention putting all weight on key offset_of_query(i) (i itself when None/invalid)."""
  T = 1 + 2 * N_REP
  a = np.zeros((COUNT, T, T))
  for i in range(T):
    j = offset_of_query(i)
    a[:, i, j if j is not None and 0 <= j <= i else i] = 1.0
  return a


def test_repeated_random_tokens():
  x = _tokens()
  assert x.shape == (COUNT, 1 + 2 * N_REP) and (x[:, 0] == 2).all()
  assert (x[:, 1 : 1 + N_REP] == x[:, 1 + N_REP :]).all()
  assert all(len(set(row[1 : 1 + N_REP])) == N_REP for row in x) and not np.isin(x[:, 1:], [0, 1, 2]).any()
  assert (ind.repeated_random_tokens(V, [0, 1, 2], n=N_REP, count=COUNT, seed=0, bos=(2,)) == x).all()
  with pytest.raises(UserError, match="induction.n"):
    ind.repeated_random_tokens(5, [0, 1, 2], n=3, count=1, seed=0)
  among = [1, 2, 5, 7, 7, 9, 11, 13]  # its repeats and specials are dropped: 5 ids to draw from
  y = ind.repeated_random_tokens(V, [0, 1, 2], n=5, count=COUNT, seed=0, bos=(2,), among=among)
  assert all(sorted(row[1:6]) == [5, 7, 9, 11, 13] and (row[1:6] == row[6:]).all() for row in y)
  assert len({tuple(row) for row in y}) > 1  # each row its own order
  with pytest.raises(UserError, match="non-special ids drawn from"):
    ind.repeated_random_tokens(V, [0, 1, 2], n=6, count=1, seed=0, among=among)


@pytest.mark.parametrize(
  "role,offset",
  [
    ("previous_token", lambda i: i - 1),
    ("duplicate_token", lambda i: i - N_REP if i > N_REP else None),
    ("induction", lambda i: i - N_REP + 1 if i > N_REP else None),
  ],
)
def test_hand_built_maps_score_one_on_their_detector(role, offset):
  a = _map(offset)[None, :, None]  # [L=1, B, H=1, T, S]
  scores = ind.pattern_scores_of_maps(a, _tokens(), specials=[0, 1, 2])
  for other, value in scores.items():
    if other == role:
      assert value[0, 0] == pytest.approx(1.0)
    elif not (role == "previous_token" and other == "induction"):
      assert value[0, 0] == pytest.approx(0.0, abs=1e-6)
  if role == "previous_token":  # i−1 is i−n+1 only for n = 2: a previous-token map is not an induction map
    assert scores["induction"][0, 0] == pytest.approx(0.0, abs=1e-6)


def test_uniform_map_scores_the_mean_share():
  T = 1 + 2 * N_REP
  a = np.tril(np.ones((T, T)))
  a = np.broadcast_to(a / a.sum(1, keepdims=True), (COUNT, T, T))[None, :, None]
  s = ind.pattern_scores_of_maps(a, _tokens(), specials=[0, 1, 2])
  expected = np.mean([1.0 / (i + 1) for i in range(N_REP + 1, T)])
  assert s["induction"][0, 0] == pytest.approx(expected) and s["duplicate_token"][0, 0] == pytest.approx(expected)


def test_copying_score_identity_and_negation():
  rng = np.random.default_rng(0)
  D, K = 6, 6
  w_e = rng.normal(size=(10, D))
  q, _ = np.linalg.qr(rng.normal(size=(D, D)))  # W_V W_O = I: the OV circuit is W_E W_U, PSD for W_U = W_Eᵀ
  assert ind.copying_score(np.ones(5)) == 1.0 and ind.copying_score(-np.ones(5)) == -1.0
  assert ind.copying_score(ind.ov_eigenvalues(w_e, q, q.T, w_e.T)) == pytest.approx(1.0)
  assert ind.copying_score(ind.ov_eigenvalues(w_e, q, -q.T, w_e.T)) == pytest.approx(-1.0)
  assert ind.copying_score(ind.ov_eigenvalues(np.eye(K), np.eye(K), np.eye(K), np.eye(K))) == 1.0


def test_kxk_route_equals_vxv_eigenvalues():
  rng = np.random.default_rng(1)
  V_, D, K = 12, 8, 3
  args = rng.normal(size=(V_, D)), rng.normal(size=(D, K)), rng.normal(size=(K, D)), rng.normal(size=(D, V_))
  small = np.sort_complex(ind.ov_eigenvalues(*args))
  full = ind.ov_eigenvalues_full(*args)
  full = np.sort_complex(full[np.argsort(-np.abs(full))[:K]])  # the K non-zero ones
  np.testing.assert_allclose(small, full, rtol=1e-6, atol=1e-8)
  assert np.abs(np.sort(np.abs(ind.ov_eigenvalues_full(*args)))[: V_ - K]).max() < 1e-8


def _tiny(mlp=True, **kw):
  cfg = ModelConfig(kind="decoder", vocab_size=V, num_layers=2, num_heads=2, d_model=8, d_head=4, d_ff=16, max_len=16,
                    mlp=mlp, **kw)  # fmt: skip
  return Transformer(cfg, rngs=nnx.Rngs(params=0))


def test_copying_scores_of_a_model_fold_the_layernorm_gains():
  model = _tiny()
  block = model.blocks[1]
  w_e = np.asarray(model.token_embed_VD[...])
  g1 = np.linspace(0.5, 2.0, 8)
  gf = np.linspace(2.0, 0.5, 8)
  block.ln_attention.scale[...] = g1
  model.ln_final.scale[...] = gf
  w_v = np.asarray(block.attention.w_v_DHK[...])[:, 1]
  w_o = np.asarray(block.attention.w_o_HKD[...])[1]
  expected = ind.copying_score(ind.ov_eigenvalues_full(w_e, g1[:, None] * w_v, w_o, gf[:, None] * w_e.T))
  assert ind.copying_scores(model)[1, 1] == pytest.approx(expected, abs=1e-6)


def test_attention_only_model():
  model = _tiny(mlp=False)
  assert not hasattr(model.blocks[0], "mlp") and not hasattr(model.blocks[0], "ln_mlp")
  n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
  assert n_params < sum(x.size for x in jax.tree.leaves(nnx.state(_tiny(), nnx.Param)))
  logits, inter = model(np.asarray(_tokens()[:, :12]), capture=("pattern",))
  assert logits.shape == (COUNT, 12, V) and inter.pattern_LBHTS.shape == (2, COUNT, 2, 12, 12)


def test_run_matches_the_maps_of_the_model():
  model = _tiny()
  x = _tokens()
  p = ind.run(model, x, np.ones(x.shape, bool), np.array([0, 1, 2]), batch_size=3)  # a padded last batch
  _, inter = model(x, capture=("pattern",))
  direct = ind.pattern_scores_of_maps(np.asarray(inter.pattern_LBHTS), x, [0, 1, 2])
  scores = ind.attention_scores(p, resamples=50, seed=0)
  for role in ind.ATTENTION_ROLES:
    np.testing.assert_allclose(scores[role][0], direct[role], rtol=1e-5)
    assert (scores[role][1] <= scores[role][0] + 1e-9).all() and (scores[role][0] <= scores[role][2] + 1e-9).all()


def test_icl_positions_and_scores():
  assert ind.icl_positions(512) == (50, 500)
  assert ind.icl_positions(128) == (12, 125)
  nll = np.tile(np.linspace(3.0, 1.0, 16), (20, 1)) + np.random.default_rng(0).normal(0, 0.01, (20, 16))
  value, low, high = ind.icl_score(nll, np.ones((20, 16), bool), 2, 14, resamples=200, seed=0)
  assert value == pytest.approx(nll[:, 13].mean() - nll[:, 1].mean()) and low <= value <= high and value < -1.5
  pos, mean, _, _ = ind.loss_by_position(nll, np.ones((20, 16), bool), resamples=50, seed=0)
  assert list(pos) == list(range(1, 16)) and mean[0] == pytest.approx(nll[:, 0].mean())


def test_formation_window():
  steps = [0, 10, 30, 100, 300]
  assert ind.formation_window(steps, [0.0, 0.1, 0.2, 0.7, 0.9], 0.4) == (30, 100)
  assert ind.formation_window(steps, [0.0, 0.5, 0.2, 0.7, 0.9], 0.4) == (30, 100)  # crosses for good at 100
  assert ind.formation_window(steps, [0.0] * 5, 0.4) == (None, None)
  assert ind.formation_window(steps, [0.5] * 5, 0.4) == (None, 0)


def test_combine_labels():
  rows = [
    dict(model="m", step=1, layer=0, head=0, label="none", rule="x"),
    dict(model="m", step=1, layer=0, head=0, label="induction", rule="y"),
  ]
  out = induction_run.combine_labels(rows, 1, 2, "m", 1)
  assert [(r["head"], r["label"]) for r in out] == [(0, "induction"), (1, "none")]


# --- `headspec attention` end to end on a tiny decoder ---


@pytest.fixture(scope="module")
def run_dir(synthetic_data_dir, tmp_path_factory):
  c = quickstart_config("decoder")
  c.data_dir = str(synthetic_data_dir)
  c.data.vocab_size = 512
  c.model.num_layers, c.model.num_heads, c.model.d_model, c.model.d_head, c.model.d_ff = 2, 2, 32, 8, 64
  c.model.mlp = False
  c.train.steps, c.train.batch_size, c.train.seq_len = 4, 8, 40
  c.train.eval_every = c.train.diversity_every = 0
  c.train.checkpoint_every = 100
  c.train.keep_steps = (0, 2)
  workdir = tmp_path_factory.mktemp("induction_run")
  train_and_evaluate(c, workdir)
  assert runs.resolve_steps(workdir, "all") == [0, 2, 4]
  assert runs.read_config(workdir).model.mlp is False
  return workdir


def _config(**induction):
  c = attention_config()
  c.treebank = ""
  c.steps = "all"
  c.roles.bootstrap_resamples = 50
  c.induction.n = 50  # too long for the 40-token context: n = 19 is used
  c.induction.num_sequences = 20
  c.induction.num_tokens = 400
  c.induction.causal.num_sequences = 10
  c.induction.causal.random_seeds = 2
  for k, v in induction.items():
    c.induction[k] = v
  return c


def _read(path):
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def test_draw_from_text_uses_only_the_evaluation_texts_ids(run_dir):
  """induction.draw='text': r_1..r_n come from the ids that occur in the run's validation rows (no byte
  pieces the text never uses), also with natural_text off; 'vocabulary' reaches ids outside them."""
  from headspec.attention.config import check_config
  from headspec.runs import targets

  drawn = {}
  for draw in ("vocabulary", "text"):
    c = _config(draw=draw, natural_text=False, num_sequences=200, n=10)
    check_config(c)
    jobs = targets.plan(c, run_dir, steps="4")
    data = induction_run.load_data(c, run_dir, jobs)
    drawn[draw] = set(np.unique(data.repeated_NT[:, data.prefix :]).tolist())
    seen = set(np.unique(data.natural_NT[data.natural_valid_NT]).tolist())
  assert drawn["text"] <= seen - set(data.specials.tolist()) and len(drawn["text"]) > 50
  assert drawn["vocabulary"] - seen  # 200 x 10 draws from 512 ids reach ids the text never uses
  with pytest.raises(UserError, match="induction.draw='words': use 'vocabulary' or 'text'"):
    check_config(_config(draw="words"))


def test_attention_command_induction_step(run_dir, caplog):
  # rows another analysis wrote for the same (model, step) are kept
  tables.merge(
    tables.path_of(run_dir, tables.ABLATION_CAUSAL),
    [
      dict(
        model=run_dir.name,
        step=4,
        kind="probe_selective",
        task="upos",
        k=1,
        selection="selective",
        seed=-1,
        metric="probe_accuracy",
        value=0.5,
        ci_low=0.4,
        ci_high=0.6,
      )
    ],  # fmt: skip
    tables.ABLATION_CAUSAL,
  )
  caplog.set_level(logging.INFO)  # the progress lines are absl INFO logs
  summary = run_attention(_config(), run_dir)
  out = caplog.text
  assert "using n=19" in out and "formation window" in out
  assert summary.name == "induction_summary.md" and "Formation window" in summary.read_text()
  assert (run_dir / "attention" / "induction_formation.png").is_file()
  roles = _read(run_dir / "attention" / "roles.csv")
  assert {(r["data"], r["role"]) for r in roles} == {
    *(("repeated_random", r) for r in ind.ATTENTION_ROLES),
    *(("natural_text", r) for r in ind.ATTENTION_ROLES),
    ("weights", "copying"),
  }
  assert {r["step"] for r in roles} == {"0", "2", "4"} and len(roles) == 3 * 7 * 4
  for r in roles:
    if r["data"] != "weights":
      assert float(r["ci_low"]) - 1e-9 <= float(r["score"]) <= float(r["ci_high"]) + 1e-9
    assert -1.0 - 1e-9 <= float(r["score"]) <= 1.0 + 1e-9
  labels = _read(run_dir / "attention" / "labels.csv")
  assert {(r["step"], r["layer"], r["head"]) for r in labels} == {
    (str(s), str(l), str(h)) for s in (0, 2, 4) for l in range(2) for h in range(2)
  }
  icl = _read(run_dir / "attention" / "icl.csv")
  assert {r["kind"] for r in icl} == {"loss_at_position", "icl_score", "repeat_first", "repeat_second", "repeat_drop"}
  assert all(r["position"] == "" for r in icl if r["kind"] != "loss_at_position")
  by = {(r["step"], r["kind"]): float(r["value"]) for r in icl}
  for s in ("0", "2", "4"):  # the drop is the copies' difference
    assert by[s, "repeat_drop"] == pytest.approx(by[s, "repeat_first"] - by[s, "repeat_second"], abs=1e-5)
  assert sorted(int(r["position"]) for r in icl if r["kind"] == "loss_at_position" and r["step"] == "4") == list(
    range(1, 40)
  )
  causal = _read(run_dir / "ablation" / "causal.csv")
  assert {r["kind"] for r in causal if r["step"] == "4"} == {"probe_selective", "induction"}
  ours = [r for r in causal if r["kind"] == "induction"]
  assert {r["task"] for r in ours} == {"repeated_random/zero", "repeated_random/mean"}
  assert {int(r["k"]) for r in ours} == {1, 2, 4} and {r["metric"] for r in ours} == set(
    __import__("headspec.ablation.causal", fromlist=["x"]).INDUCTION_METRICS
  )
  # re-running one step replaces its rows only
  before = len(_read(run_dir / "attention" / "roles.csv"))
  c = _config()
  c.steps = "4"
  run_attention(c, run_dir)
  assert len(_read(run_dir / "attention" / "roles.csv")) == before


def test_causal_check_at_the_last_step_only(run_dir):
  """induction.causal.steps='last' runs the causal check at each model's last planned step, not before."""
  from headspec.attention.config import check_config
  from headspec.runs import targets

  c = _config()
  c.induction.causal.steps = "last"
  check_config(c)
  jobs = targets.plan(c, run_dir, steps="all")
  data = induction_run.load_data(c, run_dir, jobs)
  assert data.causal_at == {(run_dir.name, 4)}
  first = next(j for j in jobs if j.step == 0)
  model, _ = first.load()
  assert induction_run.analyse(first, model, data, c)["causal"] == []
  c.induction.causal.steps = "all"
  assert induction_run.load_data(c, run_dir, jobs).causal_at == {(run_dir.name, s) for s in (0, 2, 4)}
  c.induction.causal.steps = "first"
  with pytest.raises(UserError, match="induction.causal.steps='first': use 'all' or 'last'"):
    check_config(c)


def test_encoder_refused_with_one_line(run_dir, monkeypatch):
  from headspec.runs import targets

  real = targets.run_targets

  def as_encoder(*a, **k):
    import dataclasses

    return [dataclasses.replace(t, kind="encoder") for t in real(*a, **k)]

  monkeypatch.setattr(targets, "run_targets", as_encoder)
  with pytest.raises(UserError, match="need a decoder") as e:
    run_attention(_config(enabled="on"), run_dir)
  assert "\n" not in str(e.value)
  with pytest.raises(UserError, match="nothing to analyse"):
    run_attention(_config(), run_dir)  # 'auto' skips encoders; without a treebank nothing is left


# --- an induction head forms where theory says it can (Olsson et al. 2022; Elhage et al. 2021) ---


def _scores_and_repeat_losses(model):
  """Role scores at the unseen n (repeated random tokens) and the mean first- and second-repeat losses."""
  x = ind.repeated_random_tokens(INDUCTION_VOCAB, INDUCTION_SPECIALS, n=INDUCTION_N, count=100, seed=1, bos=(2,))
  p = ind.run(model, x, np.ones(x.shape, bool), np.array(INDUCTION_SPECIALS))
  first, second = ind.repeat_losses(p.nll_NT, INDUCTION_N)
  return {role: s[0] for role, s in ind.attention_scores(p, resamples=20, seed=0).items()}, first.mean(), second.mean()


@pytest.mark.slow
@pytest.mark.e2e
def test_induction_head_forms_in_two_layers_not_in_one(attention_only_decoder):
  """Two attention-only layers form an induction head at an n never trained on; one layer cannot.

  The layer-1 head composes with a layer-0 head that tells it where to look: a previous-token head
  (K-composition, Olsson et al.'s account) or a duplicate-token head (Q-composition). Which one forms is
  decided by the seed (docs/attention.md lists our trials), so the test asks for either."""
  (scores, first, second), (scores_1, first_1, second_1) = (
    _scores_and_repeat_losses(attention_only_decoder(layers)) for layers in (2, 1)
  )
  induction, supplier = scores["induction"], np.maximum(scores["previous_token"], scores["duplicate_token"])
  assert induction[1].max() > 0.5 and induction[0].max() < 0.2, scores
  assert supplier[0].max() > 0.5, scores
  assert second < first - 2.0, (first, second)  # in-context learning: the second repeat is predicted
  assert scores_1["induction"].max() < 0.2, scores_1
  assert second_1 > first_1 - 0.5, (first_1, second_1)


def test_repeat_loss_cis_are_the_copies_means_and_their_difference():
  """repeat_first / repeat_second: the copies' mean losses; repeat_drop: first − second, with a bootstrap CI
  over sequences that holds the mean and shrinks to it when every sequence agrees."""
  first, second = np.array([6.0, 6.2, 6.4, 6.6]), np.array([5.0, 6.2, 4.4, 6.0])
  out = ind.repeat_loss_cis(first, second, resamples=200, seed=0)
  assert out["repeat_first"][0] == pytest.approx(6.3) and out["repeat_second"][0] == pytest.approx(5.4)
  v, lo, hi = out["repeat_drop"]
  assert v == pytest.approx(0.9) and lo < v < hi
  v, lo, hi = ind.repeat_loss_cis(first, first - 0.5, resamples=50, seed=0)["repeat_drop"]
  assert (v, lo, hi) == pytest.approx((0.5, 0.5, 0.5))


def test_causal_check_selects_on_one_half_and_measures_on_the_other(run_dir, monkeypatch):
  """The top-k induction heads (and the unlabelled control's) are chosen on the first half of the
  repeated sequences and their ablation measured on the second: disjoint sets, the scores of the first."""
  select, measure = ind.causal_split(20, 10)
  assert not set(select) & set(measure) and len(select) == 10 and len(measure) == 10
  assert list(ind.causal_split(20, 4)[1]) == [10, 11, 12, 13]
  with pytest.raises(UserError, match="induction.num_sequences=2: the causal check needs 3 or more"):
    ind.causal_split(2, 2)
  from headspec.ablation import causal as causal_lib
  from headspec.runs import targets

  c = _config()
  jobs = targets.plan(c, run_dir, steps="4")
  data = induction_run.load_data(c, run_dir, jobs)
  seen = {}
  real_rows = causal_lib.induction_rows

  def spy(model, tokens_NT, n, prefix, induction_LH, cc, **kw):
    seen.update(tokens=np.asarray(tokens_NT), induction=np.asarray(induction_LH))
    return real_rows(model, tokens_NT, n, prefix, induction_LH, cc, **kw)

  monkeypatch.setattr(causal_lib, "induction_rows", spy)
  model, _ = jobs[0].load()
  out = induction_run.analyse(jobs[0], model, data, c)
  assert out["causal"]
  rows_of = lambda x: {tuple(r) for r in x}
  select, measure = ind.causal_split(len(data.repeated_NT), c.induction.causal.num_sequences)
  assert rows_of(seen["tokens"]) == rows_of(data.repeated_NT[measure])
  assert not rows_of(seen["tokens"]) & rows_of(data.repeated_NT[select])  # no sequence both selects and measures
  rep = ind.run(model, data.repeated_NT[select], np.ones(data.repeated_NT[select].shape, bool), data.specials)
  want = ind.attention_scores(rep, resamples=c.roles.bootstrap_resamples, seed=c.seed)["induction"][0]
  np.testing.assert_allclose(seen["induction"], want, rtol=1e-5, atol=1e-6)
  # 2 heads a layer, k = 1: one layer-matched candidate, ablated once, not twice (random_seeds = 2)
  k1 = [r for r in out["causal"] if r["k"] == 1 and r["selection"] == "random_layer_matched"]
  assert {r["value"] for r in k1 if r["metric"] == "candidate_sets"} == {1.0}
  assert {r["seed"] for r in k1 if r["metric"] == "loss_delta_second"} == {0}
