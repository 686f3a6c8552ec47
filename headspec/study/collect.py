"""The study's rows read from each run's tables (ROOT/RUN/...), one function per study table; `collect` for all."""

from __future__ import annotations

import os

import numpy as np

from headspec.errors import UserError
from headspec.io import metrics, remote, tables
from headspec.launch import experiments
from headspec.probing import tasks as probe_tasks
from headspec.study.statistics import (
  ALL_HEADS_METRIC,
  causal_seeds,
  conditions,
  formation_tests,
  holm,
  mde,
  spearman,
  within_layer_spearman,
)

OUT = "study"
ROLES = ("previous_token", "duplicate_token", "induction")


def tasks() -> tuple[str, ...]:
  """The probe tasks the study draws, in the probing registry's order (headspec/probing/tasks.py `REGISTRY`),
  so a task added there reaches the study's figures and summary without a list here."""
  return tuple(probe_tasks.REGISTRY)


COLUMNS = {name: ",".join(t.columns) for name, t in tables.STUDY.items()}
"""Every study table's columns (headspec/io/tables.py `STUDY`, docs/outputs.md), so an empty table has its header."""


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
  """The training and validation losses of metrics.jsonl, one row per logged step (`metrics.read_metrics`:
  a cut-off or non-UTF-8 line is skipped with one warning)."""
  by_step: dict[int, dict] = {}
  for record in metrics.read_metrics(workdir):
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


def _all_heads_loss(run: dict, workdir) -> list[dict]:
  """The causal rows' ALL_HEADS_METRIC row of a run: the LM-loss change with every head zero-ablated at the last
  pruned step, ablation/pruning.csv's `loss` at heads_pruned = L·H minus its `loss` with none pruned (the same
  for every ranking: their mean), the scale of the TOST margins (statistics.EQUIVALENCE); [] without both points."""
  frame = _frame(workdir, tables.ABLATION_PRUNING)
  if frame is None or not len(frame):
    return []
  frame = frame[(frame["metric"] == "loss") & (frame["step"] == frame["step"].max())]
  none, every = (frame[np.isclose(frame["fraction_pruned"], f)] for f in (0.0, 1.0))
  if not len(every) or not len(none):
    return []
  change = float(every["value"].mean() - none["value"].mean())
  return [dict(**run, step=int(every["step"].iloc[0]), task="", k=int(every["heads_pruned"].iloc[0]),
               metric=ALL_HEADS_METRIC, value=change, ci_low=np.nan, ci_high=np.nan, mde=np.nan)]  # fmt: skip


def causal(run: dict, workdir) -> list[dict]:
  frame = _frame(workdir, tables.ABLATION_CAUSAL)
  if frame is None:
    return []
  frame = frame[(frame["kind"] == "probe_selective") & frame["metric"].str.endswith("_vs_random")]
  frame = frame[frame["step"] == frame["step"].max()]
  return _all_heads_loss(run, workdir) + [
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


SAE_HEAD_METRICS = ("specialization", "exclusive_features", "features_carried", "z_rms")  # sae/heads.csv, per head
SAE_PERMUTATIONS = 2000  # per ρ of sae.csv (steps × tasks × 3 per run): p resolution 1/2001


def sae_heads(run: dict, workdir) -> list[dict]:
  """sae_heads.csv rows of one run: per kept step, SAE configuration and head, sae/heads.csv's S_h, exclusive
  and carried features of the SAEs on z and the head's z RMS (`headspec sae`, docs/sae.md; NaN where absent)."""
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
  and exclusive features, and the rank correlations over heads of S_h with the probes' test selectivity and,
  on the same heads, with their z RMS (`spearman_z_rms`: how much of S_h a head's output scale alone could
  explain; Holm over the run's z RMS rows apart from the selectivity family)."""
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
      if "z_rms" in g and g["z_rms"].notna().sum() >= 3:
        r = g.dropna(subset=["z_rms"])
        rows.append(("spearman_z_rms", *spearman(r["specialization"], r["z_rms"], **kw)))
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
  for family in (lambda r: r["measure"] != "spearman_z_rms", lambda r: r["measure"] == "spearman_z_rms"):
    tested = [r for r in out if np.isfinite(r["p_value"]) and family(r)]
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
