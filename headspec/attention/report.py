"""attention/clark_summary.md: per relation and direction, the best head chosen on the selection split
(dev) and reported on the report split (test), next to the best fixed-offset baseline chosen the same way."""

from __future__ import annotations

import numpy as np

from headspec.attention import clark as clark_lib


def _fmt(x) -> str:
  return "n/a" if x is None or not np.isfinite(x) else f"{x:.3f}"


def job_section(
  job, kind: str, config, select_key: str, select, report_key: str, report, arcs_report, chosen, skipped=()
) -> str:
  """The markdown of one (model, step): one table row per relation and direction; `skipped`: a line per
  split that lost sentences the model cannot represent (align.Representable.summary)."""
  arc_set = config.clark.arcs
  scored = "reachable arcs only" if (kind == "decoder" or arc_set == "reachable") else "all non-root arcs"
  lines = [
    f"## {job.name}, step {job.step} ({kind})",
    "",
    f"Best head chosen on {select_key}, its accuracy reported on {report_key or select_key}; baseline = the best fixed "
    f"relative offset (chosen on {select_key} the same way). Scored on {scored} (clark.arcs={arc_set!r}).",
  ]
  if kind == "decoder":
    lines.append(
      "A decoder attends only to the left: dependent_to_head is scored on arcs whose head precedes the dependent, "
      "head_to_dependent on arcs whose dependent precedes the head (offsets k < 0); `reachable` is that share of "
      "the relation's arcs, and accuracies are over reachable arcs only."
    )
  else:
    lines.append(
      "`reachable`: the share of the relation's arcs a left-to-right decoder could get right; with "
      "clark.arcs='reachable' an encoder is scored on exactly those arcs, to compare with a decoder."
    )
  lines.append(
    "head_to_dependent is Clark et al.'s released second direction: each dependent predicts the word that attends "
    "to it most, right when that is its head."
  )
  lines += [f"Skipped (the model cannot represent them; scores are over the other sentences): {s}." for s in skipped]
  lines += [
    "",
    "| relation | direction | n | reachable | best head | acc (select) | acc (report) | offset | baseline (report) |",
    "|---|---|---:|---:|---|---:|---:|---:|---:|",
  ]
  final = report if report is not None else select
  for relation, direction in select.accuracy:
    key = (relation, direction)
    acc_LH = select.accuracy[key]
    if select.n[key] == 0 or not np.isfinite(acc_LH).any():
      continue
    l, h = np.unravel_index(np.nanargmax(acc_LH), acc_LH.shape)
    of_r = np.ones(arcs_report.num_arcs, bool) if relation == clark_lib.ALL else arcs_report.relation_N == relation
    share = clark_lib.reachable(arcs_report, direction)[of_r].mean() if of_r.any() else float("nan")
    k = chosen[key]
    lines.append(
      f"| {relation} | {direction} | {final.n[key]} | {_fmt(share)} | L{l}H{h} | {_fmt(acc_LH[l, h])} | "
      f"{_fmt(final.accuracy[key][l, h])} | {k:+d} | {_fmt(final.baseline[key][k])} |"
    )
  return "\n".join(lines) + "\n"


def summary(sections: list[str], frequency_source: str) -> str:
  head = [
    "# Syntax from attention (Clark et al. 2019 §4.2)",
    "",
    "Accuracy: the share of arcs whose query word's most-attended other word (word-level attention: sum over a "
    "word's pieces' columns, mean over its rows) is its partner on the arc. The (model, step)s computed by the "
    "last `headspec attention` call; attention/clark.csv keeps every row. Head roles: attention/roles.csv and "
    f"labels.csv (rare-word frequencies from {frequency_source}); definitions in docs/attention.md.",
    "",
  ]
  return "\n".join(head) + "\n" + "\n".join(sections)
