"""Per-head probe selectivity read from RUN/probes/results.csv: what the causal probe test ranks heads by
(headspec/ablation/causal.py) and what an SAE's head attribution is compared with (headspec/sae/run.py).
Shared layer: it reads the probing table's contract (headspec/io/tables.py), not the probing code.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from headspec.errors import UserError
from headspec.io import tables


@dataclasses.dataclass(frozen=True)
class Selectivity:
  """Dev-split selectivity [L,H] of each task's probes on heads, for one (model, step)."""

  treebank: str
  by_task: dict


def read_selectivity(workdir, model_name: str, step: int, num_layers: int, num_heads: int) -> Selectivity | None:
  """Per-head dev selectivity of (model, step) from RUN/probes/results.csv; None when it has none.

  A file whose head rows do not cover exactly this model's L layers × H heads is a UserError.
  """
  path = tables.path_of(workdir, tables.PROBES)
  rows = [r for r in tables.read(path, tables.PROBES) if r["model"] == model_name and int(r["step"]) == step]
  heads = [r for r in rows if int(r["head"]) >= 0 and int(r["layer"]) >= 0]
  if not heads:
    return None
  dev = [r for r in heads if r["split"].endswith("/dev")]
  if not dev:
    raise UserError(f"{path}: no dev-split rows for {model_name} step {step} (selectivity is ranked on dev)")
  treebank = dev[0]["split"].split("/")[0]
  by_task = {}
  for r in dev:
    if r["split"] != f"{treebank}/dev":
      continue
    layer, head = int(r["layer"]), int(r["head"])
    if layer >= num_layers or head >= num_heads:
      raise UserError(
        f"{path}: {model_name} step {step} has a probe on layer {layer} head {head}, but the model has "
        f"{num_layers} layers × {num_heads} heads (results of another model?)"
      )
    by_task.setdefault(r["task"], np.full((num_layers, num_heads), np.nan))[layer, head] = float(r["selectivity"])
  for task, sel in by_task.items():
    if np.isnan(sel).any():
      raise UserError(
        f"{path}: {model_name} step {step} task {task}: probes on {int((~np.isnan(sel)).sum())} heads, the model "
        f"has {num_layers} layers × {num_heads} heads"
      )
  return Selectivity(treebank, by_task)
