"""Spread of per-head probing results over repeated runs: what a new seed or training sample changes.

  python analysis/probe_spread.py RUN_S0 RUN_S1 RUN_S2 [...] --out DIR

Each RUN is a `headspec probe` run of the same model with another `seed` (it redraws the control task's
labels and the probes' minibatch order and, with `probe.max_train_words`, the training subsample). The
95% CIs of one run cover the sampling of evaluation sentences only; the spread over runs is the
variance of the fit, the control labels and the training sample (docs/probing_core.md, Statistics).
Per task, over the heads (layer, head >= 0) of each run's own model at its last step:
- each head's selectivity on the report split (test when there is one) in every run, its mean and its
  sample standard deviation over the runs;
- `seed sd`: the mean over heads of that standard deviation, beside `CI half-width`: the mean over heads
  and runs of half the paired 95% bootstrap CI of selectivity (probes/selectivity.csv; one run's
  sentence-sampling uncertainty);
- Spearman's rank correlation of the heads' selectivities between every pair of runs (mean and least);
- each run's top head, chosen on the dev split, and in how many runs the most common top head is top.
Writes DIR/spread.csv (task, layer, head, mean, sd, runs, then one column per run), DIR/spread.md and
DIR/spread_<task>.{png,svg} (each head's selectivity in every run, heads ordered by their mean).
"""

from __future__ import annotations

import collections
import itertools
import pathlib

import numpy as np
from _common import frame, heads_only, main_guard, need, parser, primary_model, run_dirs, save, select_and_report_splits

from headspec.errors import UserError
from headspec.io import tables


def per_run(run: pathlib.Path) -> dict:
  """task -> (report-split selectivity by (layer, head), dev-chosen top head, mean CI half-width or nan)."""
  probes = frame(run, tables.PROBES)
  if probes is None:
    return {}
  own = heads_only(probes[probes["model"] == primary_model(probes)])
  own = own[own["step"] == own["step"].max()]
  select, report = select_and_report_splits(own["split"])
  cis = frame(run, tables.PROBE_SELECTIVITY)
  out = {}
  for task, group in own.groupby("task"):
    rep = group[group["split"] == report].set_index(["layer", "head"])["selectivity"]
    dev = group[group["split"] == select].set_index(["layer", "head"])["selectivity"]
    if rep.empty or dev.empty:
      continue
    half = float("nan")
    if cis is not None:
      c = cis[(cis["task"] == task) & (cis["split"] == report) & (cis["head"] >= 0) & (cis["layer"] >= 0)]
      c = c[(c["model"] == primary_model(probes)) & (c["step"] == own["step"].max())]
      if len(c):
        half = float(((c["selectivity_ci_high"] - c["selectivity_ci_low"]) / 2).mean())
    out[task] = (rep, dev.idxmax(), half)
  return out


def main(argv=None) -> list:
  p = parser(__doc__.splitlines()[0])
  args = p.parse_args(argv)
  import matplotlib.pyplot as plt
  import pandas as pd

  runs = run_dirs(args.runs)
  if len(runs) < 2:
    raise UserError("probe_spread needs at least two runs (the same model probed with different seeds)")
  need({run: frame(run, tables.PROBES) for run in runs}, tables.PROBES)
  results = {run: per_run(run) for run in runs}
  tasks = [t for t in dict.fromkeys(t for r in results.values() for t in r) if all(t in r for r in results.values())]
  if not tasks:
    raise UserError(f"no task has head results in every one of {', '.join(map(str, runs))}")
  names = [run.name for run in runs]
  if len(set(names)) < len(names):
    names = [str(run) for run in runs]
  out = pathlib.Path(args.out)
  rows, lines, written = [], ["# Probe results over repeated runs", ""], []
  lines += [f"Runs: {', '.join(names)}. Selectivity on each run's report split; top head chosen on dev.", ""]
  lines += [
    "| task | heads | seed sd (mean over heads) | CI half-width (mean) | Spearman between runs (mean, least) "
    "| top head per run | runs agreeing on the top head |",
    "|---|---|---|---|---|---|---|",
  ]
  for task in tasks:
    table = pd.concat([results[run][task][0].rename(name) for run, name in zip(runs, names)], axis=1)
    table = table.dropna()
    if table.empty:
      continue
    mean, sd = table.mean(axis=1), table.std(axis=1, ddof=1)
    rho = [table[a].corr(table[b], method="spearman") for a, b in itertools.combinations(names, 2)]
    tops = [results[run][task][1] for run in runs]
    top, agree = collections.Counter(tops).most_common(1)[0]
    halves = np.asarray([results[run][task][2] for run in runs])
    half = float(np.nanmean(halves)) if np.isfinite(halves).any() else float("nan")
    lines.append(
      f"| {task} | {len(table)} | {sd.mean():.4f} | {half:.4f} | {np.mean(rho):.3f}, {np.min(rho):.3f} | "
      + ", ".join(f"L{layer}H{head}" for layer, head in tops)
      + f" | {agree}/{len(runs)} (L{top[0]}H{top[1]}) |"
    )
    for (layer, head), values in table.iterrows():
      row = dict(task=task, layer=layer, head=head, mean=mean[(layer, head)], sd=sd[(layer, head)], runs=len(runs))
      rows.append({**row, **values.to_dict()})
    order = mean.sort_values(ascending=False).index
    fig, ax = plt.subplots(figsize=(max(5, 0.12 * len(order)), 3.5), layout="constrained")
    x = np.arange(len(order))
    for i, name in enumerate(names):
      ax.plot(x, table.loc[order, name], "o", ms=3, alpha=0.7, label=name, color=f"C{i}")
    ax.plot(x, mean[order], "-", color="black", lw=1, label="mean")
    ax.set_xticks(x[:: max(1, len(x) // 24)], [f"L{l}H{h}" for l, h in order][:: max(1, len(x) // 24)], rotation=90)
    ax.set_ylabel("selectivity")
    ax.set_title(f"{task}: each head's selectivity in every run (heads by mean)")
    ax.legend(fontsize=7)
    written += save(fig, out, f"spread_{task}")
  columns = ["task", "layer", "head", "mean", "sd", "runs", *names]
  pd.DataFrame(rows, columns=columns).to_csv(out / "spread.csv", index=False)
  (out / "spread.md").write_text("\n".join(lines) + "\n")
  return [*written, out / "spread.csv", out / "spread.md"]


if __name__ == "__main__":
  main_guard(main)
