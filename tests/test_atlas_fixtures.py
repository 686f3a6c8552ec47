"""Fixture runs for the atlas and analysis/ tests: every per-head table, written through headspec.tables
following the contracts in docs/outputs.md (pure Python: no JAX, no NumPy), plus metrics.jsonl and
attention pictures. Imported by tests/test_atlas.py and tests/test_analysis*.py; no tests of its own."""

from __future__ import annotations

import json
import pathlib
import random
import struct
import zlib

from headspec import tables

TASKS = ("upos", "arc")
SPLITS = ("synth/dev", "synth/test")
RELATIONS = ("nsubj", "obj", "det", "amod")
ROLES = ("previous_token", "induction", "positional")


def tiny_png(width: int = 24, height: int = 16, colour=(40, 120, 200)) -> bytes:
  """A valid RGB PNG of one colour (no imaging library)."""
  chunk = lambda kind, data: (
    struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)
  )
  raw = b"".join(b"\x00" + bytes(colour) * width for _ in range(height))
  header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
  return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def write_run(
  workdir,
  *,
  layers: int = 3,
  heads: int = 4,
  steps=(0, 100, 1000),
  seed: int = 0,
  shift: float = 0.0,
  probes: bool = True,
  diversity: bool = True,
  ablation: bool = True,
  attention: bool = True,
  test_split: bool = True,
  structural: bool = False,
  patching: bool = False,
) -> pathlib.Path:
  """A run directory with the chosen tables; `shift` raises probe accuracies (a "better" run). The structural
  probe and patching tables are opt-in (the analysis/ tests count the others). Known answers: head (1, 2) has
  the best distance UUAS, and patching its z at the last position restores the whole logit difference."""
  workdir = pathlib.Path(workdir)
  workdir.mkdir(parents=True, exist_ok=True)
  name = workdir.name
  rng = random.Random(seed)
  last = max(steps)
  grow = lambda step: (step + 1) / (last + 1)
  with open(workdir / "metrics.jsonl", "w") as f:
    for step in range(0, last + 1, max(1, last // 20)):
      f.write(json.dumps({"step": step, "loss": 6.0 - 3.0 * grow(step) + 0.05 * rng.random()}) + "\n")
  if probes:
    rows = []
    for model, model_steps in ((name, steps), (f"{name}-random", (0,))):
      for step in model_steps:
        for task in TASKS:
          for split in SPLITS if test_split else SPLITS[:1]:
            for layer in range(-1, layers):
              for head in (-1,) if layer < 0 else range(-1, heads):
                control = 0.3 + 0.05 * rng.random()
                best = layer == 1 and head == 2 and task == "upos" and not model.endswith("-random")
                acc = min(0.99, control + 0.05 * rng.random() + shift + (0.3 * grow(step) if best else 0.0))
                rows.append(
                  dict(
                    model=model,
                    step=step,
                    task=task,
                    layer=layer,
                    head=head,
                    split=split,
                    accuracy=acc,
                    ci_low=acc - 0.02,
                    ci_high=acc + 0.02,
                    control_accuracy=control,
                    selectivity=acc - control,
                    n=1000,
                  )
                )
    tables.write(tables.path_of(workdir, tables.PROBES), rows, tables.PROBES)
    base = [dict(task=t, split=s, baseline="majority", accuracy=0.2, n=1000) for t in TASKS for s in SPLITS]
    tables.write(tables.path_of(workdir, tables.PROBE_BASELINES), base, tables.PROBE_BASELINES)
  if diversity:
    rows = []
    for step in steps:
      for layer in range(layers):
        for i in range(heads):
          for metric in ("attention_entropy", "attention_distance"):
            rows.append(
              dict(model=name, step=step, layer=layer, head_i=i, head_j=-1, metric=metric, value=rng.random() * 3)
            )
          for j in range(heads):
            v = 0.0 if i == j else 0.2 + 0.5 * grow(step) * rng.random() + shift
            rows.append(dict(model=name, step=step, layer=layer, head_i=i, head_j=j, metric="js_distance", value=v))
    tables.write(tables.path_of(workdir, tables.DIVERSITY), rows, tables.DIVERSITY)
  if ablation:
    rows = []
    for layer in range(layers):
      for head in range(heads):
        v = 0.5 * rng.random()
        rows.append(
          dict(
            model=name,
            step=last,
            method="zero",
            layer=layer,
            head=head,
            metric="loss_delta",
            value=v,
            ci_low=v - 0.05,
            ci_high=v + 0.05,
          )
        )
        s = rng.random()
        rows.append(
          dict(
            model=name,
            step=last,
            method="importance",
            layer=layer,
            head=head,
            metric="score",
            value=s,
            ci_low=float("nan"),
            ci_high=float("nan"),
          )
        )
    tables.write(tables.path_of(workdir, tables.ABLATION_HEADS), rows, tables.ABLATION_HEADS)
    rows, total = [], layers * heads
    for ranking, seeds in (("importance", (0,)), ("random", (0, 1, 2))):
      for s in seeds:
        for k in range(total + 1):
          penalty = (k / total) ** (2.0 if ranking == "importance" else 1.0)
          rows.append(
            dict(
              model=name,
              step=last,
              ranking=ranking,
              seed=s,
              heads_pruned=k,
              fraction_pruned=k / total,
              metric="loss",
              value=3.0 + 2.0 * penalty + 0.05 * rng.random(),
            )
          )
    tables.write(tables.path_of(workdir, tables.ABLATION_PRUNING), rows, tables.ABLATION_PRUNING)
    rows = [
      dict(
        model=name,
        step=last,
        metric="loss_delta",
        layer_a=0,
        head_a=0,
        layer_b=1,
        head_b=2,
        joint=0.9,
        sum_of_singles=0.5,
        interaction=0.4,
      )
    ]
    tables.write(tables.path_of(workdir, tables.ABLATION_INTERACTIONS), rows, tables.ABLATION_INTERACTIONS)
  if attention:
    clark, base, roles, labels = [], [], [], []
    for rel in RELATIONS + ("all",):
      for direction in ("dependent_to_head", "head_to_dependent"):
        base.append(
          dict(
            model=name, step=last, split="synth/dev", relation=rel, direction=direction, offset=-1, accuracy=0.3, n=50
          )
        )
        for layer in range(layers):
          for head in range(heads):
            acc = rng.random() * 0.6 + (0.35 if (layer, head, rel) == (1, 2, "nsubj") else 0.0)
            clark.append(
              dict(
                model=name,
                step=last,
                split="synth/dev",
                relation=rel,
                direction=direction,
                layer=layer,
                head=head,
                accuracy=acc,
                n=50,
              )
            )
    for layer in range(layers):
      for head in range(heads):
        scores = {role: rng.random() for role in ROLES}
        for role, score in scores.items():
          roles.append(
            dict(
              model=name,
              step=last,
              data="treebank",
              layer=layer,
              head=head,
              role=role,
              score=score,
              ci_low=score - 0.1,
              ci_high=score + 0.1,
            )
          )
        top = max(scores, key=scores.get)
        labels.append(
          dict(model=name, step=last, layer=layer, head=head, label=top, rule=f"{top} score >= 0.5 (<b>html</b> & co)")
        )
    tables.write(tables.path_of(workdir, tables.CLARK), clark, tables.CLARK)
    tables.write(tables.path_of(workdir, tables.CLARK_BASELINES), base, tables.CLARK_BASELINES)
    tables.write(tables.path_of(workdir, tables.ROLES), roles, tables.ROLES)
    tables.write(tables.path_of(workdir, tables.LABELS), labels, tables.LABELS)
    pictures = workdir / "attention"
    pictures.mkdir(parents=True, exist_ok=True)
    (pictures / "L1H2_sentence0.png").write_bytes(tiny_png(240, 120, (200, 60, 60)))
    (pictures / "layer0_head1.png").write_bytes(tiny_png(120, 80, (60, 160, 60)))
    (pictures / "clark_summary.png").write_bytes(tiny_png(200, 60))
  if structural:
    write_structural(workdir, layers, heads, last, rng)
  if patching:
    write_patching(workdir, layers, heads, last)
  return workdir


def write_structural(workdir: pathlib.Path, layers: int, heads: int, step: int, rng: random.Random) -> None:
  """probes/structural.csv (docs/outputs.md): distance (uuas, dspr) and depth (root_acc, nspr) per head, per
  layer's residual stream (head -1) and the embeddings (layer -1), on dev and test."""
  rows = []
  for task, metrics in (("distance", ("uuas", "dspr")), ("depth", ("root_acc", "nspr"))):
    for split in SPLITS:
      for layer in range(-1, layers):
        for head in (-1,) if layer < 0 else range(-1, heads):
          for metric in metrics:
            value = 0.2 + 0.2 * rng.random() + (0.4 if (layer, head, metric) == (1, 2, "uuas") else 0.0)
            rows.append(dict(model=workdir.name, step=step, task=task, layer=layer, head=head, split=split,
                             metric=metric, value=value, ci_low=value - 0.03, ci_high=value + 0.03,
                             control_value=0.25, selectivity=value - 0.25, rank=8, n=80))  # fmt: skip
  tables.write(tables.path_of(workdir, tables.PROBE_STRUCTURAL), rows, tables.PROBE_STRUCTURAL)


def write_patching(workdir: pathlib.Path, layers: int, heads: int, step: int, T: int = 4) -> None:
  """patching/results.csv and summary.csv (docs/outputs.md) of `headspec patch` on the induction task: z and
  resid_pre by head and position, denoising, activation and attribution, and path_logits. Corrupted logit
  difference 1, clean 3; z of head (1, 2) at the last position gives 3 (all restored), head (0, 1) there 0
  (−0.5 of it); everything else 1.5 at the last position, 1 elsewhere."""
  rows, key = [], dict(model=workdir.name, step=step, task="induction", direction="denoising")

  def value(layer, head, position):
    if position < T - 1:
      return 1.0
    return {(1, 2): 3.0, (0, 1): 0.0}.get((layer, head), 1.5)

  for layer in range(layers):
    for position in range(T):
      rows.append(key | dict(method="activation", site="resid_pre", layer=layer, head=-1, position=position,
                             value=3.0 if position == T - 1 else 1.0))  # fmt: skip
      for head in range(heads):
        v = value(layer, head, position)
        rows.append(key | dict(method="activation", site="z", layer=layer, head=head, position=position, value=v))
        rows.append(key | dict(method="attribution", site="z", layer=layer, head=head, position=position,
                               value=0.5 * (v - 1.0)))  # fmt: skip
  for layer in range(layers):
    for head in range(heads):
      rows.append(key | dict(method="path_logits", site="z", layer=layer, head=head, position=-1, value=1.2))
  tables.write(tables.path_of(workdir, tables.PATCHING), rows, tables.PATCHING)
  summary = [
    dict(model=workdir.name, step=step, task="induction", site=site, direction="denoising", metric=metric, value=v)
    for site in ("z", "resid_pre")
    for metric, v in (("base", 1.0), ("source", 3.0), ("agreement", 0.9))
  ]
  tables.write(tables.path_of(workdir, tables.PATCHING_SUMMARY), summary, tables.PATCHING_SUMMARY)
