"""Specialization over training: per probe task, the best head's selectivity and the number of heads
above a selectivity threshold, against the checkpoint step (log scale), for one or several runs.

  python analysis/specialization.py RUN [RUN_B ...] --out DIR [--threshold 0.05]

The best head is selected on the dev split and its selectivity reported on the test split when the
run has one: selecting and reporting on the same split is biased upward (the maximum of noisy
estimates). With no test split it is reported on dev and the figure says so.

Intervals: results.csv gives the accuracy's 95% percentile bootstrap CI over sentences; a head's
selectivity interval is that CI minus its control accuracy (the control's own sampling error is not
included). "Heads above threshold" counts heads whose selectivity on the report split exceeds the
threshold; its band runs from the heads whose whole interval is above it to those whose interval
reaches above it.

Reads RUN/probes/results.csv (each run's own model; the `-random` control, when present, is a dashed
line at its step-0 value). Writes DIR/specialization.{png,svg} and DIR/specialization.csv.
"""

from __future__ import annotations

import csv
import pathlib

from _common import (
  frame,
  heads_only,
  main_guard,
  need,
  parser,
  primary_model,
  run_dirs,
  save,
  select_and_report_splits,
  step_axis,
)

from headspec.io import tables

COLUMNS = (
  "run,model,task,step,select_split,report_split,best_layer,best_head,selectivity,ci_low,ci_high,"
  "heads_above,heads_above_low,heads_above_high,threshold"
).split(",")


def curves(df, threshold: float) -> list[dict]:
  """One row per (task, step) of the run's own model."""
  model = primary_model(df)
  own = heads_only(df[df["model"] == model])
  select, report = select_and_report_splits(own["split"])
  out = []
  for (task, step), group in own.groupby(["task", "step"]):
    dev = group[group["split"] == select]
    rep = group[group["split"] == report].set_index(["layer", "head"])
    if dev.empty or rep.empty:
      continue
    best = dev.loc[dev["selectivity"].idxmax()]
    row = rep.loc[(best["layer"], best["head"])]
    low = rep["ci_low"] - rep["control_accuracy"]
    high = rep["ci_high"] - rep["control_accuracy"]
    out.append(
      dict(
        model=model,
        task=task,
        step=int(step),
        select_split=select,
        report_split=report,
        best_layer=int(best["layer"]),
        best_head=int(best["head"]),
        selectivity=float(row["selectivity"]),
        ci_low=float(row["ci_low"] - row["control_accuracy"]),
        ci_high=float(row["ci_high"] - row["control_accuracy"]),
        heads_above=int((rep["selectivity"] > threshold).sum()),
        heads_above_low=int((low > threshold).sum()),
        heads_above_high=int((high > threshold).sum()),
        threshold=threshold,
      )
    )
  return out


def random_control(df) -> dict:
  """task -> the random-weights control's best-head selectivity (selected on dev, reported as above)."""
  model = primary_model(df)
  control = df[df["model"] == f"{model}-random"]
  if control.empty:
    return {}
  rows = curves(control.assign(model=model), float("inf"))
  return {r["task"]: r["selectivity"] for r in rows}


def main(argv=None) -> list:
  p = parser(__doc__.splitlines()[0])
  p.add_argument("--threshold", type=float, default=0.05, help="selectivity threshold for counting heads")
  args = p.parse_args(argv)
  import matplotlib.pyplot as plt

  runs = run_dirs(args.runs)
  frames = {run: frame(run, tables.PROBES) for run in runs}
  need(frames, tables.PROBES)
  rows, controls = [], {}
  for run, df in frames.items():
    if df is not None:
      rows += [dict(r, run=run.name) for r in curves(df, args.threshold)]
      controls[run.name] = random_control(df)
  tasks = sorted({r["task"] for r in rows})
  fig, axes = plt.subplots(
    2, len(tasks), figsize=(3.6 * len(tasks), 6), squeeze=False, sharex=True, layout="constrained"
  )
  colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for t, task in enumerate(tasks):
    top, bottom = axes[0][t], axes[1][t]
    for k, run in enumerate(frames):
      series = sorted((r for r in rows if r["run"] == run.name and r["task"] == task), key=lambda r: r["step"])
      if not series:
        continue
      c = colours[k % len(colours)]
      steps = [r["step"] for r in series]
      biased = series[0]["select_split"] == series[0]["report_split"]
      label = f"{run.name}" + (" (selected and reported on dev: biased up)" if biased else "")
      top.plot(steps, [r["selectivity"] for r in series], "o-", color=c, label=label, ms=3)
      top.fill_between(steps, [r["ci_low"] for r in series], [r["ci_high"] for r in series], color=c, alpha=0.2)
      if task in controls.get(run.name, {}):
        top.axhline(controls[run.name][task], color=c, ls="--", lw=0.8)
      bottom.plot(steps, [r["heads_above"] for r in series], "o-", color=c, ms=3)
      bottom.fill_between(
        steps, [r["heads_above_low"] for r in series], [r["heads_above_high"] for r in series], color=c, alpha=0.2
      )
      for ax in (top, bottom):
        step_axis(ax, steps)
    report = {r["report_split"] for r in rows if r["task"] == task}
    top.set_title(f"{task}: best head (dev-selected), on {', '.join(sorted(report))}", fontsize=8)
    top.set_ylabel("selectivity (95% CI)")
    bottom.set_ylabel(f"heads with selectivity > {args.threshold:g}")
    if any(task in c for c in controls.values()):
      top.plot([], [], "k--", lw=0.8, label="random-weights control (step 0)")
    top.legend(fontsize=6)
  out = pathlib.Path(args.out)
  written = save(fig, out, "specialization")
  with open(out / "specialization.csv", "w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows({c: r[c] for c in COLUMNS} for r in rows)
  return [*written, out / "specialization.csv"]


if __name__ == "__main__":
  main_guard(main)
