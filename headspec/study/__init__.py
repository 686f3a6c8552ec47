"""`headspec study --workdir=ROOT`: an experiment's results across runs, steps and conditions (docs/study.md).

Reads ROOT/experiment.json (the runs, their condition and seed) and every run's tables, and writes
ROOT/study/: the tables below as CSV, figures, and summary.md. Only measured values; heads are always
chosen on dev and reported on test (the maximum over 48 noisy dev estimates is biased upwards on dev).

  training.csv    per run and logged step: the training loss and, where evaluated, the validation loss.
  emergence.csv   per run, step, task: the best head (highest dev selectivity, probes/selectivity.csv
                  dev_rank 1), its test selectivity and paired 95% CI; the median head's test selectivity
                  (best − median: how far one head stands out from the others); `selective_heads`, the heads whose
                  test selectivity CI lies above 0 (uncorrected for the 48 comparisons: a count to follow
                  over steps, not a test); `above_init_heads`, the heads whose CI lies above the best
                  head of the same run at step 0 (its untrained weights: random features already
                  tell word types apart, so they are slightly selective); the best residual stream (chosen on dev) for reference.
  layers.csv      per run and task: the first kept step at which each layer has a head above init.
  formation.csv   per run and head: its formation step, the first kept step at which it is above init
                  (the rule of `above_init_heads`), per probe task (test selectivity) and per role
                  (attention/roles.csv score on repeated random sequences, its bootstrap CI); NaN: never.
  structural.csv  per run, step and metric of Hewitt & Manning's structural probes (UUAS and DSpr. of the
                  distance probe, root accuracy and NSpr. of the depth probe; probes/structural.csv): per
                  `choice`, the head and the residual stream with the highest dev value (best_value: the
                  one whose raw value is compared over steps and with the baseline) and with the highest
                  dev selectivity (most_selective: value − control-tree value, as the other probes are
                  chosen), their test value with its 95% CI, the control value and selectivity, beside
                  H&M's linear-structure baseline on test.
  diversity.csv   per run, step, metric: the mean over layers and head pairs (or heads) of
                  diversity/results.csv.
  roles.csv       per run and step: the best previous-token, duplicate-token and induction scores of any
                  head on repeated random sequences (attention/roles.csv, data=repeated_random), and the
                  median head's (best − median: whether one head carries the role).
  induction.csv   per run, step and measure (decoders with the induction step of `headspec attention`): from
                  attention/icl.csv the loss on the first and second copy of repeated random sequences and
                  repeat_drop = first − second (the in-context loss drop induction heads bring), and the ICL
                  score on text; from ablation/causal.csv (kind=induction) the top-k induction heads ablated,
                  the second copy's loss change and its excess over k layer-matched and k unlabelled random
                  heads, with CIs and `mde` (the check's power, `mde()`).
                  formation.csv also gets source=loss, task=repeat_drop (layer, head −1): the first kept step
                  whose repeat_drop CI lies above step 0's value + 1 nat (DROP_FORMED).
  causal.csv      per run and task at the last step: ablating the k most selective heads vs k
                  layer-matched random heads (ablation/causal.csv `*_vs_random` rows, paired CIs:
                  probe_accuracy_vs_random is decodability after ablation, a probe refitted on the ablated
                  model, not whether the model uses the heads; loss_delta_vs_random the LM loss), with
                  `mde`, the smallest effect the test detects at 80% power (`mde()`; not an equivalence bound).
  conditions.csv  per non-baseline condition and task: condition − baseline at the last step, paired by seed
                  (Welch where the conditions share fewer than 2 seeds): best head's test selectivity, best −
                  median; task '': each diversity metric; per task and k: the causal test's decodability and
                  LM-loss rows. Mean, 95% t interval, the test, its p and Holm's p within its `family`.
  causal_seeds.csv  per condition, task, k and metric (decodability after ablation, LM loss): the causal test
                  over seeds, one-sample t test with Holm, and the TOST of |mean| < tost_margin.
  formation_tests.csv  per quantity that forms (a role's label step, the repeat drop) and pair of conditions:
                  Fisher's exact test of the seeds formed, Mann–Whitney U of the steps, Holm over the pairs.
  rankings.csv    per run, task and measure of how much the model needs a head, at the last step:
                  Spearman's ρ between that measure and test selectivity over all heads, with a
                  permutation p-value over all heads; the mean of the per-layer ρ with a permutation
                  p-value that shuffles heads only within their layer (so the layers' different levels
                  of selectivity and importance cannot make the correlation); both p-values Holm-adjusted
                  over the run's family of tests (every task × measure × test). Measures (ablation/heads.csv):
                  zero_ablation and mean_ablation, the SIGNED loss change when the head alone is removed
                  (> 0: the model needs it); importance_raw, Michel et al. 2019's E|∂ℓ/∂m_h|; importance,
                  the same normalised per layer (the pruning ranking; comparable only within a layer).
  sae_heads.csv   per run, kept step and head (sae/heads.csv of `headspec sae` on z, every layer): the head's
                  feature specialization S_h, its exclusive and carried features (docs/sae.md).
  sae.csv         per run and kept step, from sae_heads.csv: `specialization_mean` and `_max` over heads,
                  `exclusive_features` (summed over heads), `heads_with_exclusive`; per probe task where the
                  step was probed, Spearman's ρ over heads of S_h with the head's test selectivity
                  (`spearman_selectivity`, permutation p), its within-layer mean (`within_layer_spearman`,
                  heads shuffled within their layer), and `spearman_change`: ρ over heads of S_h's change
                  since the first step probed with the selectivity's change (does specialization rise where
                  selectivity does?); p Holm-adjusted over the run's ρ rows.
  reference.csv   the best head's test selectivity per task, the structural-probe value per metric of the
                  head with the best dev value (beside the linear baseline) and the best head's Clark accuracy per relation
                  (beside the best fixed offset), all chosen on dev and reported on test, for each run's
                  last step and each reference model (all-MiniLM-L6-v2); n: test words, sentences or arcs.

Per condition, summary.md gives the mean over seeds, its 95% t interval over seeds (t_low, t_high) and the
range (min to max) of each figure.
"""

from __future__ import annotations

import os

import numpy as np
from etils import epath

from headspec import experiments, figures, provenance, remote, resampling, tables, train_log
from headspec.errors import UserError

OUT = "study"
TASKS = ("upos", "xpos", "deprel", "arc")
ROLES = ("previous_token", "duplicate_token", "induction")


COLUMNS = {  # every study table's columns (docs/outputs.md), so that an empty table still has its header
  "training": "run,condition,seed,step,loss,eval_loss",
  "emergence": "run,condition,seed,step,task,best_layer,best_head,selectivity,ci_low,ci_high,median_selectivity,"
  "selective_heads,"
  "above_init_heads,init_best,heads,"
  "residual_layer,residual_selectivity",
  "layers": "run,condition,seed,task,layer,first_step",
  "structural": "run,condition,seed,step,task,metric,source,choice,layer,head,value,ci_low,ci_high,control_value,"
  "selectivity,linear,n",
  "diversity": "run,condition,seed,step,metric,value",
  "roles": "run,condition,seed,step,role,layer,head,score,median_score",
  "causal": "run,condition,seed,step,task,k,metric,value,ci_low,ci_high,mde",
  "induction": "run,condition,seed,step,measure,k,value,ci_low,ci_high,mde",
  "formation": "run,condition,seed,source,task,layer,head,init_best,formation_step",
  "causal_seeds": "condition,task,k,metric,mean,t_low,t_high,min,max,seeds,p_value,family,p_holm,mde,below_0,"
  "above_0,tost_margin,tost_p",
  "formation_tests": "quantity,condition_a,condition_b,formed_a,seeds_a,formed_b,seeds_b,median_step_a,"
  "median_step_b,fisher_p,fisher_p_holm,mannwhitney_u,mannwhitney_p,mannwhitney_p_holm",
  "conditions": "condition,task,measure,k,difference,ci_low,ci_high,seeds,baseline_seeds,test,p_value,family,p_holm",
  "rankings": "run,condition,seed,step,task,measure,spearman,p_value,p_holm,within_layer_spearman,"
  "within_layer_p,within_layer_p_holm,heads",
  "reference": "run,condition,kind,what,layer,head,value,baseline,n",
  "sae_heads": "run,condition,seed,step,sae,layer,head,specialization,exclusive_features,features_carried",
  "sae": "run,condition,seed,step,sae,measure,task,value,p_value,p_holm,heads",
}


def _frame(workdir, table):
  """The table of a run or reference folder without random-weights controls (`<model>-random` rows)."""
  path = tables.path_of(workdir, table)
  if not path.exists():
    return None
  frame = tables.read_frame(path, table)
  return frame[~frame["model"].str.endswith("-random")] if "model" in frame else frame


def _splits(frame, path: str):
  """The tune (dev) and report (test) splits of the probe's treebank, e.g. en_ewt/dev, en_ewt/test."""
  splits = sorted(set(frame["split"]))
  dev = next((s for s in splits if s.endswith("/dev")), None)
  test = dev and next((s for s in splits if s == dev.rsplit("/", 1)[0] + "/test"), None)
  if not test:
    raise UserError(f"{path}: no dev and test split of one treebank (the study chooses on dev, reports test)")
  return dev, test


def _best(frame, column: str):
  """The row with the largest `column` (NaN ignored), or None."""
  frame = frame.dropna(subset=[column])
  return None if frame.empty else frame.loc[frame[column].idxmax()]


def training(run: dict, workdir) -> list[dict]:
  """The training and validation losses of metrics.jsonl, one row per logged step (`train_log.read_metrics`:
  a cut-off or non-UTF-8 line is skipped with one warning)."""
  by_step: dict[int, dict] = {}
  for record in train_log.read_metrics(workdir):
    row = by_step.setdefault(record["step"], dict(**run, step=record["step"], loss=np.nan, eval_loss=np.nan))
    for key, column in (("loss", "loss"), ("eval/loss", "eval_loss")):
      if isinstance(record.get(key), (int, float)) and not isinstance(record[key], bool):
        row[column] = float(record[key])
  return [by_step[s] for s in sorted(by_step)]


def _init_best(heads, key: str, value: str) -> dict:
  """{key: the largest `value` of any head at step 0} (the untrained weights' best head; absent when step 0
  was not kept, so that the thresholds below are NaN)."""
  return heads[heads["step"] == 0].groupby(key)[value].max().to_dict()


def _above_init(ci_low, threshold):
  """The rule for a head "above init" (emergence's above_init_heads, layers.csv and formation.csv): its CI
  low end lies above the step-0 best head's value (NaN threshold: never)."""
  return ci_low > threshold


def emergence(run: dict, workdir) -> tuple[list[dict], list[dict]]:
  """(emergence rows, layers rows) of one run from probes/selectivity.csv."""
  sel = _frame(workdir, tables.PROBE_SELECTIVITY)
  if sel is None:
    return [], []
  dev, test = _splits(sel, os.fspath(tables.path_of(workdir, tables.PROBE_SELECTIVITY)))
  rows, first = [], {}
  init_best = _init_best(sel[(sel["split"] == test) & (sel["head"] >= 0)], "task", "selectivity")
  for (step, task), g in sel.groupby(["step", "task"]):
    heads = g[(g["split"] == test) & (g["head"] >= 0)]
    best = heads[heads["dev_rank"] == 1]
    if best.empty:
      continue
    best = best.iloc[0]
    selective = heads[heads["selectivity_ci_low"] > 0]
    threshold = init_best.get(task, np.nan)
    above_init = heads[_above_init(heads["selectivity_ci_low"], threshold)]
    resid_dev = _best(g[(g["split"] == dev) & (g["head"] < 0) & (g["layer"] >= 0)], "selectivity")
    resid = dict(residual_layer=np.nan, residual_selectivity=np.nan)
    if resid_dev is not None:
      r = g[(g["split"] == test) & (g["head"] < 0) & (g["layer"] == resid_dev["layer"])]
      if not r.empty:
        resid = dict(residual_layer=int(resid_dev["layer"]), residual_selectivity=r.iloc[0]["selectivity"])
    rows.append(
      dict(
        **run,
        step=int(step),
        task=task,
        best_layer=int(best["layer"]),
        best_head=int(best["head"]),
        selectivity=best["selectivity"],
        ci_low=best["selectivity_ci_low"],
        ci_high=best["selectivity_ci_high"],
        median_selectivity=heads["selectivity"].median(),
        selective_heads=len(selective),
        above_init_heads=len(above_init) if np.isfinite(threshold) else np.nan,
        init_best=threshold,
        heads=len(heads),
        **resid,
      )
    )
    for layer in sorted(set(above_init["layer"])):
      first.setdefault((task, int(layer)), int(step))
  layers = [dict(**run, task=t, layer=layer, first_step=s) for (t, layer), s in sorted(first.items())]
  return rows, layers


def _formation_rows(heads, key: str, value: str, low: str) -> list[dict]:
  """Per (key, layer, head) of `heads` (one split, heads only, every kept step): step 0's best value of the
  key (`init_best`) and the first kept step at which the head's CI lies above it (`_above_init`; NaN: never)."""
  init_best = _init_best(heads, key, value)
  out = []
  for (k, layer, head), g in heads.groupby([key, "layer", "head"]):
    threshold = init_best.get(k, np.nan)
    above = g[_above_init(g[low], threshold)]
    first = int(above["step"].min()) if len(above) else np.nan
    out.append(dict(task=k, layer=int(layer), head=int(head), init_best=threshold, formation_step=first))
  return out


def formation(run: dict, workdir) -> list[dict]:
  """formation.csv rows of one run: per head, the formation step of each probe task's test selectivity
  (probes/selectivity.csv) and of each role's score on repeated random sequences (attention/roles.csv,
  its bootstrap CI), by the rule of emergence's above_init_heads."""
  out = []
  sel = _frame(workdir, tables.PROBE_SELECTIVITY)
  if sel is not None and not sel.empty:
    _, test = _splits(sel, os.fspath(tables.path_of(workdir, tables.PROBE_SELECTIVITY)))
    heads = sel[(sel["split"] == test) & (sel["head"] >= 0)]
    out += [
      dict(**run, source="probe", **r) for r in _formation_rows(heads, "task", "selectivity", "selectivity_ci_low")
    ]
  ro = _frame(workdir, tables.ROLES)
  if ro is not None and not ro.empty:
    heads = ro[(ro["data"] == "repeated_random") & ro["role"].isin(ROLES) & (ro["head"] >= 0)]
    out += [dict(**run, source="role", **r) for r in _formation_rows(heads, "role", "score", "ci_low")]
  return out


STRUCTURAL_CHOICES = (  # (choice, the dev column that picks the head): both are reported, named by `choice`
  ("best_value", "value"),  # the highest dev value: what a raw UUAS/DSpr. compares across steps and with the
  #                           linear baseline (the choice of probing/report.py)
  ("most_selective", "selectivity"),  # the highest dev value − control-tree value: as the other probes choose
)


def _structural_best(frame, workdir) -> list[dict]:
  """Per (step, task, metric) of probes/structural.csv rows and per `STRUCTURAL_CHOICES`: the head and the
  residual stream (layer >= 0) with the highest dev value (`best_value`) and with the highest dev selectivity
  (`most_selective`), as their test rows, with H&M's linear baseline on test beside them."""
  dev, test = _splits(frame, os.fspath(tables.path_of(workdir, tables.PROBE_STRUCTURAL)))
  base = _frame(workdir, tables.PROBE_BASELINES)
  linear = (
    {}
    if base is None
    else {(r["task"], r["baseline"]): r["accuracy"] for _, r in base[base["split"] == test].iterrows()}
  )
  out = []
  for (step, task, metric), g in frame.groupby(["step", "task", "metric"]):
    for source, mine in (("head", g[g["head"] >= 0]), ("residual", g[(g["head"] < 0) & (g["layer"] >= 0)])):
      for choice, column in STRUCTURAL_CHOICES:
        best = _best(mine[mine["split"] == dev], column)
        if best is None:
          continue
        t = mine[(mine["split"] == test) & (mine["layer"] == best["layer"]) & (mine["head"] == best["head"])]
        if t.empty:
          continue
        r = t.iloc[0]
        out.append(
          dict(step=int(step), task=task, metric=metric, source=source, choice=choice, layer=int(r["layer"]),
               head=int(r["head"]), value=r["value"], ci_low=r["ci_low"], ci_high=r["ci_high"],
               control_value=r["control_value"], selectivity=r["selectivity"],
               linear=linear.get((task, f"linear_{metric}"), np.nan), n=int(r["n"]))
        )  # fmt: skip
  return out


def structural(run: dict, workdir) -> list[dict]:
  """structural.csv rows of one run (module docstring) from probes/structural.csv and probes/baselines.csv."""
  frame = _frame(workdir, tables.PROBE_STRUCTURAL)
  if frame is None or frame.empty:
    return []
  return [dict(**run, **r) for r in _structural_best(frame, workdir)]


def diversity(run: dict, workdir) -> list[dict]:
  """diversity.csv rows of one run from its own model's rows of diversity/results.csv (the run folder's
  name, as `headspec diversity` writes it; the most frequent model if none has it, e.g. a renamed folder)."""
  frame = _frame(workdir, tables.DIVERSITY)
  if frame is None or frame.empty:
    return []
  models = frame["model"]
  frame = frame[models == (run["run"] if (models == run["run"]).any() else models.value_counts().index[0])]
  off_diagonal = frame[(frame["head_j"] < 0) | (frame["head_i"] != frame["head_j"])]
  means = off_diagonal.groupby(["step", "metric"])["value"].mean()
  return [dict(**run, step=int(s), metric=m, value=v) for (s, m), v in means.items()]


def roles(run: dict, workdir) -> list[dict]:
  frame = _frame(workdir, tables.ROLES)
  if frame is None:
    return []
  frame = frame[(frame["data"] == "repeated_random") & frame["role"].isin(ROLES)]
  out = []
  for (step, role), g in frame.groupby(["step", "role"]):
    best = _best(g, "score")
    if best is None:
      continue
    out.append(
      dict(**run, step=int(step), role=role, layer=int(best["layer"]), head=int(best["head"]), score=best["score"],
           median_score=g["score"].median())
    )  # fmt: skip
  return out


ICL_KINDS = ("repeat_first", "repeat_second", "repeat_drop", "icl_score")
INDUCTION_CAUSAL = ("loss_delta_second", "loss_delta_second_vs_random", "loss_delta_second_vs_unlabelled")


def induction(run: dict, workdir) -> list[dict]:
  """induction.csv rows of one run (module docstring): every kept step's in-context losses and causal check."""
  out = []
  icl = _frame(workdir, tables.ICL)
  if icl is not None:
    for _, r in icl[icl["kind"].isin(ICL_KINDS)].iterrows():
      out.append(dict(**run, step=int(r["step"]), measure=r["kind"], k=np.nan, value=r["value"],
                      ci_low=r["ci_low"], ci_high=r["ci_high"], mde=np.nan))  # fmt: skip
  ca = _frame(workdir, tables.ABLATION_CAUSAL)
  if ca is not None:
    mine = ca[(ca["kind"] == "induction") & (ca["selection"] == "top_induction") & ca["metric"].isin(INDUCTION_CAUSAL)]
    for _, r in mine.iterrows():
      ablation = str(r["task"]).rpartition("/")[2]  # repeated_random/zero -> zero
      out.append(dict(**run, step=int(r["step"]), measure=f"{r['metric']} ({ablation})", k=int(r["k"]),
                      value=r["value"], ci_low=r["ci_low"], ci_high=r["ci_high"],
                      mde=float(mde(r["ci_low"], r["ci_high"]))))  # fmt: skip
  return out


DROP_FORMED = 1.0  # nats: the repeat drop counts as formed once the second copy is e ≈ 2.7 times likelier


def _drop_formation(rows: list[dict]) -> list[dict]:
  """formation.csv's row for the repeat drop of one run: the first kept step whose CI lies above step 0's
  value + DROP_FORMED nats. (Step 0's own rule, CI above step 0's value, fires at the first step of any
  training: 200 sequences make the drop's CI a few hundredths of a nat wide, and copying a token or two
  already moves it that much; a nat is a drop that prefix matching and copying make, not bigram noise.)"""
  drop = [r for r in rows if r["measure"] == "repeat_drop"]
  init = [r["value"] for r in drop if r["step"] == 0]
  if not drop or not init:
    return []
  above = [r["step"] for r in drop if _above_init(r["ci_low"], init[0] + DROP_FORMED)]
  first = min(above) if above else np.nan
  run = {k: drop[0][k] for k in ("run", "condition", "seed")}
  return [dict(**run, source="loss", task="repeat_drop", layer=-1, head=-1, init_best=init[0], formation_step=first)]


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


def mde(ci_low, ci_high):
  """The minimum detectable effect at 80% power (two-sided α = 0.05) of an estimate with this 95% CI:
  (z_0.975 + z_0.80) × SE ≈ 2.8 × SE with SE = half-width / 1.96 (Bloom 1995, "Minimum detectable effects",
  Evaluation Review 19(5); the standard normal power calculation). A bootstrap CI may be asymmetric: the
  mean half-width, (ci_high − ci_low) / 2, is used."""
  return (1.96 + 0.8416) * (np.asarray(ci_high, float) - np.asarray(ci_low, float)) / 2 / 1.96


def causal(run: dict, workdir) -> list[dict]:
  frame = _frame(workdir, tables.ABLATION_CAUSAL)
  if frame is None:
    return []
  frame = frame[(frame["kind"] == "probe_selective") & frame["metric"].str.endswith("_vs_random")]
  frame = frame[frame["step"] == frame["step"].max()]
  return [
    dict(
      **run,
      step=int(r["step"]),
      task=r["task"],
      k=int(r["k"]),
      metric=r["metric"],
      value=r["value"],
      ci_low=r["ci_low"],
      ci_high=r["ci_high"],
      mde=float(mde(r["ci_low"], r["ci_high"])),
    )
    for _, r in frame.iterrows()
  ]


CAUSAL_MEASURES = {  # the causal test's metrics the study tests over seeds, and what each measures
  "probe_accuracy_vs_random": "decodability after ablation (a probe refitted on the ablated last layer)",
  "loss_delta_vs_random": "LM loss change (> 0: the model needs the selective heads more)",
}
# Equivalence margins of the TOST (`causal_seeds`): |selective − random| below this counts as "no more than".
# headspec study takes no config, so the margin is this constant, written beside every TOST p in its table.
EQUIVALENCE_MARGINS = {"probe_accuracy_vs_random": 0.01, "loss_delta_vs_random": 0.01}


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


def _ranks(x) -> np.ndarray:
  import pandas as pd

  r = pd.Series(np.asarray(x, np.float64)).rank().to_numpy()
  return (r - r.mean()) / (r.std() or 1.0)


def spearman(x, y, *, permutations: int = 10000, seed: int = 0) -> tuple[float, float]:
  """Spearman's ρ (Pearson correlation of ranks, ties averaged) and its two-sided permutation p-value."""
  rx, ry = _ranks(x), _ranks(y)
  rho = float(np.mean(rx * ry))
  rng = np.random.default_rng(seed)
  shuffled = np.array([np.mean(rx * ry[rng.permutation(len(ry))]) for _ in range(permutations)])
  p = (1 + np.sum(np.abs(shuffled) >= abs(rho) - 1e-12)) / (permutations + 1)
  return rho, float(p)


def within_layer_spearman(x, y, layer, *, permutations: int = 10000, seed: int = 0) -> tuple[float, float]:
  """The mean over layers of Spearman's ρ between x and y among one layer's heads, and its two-sided
  permutation p-value with y shuffled only within each layer (the layers' levels are kept under the null)."""
  layer = np.asarray(layer)
  groups = [np.flatnonzero(layer == l) for l in np.unique(layer)]
  groups = [g for g in groups if len(g) >= 3]
  if not groups:
    return float("nan"), float("nan")
  rx = [_ranks(np.asarray(x)[g]) for g in groups]
  ry = [_ranks(np.asarray(y)[g]) for g in groups]
  rho = float(np.mean([np.mean(a * b) for a, b in zip(rx, ry)]))
  rng = np.random.default_rng(seed)
  shuffled = np.array(
    [np.mean([np.mean(a * b[rng.permutation(len(b))]) for a, b in zip(rx, ry)]) for _ in range(permutations)]
  )
  return rho, float((1 + np.sum(np.abs(shuffled) >= abs(rho) - 1e-12)) / (permutations + 1))


holm = resampling.holm  # Holm (1979), shared with the other analyses (headspec/resampling.py)


# How much the model needs a head (ablation/heads.csv (method, metric)); signed ablation effects first.
RANKING_MEASURES = {
  "zero_ablation": ("zero", "loss_delta"),
  "mean_ablation": ("mean", "loss_delta"),
  "importance_raw": ("importance", "raw_score"),
  "importance": ("importance", "score"),
}


def rankings(run: dict, workdir) -> list[dict]:
  """rankings.csv rows of one run (module docstring): each measure against test selectivity, per task."""
  heads, sel = _frame(workdir, tables.ABLATION_HEADS), _frame(workdir, tables.PROBE_SELECTIVITY)
  if heads is None or sel is None or heads.empty:
    return []
  step = int(heads["step"].max())
  heads = heads[heads["step"] == step]
  _, test = _splits(sel, os.fspath(tables.path_of(workdir, tables.PROBE_SELECTIVITY)))
  out = []
  for task, g in sel[(sel["step"] == step) & (sel["split"] == test) & (sel["head"] >= 0)].groupby("task"):
    for measure, (method, metric) in RANKING_MEASURES.items():
      merged = heads[(heads["method"] == method) & (heads["metric"] == metric)].merge(g, on=["layer", "head"])
      if len(merged) < 3:
        continue
      rho, p = spearman(merged["value"], merged["selectivity"])
      w_rho, w_p = within_layer_spearman(merged["value"], merged["selectivity"], merged["layer"])
      out.append(
        dict(**run, step=step, task=task, measure=measure, spearman=rho, p_value=p, within_layer_spearman=w_rho,
             within_layer_p=w_p, heads=len(merged))
      )  # fmt: skip
  adjusted = holm([r["p_value"] for r in out] + [r["within_layer_p"] for r in out])
  for r, p, w_p in zip(out, adjusted[: len(out)], adjusted[len(out) :]):
    r["p_holm"], r["within_layer_p_holm"] = p, w_p
  return out


SAE_HEAD_METRICS = ("specialization", "exclusive_features", "features_carried")  # sae/heads.csv, per head
SAE_PERMUTATIONS = 2000  # per ρ of sae.csv (steps × tasks × 3 per run): p resolution 1/2001


def sae_heads(run: dict, workdir) -> list[dict]:
  """sae_heads.csv rows of one run: per kept step, SAE configuration and head, sae/heads.csv's S_h, exclusive
  and carried features of the SAEs on z (`headspec sae`, docs/sae.md)."""
  frame = _frame(workdir, tables.SAE_HEADS)
  if frame is None or frame.empty:
    return []
  frame = frame[(frame["site"] == "z") & frame["metric"].isin(SAE_HEAD_METRICS)]
  wide = frame.pivot_table(index=["step", "sae", "layer", "head"], columns="metric", values="value", aggfunc="first")
  out = []
  for (step, sae, layer, head), r in wide.iterrows():
    values = {m: float(r[m]) if m in r else np.nan for m in SAE_HEAD_METRICS}
    out.append(dict(**run, step=int(step), sae=sae, layer=int(layer), head=int(head), **values))
  return out


def _test_selectivity(workdir):
  """probes/selectivity.csv's test rows of heads, or None."""
  sel = _frame(workdir, tables.PROBE_SELECTIVITY)
  if sel is None or sel.empty:
    return None
  _, test = _splits(sel, os.fspath(tables.path_of(workdir, tables.PROBE_SELECTIVITY)))
  return sel[(sel["split"] == test) & (sel["head"] >= 0)]


def sae_summary(run: dict, heads_rows: list[dict], workdir) -> list[dict]:
  """sae.csv rows of one run from its sae_heads rows (module docstring): per step the heads' specialization
  and exclusive features, and the rank correlations over heads of S_h with the probes' test selectivity."""
  import pandas as pd

  if not heads_rows:
    return []
  hs = pd.DataFrame(heads_rows)
  sel = _test_selectivity(workdir)
  out = []
  for (sae, step), g in hs.groupby(["sae", "step"]):
    spec = g["specialization"].dropna()
    key = dict(**run, step=int(step), sae=sae, task="", p_value=np.nan)
    for measure, value, n in (
      ("specialization_mean", spec.mean() if len(spec) else np.nan, len(spec)),
      ("specialization_max", spec.max() if len(spec) else np.nan, len(spec)),
      ("exclusive_features", g["exclusive_features"].sum(), len(g)),
      ("heads_with_exclusive", (g["exclusive_features"] > 0).sum(), len(g)),
    ):
      out.append(dict(key, measure=measure, value=float(value), heads=n))
  if sel is not None:
    keyed = hs.merge(sel[["step", "task", "layer", "head", "selectivity"]], on=["step", "layer", "head"])
    keyed = keyed.dropna(subset=["specialization", "selectivity"])
    first = keyed.groupby(["sae", "task"])["step"].min().to_dict()  # the first step with both measured
    base = keyed.rename(columns={"specialization": "spec0", "selectivity": "sel0"})[
      ["sae", "step", "task", "layer", "head", "spec0", "sel0"]
    ]
    for (sae, step, task), g in keyed.groupby(["sae", "step", "task"]):
      if len(g) < 3:
        continue
      kw = dict(permutations=SAE_PERMUTATIONS)
      rho, p = spearman(g["specialization"], g["selectivity"], **kw)
      w_rho, w_p = within_layer_spearman(g["specialization"], g["selectivity"], g["layer"], **kw)
      rows = [("spearman_selectivity", rho, p), ("within_layer_spearman", w_rho, w_p)]
      start = base[(base["sae"] == sae) & (base["step"] == first[sae, task]) & (base["task"] == task)]
      if int(step) != first[sae, task] and len(start):
        d = g.merge(start.drop(columns="step"), on=["sae", "task", "layer", "head"])
        if len(d) >= 3:
          rows.append(
            ("spearman_change", *spearman(d["specialization"] - d["spec0"], d["selectivity"] - d["sel0"], **kw))
          )
      for measure, value, p_value in rows:
        out.append(dict(**run, step=int(step), sae=sae, measure=measure, task=task, value=value, p_value=p_value,
                        heads=len(g)))  # fmt: skip
  tested = [r for r in out if np.isfinite(r["p_value"])]
  for r, p in zip(tested, holm([r["p_value"] for r in tested])):
    r["p_holm"] = float(p)
  for r in out:
    r.setdefault("p_holm", np.nan)
  return out


def reference(name: str, workdir, condition: str) -> list[dict]:
  """Best head per probe task and per Clark relation (chosen on dev, reported on test) at the last step."""
  out = []
  sel = _frame(workdir, tables.PROBE_SELECTIVITY)
  if sel is not None and not sel.empty:
    sel = sel[sel["step"] == sel["step"].max()]
    _, test = _splits(sel, os.fspath(tables.path_of(workdir, tables.PROBE_SELECTIVITY)))
    for task, g in sel[(sel["split"] == test) & (sel["dev_rank"] == 1)].groupby("task"):
      r = g.iloc[0]
      out.append(
        dict(
          run=name,
          condition=condition,
          kind="probe_selectivity",
          what=task,
          layer=int(r["layer"]),
          head=int(r["head"]),
          value=r["selectivity"],
          baseline=np.nan,
          n=int(r["n"]),
        )
      )
  tree = _frame(workdir, tables.PROBE_STRUCTURAL)
  if tree is not None and not tree.empty:
    tree = tree[tree["step"] == tree["step"].max()]
    for r in _structural_best(tree, workdir):
      if r["source"] == "head" and r["choice"] == "best_value":  # a raw value beside the linear baseline
        out.append(
          dict(run=name, condition=condition, kind="structural", what=r["metric"], layer=r["layer"], head=r["head"],
               value=r["value"], baseline=r["linear"], n=r["n"])
        )  # fmt: skip
  clark, base = _frame(workdir, tables.CLARK), _frame(workdir, tables.CLARK_BASELINES)
  if clark is not None and base is not None and not clark.empty:
    step = clark["step"].max()
    clark, base = clark[clark["step"] == step], base[base["step"] == step]
    dev, test = _splits(clark, os.fspath(tables.path_of(workdir, tables.CLARK)))
    for (relation, direction), g in clark.groupby(["relation", "direction"]):
      best = _best(g[g["split"] == dev], "accuracy")
      if best is None:
        continue
      t = g[(g["split"] == test) & (g["layer"] == best["layer"]) & (g["head"] == best["head"])]
      b = base[(base["split"] == test) & (base["relation"] == relation) & (base["direction"] == direction)]
      if t.empty:
        continue
      out.append(
        dict(
          run=name,
          condition=condition,
          kind=f"clark/{direction}",
          what=relation,
          layer=int(best["layer"]),
          head=int(best["head"]),
          value=t.iloc[0]["accuracy"],
          baseline=b["accuracy"].max() if not b.empty else np.nan,
          n=int(t.iloc[0]["n"]),
        )
      )
  return out


def collect(root) -> dict:
  """Every study table of ROOT as a list of rows: {name: rows}."""
  plan = experiments.read_plan(root)
  root = remote.run_path(root)
  names = ("training", "emergence", "layers", "formation", "structural", "diversity", "roles", "induction", "causal")
  names += ("rankings", "reference", "sae_heads", "sae")  # conditions, causal_seeds, formation_tests: below
  out = {k: [] for k in names}
  for r in plan["runs"]:
    run = dict(run=r["name"], condition=r["condition"], seed=r["seed"])
    workdir = root / r["name"]
    out["training"] += training(run, workdir)
    rows, layers = emergence(run, workdir)
    out["emergence"] += rows
    out["layers"] += layers
    out["formation"] += formation(run, workdir)
    out["structural"] += structural(run, workdir)
    out["diversity"] += diversity(run, workdir)
    out["roles"] += roles(run, workdir)
    ind_rows = induction(run, workdir)
    out["induction"] += ind_rows
    out["formation"] += _drop_formation(ind_rows)
    out["causal"] += causal(run, workdir)
    out["rankings"] += rankings(run, workdir)
    out["reference"] += reference(r["name"], workdir, r["condition"])
    heads_rows = sae_heads(run, workdir)
    out["sae_heads"] += heads_rows
    out["sae"] += sae_summary(run, heads_rows, workdir)
  for name in plan.get("references", []):
    out["reference"] += reference(name, root / name, "reference")
  if not out["emergence"]:
    raise UserError(f"{root}: no run has probes/selectivity.csv yet (run the experiment's probe stages first)")
  import pandas as pd

  causal_frame = pd.DataFrame(out["causal"], columns=COLUMNS["causal"].split(","))
  out["conditions"] = conditions(pd.DataFrame(out["emergence"]), pd.DataFrame(out["diversity"]), causal_frame)
  out["causal_seeds"] = causal_seeds(causal_frame)
  out["formation_tests"] = formation_tests(
    pd.DataFrame(out["roles"], columns=COLUMNS["roles"].split(",")),
    pd.DataFrame(out["formation"], columns=COLUMNS["formation"].split(",")),
  )
  return out


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


def causal_seeds(causal) -> list[dict]:
  """causal_seeds.csv rows: per condition, task, k and each of CAUSAL_MEASURES, the runs' causal test
  (selective − random) over seeds: mean, 95% t interval, range, seed count, the one-sample t test of 0
  (`p_value`; Holm over the family `<condition>:<metric>`, every task × k, `p_holm`), the median `mde`, the
  seeds whose own CI lies below / above 0, and Schuirmann's TOST of |mean| < `tost_margin`
  (EQUIVALENCE_MARGINS; `tost_p`: what a "no more than" statement needs)."""
  out = []
  c = causal[causal["metric"].isin(list(CAUSAL_MEASURES))]
  for (condition, metric, task, k), g in c.groupby(["condition", "metric", "task", "k"]):
    t = resampling.one_sample_t(g["value"])
    margin = EQUIVALENCE_MARGINS[metric]
    out.append(
      dict(condition=condition, task=task, k=int(k), metric=metric, mean=t["mean"], t_low=t["low"],
           t_high=t["high"], min=g["value"].min(), max=g["value"].max(), seeds=t["n"], p_value=t["p"],
           family=f"{condition}:{metric}", mde=g["mde"].median(), below_0=int((g["ci_high"] < 0).sum()),
           above_0=int((g["ci_low"] > 0).sum()), tost_margin=margin, tost_p=resampling.tost(g["value"], margin))
    )  # fmt: skip
  for family in dict.fromkeys(r["family"] for r in out):
    mine = [r for r in out if r["family"] == family]
    for r, p in zip(mine, resampling.holm([r["p_value"] for r in mine])):
      r["p_holm"] = float(p)
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


def _markdown(frame, floats: str = ".3f") -> str:
  cols = list(frame.columns)
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  for _, r in frame.iterrows():
    cells = [format(v, floats) if isinstance(v, float) else str(v) for v in r]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


STATISTICS = """## Statistics: families of tests and their corrections
- rankings: per run, one family of every task × measure × {all heads, within layer} permutation test,
  Holm-adjusted (Holm 1979; p_holm, within_layer_p_holm).
- selective_heads, above_init_heads, layers and formation: one CI comparison per head and step, uncorrected:
  counts and first crossings to follow over training, not tests of a head.
- causal: one paired CI per run, task and k, uncorrected; mde is its power, not an equivalence bound.
  causal_seeds: over seeds, a one-sample t test per condition, task, k and metric, Holm within condition ×
  metric (every task × k); tost_p tests |mean| < tost_margin (Schuirmann 1987), for "no more than" statements.
  probe_accuracy_vs_random is decodability after ablation (a refitted probe), not use; loss_delta_vs_random
  is the LM loss.
- induction: the causal check of the top-k induction heads, one paired CI per run, kept step, k and ablation,
  uncorrected (a curve over training to read, not a family of tests); mde is its power. The repeat drop's
  formation step: its CI 1 nat above step 0's; the label steps: the best head's score at 0.4, no CI.
  formation_tests: per pair of conditions, Fisher's exact test of the seeds formed and Mann–Whitney U of the
  steps (never = after every step), Holm within each quantity and test over the pairs.
- conditions: condition − baseline per measure, paired t test by seed (Welch where fewer than 2 seeds are
  shared), Holm within each family: condition × {specialization (task × 2 measures), diversity (every
  metric), probe_accuracy_vs_random (task × k), loss_delta_vs_random (task × k)}.
- t_low, t_high in the per-condition tables: a 95% t interval over seeds (training, probe fit and control
  draw vary with the seed), one per row, uncorrected; NaN with one seed."""


def _figures(frames: dict, out: epath.Path) -> list[str]:
  import matplotlib

  matplotlib.use("Agg")
  # Condition and run names are drawn as written: `$` is not mathtext.
  with matplotlib.rc_context({"text.parse_math": False}):
    return _draw(frames, out)


def _loss_figure(tr, colors):
  """study/loss.png: every run's training loss (line) and validation loss (points) by step."""
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(5.5, 3.5))
  for _run, g in tr.groupby("run"):
    c = colors.get(g["condition"].iloc[0], "k")
    ax.plot(g["step"], g["loss"], lw=0.8, color=c, alpha=0.6, label=g["condition"].iloc[0])
    ev = g.dropna(subset=["eval_loss"])
    ax.plot(ev["step"], ev["eval_loss"], "o--", ms=3, lw=1, color=c)
  ax.set_xlabel("training step")
  ax.set_ylabel("loss (nats/token): train —, validation o--")
  handles, labels = ax.get_legend_handles_labels()
  unique = dict(zip(labels, handles))
  ax.legend(unique.values(), unique.keys(), fontsize=8)
  return fig


def _induction_figure(ind, per_run, colors):
  """study/induction.png: the repeat drop and the top induction head's causal checks (k = 1, against
  layer-matched and unlabelled random heads) per run by step."""
  import matplotlib.pyplot as plt

  shown = (("repeat_drop", "repeat drop: 1st − 2nd copy (nats)"),
           ("loss_delta_second_vs_random (zero)", "top induction head ablated − random head\n(2nd copy loss, k = 1)"),
           ("loss_delta_second_vs_unlabelled (zero)",
            "top induction head ablated − random\nunlabelled head (2nd copy loss, k = 1)"))  # fmt: skip
  fig, axes = plt.subplots(1, len(shown), figsize=(4.5 * len(shown), 3.4), squeeze=False)
  for ax, (measure, title) in zip(axes[0], shown):
    per_run(ax, ind[(ind["measure"] == measure) & (ind["k"].isna() | (ind["k"] == 1))], "value")
    ax.axhline(0, color="gray", lw=0.5)
    ax.set_title(title, fontsize=9)
    ax.set_xlabel("training step (0 drawn at 1)")
  drawn = sorted(set(ind["condition"]))
  axes[0, 0].legend([plt.Line2D([], [], color=colors[c]) for c in drawn], drawn, fontsize=8)  # one line a run
  return fig


def _draw(frames: dict, out: epath.Path) -> list[str]:
  import matplotlib.pyplot as plt

  written = []
  seen = set().union(*(set(f["condition"]) for f in frames.values() if "condition" in f))
  colors = {c: f"C{i}" for i, c in enumerate(sorted(seen))}  # a part's runs may lack a table yet

  def x_of(steps):  # log-spaced steps with step 0 drawn at 1
    return np.maximum(np.asarray(steps, float), 1.0)

  def per_run(ax, frame, y: str) -> None:  # one line per run, coloured by its condition, over log steps
    for _run, g in frame.groupby("run"):
      g = g.sort_values("step")
      ax.plot(x_of(g["step"]), g[y], "o-", ms=3, lw=1, color=colors[g["condition"].iloc[0]])
    figures.log_x(ax)

  def save(fig, name: str) -> None:
    fig.tight_layout()
    remote.save_figure(fig, out / name, dpi=110)
    plt.close(fig)
    written.append(name)

  em = frames["emergence"]
  tasks = [t for t in TASKS if t in set(em["task"])]
  fig, axes = plt.subplots(2, len(tasks), figsize=(4 * len(tasks), 6.5), squeeze=False)
  seeds = em.groupby("condition")["run"].nunique()
  for j, task in enumerate(tasks):
    for _run, g in em[em["task"] == task].groupby("run"):
      g = g.sort_values("step")
      condition = g["condition"].iloc[0]
      c, many = colors[condition], seeds[condition] > 1
      axes[0, j].plot(x_of(g["step"]), g["selectivity"], "o-", color=c, ms=2 if many else 3, lw=0.6 if many else 1,
                      alpha=0.35 if many else 1, label=None if many else condition)  # fmt: skip
      if not many:  # one seed: its sentence-bootstrap CI
        axes[0, j].fill_between(x_of(g["step"]), g["ci_low"], g["ci_high"], color=c, alpha=0.12)
      axes[1, j].plot(x_of(g["step"]), g["above_init_heads"], "o-", color=c, ms=3, lw=1)
    for condition, g in em[em["task"] == task].groupby("condition"):  # several seeds: mean, t interval band
      if seeds[condition] > 1:  # (a band from 3 seeds at a step on: with 2, t_0.975,1 = 12.7 swamps the plot)
        band = _by_condition(g, ["step"], "selectivity").sort_values("step")
        band = band.assign(
          t_low=band["t_low"].where(band["count"] >= 3), t_high=band["t_high"].where(band["count"] >= 3)
        )
        c = colors[condition]
        axes[0, j].plot(
          x_of(band["step"]),
          band["mean"],
          "-",
          color=c,
          lw=2,
          label=f"{condition}: mean of up to {seeds[condition]} seeds, 95% t band (≥3)",
        )
        axes[0, j].fill_between(x_of(band["step"]), band["t_low"], band["t_high"], color=c, alpha=0.18)
    axes[0, j].set_title(f"{task}: best head (dev-chosen), test")
    axes[0, j].axhline(0, color="gray", lw=0.5)
    axes[1, j].set_xlabel("training step (0 drawn at 1)")
    for ax in axes[:, j]:
      figures.log_x(ax)
  axes[0, 0].set_ylabel("selectivity (accuracy − control)")
  axes[1, 0].set_ylabel("heads above step 0's best (CI)")
  handles, labels = axes[0, 0].get_legend_handles_labels()
  unique = dict(zip(labels, handles))
  axes[0, 0].legend(unique.values(), unique.keys(), fontsize=8)
  save(fig, "emergence.png")

  div = frames["diversity"]
  if len(div):
    metrics = sorted(set(div["metric"]))
    cols = 3
    rows_ = -(-len(metrics) // cols)
    fig, axes = plt.subplots(rows_, cols, figsize=(4.2 * cols, 3 * rows_), squeeze=False)
    for ax, metric in zip(axes.flat, metrics):
      per_run(ax, div[div["metric"] == metric], "value")
      ax.set_title(metric, fontsize=9)
    for ax in list(axes.flat)[len(metrics) :]:
      ax.axis("off")
    save(fig, "diversity.png")

  tr = frames["training"]
  if len(tr):
    save(_loss_figure(tr, colors), "loss.png")

  ind = frames.get("induction", ())  # a caller may draw a subset of the tables
  if len(ind):
    save(_induction_figure(ind, per_run, colors), "induction.png")

  sae = frames.get("sae", ())
  if len(sae):
    shown = (("specialization_mean", "mean feature specialization S_h over heads"),
             ("exclusive_features", "head-exclusive SAE features (all heads)"))  # fmt: skip
    fig, axes = plt.subplots(1, len(shown), figsize=(4.5 * len(shown), 3.4), squeeze=False)
    for ax, (measure, title) in zip(axes[0], shown):
      per_run(ax, sae[sae["measure"] == measure], "value")
      ax.set_title(title, fontsize=9)
      ax.set_xlabel("training step (0 drawn at 1)")
    drawn = sorted(set(sae["condition"]))
    axes[0, 0].legend([plt.Line2D([], [], color=colors[c]) for c in drawn], drawn, fontsize=8)
    save(fig, "sae.png")

  ro = frames["roles"]
  if len(ro):
    fig, axes = plt.subplots(1, len(ROLES), figsize=(4 * len(ROLES), 3.2), squeeze=False)
    for ax, role in zip(axes[0], ROLES):
      per_run(ax, ro[ro["role"] == role], "score")
      ax.set_title(f"best {role} score (repeated random)", fontsize=9)
      ax.set_ylim(0, 1)
    save(fig, "roles.png")
  return written


@provenance.recorded("study")
def _emergence_sections(frames: dict) -> list[str]:
  """summary.md: training loss and the best head's selectivity over training, per condition."""
  em = frames["emergence"]
  last = em[em["step"] == em.groupby("run")["step"].transform("max")]
  tr = frames["training"]
  final = tr.dropna(subset=["eval_loss"]).groupby("run").tail(1) if len(tr) else tr
  parts = [
    "Every number below is measured in this experiment's runs; heads are chosen on dev and reported on test.",
    "Per condition: the mean over seeds, its 95% t interval over seeds (t_low, t_high; NaN with one seed), the "
    "range (min, max) and the number of seeds.",
    "",
    *(
      ["## Last validation loss (nats/token)", _markdown(final[["run", "condition", "seed", "step", "eval_loss"]]), ""]
      if len(final)
      else []
    ),
    "## Best head's test selectivity by step",
    _markdown(_by_condition(em, ["task", "step"], "selectivity")),
    "",
    "## Best head minus median head (test selectivity), by step: how far one head stands out",
    _markdown(_by_condition(em.assign(gap=em["selectivity"] - em["median_selectivity"]), ["task", "step"], "gap")),
    "",
    "## Heads with test selectivity CI above 0, by step",
    _markdown(_by_condition(em, ["task", "step"], "selective_heads"), ".1f"),
    "",
    "## Heads whose selectivity CI lies above the best head of the untrained model (step 0), by step",
    _markdown(_by_condition(em, ["task", "step"], "above_init_heads"), ".1f"),
    "",
    "## At the last step: best head vs best residual stream (test selectivity)",
    _markdown(
      last[
        ["run", "task", "best_layer", "best_head", "selectivity", "ci_low", "ci_high"]
        + [c for c in ("residual_layer", "residual_selectivity") if c in last]
      ]
    ),
  ]
  return parts


def _formation_sections(frames: dict) -> list[str]:
  """summary.md: when each layer's heads form, and the regularizers against baseline."""
  parts = []
  if len(frames["layers"]):
    parts += ["", "## First step with a head above step 0's best, per layer", _markdown(frames["layers"])]
  if len(frames["formation"]):
    parts += [
      "",
      "## Formation step per head (its CI above step 0's best head), median over a layer's heads, over seeds",
      "Per seed the median over the layer's heads (a head that never formed counts as never: NaN when half or "
      "more never did); median, min and max of those over seeds; seeds_formed: seeds with any head formed. "
      "probe: test selectivity; role: score on repeated random sequences; loss: the repeat drop of the whole "
      f"model (layer −1), formed when its CI lies {DROP_FORMED:g} nat above step 0's. Per head: "
      "study/formation.csv.",
      _markdown(_formation_summary(frames["formation"]), ".0f"),
    ]
  if len(frames["conditions"]):
    parts += [
      "",
      "## Regularizers vs baseline at the last step: condition − baseline, tested",
      "paired_t: a t test over the seeds both conditions ran (mean, 95% t interval); welch_t: Welch's t test where "
      "they share fewer than 2 seeds. p_holm: Holm within the family (condition:specialization, condition:diversity, "
      'condition:probe_accuracy_vs_random, condition:loss_delta_vs_random; docs/study.md "Statistics"). '
      "selectivity: the best head's test selectivity; best_minus_median: best − median head; rows without a task: "
      "the diversity metrics (mean over layers and head pairs); rows with k: the causal test's selective − random "
      "(probe_accuracy_vs_random: decodability after ablation; loss_delta_vs_random: the LM loss). NaN: one seed.",
      _markdown(frames["conditions"], ".4f"),
    ]
  return parts


def _structural_sections(frames: dict) -> list[str]:
  """summary.md: Hewitt & Manning's structural probes, by step and at the last step. The by-step value is the
  head with the best DEV VALUE (`choice` best_value): a raw UUAS/DSpr. compared across steps and with the
  linear baseline must come from the head chosen for that value; the most selective head's (value − control)
  is beside it at the last step."""
  parts = []
  if len(frames["structural"]):
    st = frames["structural"]
    st_last = st[st["step"] == st.groupby("run")["step"].transform("max")]
    parts += [
      "",
      "## Structural probes (Hewitt & Manning 2019): the best head's test value by step",
      "UUAS and DSpr. (distance probe), root accuracy and NSpr. (depth probe) of the head with the highest dev "
      "value (choice best_value; study/structural.csv also has the most selective head, choice most_selective).",
      _markdown(
        _by_condition(st[(st["source"] == "head") & (st["choice"] == "best_value")], ["metric", "step"], "value")
      ),  # fmt: skip
      "",
      "## Structural probes: the most selective head's test selectivity (value − control-tree value) by step",
      _markdown(
        _by_condition(
          st[(st["source"] == "head") & (st["choice"] == "most_selective")], ["metric", "step"], "selectivity"
        )
      ),  # fmt: skip
      "",
      "## At the last step: structural probes, both choices, head and residual stream (test; linear: H&M's baseline)",
      "best_value: the highest dev value (compare its value with linear); most_selective: the highest dev "
      "value − control (compare its selectivity).",
      _markdown(
        st_last[
          ["run", "metric", "source", "choice", "layer", "head", "value", "ci_low", "ci_high", "control_value"]
          + ["selectivity", "linear"]
        ]
      ),
    ]
  return parts


def _induction_section(frames: dict) -> list[str]:
  """summary.md's induction section: the repeat drop, ICL score and the causal checks (k = 1) by step,
  the check's power and the first step a head reaches the role's label."""
  ind = frames["induction"]
  shown = [
    "repeat_drop",
    "icl_score",
    "loss_delta_second_vs_random (zero)",
    "loss_delta_second_vs_unlabelled (zero)",
  ]
  ind = ind[ind["measure"].isin(shown) & (ind["k"].isna() | (ind["k"] == 1))]
  parts = [
    "",
    "## Induction by step: the in-context loss drop and the causal check",
    "repeat_drop: loss on the first copy of repeated random sequences − on the second (nats; > 0: the model "
    "copies from context); icl_score: loss at a late − an early token of the text (< 0: context helps); "
    "loss_delta_second_vs_random (zero), k = 1: the second copy's loss rise when the top induction head is "
    "zero-ablated, minus when a layer-matched random head is; loss_delta_second_vs_unlabelled (zero): the "
    "same minus a random head of any layer that no previous-token, duplicate-token or induction label names "
    "(the control where the top head's layer holds other induction heads, which the layer-matched draw then "
    "picks). Every k, mean ablation and CIs: "
    "study/induction.csv; the repeat drop's formation step: the formation table (source loss).",
    _markdown(_by_condition(ind, ["measure", "step"], "value")),
  ]
  if ind["mde"].notna().any():
    parts += [
      "",
      "Power of the causal check (k = 1, zero ablation): the median over runs and steps of mde, the smallest "
      f"excess it detects at 80% power: {ind['mde'].median():.3f} nats.",
    ]
  if len(frames.get("formation_tests", ())):
    parts += [
      "",
      "### Conditions compared: how many seeds formed (Fisher's exact test) and when (Mann–Whitney U)",
      "label/ROLE: the first kept step a run's best head reaches the label; loss/repeat_drop: the repeat drop's "
      "formation step. A run that never formed counts as later than every step in the Mann–Whitney test. Holm "
      "within each quantity and test over the condition pairs.",
      _markdown(frames["formation_tests"], ".4g"),
    ]
  if len(frames["roles"]):
    parts += [
      "",
      f"### First kept step with a head at or above {_label_min()} (the role's label), over seeds",
      "median, min and max over the seeds that reached it; seeds_reached of seeds. The per-head formation "
      "steps by the CI rule (above step 0's best head) are in the formation table.",
      _markdown(_label_steps(frames["roles"]), ".0f"),
    ]
  return parts


def _sae_section(frames: dict) -> list[str]:
  """summary.md: the SAEs' head specialization by step and its rank correlation with probe selectivity."""
  sae = frames["sae"]
  levels = sae[sae["task"].fillna("") == ""]
  rho = sae[sae["task"].fillna("") != ""]
  parts = [
    "",
    "## Heads through SAE features, by step (sparse autoencoders on each layer's z, docs/sae.md)",
    "specialization_mean / _max: S_h over the heads (1/H: every feature a head writes spread evenly over the "
    "heads; 1: all its own); exclusive_features: features with one head's decoder share ≥ exclusive_min, summed "
    "over heads; heads_with_exclusive: heads with at least one.",
    _markdown(_by_condition(levels, ["sae", "measure", "step"], "value")),
  ]
  if len(rho):
    parts += [
      "",
      "### Does feature specialization go with probe selectivity? Spearman ρ over heads, by step",
      "spearman_selectivity: S_h against the head's test selectivity at that step; within_layer_spearman: the "
      "mean per-layer ρ; spearman_change: S_h's change since the first probed step against the selectivity's "
      "(> 0: specialization rose where selectivity did). Per run p and Holm: study/sae.csv.",
      _markdown(_by_condition(rho, ["sae", "measure", "task", "step"], "value")),
    ]
  return parts


def _later_sections(frames: dict) -> list[str]:
  """summary.md: diversity, roles, the causal test, rankings and the reference models."""
  parts = []
  if len(frames["diversity"]):
    d = frames["diversity"]
    steps = sorted(set(d["step"]))
    parts += [
      "",
      "## Diversity (mean over layers and head pairs), first and last step",
      _markdown(_by_condition(d[d["step"].isin([steps[0], steps[-1]])], ["metric", "step"], "value"), ".4f"),
    ]
  if len(frames["roles"]):
    parts += [
      "",
      "## Best previous-token / duplicate-token / induction score by step",
      _markdown(_by_condition(frames["roles"], ["role", "step"], "score")),
      "",
      "### Best − median head's score, by step (whether one head carries the role)",
      _markdown(
        _by_condition(
          frames["roles"].assign(gap=frames["roles"]["score"] - frames["roles"]["median_score"]),
          ["role", "step"],
          "gap",
        )
      ),
    ]
  if len(frames["induction"]):
    parts += _induction_section(frames)
  if len(frames["causal"]):
    c = frames["causal"]
    parts += [
      "",
      "## Causal test: k most selective heads vs k layer-matched random heads (ablated − random)",
      "probe_accuracy_vs_random: DECODABILITY AFTER ABLATION, the accuracy of a probe refitted on the ablated last "
      "layer (< 0: less of the task is linearly decodable once the selective heads are gone; not whether the model "
      "uses them); loss_delta_vs_random: the LM loss change (> 0: the model's loss needs the selective heads more).",
      _markdown(
        c[c["metric"].isin(list(CAUSAL_MEASURES))][["run", "task", "k", "metric", "value", "ci_low", "ci_high", "mde"]],
        ".4f",
      ),
      "mde: the smallest effect this test detects with 80% power at α = 0.05, 2.8 × SE, SE = CI half-width / "
      '1.96 (Bloom 1995). It is not an equivalence bound: a "no more than" statement needs tost_p below.',
      "",
      "### Over seeds: the causal test per condition, decodability and LM loss (study/causal_seeds.csv)",
      _markdown(frames["causal_seeds"], ".4f"),
      "p_value: one-sample t test of 0 over seeds; p_holm: Holm within condition × metric (every task × k); "
      "below_0 / above_0: seeds whose own CI lies below / above 0; tost_p: Schuirmann's two one-sided t tests of "
      "|mean| < tost_margin (small: shown to be within the margin).",
    ]
  if len(frames.get("sae", ())):
    parts += _sae_section(frames)
  if len(frames["rankings"]):
    parts += [
      "",
      "## How much the model needs a head vs its selectivity (Spearman ρ; permutation p, Holm-adjusted)",
      "zero_ablation / mean_ablation: the signed loss change when the head alone is removed (> 0: needed); "
      "importance_raw: E|∂ℓ/∂m_h| (a magnitude: also high for a head whose removal lowers the loss); importance: "
      "the same normalised per layer. within_layer: mean per-layer ρ, heads shuffled only within their layer.",
      _markdown(
        frames["rankings"][
          ["run", "task", "measure", "spearman", "p_holm", "within_layer_spearman", "within_layer_p_holm", "heads"]
        ]
      ),
      "",
      "### Over seeds: Spearman ρ per condition (mean, 95% t interval over seeds, range)",
      _markdown(_by_condition(frames["rankings"], ["task", "measure"], "spearman")),
    ]
  if len(frames["reference"]):
    ref = frames["reference"]
    wide = ref.pivot_table(index=["kind", "what"], columns="run", values="value", aggfunc="first")
    wide["baseline"] = ref.groupby(["kind", "what"])["baseline"].first()
    wide["n (test, first run)"] = ref.groupby(["kind", "what"])["n"].first()
    parts += [
      "",
      "## Runs' last step and reference models: the best head's test value (chosen on dev)",
      "probe_selectivity: selectivity; structural: the structural probe's value (UUAS, DSpr., root accuracy, "
      "NSpr.) beside H&M's linear baseline; clark/*: attention accuracy on the arcs both models see, beside the "
      "best fixed offset (baseline). Layers and heads: study/reference.csv.",
      _markdown(wide.reset_index()),
    ]
  return parts


def write_study(root) -> epath.Path:
  """ROOT/study/{*.csv, *.png, summary.md}; returns the summary's path."""
  import pandas as pd

  rows = collect(root)
  out = remote.run_path(root) / OUT
  out.mkdir(parents=True, exist_ok=True)
  frames = {k: pd.DataFrame(v, columns=COLUMNS[k].split(",")) for k, v in rows.items()}
  for name, frame in frames.items():
    remote.write_bytes_atomic(out / f"{name}.csv", frame.to_csv(index=False, float_format="%.6g").encode())
  figures = _figures(frames, out)
  parts = [f"# Study: {os.fspath(root)}", ""] + _emergence_sections(frames)
  parts += _formation_sections(frames) + _structural_sections(frames) + _later_sections(frames)
  parts += ["", STATISTICS, "", "Figures: " + ", ".join(figures), ""]
  summary = out / "summary.md"
  remote.write_bytes_atomic(summary, "\n".join(parts).encode())
  return summary
