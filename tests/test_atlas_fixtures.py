"""Fixture runs for the atlas and analysis/ tests: every per-head table, written through headspec.io.tables
following the contracts in docs/outputs.md (pure Python: no JAX, no NumPy), plus metrics.jsonl and
attention pictures. Imported by tests/test_atlas.py and tests/test_analysis*.py; no tests of its own."""

from __future__ import annotations

import json
import pathlib
import random
import struct
import zlib

from headspec.io import tables

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
  sae: bool = False,
  circuit: bool = False,
) -> pathlib.Path:
  """A run directory with the chosen tables; `shift` raises probe accuracies (a "better" run). The structural
  probe, patching, SAE and circuit tables are opt-in (the analysis/ tests count the others). Known answers:
  head (1, 2) has the best distance UUAS, and patching its z at the last position restores the whole logit
  difference; `write_sae` and `write_circuit` say theirs."""
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
  if sae:
    write_sae(workdir, heads, steps)
  if circuit:
    write_circuit(workdir, layers, heads, steps)
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


SAE_NAME = "topk-f8-k2"
# The SAE of layer 1's z at the last step (sae/features.csv): feature -> (top head, its share, heads carrying it
# largest share first, firing rate). Head 2's strongest: f3 (0.95), f1 (0.7), f5 (0.6), then carried with a
# smaller share f6 (2nd after a 0.5 head), f7 (2nd after a 0.8 head), f0 (3rd); f4 has the largest share but
# is dead (fires nowhere), so it is none of them.
SAE_FEATURES = {
  0: (3, 0.5, "3;0;2", 0.1),
  1: (2, 0.7, "2;1", 0.2),
  2: (0, 0.9, "0", 0.05),
  3: (2, 0.95, "2", 0.3),
  4: (2, 0.99, "2", 0.0),
  5: (2, 0.6, "2;0", 0.1),
  6: (0, 0.5, "0;2", 0.1),
  7: (1, 0.8, "1;2", 0.1),
}


def write_sae(workdir: pathlib.Path, heads: int, steps, layer: int = 1) -> None:
  """sae/metrics.csv, features.csv, heads.csv, contexts.csv, labels.csv, histograms.csv, shares.csv and logits.csv
  (docs/outputs.md) of one TopK SAE on `layer`'s z at every step (heads ≥ 4): at the last step the features of
  SAE_FEATURES; at earlier ones every feature is head 0's alone. Each live feature f has four contexts
  ('ctx f rank r', rank 0 the strongest) and the UPOS profile NOUN 0.5, VERB 0.3, DET 0.2 (counts of 10 words)
  and deprel nsubj 1.0; heads.csv has every head's counts, S_h = 0.1·(h + 1) + step/10⁴, and another model
  (`minilm`) at step 0. Per feature (`feature_tables`): its histogram over eval_tokens = 1000, its head shares,
  its logit effect."""
  name, last = workdir.name, max(steps)
  metrics, features, head_rows, contexts, labels = [], [], [], [], []
  per_feature = {tables.SAE_HISTOGRAMS: [], tables.SAE_SHARES: [], tables.SAE_LOGITS: []}
  for model, model_steps in ((name, steps), ("minilm", (0,))):
    for step in model_steps:
      key = dict(model=model, step=step, site="z", layer=layer, sae=SAE_NAME)
      for metric, value in (
        ("features", 8),
        ("width", 4 * heads),
        ("l0", 2.0),
        ("fvu", 0.125),
        ("dead_fraction", 0.125),
        ("eval_tokens", SAE_EVAL_TOKENS),
      ):
        metrics.append(key | dict(metric=metric, value=value))
      table = SAE_FEATURES if (model, step) == (name, last) else {f: (0, 1.0, "0", 0.1) for f in SAE_FEATURES}
      for table_of, rows in feature_tables(key, table, heads).items():
        per_feature[table_of] += rows
      for f, (top, share, carried, rate) in table.items():
        features.append(key | dict(feature=f, firing_rate=rate, mean_activation=0.5 + f if rate else float("nan"),
                                   top_head=top, top_head_fraction=share, entropy_bits=1.0 - share, heads=carried,
                                   treebank_fires=10 if rate else 0, upos="NOUN" if rate else "",
                                   upos_selectivity=0.25 if rate else float("nan"), deprel="nsubj" if rate else "",
                                   deprel_selectivity=0.5 if rate else float("nan"), head_distance="",
                                   head_distance_selectivity=float("nan")))  # fmt: skip
        if not rate:
          continue
        for rank in range(4):
          contexts.append(key | dict(feature=f, rank=rank, split="synth/dev", sentence=rank, word_index=1, word="w",
                                     context=f"ctx {f} [[rank]] {rank}", activation=4.0 - rank))  # fmt: skip
        for label_set, label, count in (
          ("upos", "VERB", 3),
          ("upos", "DET", 2),
          ("upos", "NOUN", 5),
          ("deprel", "nsubj", 10),
        ):
          labels.append(key | dict(feature=f, label_set=label_set, label=label, count=count, fraction=count / 10))
      for h in range(heads):
        carried = [f for f, (_, _, c, rate) in table.items() if rate and str(h) in c.split(";")]
        values = dict(features_carried=len(carried), exclusive_features=sum(table[f][1] >= 0.9 and table[f][0] == h
                                                                            for f in carried),
                      specialization=0.1 * (h + 1) + step / 1e4, mean_entropy_bits=0.5,
                      max_feature_selectivity_upos=0.25, selective_features_upos=len(carried), probe_selectivity_upos=0.3)  # fmt: skip
        head_rows += [key | dict(head=h, metric=metric, value=v) for metric, v in values.items()]
  for table, rows in ((tables.SAE_METRICS, metrics), (tables.SAE_FEATURES, features), (tables.SAE_HEADS, head_rows),
                      (tables.SAE_CONTEXTS, contexts), (tables.SAE_LABELS, labels), *per_feature.items()):  # fmt: skip
    tables.merge(tables.path_of(workdir, table), rows, table)  # another layer's SAE adds its rows


SAE_EVAL_TOKENS = 1000
# The logit effect's tokens of a live feature f (sae/logits.csv): promoted `up<f>.<rank>` with logit 3 − rank,
# suppressed `down<f>.<rank>` with −(3 − rank); f3's first promoted token is markup, its second starts with a space.
SAE_TOKEN_MARKUP = "<b>tok</b>"


def feature_tables(key: dict, table: dict, heads: int) -> dict:
  """histograms.csv, shares.csv and logits.csv of one SAE whose features are `table` (SAE_FEATURES' form).
  Histogram: a live feature fires on firing_rate × SAE_EVAL_TOKENS tokens, in bins 0 (a tenth of them, [1, 2)) and
  3 (the rest, [4, 5]). Shares: the top head its share, the other carried heads 0.9 of the rest evenly, the
  heads it lacks 0.1 of the rest evenly (all of it if it has no other carried head)."""
  out = {tables.SAE_HISTOGRAMS: [], tables.SAE_SHARES: [], tables.SAE_LOGITS: []}
  for f, (top, share, carried, rate) in table.items():
    others = [int(h) for h in carried.split(";")[1:]]
    rest = [h for h in range(heads) if h != top and h not in others]
    for h in range(heads):
      if h == top:
        value = share
      elif h in others:
        value = (1 - share) * 0.9 / len(others)
      else:
        value = (1 - share) * (0.1 if others else 1.0) / len(rest)
      out[tables.SAE_SHARES].append(key | dict(feature=f, head=h, share=value))
    if not rate:
      continue
    active = round(rate * SAE_EVAL_TOKENS)
    for b, low, count in ((0, 1.0, active // 10), (3, 4.0, active - active // 10)):
      out[tables.SAE_HISTOGRAMS].append(key | dict(feature=f, bin=b, low=low, high=low + 1.0, count=count))
    for direction, sign, word in (("promoted", 1.0, "up"), ("suppressed", -1.0, "down")):
      for rank in range(3):
        token = f"{word}{f}.{rank}"
        if (f, direction, rank) == (3, "promoted", 0):
          token = SAE_TOKEN_MARKUP
        elif (f, direction, rank) == (3, "promoted", 1):
          token = " the"
        out[tables.SAE_LOGITS].append(key | dict(feature=f, direction=direction, rank=rank, token_id=100 * f + rank,
                                                 token=token, value=sign * (3 - rank)))  # fmt: skip
  return out


# circuit/edges.csv's known scores at the last step (exact; EAP 0.75×, EAP-IG 0.9× of them) on an otherwise
# small graph, and the one edge where EAP alone is large (embed → L1H2's v: exact 0.05, EAP 3).
CIRCUIT_SCORES = {("L0H1", "L1H2", "k"): 2.0, ("embed", "L1H2", "q"): -1.0, ("L1H2", "logits", "logits"): 1.5}
CIRCUIT_EAP_ONLY = ("embed", "L1H2", "v")


def write_circuit(workdir: pathlib.Path, layers: int, heads: int, steps, groups: int | None = None) -> None:
  """circuit/edges.csv (docs/outputs.md) of `headspec circuit` on the induction task: every edge of a model
  with `layers` layers of `heads` heads and an MLP each (`groups` K/V groups: k and v edges enter
  L<l>G<g>), scored by exact, EAP and EAP-IG (5 steps) at every step. At the last step CIRCUIT_SCORES (with
  `groups`, the L1H2 k edge enters L1G<its group>) and CIRCUIT_EAP_ONLY; at earlier steps embed → L1H2's q
  is 5 alone; every other edge scores at most 0.009 in size."""
  name, last = workdir.name, max(steps)
  # (name, layer, head, depth) as headspec/patching/edges.py: embeddings 0, layer a's heads 2a + 1, its MLP 2a + 2
  nodes = [("embed", -1, -1, 0)] + [(f"L{a}H{h}", a, h, 2 * a + 1) for a in range(layers) for h in range(heads)]
  nodes += [(f"MLP{a}", a, -1, 2 * a + 2) for a in range(layers)]
  per_head = heads // (groups or heads)
  inputs = []  # (downstream, input, layer, head, reads: the depths below this)
  for a in range(layers):
    inputs += [(f"L{a}H{h}", "q", a, h, 2 * a + 1) for h in range(heads)]
    for kv in ("k", "v"):
      targets = [(f"L{a}G{g}", g) for g in range(groups)] if groups else [(f"L{a}H{h}", h) for h in range(heads)]
      inputs += [(downstream, kv, a, g, 2 * a + 1) for downstream, g in targets]
    inputs.append((f"MLP{a}", "mlp", a, -1, 2 * a + 2))
  inputs.append(("logits", "logits", layers, -1, 2 * layers + 1))
  special = dict(CIRCUIT_SCORES)
  if groups:
    special[("L0H1", f"L1G{2 // per_head}", "k")] = special.pop(("L0H1", "L1H2", "k"))
  rows = []
  for step in steps:
    for i, (upstream, ul, uh, depth) in enumerate(nodes):
      for j, (downstream, inp, dl, dh, reads) in enumerate(inputs):
        if depth >= reads:
          continue
        edge = (upstream, downstream, inp)
        small = 0.001 * ((7 * i + 13 * j) % 19 - 9)
        exact = special.get(edge, small) if step == last else 5.0 if edge == ("embed", "L1H2", "q") else small
        by_method = {"exact": (0, exact), "eap": (1, 0.75 * exact), "eap_ig": (5, 0.9 * exact)}
        if step == last and edge == CIRCUIT_EAP_ONLY:
          by_method = {"exact": (0, 0.05), "eap": (1, 3.0), "eap_ig": (5, 0.05)}
        for method, (n, score) in by_method.items():
          rows.append(dict(model=name, step=step, task="induction", upstream=upstream, downstream=downstream, input=inp,
                           upstream_layer=ul, upstream_head=uh, downstream_layer=dl, downstream_head=dh, method=method,
                           direction="noising", steps=n, score=score))  # fmt: skip
  tables.write(tables.path_of(workdir, tables.CIRCUIT_EDGES), rows, tables.CIRCUIT_EDGES)
