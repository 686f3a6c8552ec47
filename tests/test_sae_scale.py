"""SAE head shares controlled for scale, and the splice's fidelity (headspec/sae/, docs/sae.md)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

import headspec
from headspec.errors import UserError
from headspec.sae import metrics
from headspec.sae.model import SAE

H, KH, PER_HEAD = 4, 8, 4  # identical structure in every head: 4 planted unit directions in each 8-wide slice


def planted(n: int = 4096, active: int = 4, seed: int = 0):
  """x_NK: sparse sums of 16 planted directions, 4 inside each head's slice, plus a little noise."""
  rng = np.random.default_rng(seed)
  K, P = H * KH, H * PER_HEAD
  directions_PK = np.zeros((P, K))
  for p, h in enumerate(np.repeat(np.arange(H), PER_HEAD)):
    u = rng.normal(size=KH)
    directions_PK[p, h * KH : (h + 1) * KH] = u / np.linalg.norm(u)
  coef_NP = np.zeros((n, P))
  for row in coef_NP:
    row[rng.choice(P, active, replace=False)] = rng.uniform(1, 2, active)
  return coef_NP @ directions_PK + 0.01 * rng.normal(size=(n, K))


def specialization(x_NK, **options):
  """[H] S_h of a TopK SAE with fewer features (12) than planted directions (16), so heads compete for them."""
  sae = headspec.fit_sae(x_NK, features=12, kind="topk", k=4, steps=600, batch_size=256, lr=3e-3, seed=0,
                         progress=False, **options)  # fmt: skip
  live_F = metrics.firing_rates(np.asarray(sae.encode(x_NK))) > 0
  return metrics.specialization(headspec.sae_head_fractions(sae, heads=H), live_F)


@pytest.mark.parametrize("scale", [0.1, 0.3])
def test_a_small_heads_specialization_collapses_with_one_scale_and_not_per_head(scale):
  """Head 3's z scaled down: with one global scale its features go to the louder heads and S_3 collapses (0.07 at
  0.1×, 0.32 at 0.3×, the others 0.88-0.94); with each head at unit RMS S_3 is within the others' spread."""
  x = planted()
  x[:, 3 * KH :] *= scale
  S_global = specialization(x)
  assert S_global[3] < 0.5 * S_global[:3].min()
  S_head = specialization(x, normalize="per_head", heads=H)
  assert S_head.min() > 0.7 and abs(S_head[3] - S_head[:3].mean()) < 0.15


@pytest.mark.parametrize("kind", ["topk", "jumprelu"])
def test_per_head_scales_are_folded_back_so_the_sae_reads_raw_z(kind):
  """A per-head SAE on x equals a global-scale SAE on x with each head rescaled to the global RMS (the same
  inputs after scaling): its features times 1, its reconstruction times each head's scale, its decoder in the
  trained coordinates that one's; head shares from those coordinates."""
  x = planted(n=1024)
  x[:, : 2 * KH] *= 3.0
  x[:, 3 * KH :] *= 0.2
  kw = dict(features=16, kind=kind, k=4, steps=30, batch_size=128, lr=3e-3, seed=0, progress=False)
  per_head = headspec.fit_sae(x, normalize="per_head", heads=H, **kw)
  s_H = metrics.head_rms(x, H)
  s = float(np.sqrt(np.mean(s_H**2)))
  rel_K = np.repeat(s_H / s, KH)
  x_equal = (x / rel_K).astype(np.float32)
  equal = headspec.fit_sae(x_equal, **kw)
  assert per_head.info["head_scales"] == pytest.approx(s_H.tolist(), rel=1e-5)
  np.testing.assert_allclose(np.asarray(per_head.head_scale_K), rel_K, rtol=1e-5)
  np.testing.assert_allclose(np.asarray(per_head.encode(x)), np.asarray(equal.encode(x_equal)), atol=2e-3, rtol=1e-3)
  np.testing.assert_allclose(np.asarray(per_head(x)), np.asarray(equal(x_equal)) * rel_K, atol=2e-3, rtol=1e-3)
  np.testing.assert_allclose(np.asarray(per_head.trained_decoder_FK), np.asarray(equal.W_dec_FK), atol=1e-4)
  np.testing.assert_allclose(np.linalg.norm(np.asarray(per_head.trained_decoder_FK), axis=1), 1.0, atol=1e-5)
  np.testing.assert_allclose(headspec.sae_head_fractions(per_head, heads=H),
                             headspec.sae_head_fractions(equal, heads=H), atol=1e-4)  # fmt: skip
  glob = headspec.fit_sae(x, **kw)  # the default: one scale, folded into the biases; no head scales
  assert glob.head_scale_K is None and "head_scales" not in glob.info
  np.testing.assert_array_equal(np.asarray(glob.trained_decoder_FK), np.asarray(glob.W_dec_FK))


@pytest.mark.parametrize(
  "kwargs, message",
  [
    (dict(normalize="rms"), "normalize='rms'; choose one of global, per_head"),
    (dict(normalize="per_head"), "normalize='per_head' needs heads >= 1"),
    (dict(normalize="per_head", heads=3), "heads=3 does not divide the input width 32"),
  ],
)
def test_bad_normalisation_is_one_line(kwargs, message):
  with pytest.raises(UserError, match=message):
    headspec.fit_sae(planted(n=64), features=8, k=2, progress=False, **kwargs)


def test_head_rms():
  x = np.concatenate([np.full((3, 2), 2.0), np.array([[3.0, 4.0], [0.0, 0.0], [0.0, 0.0]])], 1)
  np.testing.assert_allclose(metrics.head_rms(x, 2), [2.0, np.sqrt(25 / 6)])


def _model():
  from flax import nnx

  from headspec.model.config import ModelConfig
  from headspec.model.transformer import Transformer

  cfg = ModelConfig(kind="decoder", vocab_size=40, num_layers=2, num_heads=4, d_model=32, d_head=8, d_ff=64,
                    max_len=16)  # fmt: skip
  return Transformer(cfg, rngs=nnx.Rngs(params=0))


def test_splice_kl_and_agreement():
  """A perfect reconstruction: KL 0, agreement 1, the clean loss; a zero SAE (x̂ = b_dec = 0): zero ablation's
  KL > 0, equal to KL(p_clean ‖ p_spliced) computed here from the two passes' logits."""
  from scipy.special import log_softmax

  from headspec.model import edits
  from headspec.sae import splice
  from headspec.words.evalset import Batch

  model = _model()
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, 40, (4, 12)).astype(np.int32)
  valid = np.ones_like(tokens, bool)
  weights = np.ones(tokens.shape, np.float32)
  weights[:, -1] = 0
  batches = [Batch(tokens[i : i + 2], valid[i : i + 2], np.roll(tokens, -1, 1)[i : i + 2], weights[i : i + 2],
                   np.arange(2)) for i in (0, 2)]  # fmt: skip
  E = 32
  identity = SAE(jnp.eye(E), jnp.zeros(E), jnp.eye(E), jnp.zeros(E), jnp.full(E, -jnp.inf), kind="jumprelu")
  zero = SAE(jnp.zeros((E, E)), jnp.zeros(E), jnp.zeros((E, E)), jnp.zeros(E), kind="relu")
  mean_E = np.zeros(E)
  perfect = splice.scores(model, batches, "z", 0, identity, mean_E)
  assert perfect["kl"]["splice"] == pytest.approx(0.0, abs=1e-6) and perfect["agreement"]["splice"] == 1.0
  assert perfect["loss"]["splice"] == pytest.approx(perfect["loss"]["clean"], abs=1e-5)
  assert splice.losses(model, batches, "z", 0, identity, mean_E) == perfect["loss"]
  bad = splice.scores(model, batches, "z", 0, zero, mean_E)
  assert bad["kl"]["splice"] > 1e-4 and bad["kl"]["splice"] == pytest.approx(bad["kl"]["zero_ablation"], rel=1e-5)
  assert 0 <= bad["agreement"]["splice"] <= 1
  clean, _ = model(jnp.asarray(tokens))
  spliced, _ = model(jnp.asarray(tokens), interventions={"z": edits.splice(zero, layers=0)})
  logq, logp = log_softmax(np.asarray(clean, np.float64), -1), log_softmax(np.asarray(spliced, np.float64), -1)
  kl_BT = (np.exp(logq) * (logq - logp)).sum(-1)
  assert bad["kl"]["splice"] == pytest.approx((kl_BT * weights).sum() / weights.sum(), rel=1e-4)
  agree_BT = np.asarray(clean).argmax(-1) == np.asarray(spliced).argmax(-1)
  assert bad["agreement"]["splice"] == pytest.approx((agree_BT * weights).sum() / weights.sum())


def test_study_sets_s_h_against_z_rms_beside_selectivity(tmp_path):
  """study/sae_heads.csv carries each head's z RMS; sae.csv per task ρ(S_h, z RMS) over the heads ρ(S_h,
  selectivity) uses, Holm apart from the selectivity rows, and summary.md shows it with its interval over seeds."""
  import pandas as pd
  from test_study import _sae_head_rows, _selectivity_rows

  from headspec import study
  from headspec.io import tables
  from headspec.launch import experiments

  root = tmp_path / "exp"
  exp = experiments.Experiment(runs=(experiments.Run("baseline_s0", "c.py", "baseline", 0),), analyses=())
  experiments.write_plan(root, exp, "c.py")
  run = root / "baseline_s0"
  heads = [(layer, head) for layer in range(2) for head in range(3)]
  sel = {k: (0.1 * i, 0.1 * i, 0.1 * i - 0.02) for i, k in enumerate(heads)}
  tables.write(tables.path_of(run, tables.PROBE_SELECTIVITY), _selectivity_rows("baseline_s0", 100, sel),
               tables.PROBE_SELECTIVITY)  # fmt: skip
  rows = _sae_head_rows("baseline_s0", 100, {k: (0.3 + 0.05 * i, 0) for i, k in enumerate(heads)})
  key = dict(model="baseline_s0", step=100, site="z", sae="topk-f64-k4", metric="z_rms")
  rows += [key | dict(layer=layer, head=head, value=1.0 - 0.1 * i) for i, (layer, head) in enumerate(heads)]
  tables.write(tables.path_of(run, tables.SAE_HEADS), rows, tables.SAE_HEADS)
  summary = study.write_study(root).read_text()
  per_head = pd.read_csv(root / "study" / "sae_heads.csv").set_index(["layer", "head"])
  assert per_head.loc[(1, 2), "z_rms"] == pytest.approx(0.5)
  s = pd.read_csv(root / "study" / "sae.csv").set_index(["measure", "task"])
  assert s.loc[("spearman_z_rms", "upos"), "value"] == pytest.approx(-1.0)
  assert s.loc[("spearman_z_rms", "upos"), "heads"] == 6
  assert s.loc[("spearman_z_rms", "upos"), "p_holm"] == pytest.approx(s.loc[("spearman_z_rms", "upos"), "p_value"])
  assert s.loc[("spearman_selectivity", "upos"), "value"] == pytest.approx(1.0)
  assert "| baseline | topk-f64-k4 | spearman_z_rms | upos | 100 | -1.000 |" in summary


@pytest.mark.slow  # ~80 s: trains the tiny decoder, then one SAE with its splice
def test_cli_per_head_writes_z_rms_and_the_splice_fidelity(train_tiny_decoder, synthetic_data_dir, tmp_path, capsys):
  from test_sae import SMALL, sae_cli

  workdir = train_tiny_decoder(200, (), name="sae_scale")
  small = SMALL | dict(analysis__treebank="", sae__normalize="per_head")
  assert sae_cli(tmp_path, workdir, synthetic_data_dir, **small) == 0
  frame = headspec.read_table(workdir, "sae_metrics")
  value = dict(zip(frame["metric"], frame["value"]))
  assert value["kl_splice"] < value["kl_zero_ablation"] and value["kl_splice"] >= 0
  assert 0.5 < value["agreement_splice"] <= 1 and value["agreement_zero_ablation"] <= value["agreement_splice"]
  assert value["kl_recovered_zero"] > 0.5 and value["eval_tokens"] > 0
  heads = headspec.read_table(workdir, "sae_heads")
  z_rms = heads[heads["metric"] == "z_rms"].sort_values("head")["value"].to_numpy()
  assert len(z_rms) == 4 and (z_rms > 0).all()
  capsys.readouterr()
  for bad, message in ((dict(sae__normalize="unit"), "sae.normalize='unit'; choose one of global, per_head"),
                       (dict(site="resid_pre"), "sae.normalize='per_head' needs a site with heads")):  # fmt: skip
    assert sae_cli(tmp_path, workdir, synthetic_data_dir, **(small | bad)) == 2
    assert message in capsys.readouterr().err


def test_the_study_settings_normalise_per_head():
  """The study's SAE stages (natural text, induction) train on each head's z at unit RMS; `headspec sae` keeps
  one global scale by default."""
  from headspec.configs.experiments import induction, specialization
  from headspec.sae.config import sae_config

  assert specialization.sae_stage_config().sae.normalize == "per_head"
  assert induction.get_config("sae").sae.normalize == "per_head"
  assert sae_config().sae.normalize == "global"
