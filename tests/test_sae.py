"""Sparse autoencoders on attention outputs (headspec/sae/, docs/sae.md)."""

from __future__ import annotations

import numpy as np
import pytest

import headspec
from headspec.errors import UserError
from headspec.sae import metrics
from headspec.sae import train as sae_train

H, KH, PER_HEAD = 4, 8, 4  # planted features: 4 per head, each a unit direction inside one head's 8-wide slice


def planted(n: int = 8192, active: int = 3, seed: int = 0):
  """(x_NK, directions_PK, head_P): inputs that are sparse sums of planted unit directions, plus a little noise."""
  rng = np.random.default_rng(seed)
  K, P = H * KH, H * PER_HEAD
  directions_PK, head_P = np.zeros((P, K)), np.repeat(np.arange(H), PER_HEAD)
  for p, h in enumerate(head_P):
    u = rng.normal(size=KH)
    directions_PK[p, h * KH : (h + 1) * KH] = u / np.linalg.norm(u)
  coef_NP = np.zeros((n, P))
  for row in coef_NP:
    row[rng.choice(P, active, replace=False)] = rng.uniform(1, 2, active)
  return coef_NP @ directions_PK + 0.01 * rng.normal(size=(n, K)), directions_PK, head_P


@pytest.fixture(scope="module")
def planted_fit():
  x, directions, head = planted()
  sae = headspec.fit_sae(x, features=32, kind="topk", k=3, steps=1500, seed=0, batch_size=256, lr=3e-3, progress=False)
  return x, directions, head, sae


def test_topk_recovers_planted_features_and_their_heads(planted_fit):
  x, directions_PK, head_P, sae = planted_fit
  cos_PF = directions_PK @ np.asarray(sae.W_dec_FK).T
  assert cos_PF.max(1).mean() >= 0.9
  best_P = cos_PF.argmax(1)
  fractions_FH = headspec.sae_head_fractions(sae, heads=H)
  assert fractions_FH.shape == (32, H)
  np.testing.assert_allclose(fractions_FH.sum(1), 1.0, rtol=1e-6)
  np.testing.assert_array_equal(fractions_FH[best_P].argmax(1), head_P)
  assert fractions_FH[best_P].max(1).min() > 0.9
  f = np.asarray(sae.encode(x[:512]))
  assert ((f > 0).sum(1) <= 3).all() and metrics.l0(f) > 2
  assert metrics.fvu(x[:512], np.asarray(sae.decode(f))) < 0.1
  assert {"encode", "decode", "W_enc_KF", "W_dec_FK", "b_dec_K"} <= set(dir(sae))
  assert sae.W_enc_KF.shape == (32, 32) and sae.b_dec_K.shape == (32,)


def test_relu_l1_keeps_decoder_rows_at_unit_norm():
  x, _, _ = planted(n=2048)
  sae = headspec.fit_sae(x, features=24, kind="relu", l1=0.5, steps=200, batch_size=128, lr=3e-3, progress=False)
  np.testing.assert_allclose(np.linalg.norm(np.asarray(sae.W_dec_FK), axis=1), 1.0, atol=1e-5)
  f = np.asarray(sae.encode(x[:256]))
  assert (f >= 0).all() and metrics.l0(f) < 24  # the L1 penalty makes it sparse
  assert metrics.fvu(x[:256], np.asarray(sae.decode(f))) < 0.5


def test_finished_checkpoint_is_returned_and_other_options_refused(tmp_path):
  x, _, _ = planted(n=1024)
  kw = dict(features=16, k=3, batch_size=64, lr=3e-3, chunk=10, progress=False, checkpoint_dir=tmp_path / "c")
  first = headspec.fit_sae(x, steps=40, checkpoint_every=20, **kw)
  again = headspec.fit_sae(x, steps=40, checkpoint_every=20, **kw)
  assert (first.info["resumed_at"], again.info["resumed_at"]) == (0, 40)
  np.testing.assert_array_equal(np.asarray(again.W_dec_FK), np.asarray(first.W_dec_FK))
  with pytest.raises(UserError, match="holds an SAE trained with other options steps"):
    headspec.fit_sae(x, steps=30, checkpoint_every=20, **kw)
  with pytest.raises(UserError, match="holds an SAE trained with other inputs"):
    headspec.fit_sae(x[:-1], steps=40, checkpoint_every=20, **kw)


def test_resume_mid_run(tmp_path, monkeypatch):
  """A run killed after its first checkpoint continues from it to the uninterrupted run's weights."""
  x, _, _ = planted(n=1024)
  kw = dict(features=16, k=3, batch_size=64, lr=3e-3, chunk=10, steps=40, progress=False)
  whole = headspec.fit_sae(x, **kw)
  from headspec.sae import checkpoint as ckpt

  real_save, calls = ckpt.save, []

  def save_then_die(mngr, step, state, meta):
    real_save(mngr, step, state, meta)
    calls.append(step)
    if step == 20:
      mngr.wait_until_finished()
      raise KeyboardInterrupt

  monkeypatch.setattr(ckpt, "save", save_then_die)
  with pytest.raises(KeyboardInterrupt):
    headspec.fit_sae(x, checkpoint_dir=tmp_path / "c", checkpoint_every=20, **kw)
  monkeypatch.setattr(ckpt, "save", real_save)
  resumed = headspec.fit_sae(x, checkpoint_dir=tmp_path / "c", checkpoint_every=20, **kw)
  assert resumed.info["resumed_at"] == 20
  np.testing.assert_allclose(np.asarray(resumed.W_dec_FK), np.asarray(whole.W_dec_FK), atol=1e-5)


@pytest.mark.parametrize(
  "kwargs, message",
  [
    (dict(features=0), "features=0 must be a positive"),
    (dict(features=-3), "features=-3 must be a positive"),
    (dict(features=8, k=9), "k=9 must be between 1 and features=8"),
    (dict(features=8, kind="jump"), "kind='jump'"),
    (dict(features=8, k=2, steps=0), "steps=0"),
  ],
)
def test_bad_options_are_one_line(kwargs, message):
  x, _, _ = planted(n=64)
  with pytest.raises(UserError, match=message):
    headspec.fit_sae(x, progress=False, **kwargs)


def test_nan_activations_are_refused():
  x, _, _ = planted(n=64)
  x[5, 2] = np.nan
  with pytest.raises(UserError, match="NaN or inf in 1 row.*first row 5"):
    headspec.fit_sae(x, features=8, k=2, progress=False)


def test_split_rows_trains_on_the_first_tokens_and_cuts_a_short_text_in_proportion():
  from headspec.sae.run import split_rows

  tokens, valid = np.arange(40).reshape(10, 4), np.ones((10, 4), bool)
  (train, _), (held, _) = split_rows(tokens, valid, train_tokens=12, eval_tokens=8)
  assert (len(train), len(held)) == (3, 7) and train[-1, -1] == 11  # the first rows holding 12 tokens
  (train, _), (held, _) = split_rows(tokens, valid, train_tokens=300, eval_tokens=100)  # 40 tokens: 30 train
  assert (len(train), len(held)) == (8, 2)
  with pytest.raises(UserError, match="needs two rows at least"):
    split_rows(tokens[:1], valid[:1], train_tokens=3, eval_tokens=1)


def test_metric_formulas_on_known_cases():
  x = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
  assert metrics.fvu(x, x) == 0.0
  assert metrics.fvu(x, np.broadcast_to(x.mean(0), x.shape)) == pytest.approx(1.0)
  assert metrics.fvu(x, x + np.array([0.5, 0.0])) == pytest.approx(4 * 0.25 / 2.0)  # Σ‖e‖² = 1, Σ‖x − x̄‖² = 2
  f = np.array([[1.0, 0.0, 0.0], [2.0, 3.0, 0.0], [0.5, 0.0, 0.0], [1.0, 0.0, 0.0]])
  assert metrics.l0(f) == pytest.approx(5 / 4)
  rates = metrics.firing_rates(f)
  np.testing.assert_allclose(rates, [1.0, 0.25, 0.0])
  assert metrics.dead_fraction(rates) == pytest.approx(1 / 3)
  assert metrics.dense_fraction(rates, 0.5) == pytest.approx(1 / 3)
  assert metrics.loss_recovered(clean=2.0, splice=2.5, ablated=4.0) == pytest.approx(0.75)
  assert np.isnan(metrics.loss_recovered(2.0, 2.5, 2.0))
  a = np.array([[1.0, 0.0], [0.5, 0.5], [0.25, 0.75]])
  np.testing.assert_allclose(metrics.entropy_bits(a), [0.0, 1.0, -(0.25 * np.log2(0.25) + 0.75 * np.log2(0.75))])
  # S_h = Σ a² / Σ a over live features: head 0 (1 + .25 + .0625)/(1.75), head 1 (.25 + .5625)/1.25
  np.testing.assert_allclose(metrics.specialization(a, [1, 1, 1]), [1.3125 / 1.75, 0.8125 / 1.25])
  np.testing.assert_allclose(metrics.specialization(a, [1, 0, 0]), [1.0, np.nan])
  w = np.array([[3.0, 4.0, 0.0, 0.0], [1.0, 0.0, 1.0, 0.0]])  # heads of width 2
  np.testing.assert_allclose(metrics.head_fractions(w, 2), [[1.0, 0.0], [0.5, 0.5]])
  with pytest.raises(UserError, match="heads=3 must be a positive divisor of the SAE width 4"):
    metrics.head_fractions(w, 3)


def test_geometric_median_is_robust_and_exact():
  x = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [100.0, 100.0]])
  m = sae_train.geometric_median(x, iterations=1000, tolerance=1e-12)
  distances = lambda c: np.linalg.norm(x - c, axis=1).sum()
  assert distances(m) <= distances(x.mean(0))
  for d in ([1e-3, 0], [0, 1e-3], [-1e-3, 0], [0, -1e-3]):
    assert distances(m) <= distances(m + np.array(d)) + 1e-9  # a minimum


def test_schedules():
  o = sae_train.Options(features=4, steps=100, lr=1.0, warmup_steps=10, decay_fraction=0.2)
  s = sae_train.schedule(o)
  assert float(s(0)) == pytest.approx(0.1) and float(s(10)) == pytest.approx(1.0)
  assert (
    float(s(80)) == pytest.approx(1.0) and float(s(90)) == pytest.approx(0.5) and float(s(100)) == pytest.approx(0.0)
  )


# --- `headspec sae` on the quickstart-sized tiny decoder (tests/conftest.py) ---

SMALL = dict(
  train_tokens=4000, eval_tokens=2000, layer=0, sae__train_steps=300, sae__batch_size=256, sae__lr=3e-3,
  analysis__treebank="synthetic", analysis__max_sentences=40, analysis__batch_tokens=512, analysis__top=5,
)  # fmt: skip


def sae_cli(tmp_path, workdir, data_dir, **overrides) -> int:
  """`headspec sae` in process with configs/sae.py plus `overrides` (key path with '__' for '.'): in-process
  cli.main does not apply --config.key=value overrides, so they go into a config file."""
  from headspec.cli import main as cli

  name = tmp_path / f"sae_cfg_{len(list(tmp_path.glob('sae_cfg_*.py')))}.py"
  lines = ["from headspec.configs.sae import get_config as base", "def get_config(a=None):", "  c = base(None)"]
  lines += [
    f"  c.{key.replace('__', '.')} = {value!r}" for key, value in {"data_dir": str(data_dir), **overrides}.items()
  ]
  name.write_text("\n".join(lines + ["  return c\n"]))
  cli.FLAGS.unparse_flags()  # absl keeps flag values between in-process calls
  return cli.main(["headspec", "sae", f"--config={name}", f"--workdir={workdir}"])


def snapshot(path) -> dict:
  return {p: p.read_bytes() for p in path.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def trained_run(train_tiny_decoder):
  return train_tiny_decoder(200, (), name="sae")


@pytest.mark.slow
def test_cli_on_the_tiny_decoder(trained_run, synthetic_data_dir, tmp_path):
  from headspec.io import tables

  write_probes(trained_run, "sae", 200, layers=2)
  assert sae_cli(tmp_path, trained_run, synthetic_data_dir, **SMALL) == 0
  read = lambda name: headspec.read_table(trained_run, name)
  metrics_frame = read("sae_metrics")
  value = dict(zip(metrics_frame["metric"], metrics_frame["value"]))
  assert set(metrics_frame["sae"]) == {"topk-f256-k16"} and set(metrics_frame["layer"]) == {0}
  assert value["features"] == 256 and value["width"] == 32 and value["l0"] == pytest.approx(16)
  assert value["fvu"] < 0.5 and 0 <= value["dead_fraction"] <= 1 and 0 <= value["dense_fraction"] <= 1
  assert value["loss_zero_ablation"] > value["loss_clean"] + 0.01  # ablating layer 0's z costs something ...
  assert value["loss_recovered_zero"] > 0.7 and value["loss_recovered_mean"] > 0.5  # ... that the splice recovers
  assert value["loss_splice"] < value["loss_zero_ablation"]
  features = read("sae_features")
  assert len(features) == 256 and set(features["feature"]) == set(range(256))
  assert features["top_head"].between(0, 3).all() and features["entropy_bits"].between(0, 2 + 1e-9).all()
  heads = read("sae_heads")
  assert set(heads["head"]) == set(range(4))
  spec = heads[heads["metric"] == "specialization"]["value"]
  probe = heads[heads["metric"] == "probe_selectivity_upos"].sort_values("head")["value"]
  np.testing.assert_allclose(probe, [0.0, 0.1, 0.2, 0.3])  # layer 0's heads' dev selectivity, beside the features
  assert {"max_feature_selectivity_upos", "selective_features_deprel", "features_carried"} <= set(heads["metric"])
  assert len(spec) == 4 and spec.between(0.25 - 1e-9, 1).all()  # between 1/H and 1
  contexts = read("sae_contexts")
  assert len(contexts) and contexts["context"].str.contains(r"\[\[").all()
  assert set(contexts["split"]) == {"synthetic/dev"} and (contexts["rank"] < 5).all()
  labels = read("sae_labels")
  assert set(labels["label_set"]) == {"upos", "deprel", "head_distance"}
  sums = labels.groupby(["feature", "label_set"])["fraction"].sum()
  np.testing.assert_allclose(sums.to_numpy(), 1.0, atol=1e-9)  # each profile is a distribution
  for table in (tables.SAE_METRICS, tables.SAE_FEATURES, tables.SAE_HEADS, tables.SAE_CONTEXTS, tables.SAE_LABELS):
    assert tables.path_of(trained_run, table).is_file()
  (checkpoint,) = (trained_run / "sae" / "checkpoints").iterdir()  # resumable; fit_sae's tests resume one
  assert checkpoint.name.startswith("sae-step200-z0-")


@pytest.mark.slow  # 52 s at load ~5 (two layers' SAE, capture and splice programs compiled)
def test_every_layer_gets_an_sae_and_figures(short_run, synthetic_data_dir, tmp_path):
  """layers='all': one SAE per layer in every table; per (model, step) the heads heatmap over both layers and the
  entropy histogram, named <figure>_<model>_step<step>_<site>_<sae>.png."""
  import shutil

  from headspec.sae import plots

  run = tmp_path / "sae_all"
  shutil.copytree(short_run, run)
  tiny = dict(SMALL, layers="all", sae__features=32, sae__k=4, sae__train_steps=60, analysis__treebank="")
  assert sae_cli(tmp_path, run, synthetic_data_dir, **tiny) == 0
  heads = headspec.read_table(run, "sae_heads")
  assert set(zip(heads["layer"], heads["head"])) == {(l, h) for l in range(2) for h in range(4)}
  assert set(headspec.read_table(run, "sae_features")["layer"]) == {0, 1}
  figures = sorted(p.name for p in (run / "sae").glob("*.png"))
  assert figures == ["entropy_sae_all_step2_z_topk-f32-k4.png", "heads_sae_all_step2_z_topk-f32-k4.png"]
  assert all((run / "sae" / f).read_bytes()[:4] == b"\x89PNG" for f in figures)
  assert plots.tag("../a b", 3, "z", "topk-f8-k2").startswith("_._a_b-")  # one file-name component


def write_probes(workdir, model: str, step: int, layers: int, heads: int = 4) -> None:
  """A probes/results.csv with dev rows: head h of layer l has selectivity 0.1·h + l."""
  from headspec.io import tables

  rows = [dict(model=model, step=step, task="upos", layer=l, head=h, split="synthetic/dev", accuracy=0.5,
               ci_low=0.4, ci_high=0.6, control_accuracy=0.5 - (0.1 * h + l), selectivity=0.1 * h + l, n=10)
          for l in range(layers) for h in range(heads)]  # fmt: skip
  tables.merge(tables.path_of(workdir, tables.PROBES), rows, tables.PROBES)


@pytest.fixture(scope="module")
def short_run(train_tiny_decoder):
  return train_tiny_decoder(2, (), name="sae_bad")


@pytest.mark.parametrize(
  "overrides, message",
  [
    (dict(sae__features=0), "sae.features=0 must be a positive"),
    (dict(sae__features=-4), "sae.features=-4 must be a positive"),
    (dict(sae__features=8, sae__k=9), "sae.k=9 must be between 1 and sae.features=8"),
    (dict(sae__expansion=0.01), "sae.expansion=0.01 × input width 32 gives 0 features"),
    (dict(sae__kind="jump"), "kind='jump'; choose one of topk, relu, jumprelu"),
    (dict(site="nosuch"), "site='nosuch'"),
    (dict(site="pattern"), "site='pattern'"),
    (dict(layer=2), "layer=2 is not a layer of this model (0..1"),
    (dict(layer=-2), "layer=-2 is not a layer"),
    (dict(analysis__treebank="nosuch"), "nosuch"),
    (dict(layers="2"), "layers='2' names layer 2, but the model has 2 (0..1)"),
    (dict(layers="0,x"), "layers='0,x'; give ''"),
    (dict(layers="1,1"), "layers='1,1'; give ''"),
  ],
)
def test_bad_input_is_one_line_and_writes_nothing(short_run, synthetic_data_dir, tmp_path, capsys, overrides, message):
  before = snapshot(short_run)
  assert sae_cli(tmp_path, short_run, synthetic_data_dir, **{**SMALL, **overrides}) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("headspec: error:") and message in err and "\n" not in err
  assert snapshot(short_run) == before


def test_probes_of_another_model_shape_are_one_line_before_any_computation(
  short_run, synthetic_data_dir, tmp_path, capsys
):
  import shutil

  run = tmp_path / "sae_bad"
  shutil.copytree(short_run, run)
  write_probes(run, "sae_bad", 2, layers=3)  # the model has 2 layers
  before = snapshot(run)
  assert sae_cli(tmp_path, run, synthetic_data_dir, **SMALL) == 2
  lines = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
  assert len(lines) == 1 and "has a probe on layer 2 head 0, but the model has 2 layers" in lines[0]
  assert snapshot(run) == before


def test_nan_activations_are_one_line_and_write_nothing(short_run, synthetic_data_dir, tmp_path, capsys, monkeypatch):
  from headspec.sae import splice

  real = splice.capture

  def poisoned(*args, **kwargs):
    x, sums = real(*args, **kwargs)
    x[3, 1] = np.nan
    return x, sums

  monkeypatch.setattr(splice, "capture", poisoned)
  before = snapshot(short_run)
  assert sae_cli(tmp_path, short_run, synthetic_data_dir, **SMALL) == 2
  lines = [line for line in capsys.readouterr().err.splitlines() if "error" in line]  # after the progress bar
  assert len(lines) == 1 and lines[0].endswith("sae_bad step 2: z of layer 0: NaN or inf in 1 row(s), the first row 3")
  assert snapshot(short_run) == before


def test_jumprelu_recovers_planted_features_with_learned_thresholds():
  x, directions_PK, _ = planted(n=4096)
  sae = headspec.fit_sae(x, features=32, kind="jumprelu", l0=1.0, steps=1000, batch_size=256, lr=3e-3, progress=False)
  f = np.asarray(sae.encode(x[:1000]))
  assert metrics.l0(f) < 5  # 3 planted per input; thresholds start at 0.5 and are learned
  assert (directions_PK @ np.asarray(sae.W_dec_FK).T).max(1).mean() >= 0.9
  assert sae.threshold_F.shape == (32,) and float(np.median(sae.threshold_F)) != pytest.approx(0.5 * sae.info["scale"])
  np.testing.assert_allclose(np.linalg.norm(np.asarray(sae.W_dec_FK), axis=1), 1.0, atol=1e-5)


def test_jumprelu_straight_through_gradients():
  """Rajamanoharan et al. 2024 eqs. 11-12: ∂/∂θ of π·H(π − θ) is −(θ/ε)·K((π − θ)/ε), of H(π − θ) −(1/ε)·K(...)."""
  import jax
  import jax.numpy as jnp

  pre = jnp.array([[0.45, 0.9, 0.22], [0.55, 0.1, 0.31]])
  theta, eps = jnp.array([0.5, 0.5, 0.3]), 0.2
  g_pre, g_theta = jax.grad(lambda p, t: sae_train.jump_relu(p, t, eps).sum(), argnums=(0, 1))(pre, theta)
  np.testing.assert_allclose(g_pre, (pre > theta).astype(float))
  inside = np.abs(np.asarray(pre) - np.asarray(theta)) < eps / 2  # [[T, F, T], [T, F, T]]
  np.testing.assert_allclose(g_theta, -(np.asarray(theta) / eps) * inside.sum(0), rtol=1e-6)
  g_pre, g_theta = jax.grad(lambda p, t: sae_train.step_function(p, t, eps).sum(), argnums=(0, 1))(pre, theta)
  np.testing.assert_allclose(g_pre, 0.0)
  np.testing.assert_allclose(g_theta, -(1 / eps) * inside.sum(0), rtol=1e-6)
