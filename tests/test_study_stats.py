"""The study's tests over seeds: each equals scipy.stats' own, on small synthetic tables.

conditions.csv: condition − baseline paired by seed (scipy.stats.ttest_rel) or Welch (ttest_ind,
equal_var=False), Holm within each family; causal_seeds.csv: one-sample t (ttest_1samp), Holm and the TOST
(two one-sided ttest_1samp); formation_tests.csv: Fisher's exact test and Mann–Whitney U (fisher_exact,
mannwhitneyu) with a run that never formed counted as later than every step.
"""

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from headspec import study
from headspec.words import resampling


def test_holm_one_shared_helper():
  np.testing.assert_allclose(resampling.holm([0.01, 0.04, 0.03, np.nan]), [0.03, 0.06, 0.06, np.nan])
  assert study.holm is resampling.holm  # the study's rankings use the same one
  # Spearman with its permutation p-values and the MDE live in the shared layer too (the study uses them)
  for name in ("spearman", "within_layer_spearman", "mde"):
    assert getattr(study, name) is getattr(resampling, name), name
  rho, p = resampling.spearman([1, 2, 3, 4, 5], [2, 4, 6, 8, 11], permutations=200)
  assert rho == pytest.approx(1.0) and p < 0.05
  np.testing.assert_allclose(resampling.mde([-1.96], [1.96]), [1.96 + 0.8416])


def test_t_tests_equal_scipy():
  a, b = np.array([0.31, 0.27, 0.35, 0.30, 0.26]), np.array([0.35, 0.33, 0.34, 0.36, 0.30])
  t = resampling.one_sample_t(a - b)
  want = stats.ttest_rel(a, b)
  assert t["p"] == pytest.approx(want.pvalue) and t["mean"] == pytest.approx((a - b).mean())
  assert (t["low"], t["high"]) == pytest.approx(tuple(want.confidence_interval()))
  w = resampling.welch_t(a, b[:3])
  want = stats.ttest_ind(a, b[:3], equal_var=False)
  assert w["p"] == pytest.approx(want.pvalue) and w["df"] == pytest.approx(want.df)
  assert (w["low"], w["high"]) == pytest.approx(tuple(want.confidence_interval()))
  assert np.isnan(resampling.one_sample_t([0.1])["p"]) and np.isnan(resampling.welch_t([0.1], a)["p"])


def test_tost_is_two_one_sided_t_tests():
  v = np.array([0.002, -0.004, 0.001, 0.003, -0.001])
  for margin in (0.002, 0.01):
    low = stats.ttest_1samp(v, -margin, alternative="greater").pvalue
    high = stats.ttest_1samp(v, margin, alternative="less").pvalue
    assert resampling.tost(v, margin) == pytest.approx(max(low, high))
  assert resampling.tost(v, 0.01) < 0.05 < resampling.tost(v, 0.002)  # equivalent within 0.01, not 0.002
  # an interval that includes 0 is not equivalence: wide seeds, mean near 0
  wide = np.array([0.03, -0.03, 0.02, -0.025, 0.01])
  assert stats.ttest_1samp(wide, 0).pvalue > 0.05 and resampling.tost(wide, 0.01) > 0.05
  assert np.isnan(resampling.tost([0.1], 0.01)) and np.isnan(resampling.tost(v, 0.0))


def _emergence(values):
  return pd.DataFrame(
    [
      dict(run=f"{c}_s{s}", condition=c, seed=s, step=100, task="upos", selectivity=v, median_selectivity=0.1 * v)
      for c, seeds in values.items()
      for s, v in seeds.items()
    ]
  )


def test_conditions_paired_by_seed_or_welch_with_holm_per_family():
  base = {0: 0.30, 1: 0.35, 2: 0.28, 3: 0.33, 4: 0.31}
  drop = {0: 0.27, 1: 0.30, 2: 0.27, 3: 0.29, 4: 0.30}
  other = {10: 0.20, 11: 0.40, 12: 0.26}  # no seed in common with baseline: Welch
  em = _emergence(dict(baseline=base, drophead=drop, other=other))
  div = pd.DataFrame(
    [
      dict(run=f"{c}_s{s}", condition=c, seed=s, step=100, metric=f"m{m:02d}", value=v + 0.01 * m * (c == "drophead"))
      for c, seeds in (("baseline", base), ("drophead", drop))
      for s, v in seeds.items()
      for m in range(12)
    ]
  )
  causal = pd.DataFrame(
    [
      dict(run=f"{c}_s{s}", condition=c, seed=s, step=100, task="upos", k=k, metric=m, value=v * k, ci_low=np.nan,
           ci_high=np.nan, mde=np.nan)
      for c, seeds in (("baseline", base), ("drophead", drop))
      for s, v in seeds.items()
      for k in (1, 2)
      for m in ("probe_accuracy_vs_random", "loss_delta_vs_random", "probe_accuracy_fixed_vs_random")
    ]
  )  # fmt: skip
  rows = pd.DataFrame(study.conditions(em, div, causal))
  assert list(rows.columns) == study.COLUMNS["conditions"].split(",")
  seeds = sorted(base)
  r = rows[(rows["condition"] == "drophead") & (rows["measure"] == "selectivity")].iloc[0]
  want = stats.ttest_rel([drop[s] for s in seeds], [base[s] for s in seeds])
  assert r["test"] == "paired_t" and r["p_value"] == pytest.approx(want.pvalue) and r["seeds"] == 5
  assert (r["ci_low"], r["ci_high"]) == pytest.approx(tuple(want.confidence_interval()))
  w = rows[(rows["condition"] == "other") & (rows["measure"] == "selectivity")].iloc[0]
  want = stats.ttest_ind(list(other.values()), list(base.values()), equal_var=False)
  assert w["test"] == "welch_t" and w["p_value"] == pytest.approx(want.pvalue)
  assert (w["seeds"], w["baseline_seeds"]) == (3, 5)
  # families: Holm within each, never across them
  fam = rows[rows["condition"] == "drophead"].groupby("family")["measure"].count().to_dict()
  assert fam == {
    "drophead:specialization": 2,
    "drophead:diversity": 12,
    "drophead:probe_accuracy_vs_random": 2,
    "drophead:loss_delta_vs_random": 2,
  }
  for _family, g in rows.groupby("family"):
    np.testing.assert_allclose(g["p_holm"], resampling.holm(g["p_value"]))
  d = rows[rows["family"] == "drophead:diversity"].set_index("measure")
  assert d.loc["m00", "p_value"] < 0.05 < d.loc["m00", "p_holm"]  # uncorrected "significant", not over the 12
  c = rows[rows["family"] == "drophead:probe_accuracy_vs_random"].set_index("k")
  want = stats.ttest_rel([2 * drop[s] for s in seeds], [2 * base[s] for s in seeds])
  assert c.loc[2, "p_value"] == pytest.approx(want.pvalue) and c.loc[2, "task"] == "upos"


def _causal_rows(values, metric="probe_accuracy_vs_random", k=2):
  return [
    dict(condition="baseline", task="upos", k=k, metric=metric, value=v, ci_low=v - 0.01, ci_high=v + 0.01, mde=m)
    for v, m in values
  ]


def test_causal_over_seeds_t_test_holm_tost_and_loss_beside():
  dec = [(-0.03, 0.02), (-0.005, 0.03), (-0.02, 0.01)]
  rows = _causal_rows(dec) + _causal_rows([(-0.001, 0.01), (0.002, 0.01), (0.0, 0.01)], k=4)
  rows += _causal_rows([(0.2, 0.1), (0.3, 0.1), (0.25, 0.1)], metric="loss_delta_vs_random")
  rows += [dict(condition="baseline", task="upos", k=2, metric="other", value=9.0, ci_low=0, ci_high=0, mde=0)]
  out = pd.DataFrame(study.causal_seeds(pd.DataFrame(rows)))
  assert set(out.columns) == set(study.COLUMNS["causal_seeds"].split(","))
  r = out.set_index(["metric", "k"]).loc[("probe_accuracy_vs_random", 2)]
  values = [v for v, _ in dec]
  assert r["mean"] == pytest.approx(np.mean(values)) and r["seeds"] == 3 and r["below_0"] == 2 and r["mde"] == 0.02
  assert r["p_value"] == pytest.approx(stats.ttest_1samp(values, 0).pvalue) and r["t_low"] < r["mean"] < r["t_high"]
  dec_family = out[out["family"] == "baseline:probe_accuracy_vs_random"]
  assert len(dec_family) == 2  # k = 2 and 4; the loss rows are their own family
  np.testing.assert_allclose(dec_family["p_holm"], resampling.holm(dec_family["p_value"]))
  flat = out.set_index(["metric", "k"]).loc[("probe_accuracy_vs_random", 4)]
  assert flat["tost_margin"] == study.EQUIVALENCE_MARGINS["probe_accuracy_vs_random"]
  assert flat["tost_p"] == pytest.approx(resampling.tost([-0.001, 0.002, 0.0], flat["tost_margin"]))
  assert flat["tost_p"] < 0.05  # shown within the margin
  np.testing.assert_allclose(dec_family["tost_p_holm"], resampling.holm(dec_family["tost_p"]))
  assert (dec_family["tost_p_holm"] >= dec_family["tost_p"]).all()
  loss = out.set_index(["metric", "k"]).loc[("loss_delta_vs_random", 2)]
  assert loss["above_0"] == 3 and loss["family"] == "baseline:loss_delta_vs_random"


def test_formation_tests_fisher_and_mann_whitney_with_never_last(monkeypatch):
  """The induction setting's 2-layer counts as docs/study.md reports them: with MLPs 5 of 5 seeds label an
  induction head at step 1,500; attention-only 3 of 5 (2,000, 2,000, 3,000; two never)."""
  monkeypatch.setattr(study.statistics, "_label_min", lambda: 0.4)
  steps = {"L2_mlp": [1500] * 5, "L2_attn_only": [2000, 2000, 3000, None, None]}
  roles = pd.DataFrame(
    [
      dict(run=f"{c}_s{s}", condition=c, seed=s, step=step, role="induction", layer=1, head=0,
           score=0.9 if first is not None and step >= first else 0.1, median_score=0.0)
      for c, firsts in steps.items()
      for s, first in enumerate(firsts)
      for step in (0, 1000, 1500, 2000, 3000, 6000)
    ]
  )  # fmt: skip
  fo = pd.DataFrame(
    [
      dict(run=f"{c}_s{s}", condition=c, seed=s, source="loss", task="repeat_drop", layer=-1, head=-1, init_best=0.0,
           formation_step=np.nan if first is None else first)
      for c, firsts in steps.items()
      for s, first in enumerate(firsts)
    ]
  )  # fmt: skip
  out = pd.DataFrame(study.formation_tests(roles, fo)).set_index("quantity")
  assert set(out.columns) | {"quantity"} == set(study.COLUMNS["formation_tests"].split(","))
  assert set(out.index) == {"label/induction", "loss/repeat_drop"}  # nothing else formed
  for quantity in out.index:
    r = out.loc[quantity]
    assert (r["condition_a"], r["formed_a"], r["condition_b"], r["formed_b"]) == ("L2_attn_only", 3, "L2_mlp", 5)
    assert r["fisher_p"] == pytest.approx(stats.fisher_exact([[3, 2], [5, 0]]).pvalue)
    assert r["fisher_p"] == pytest.approx(0.4444, abs=1e-4)  # "reliable" is not shown by 5/5 vs 3/5
    want = stats.mannwhitneyu([2000, 2000, 3000, np.inf, np.inf], [1500] * 5, alternative="two-sided")
    assert r["mannwhitney_p"] == pytest.approx(want.pvalue) and r["mannwhitney_u"] == want.statistic
    assert r["mannwhitney_p"] < 0.01  # "earlier" is
    assert (r["median_step_a"], r["median_step_b"]) == (3000, 1500)
    assert r["fisher_p_holm"] == pytest.approx(r["fisher_p"])  # one pair: Holm leaves it


def test_mean_over_draws_resamples_the_draws_only_when_they_are_a_sample():
  rng = np.random.default_rng(0)
  boot_RD = rng.normal(size=(2000, 3)) * 0.01 + np.array([0.0, 1.0, 2.0])  # the draws differ a lot
  exact = resampling.mean_over_draws_R(boot_RD, resample_draws=False, seed=0)
  np.testing.assert_allclose(exact, boot_RD.mean(1))
  two_stage = resampling.mean_over_draws_R(boot_RD, resample_draws=True, seed=0)
  assert two_stage.std() > 10 * exact.std()  # the draws' spread enters the interval
  assert two_stage.mean() == pytest.approx(1.0, abs=0.05)
  np.testing.assert_array_equal(two_stage, resampling.mean_over_draws_R(boot_RD, resample_draws=True, seed=0))


def test_headspec_study_writes_the_tests(tmp_path):
  """write_study end to end: conditions.csv holds the causal test's paired differences (decodability and LM
  loss) with their families, causal_seeds.csv and formation_tests.csv are written, summary.md shows them."""
  from test_study import _selectivity_rows

  from headspec.io import tables
  from headspec.launch import experiments

  root = tmp_path / "exp"
  runs = tuple(experiments.Run(f"{c}_s{s}", "c.py", c, s) for c in ("baseline", "drophead") for s in range(3))
  experiments.write_plan(root, experiments.Experiment(runs=runs, analyses=()), "c.py")
  dec = {("baseline", s): v for s, v in enumerate((-0.02, -0.03, -0.025))}
  dec |= {("drophead", s): v for s, v in enumerate((-0.005, -0.01, 0.0))}
  for run in runs:
    sel = _selectivity_rows(run.name, 100, {(0, 0): (0.3, 0.3 + 0.01 * run.seed, 0.2), (0, 1): (0.1, 0.1, 0.0)})
    tables.write(tables.path_of(root / run.name, tables.PROBE_SELECTIVITY), sel, tables.PROBE_SELECTIVITY)
    v = dec[(run.condition, run.seed)]
    causal = [
      dict(model=run.name, step=100, kind="probe_selective", task="upos", k=1, selection="selective", seed=-1,
           metric=metric, value=value, ci_low=value - 0.01, ci_high=value + 0.01)
      for metric, value in (("probe_accuracy_vs_random", v), ("loss_delta_vs_random", -v))
    ]  # fmt: skip
    tables.write(tables.path_of(root / run.name, tables.ABLATION_CAUSAL), causal, tables.ABLATION_CAUSAL)
  summary = study.write_study(root).read_text()
  co = pd.read_csv(root / "study/conditions.csv")
  row = co[co["measure"] == "probe_accuracy_vs_random"].iloc[0]
  want = stats.ttest_rel([dec[("drophead", s)] for s in range(3)], [dec[("baseline", s)] for s in range(3)])
  assert (row["k"], row["test"], row["family"]) == (1, "paired_t", "drophead:probe_accuracy_vs_random")
  assert row["p_value"] == pytest.approx(want.pvalue) and row["difference"] == pytest.approx(0.02)
  assert set(co["family"]) >= {"drophead:specialization", "drophead:loss_delta_vs_random"}
  cs = pd.read_csv(root / "study/causal_seeds.csv")
  assert list(cs.columns) == study.COLUMNS["causal_seeds"].split(",")
  assert set(cs["metric"]) == {"probe_accuracy_vs_random", "loss_delta_vs_random"} and len(cs) == 4
  assert list(pd.read_csv(root / "study/formation_tests.csv").columns) == study.COLUMNS["formation_tests"].split(",")
  assert "### Over seeds: the causal test per condition, decodability and LM loss" in summary
  assert "tost_p" in summary and "condition:probe_accuracy_vs_random" in summary


def test_loss_equivalence_margin_is_a_fraction_of_ablating_every_head(tmp_path):
  """The LM-loss TOST margin is EQUIVALENCE's fraction × the condition's mean |loss change with every
  head zero-ablated| (pruning.csv's last point), not a fixed 0.01 nats that exceeds what a whole layer's
  attention costs; without that point the margin and TOST are NaN (no claim). The old fixed margin called
  these near-zero cells equivalent (tost_p < 0.05 at 0.01 nats); on the all-heads scale they are not shown."""
  import importlib

  from headspec.io import tables
  from headspec.study import statistics

  collect = importlib.import_module("headspec.study.collect")  # the module (the package exports its function)

  kind, fraction = statistics.EQUIVALENCE["loss_delta_vs_random"]
  assert kind == "all_heads"
  cells = _causal_rows([(0.004, 0.01), (0.005, 0.01), (0.006, 0.01)], metric="loss_delta_vs_random")
  assert resampling.tost([0.004, 0.005, 0.006], 0.01) < 0.05  # "equivalent" at the old ±0.01 nats
  every = [
    dict(condition="baseline", task="", k=16, metric=statistics.ALL_HEADS_METRIC, value=v) for v in (0.02, -0.04)
  ]
  out = pd.DataFrame(study.causal_seeds(pd.DataFrame(cells + every))).iloc[0]
  assert out["tost_margin"] == pytest.approx(fraction * 0.03)
  assert out["tost_p"] == pytest.approx(resampling.tost([0.004, 0.005, 0.006], fraction * 0.03)) and out["tost_p"] > 0.5
  alone = pd.DataFrame(study.causal_seeds(pd.DataFrame(cells))).iloc[0]
  assert np.isnan(alone["tost_margin"]) and np.isnan(alone["tost_p"]) and np.isnan(alone["tost_p_holm"])
  fixed = {"probe_accuracy_vs_random": ("absolute", 0.01), "loss_delta_vs_random": ("absolute", 0.01)}
  assert study.causal_seeds(pd.DataFrame(cells), equivalence=fixed)[0]["tost_p"] < 0.05  # configurable
  # collect: the all-heads row is ablation/pruning.csv's loss at the fully pruned point minus with none pruned, at
  # the last step (the table holds `loss` and `accuracy`, as headspec/ablation/pruning.py writes them)
  points = [(8, "random", 0, "loss", 5.0), (8, "importance", 0, "loss", 5.0), (8, "random", 4, "loss", 5.5),
            (8, "importance", 4, "loss", 5.5), (8, "random", 2, "loss", 5.1), (8, "random", 4, "accuracy", 0.01),
            (0, "random", 4, "loss", 9.0), (0, "random", 0, "loss", 1.0)]  # fmt: skip
  rows = [dict(model="m", step=s, ranking=r, seed=-1, heads_pruned=n, fraction_pruned=n / 4, metric=m, value=v)
          for s, r, n, m, v in points]  # fmt: skip
  tables.write(tables.path_of(tmp_path, tables.ABLATION_PRUNING), rows, tables.ABLATION_PRUNING)
  run = dict(run="r", condition="baseline", seed=0)
  [row] = collect._all_heads_loss(run, tmp_path)
  assert (row["metric"], row["step"], row["k"]) == (statistics.ALL_HEADS_METRIC, 8, 4)
  assert row["value"] == pytest.approx(0.5)
  assert collect._all_heads_loss(run, tmp_path / "none") == []


def test_induction_check_family_holds_every_cell_unless_a_primary_is_declared():
  """The 4-layer induction claims once quoted Holm over the zero-ablation cells only, leaving out the
  mean-ablation cells run alongside. With no primary declared the family is every cell of the condition (2
  ablations × 2 controls × 3 k); a declared primary's cells form the claims' family and each secondary cell is
  corrected over all of them. Only the last step counts; a primary that was not run is refused."""
  from headspec.study import statistics

  rng = np.random.default_rng(0)
  rows = []
  for seed in range(5):
    for control in statistics.INDUCTION_CONTROLS:
      for ablation in ("zero", "mean"):
        for k in (1, 2, 4):
          for step, shift in ((100, 9.0), (600, 0.3 * k)):
            rows.append(dict(run=f"s{seed}", condition="c", seed=seed, step=step, measure=f"{control} ({ablation})",
                             k=k, value=shift + rng.normal()))  # fmt: skip
    rows.append(dict(run=f"s{seed}", condition="c", seed=seed, step=600, measure="repeat_drop", k=np.nan, value=6.0))
  frame = pd.DataFrame(rows)
  assert statistics.INDUCTION_PRIMARY is None  # the study's default: one family of every cell
  out = pd.DataFrame(statistics.induction_tests(frame))
  assert len(out) == 12 and set(out["family"]) == {"c:induction:all"} and (out["seeds"] == 5).all()
  np.testing.assert_allclose(out["p_holm"], resampling.holm(out["p_value"]))
  last = frame[(frame["step"] == 600) & (frame["measure"] == f"{statistics.INDUCTION_CONTROLS[0]} (zero)")]
  one = out[(out["control"] == statistics.INDUCTION_CONTROLS[0]) & (out["ablation"] == "zero") & (out["k"] == 1)]
  assert one["mean"].item() == pytest.approx(last[last["k"] == 1]["value"].mean())  # the last step only
  primary = pd.DataFrame(statistics.induction_tests(frame, primary="zero"))
  zero, mean = primary[primary["ablation"] == "zero"], primary[primary["ablation"] == "mean"]
  assert set(zero["family"]) == {"c:induction:zero"} and set(mean["family"]) == {"c:induction:all"}
  np.testing.assert_allclose(zero["p_holm"], resampling.holm(zero["p_value"]))
  every = resampling.holm(primary["p_value"])
  np.testing.assert_allclose(mean["p_holm"], every[primary["ablation"].to_numpy() == "mean"])
  assert (zero["p_holm"].to_numpy() <= out[out["ablation"] == "zero"]["p_holm"].to_numpy() + 1e-12).all()
  with pytest.raises(ValueError, match="not among"):
    statistics.induction_tests(frame, primary="resample")
