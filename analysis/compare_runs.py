"""Compare runs (with/without DropHead, several seeds, ...): each quantity of every run, and its
difference from the first run with a 95% CI, as a table and a forest plot.

  python analysis/compare_runs.py RUN_A RUN_B [RUN_C ...] --out DIR

Quantities (each run's own model, its last step):
- `probe <task>: best head selectivity`: the head with the highest selectivity on the dev split,
  reported on the test split when there is one (selection on the reporting split is biased upward).
  CI of one run: its accuracy's 95% bootstrap CI over sentences (results.csv) minus its control
  accuracy. CI of a difference: the two runs' half-widths added in quadrature (a normal approximation
  treating the runs as independent; both runs are scored on the same sentences, whose shared
  difficulty this ignores).
- `probe <task>: mean selectivity over heads` (report split), `diversity <metric>: mean over heads`
  (per-head metrics; pairwise metrics over distinct pairs) and `ablation <method> <metric>: mean over
  heads`: CIs are percentile bootstraps over heads (2000 resamples of the heads with replacement; for a
  difference, each run's heads resampled independently). They say how much the mean depends on which
  heads there are, not on the evaluation sentences.
- `final training loss` (metrics.jsonl's last `loss`): no CI.

Reads probes/results.csv, diversity/results.csv, ablation/heads.csv and metrics.jsonl, whichever the
runs have. Writes DIR/compare.csv, DIR/compare.md and DIR/compare.{png,svg}.
"""

from __future__ import annotations

import math
import pathlib

import numpy as np
from _common import (
  bootstrap_diff_ci,
  bootstrap_mean_ci,
  frame,
  heads_only,
  main_guard,
  parser,
  primary_model,
  run_dirs,
  save,
  select_and_report_splits,
  training_metrics,
)

from headspec.errors import UserError
from headspec.io import tables

COLUMNS = [
  "quantity",
  "run",
  "value",
  "ci_low",
  "ci_high",
  "reference",
  "difference",
  "diff_ci_low",
  "diff_ci_high",
  "ci",
]


def quantities(run: pathlib.Path) -> dict:
  """quantity -> (value, ci_low, ci_high, kind, samples): kind 'best' (per-head CI) or 'heads' (samples
  are the per-head values for the bootstrap) or 'none'."""
  out = {}
  probes = frame(run, tables.PROBES)
  if probes is not None:
    own = heads_only(probes[probes["model"] == primary_model(probes)])
    own = own[own["step"] == own["step"].max()]
    select, report = select_and_report_splits(own["split"])
    for task, group in own.groupby("task"):
      dev, rep = group[group["split"] == select], group[group["split"] == report].set_index(["layer", "head"])
      if dev.empty or rep.empty:
        continue
      best = dev.loc[dev["selectivity"].idxmax()]
      row = rep.loc[(best["layer"], best["head"])]
      where = f"L{best['layer']}H{best['head']}, {report}"
      c = row["control_accuracy"]
      out[f"probe {task}: best head selectivity ({where})"] = (
        row["selectivity"],
        row["ci_low"] - c,
        row["ci_high"] - c,
        "best",
        None,
      )
      values = rep["selectivity"].to_numpy()
      out[f"probe {task}: mean selectivity over heads ({report})"] = (
        values.mean(),
        *bootstrap_mean_ci(values),
        "heads",
        values,
      )
  diversity = frame(run, tables.DIVERSITY)
  if diversity is not None and not diversity.empty:
    own = diversity[diversity["model"] == primary_model(diversity)]
    last = own[own["step"] == own["step"].max()]
    for metric, group in last.groupby("metric"):
      per_head = group[group["head_j"] == -1]
      values = (per_head if len(per_head) else group[group["head_i"] != group["head_j"]])["value"].to_numpy()
      out[f"diversity {metric}: mean over heads"] = (values.mean(), *bootstrap_mean_ci(values), "heads", values)
  ablation = frame(run, tables.ABLATION_HEADS)
  if ablation is not None:
    own = ablation[ablation["model"] == primary_model(ablation)]
    own = own[own["step"] == own["step"].max()]
    for (method, metric), group in own.groupby(["method", "metric"]):
      values = group["value"].to_numpy()
      out[f"ablation {method} {metric}: mean over heads"] = (values.mean(), *bootstrap_mean_ci(values), "heads", values)
  losses = [r["loss"] for r in training_metrics(run) if isinstance(r.get("loss"), (int, float))]
  if losses:
    out["final training loss"] = (losses[-1], math.nan, math.nan, "none", None)
  return out


def difference(a, b) -> tuple[float, float, float, str]:
  """(b − a, CI low, CI high, how the CI was made)."""
  d = float(b[0] - a[0])
  if a[3] == "heads" and b[3] == "heads":
    return (d, *bootstrap_diff_ci(a[4], b[4]), "bootstrap over heads")
  if a[3] == "best" and b[3] == "best":
    half = math.hypot((a[2] - a[1]) / 2, (b[2] - b[1]) / 2)
    return d, d - half, d + half, "per-head bootstrap CIs, half-widths in quadrature"
  return d, math.nan, math.nan, "none"


def _base(quantity: str) -> str:
  """A best-head quantity names its head: compare it across runs by task."""
  return quantity.split(" (L")[0]


def main(argv=None) -> list:
  p = parser(__doc__.splitlines()[0])
  args = p.parse_args(argv)
  import matplotlib.pyplot as plt
  import pandas as pd

  runs = run_dirs(args.runs)
  if len(runs) < 2:
    raise UserError("compare_runs needs at least two runs")
  per_run = {run: {_base(q): (q, v) for q, v in quantities(run).items()} for run in runs}
  reference = runs[0]
  rows = []
  for run in runs:
    for base, (quantity, value) in per_run[run].items():
      row = dict(
        quantity=quantity, run=run.name, value=value[0], ci_low=value[1], ci_high=value[2], reference=reference.name
      )
      row.update(difference=math.nan, diff_ci_low=math.nan, diff_ci_high=math.nan, ci="")
      if run != reference and base in per_run[reference]:
        d, lo, hi, how = difference(per_run[reference][base][1], value)
        row.update(difference=d, diff_ci_low=lo, diff_ci_high=hi, ci=how)
      rows.append(row)
  if not rows:
    raise UserError(f"none of {', '.join(map(str, runs))} has probes, diversity, ablation or metrics.jsonl")
  table = pd.DataFrame(rows, columns=COLUMNS)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  table.to_csv(out / "compare.csv", index=False)
  fmt = lambda x: "–" if not np.isfinite(x) else f"{x:.4g}"
  lines = [
    f"# Run comparison (differences: run − {reference.name})",
    "",
    "| quantity | run | value [95% CI] | difference [95% CI] | CI of the difference |",
    "|---|---|---|---|---|",
  ]
  for r in rows:
    diff = (
      ""
      if not np.isfinite(r["difference"])
      else f"{fmt(r['difference'])} [{fmt(r['diff_ci_low'])}, {fmt(r['diff_ci_high'])}]"
    )
    lines.append(
      f"| {r['quantity']} | {r['run']} | {fmt(r['value'])} [{fmt(r['ci_low'])}, {fmt(r['ci_high'])}] | {diff} | {r['ci']} |"
    )
  (out / "compare.md").write_text("\n".join(lines) + "\n")
  diffs = table[np.isfinite(table["difference"])]
  labels = [f"{r.quantity} · {r.run}" for r in diffs.itertuples()]
  fig, ax = plt.subplots(figsize=(8, 1 + 0.32 * max(1, len(diffs))), layout="constrained")
  y = np.arange(len(diffs))[::-1]
  lo = (diffs["difference"] - diffs["diff_ci_low"]).fillna(0).to_numpy()
  hi = (diffs["diff_ci_high"] - diffs["difference"]).fillna(0).to_numpy()
  ax.errorbar(diffs["difference"], y, xerr=[lo, hi], fmt="o", color="C0", capsize=3)
  ax.axvline(0, color="grey", lw=0.8)
  ax.set_yticks(y, labels, fontsize=7)
  ax.set_xlabel(f"difference from {reference.name} (95% CI; see compare.md for how each CI is made)")
  written = save(fig, out, "compare")
  return [*written, out / "compare.csv", out / "compare.md"]


if __name__ == "__main__":
  main_guard(main)
