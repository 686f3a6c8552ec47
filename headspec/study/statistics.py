"""The study's tests over seeds and runs: intervals, paired differences, families with Holm (docs/study.md "Statistics")."""

from __future__ import annotations

import numpy as np

from headspec.words import resampling


def _label_min() -> float:
  """induction.label_min's default: the score at which attention/labels.csv names a head by its role."""
  from headspec.attention.config import attention_config

  return float(attention_config().induction.label_min)


def _label_steps(roles_frame):
  """Per condition and role: the first kept step at which a run's best head reaches `_label_min()` (Olsson et al.'s
  formation window's upper end, attention/induction_summary.md), its median and range over seeds, and how
  many seeds reached it by their last step."""
  import pandas as pd

  rows, label_min = [], _label_min()
  for (condition, _run, role), g in roles_frame.groupby(["condition", "run", "role"]):
    reached = g[g["score"] >= label_min]["step"]
    rows.append(dict(condition=condition, role=role, step=reached.min() if len(reached) else np.nan))
  frame = pd.DataFrame(rows, columns=["condition", "role", "step"])
  return (
    frame.groupby(["condition", "role"])["step"]
    .agg(median="median", min="min", max="max", seeds_reached="count", seeds="size")
    .reset_index()
  )


CAUSAL_MEASURES = {  # the causal test's metrics the study tests over seeds, and what each measures
  "probe_accuracy_vs_random": "decodability after ablation (a probe refitted on the ablated last layer)",
  "loss_delta_vs_random": "LM loss change (> 0: the model needs the selective heads more)",
}
# Equivalence margins of the TOST (`causal_seeds`), per metric: ("absolute", m): |selective − random| < m; or
# ("all_heads", f): |selective − random| < f × the mean over the condition's runs of |the LM-loss change with every
# head zero-ablated| (ALL_HEADS_METRIC rows, from ablation/pruning.csv's last point), a margin on the scale of what
# the heads do at all. Why: a fixed ±0.01 nats was wider than zero-ablating a whole layer's attention in the
# natural-text setting (0.001–0.003 nats), so equivalence within it said nothing. No all-heads effect measured:
# margin and TOST NaN (no claim). headspec study takes no config: set it here or pass `equivalence=` to
# causal_seeds; the margin used is written beside every TOST p (`tost_margin`).
EQUIVALENCE = {"probe_accuracy_vs_random": ("absolute", 0.01), "loss_delta_vs_random": ("all_heads", 0.1)}
EQUIVALENCE_MARGINS = {m: v for m, (kind, v) in EQUIVALENCE.items() if kind == "absolute"}  # the absolute ones
ALL_HEADS_METRIC = "loss_delta_all_heads"  # study causal rows: a run's LM-loss change with every head zero-ablated


def equivalence_margin(causal, condition: str, metric: str, equivalence=None) -> float:
  """The TOST margin of `metric` for `condition` (EQUIVALENCE's rule; `causal`: the study's causal rows)."""
  kind, value = (equivalence or EQUIVALENCE)[metric]
  if kind == "absolute":
    return float(value)
  if kind != "all_heads":
    raise ValueError(f"equivalence margin of {metric}: kind {kind!r} is not 'absolute' or 'all_heads'")
  ref = causal[(causal["condition"] == condition) & (causal["metric"] == ALL_HEADS_METRIC)]["value"].to_numpy(float)
  ref = ref[np.isfinite(ref)]
  return float(value * np.abs(ref).mean()) if len(ref) else float("nan")


def conditions(em, div=None, causal=None, baseline: str = "baseline") -> list[dict]:
  """conditions.csv rows: per non-baseline condition, the difference condition − baseline at each run's last
  step, tested (`_difference`): paired by seed where the two conditions share 2 or more seeds (seed s minus
  baseline's seed s; a t test over the pairs, its 95% t interval), else Welch's t test over all seeds of each.
  Measures, each with its family (`family`, Holm-adjusted within it, `p_holm`; docs/study.md "Statistics"):
    <condition>:specialization  from the emergence rows `em`, per task, `selectivity` (the best head's test
                                selectivity) and `best_minus_median`;
    <condition>:diversity       from the diversity rows `div`, task '' and each diversity metric (its mean
                                over layers and head pairs);
    <condition>:<metric>        from the study's causal rows `causal`, per task and k, each of
                                CAUSAL_MEASURES (the causal test's selective − random, per run).
  A t interval rather than a bootstrap over seeds: with 3 to 5 seeds a bootstrap has few distinct resamples
  and its percentile interval cannot reach past the observed differences (too narrow); the t test assumes
  roughly normal seed differences. With one seed paired the interval and p are undefined and stay NaN."""
  last = em[em["step"] == em.groupby("run")["step"].transform("max")]
  last = last.assign(best_minus_median=last["selectivity"] - last["median_selectivity"], k=np.nan)
  out = _paired(last, ("selectivity", "best_minus_median"), baseline, "specialization")
  if div is not None and len(div):
    d = div[div["step"] == div.groupby("run")["step"].transform("max")]
    wide = d.pivot_table(index=["run", "condition", "seed", "step"], columns="metric", values="value")
    out += _paired(wide.reset_index().assign(task="", k=np.nan), tuple(sorted(d["metric"].unique())), baseline,
                   "diversity")  # fmt: skip
  if causal is not None and len(causal):
    for metric in CAUSAL_MEASURES:
      c = causal[causal["metric"] == metric]
      if len(c):
        out += _paired(c.rename(columns={"value": metric}), (metric,), baseline, metric, by=("task", "k"))
  adjusted = {}
  for family in dict.fromkeys(r["family"] for r in out):
    mine = [i for i, r in enumerate(out) if r["family"] == family]
    adjusted.update(zip(mine, resampling.holm([out[i]["p_value"] for i in mine])))
  for i, r in enumerate(out):
    r["p_holm"] = float(adjusted[i])
  return out


def _difference(cond, base) -> dict:
  """condition − baseline of one measure: `cond`, `base` {seed: value}. Paired t test over the shared seeds
  when there are 2 or more (or exactly 1 and no Welch is possible: its difference, NaN interval and p),
  else Welch's t test over every seed of each."""
  shared = sorted(set(cond) & set(base))
  if len(shared) >= 2 or (len(shared) == 1 and (len(cond) < 2 or len(base) < 2)):
    t = resampling.one_sample_t([cond[s] - base[s] for s in shared])
    return dict(difference=t["mean"], ci_low=t["low"], ci_high=t["high"], seeds=t["n"], baseline_seeds=t["n"],
                test="paired_t", p_value=t["p"])  # fmt: skip
  t = resampling.welch_t(list(cond.values()), list(base.values()))
  return dict(difference=t["mean"], ci_low=t["low"], ci_high=t["high"], seeds=t["n"], baseline_seeds=t["n_b"],
              test="welch_t", p_value=t["p"])  # fmt: skip


def _paired(last, measures: tuple[str, ...], baseline: str, kind: str, by=("task",)) -> list[dict]:
  """condition − baseline per (condition, *by) and measure, at each run's last step (`_difference`): one
  row each, family `<condition>:<kind>`. A seed whose runs end at different steps is not paired."""
  base = last[last["condition"] == baseline]
  if base.empty:  # nothing to compare with
    return []
  out = []
  for (condition, *keys), g in last[last["condition"] != baseline].groupby(["condition", *by], dropna=False):
    b = base
    for key, value in zip(by, keys):
      b = b[b[key].isna()] if isinstance(value, float) and np.isnan(value) else b[b[key] == value]
    for measure in measures:
      mine = {(s, st): v for s, st, v in zip(g["seed"], g["step"], g[measure]) if not np.isnan(v)}
      theirs = {(s, st): v for s, st, v in zip(b["seed"], b["step"], b[measure]) if not np.isnan(v)}
      if not mine or not theirs:
        continue
      row = _difference(mine, theirs)
      keyed = dict(zip(by, keys))
      out.append(dict(condition=condition, task=keyed.get("task", ""), measure=measure, k=keyed.get("k", np.nan),
                      **row, family=f"{condition}:{kind}"))  # fmt: skip
  return out


def seed_interval(values) -> tuple[float, float, float]:
  """(mean, low, high): the 95% t interval over seeds, mean ± t_0.975,n−1 · sd / √n (NaN for the bounds
  with fewer than 2 seeds). Seeds are the study's unit of replication: this interval covers training,
  probe fit and control draw, where the sentence bootstrap covers the evaluation sentences only."""
  from scipy import stats

  v = np.asarray(values, np.float64)
  v = v[~np.isnan(v)]
  n = len(v)
  mean = float(v.mean()) if n else np.nan
  half = float(stats.t.ppf(0.975, n - 1) * v.std(ddof=1) / np.sqrt(n)) if n >= 2 else np.nan
  return mean, mean - half, mean + half


def _formation_summary(fo):
  """Per condition, source, task and layer: the median formation step over the layer's heads in each seed
  (a head that never formed counts as later than every step, so the median is NaN, never, when half or
  more of the heads never formed), the median, min and max of those over seeds, and how many seeds had a
  head of the layer form at all."""
  keys = ["condition", "source", "task", "layer"]
  per_seed = (
    fo.assign(step=fo["formation_step"].fillna(np.inf), formed=fo["formation_step"].notna())
    .groupby([*keys, "seed"])
    .agg(median=("step", "median"), formed=("formed", "any"))
    .reset_index()
  )
  per_seed["median"] = per_seed["median"].replace(np.inf, np.nan)
  return (
    per_seed.groupby(keys)
    .agg(median=("median", "median"), min=("median", "min"), max=("median", "max"),
         seeds_formed=("formed", "sum"), seeds=("seed", "count"))
    .reset_index()
  )  # fmt: skip


# Shared with the other analyses (headspec/words/resampling.py): Holm (1979), Spearman's ρ with permutation p-values, the MDE.
holm, mde = resampling.holm, resampling.mde
spearman, within_layer_spearman = resampling.spearman, resampling.within_layer_spearman


def _by_condition(frame, keys: list[str], value: str):
  """Per condition and `keys`: the mean over seeds, its 95% t interval over seeds (seed_interval), the
  min..max range and the number of seeds."""
  return (
    frame.groupby(["condition", *keys])[value]
    .agg(
      mean="mean",
      t_low=lambda v: seed_interval(v)[1],
      t_high=lambda v: seed_interval(v)[2],
      min="min",
      max="max",
      count="count",
    )
    .reset_index()
  )


def causal_seeds(causal, equivalence=None) -> list[dict]:
  """causal_seeds.csv rows: per condition, task, k and each of CAUSAL_MEASURES, the runs' causal test
  (selective − random) over seeds: mean, 95% t interval, range, seed count, the one-sample t test of 0
  (`p_value`; Holm over the family `<condition>:<metric>`, every task × k, `p_holm`), the median `mde`, the
  seeds whose own CI lies below / above 0, and Schuirmann's TOST of |mean| < `tost_margin`
  (`equivalence_margin`: EQUIVALENCE, or `equivalence`; `tost_p`, Holm over the same family `tost_p_holm`: what
  a "no more than" statement needs)."""
  out = []
  c = causal[causal["metric"].isin(list(CAUSAL_MEASURES))]
  for (condition, metric, task, k), g in c.groupby(["condition", "metric", "task", "k"]):
    t = resampling.one_sample_t(g["value"])
    margin = equivalence_margin(causal, condition, metric, equivalence)
    out.append(
      dict(condition=condition, task=task, k=int(k), metric=metric, mean=t["mean"], t_low=t["low"],
           t_high=t["high"], min=g["value"].min(), max=g["value"].max(), seeds=t["n"], p_value=t["p"],
           family=f"{condition}:{metric}", mde=g["mde"].median(), below_0=int((g["ci_high"] < 0).sum()),
           above_0=int((g["ci_low"] > 0).sum()), tost_margin=margin, tost_p=resampling.tost(g["value"], margin))
    )  # fmt: skip
  for family in dict.fromkeys(r["family"] for r in out):
    mine = [r for r in out if r["family"] == family]
    p_holm, tost_holm = (resampling.holm([r[key] for r in mine]) for key in ("p_value", "tost_p"))
    for r, p, q in zip(mine, p_holm, tost_holm):
      r["p_holm"], r["tost_p_holm"] = float(p), float(q)
  return out


# The induction check's pre-registered primary ablation ('zero' or 'mean'), or None: one Holm family of every cell.
# headspec study takes no config: declare it here, before the runs, or pass `primary=` to induction_tests.
INDUCTION_PRIMARY = None
INDUCTION_CONTROLS = ("loss_delta_second_vs_random", "loss_delta_second_vs_unlabelled")


def induction_tests(induction, primary: str | None = None) -> list[dict]:
  """Per condition, the induction setting's causal check over seeds at each run's last step (study/induction.csv
  rows `<control> (<ablation>)`, INDUCTION_CONTROLS: the top-k induction heads' second-copy loss rise minus k
  layer-matched or unlabelled random heads'): per control, ablation and k the mean, 95% t interval, seeds and
  the one-sample t test of 0 (`p_value`), with Holm (1979) over a family (`family`, `p_holm`). No `primary`
  declared: one family of every cell of the condition (both ablations × controls × k), since every cell was
  run alongside the others. `primary` (an ablation, pre-registered): its cells form the claims' family; each
  secondary cell is corrected over the primary's and secondary's cells together (`family` `...:all`)."""
  if induction is None or not len(induction):
    return []
  parts = induction["measure"].str.extract(r"^(\w+) \((\w+)\)$")
  d = induction.assign(control=parts[0], ablation=parts[1])
  d = d[d["control"].isin(INDUCTION_CONTROLS) & (d["step"] == d.groupby("run")["step"].transform("max"))]
  ablations = sorted(d["ablation"].dropna().unique())
  if primary is not None and primary not in ablations:
    raise ValueError(f"induction primary ablation {primary!r}: not among the check's ablations {ablations}")
  out = []
  for (condition, control, ablation, k), g in d.groupby(["condition", "control", "ablation", "k"]):
    t = resampling.one_sample_t(g["value"])
    out.append(dict(condition=condition, control=control, ablation=ablation, k=int(k), mean=t["mean"],
                    t_low=t["low"], t_high=t["high"], seeds=t["n"], p_value=t["p"]))  # fmt: skip
  for condition in dict.fromkeys(r["condition"] for r in out):
    mine = [r for r in out if r["condition"] == condition]
    every = resampling.holm([r["p_value"] for r in mine])
    first = [r for r in mine if r["ablation"] == primary]
    for r, p in zip(first, resampling.holm([r["p_value"] for r in first])):
      r["family"], r["p_holm"] = f"{condition}:induction:{primary}", float(p)
    for r, p in zip(mine, every):
      if r["ablation"] != primary:
        r["family"], r["p_holm"] = f"{condition}:induction:all", float(p)
  return out


FORMATION_NEVER = np.inf  # a run that never formed ranks after every kept step in the Mann–Whitney test


def formation_tests(roles_frame, formation_frame) -> list[dict]:
  """formation_tests.csv rows: for each quantity that forms in some run — `label/<role>` (the first kept step
  a run's best head reaches `_label_min()`, `_label_steps`) and `loss/repeat_drop` (formation.csv, source
  loss) — and each pair of conditions: how many seeds formed (Fisher's exact test of formed / not formed,
  `fisher_p`) and when (Mann–Whitney U of the steps, a run that never formed counted as later than every
  step, FORMATION_NEVER; `mannwhitney_p`, two-sided, scipy's default method: exact without ties, else the
  normal approximation with tie correction). Holm within each quantity and test over the condition pairs
  (`fisher_p_holm`, `mannwhitney_p_holm`)."""
  from itertools import combinations

  from scipy import stats

  per_run = []  # (quantity, condition, run, step or NaN)
  if roles_frame is not None and len(roles_frame):
    label_min = _label_min()
    for (condition, run, role), g in roles_frame.groupby(["condition", "run", "role"]):
      reached = g[g["score"] >= label_min]["step"]
      per_run.append((f"label/{role}", condition, run, float(reached.min()) if len(reached) else np.nan))
  if formation_frame is not None and len(formation_frame):
    fo = formation_frame[(formation_frame["source"] == "loss") & (formation_frame["task"] == "repeat_drop")]
    per_run += [
      ("loss/repeat_drop", c, r, float(v)) for c, r, v in zip(fo["condition"], fo["run"], fo["formation_step"])
    ]
  out = []
  for quantity in dict.fromkeys(q for q, *_ in per_run):
    steps = {}
    for q, condition, _run, step in per_run:
      if q == quantity:
        steps.setdefault(condition, []).append(step)
    if not any(np.isfinite(v) for vs in steps.values() for v in vs):
      continue  # formed in no run: nothing to compare
    rows = []
    for a, b in combinations(sorted(steps), 2):
      sa, sb = np.asarray(steps[a]), np.asarray(steps[b])
      fa, fb = int(np.isfinite(sa).sum()), int(np.isfinite(sb).sum())
      fisher = stats.fisher_exact([[fa, len(sa) - fa], [fb, len(sb) - fb]]).pvalue
      ra, rb = np.where(np.isfinite(sa), sa, FORMATION_NEVER), np.where(np.isfinite(sb), sb, FORMATION_NEVER)
      if np.unique(np.concatenate([ra, rb])).size == 1:  # every run formed at the same step, or none did
        u, mw = len(ra) * len(rb) / 2, 1.0
      else:
        test = stats.mannwhitneyu(ra, rb, alternative="two-sided")
        u, mw = float(test.statistic), float(test.pvalue)
      median = lambda v: float(np.median(v)) if np.isfinite(np.median(v)) else np.nan
      rows.append(dict(quantity=quantity, condition_a=a, condition_b=b, formed_a=fa, seeds_a=len(sa), formed_b=fb,
                       seeds_b=len(sb), median_step_a=median(ra), median_step_b=median(rb), fisher_p=float(fisher),
                       mannwhitney_u=u, mannwhitney_p=mw))  # fmt: skip
    for test in ("fisher_p", "mannwhitney_p"):
      for r, p in zip(rows, resampling.holm([r[test] for r in rows])):
        r[f"{test}_holm"] = float(p)
    out += rows
  return out
