"""`headspec circuit`: edge scores (EAP, EAP-IG, exact edge patching) and faithfulness curves of a built-in
patching task (headspec/patching/tasks.py) at every requested step, through the one job loop. Writes
RUN/circuit/edges.csv and RUN/circuit/faithfulness.csv (docs/outputs.md, docs/circuits.md)."""

from __future__ import annotations

import ml_collections

from headspec import jobloop, provenance, tables, targets
from headspec.errors import UserError
from headspec.patching import tasks

EDGES, FAITHFULNESS = tables.CIRCUIT_EDGES, tables.CIRCUIT_FAITHFULNESS
METHODS = ("eap", "eap_ig", "exact")


def circuit_config() -> ml_collections.ConfigDict:
  """Every `headspec circuit` key with its default (configs/circuit.py starts from it)."""
  c = ml_collections.ConfigDict()
  c.steps = "last"  # 'all' | 'last' | comma-separated saved steps; a pretrained model has step 0 only
  c.model_name = ""  # the tables' `model` column; '' = the run folder's name or the pretrained name
  c.task = "induction"  # 'induction' | 'ioi' (headspec/patching/tasks.py)
  c.corruption = "abc"  # ioi: 'abc' | 's2' (table task `ioi` | `ioi_s2`)
  c.count = 32  # prompt pairs
  c.induction_n = 6  # induction: [BOS] r_1..r_n r_1..r_{n-1}
  c.methods = "eap,eap_ig,exact"  # scored edges: EAP, EAP-IG, exact edge patching (one forward per edge)
  c.ig_steps = 5  # EAP-IG's interpolation points (Hanna et al. 2024 use 5)
  c.sizes = "5,10,20,40"  # circuit sizes (edges kept) of the faithfulness curve; each at most the graph's E
  c.random_sets = 3  # random edge sets of each size
  c.batch_size = 0  # prompt pairs per batch; 0 = all at once
  c.seed = 0  # the prompt pairs' random tokens and the random edge sets
  c.model = ml_collections.ConfigDict()
  c.model.pretrained = ""  # a Hugging Face directory or Hub name: its step 0 instead of WORKDIR's checkpoints
  return c


def check_config(c) -> tuple[list[str], list[int]]:
  """(methods, sizes); UserError naming the first bad key."""
  if c.task not in ("induction", "ioi"):
    raise UserError(f"circuit: task={c.task!r}; choose 'induction' or 'ioi'")
  if c.get("corruption", "abc") not in tasks.CORRUPTIONS:
    raise UserError(f"circuit: corruption={c.corruption!r}; choose one of {', '.join(map(repr, tasks.CORRUPTIONS))}")
  methods = [m.strip() for m in str(c.methods).split(",") if m.strip()]
  bad = [m for m in methods if m not in METHODS]
  if bad or not methods:
    raise UserError(f"circuit: methods={c.methods!r}; name one or more of {', '.join(METHODS)}")
  if isinstance(c.ig_steps, bool) or not isinstance(c.ig_steps, int) or c.ig_steps < 1:
    raise UserError(f"circuit: ig_steps={c.ig_steps!r} must be an integer of at least 1")
  try:
    sizes = [int(s) for s in str(c.sizes).split(",") if s.strip()]
  except ValueError:
    raise UserError(f"circuit: sizes={c.sizes!r}; give comma-separated edge counts, e.g. '5,10,20'") from None
  if not sizes or min(sizes) < 1:
    raise UserError(f"circuit: sizes={c.sizes!r}; give edge counts of at least 1 (an empty circuit has nothing)")
  for key in ("count", "random_sets", "batch_size"):
    if c[key] < (1 if key == "count" else 0):
      raise UserError(f"circuit: {key}={c[key]} must be at least {1 if key == 'count' else 0}")
  return methods, sizes


class Circuit(jobloop.Analysis):
  name = "circuit"

  def plan(self):
    self.methods, self.sizes = check_config(self.config)
    return targets.plan(self.config, self.workdir, steps=self.config.steps, model_name=self.config.model_name)

  def tables(self, jobs):
    return (EDGES, FAITHFULNESS)

  def job(self, job):
    from headspec.patching import edges  # JAX: imported by a job, not by `headspec circuit --help`
    from headspec.patching import patch as patch_lib
    from headspec.patching import run as patch_run

    c = self.config
    model, tokenizer = job.load()
    if model.cfg.kind != "decoder":
      raise UserError(f"circuit: {job.name} is an encoder; the built-in tasks read a decoder's next-token logits")
    g = edges.graph(model.cfg)
    too_big = [n for n in self.sizes if n > g.E]
    if too_big:
      raise UserError(f"circuit: sizes asks for {too_big[0]} edges; {job.name}'s graph has {g.E}")
    clean, corrupt, answers = patch_run.task_pairs(c, model, tokenizer)
    p = patch_lib.prompts(model.cfg, clean, corrupt, answers, "logit_diff", tokenizer, tokenizer.pad_id)
    batch = c.batch_size or None
    key = dict(model=job.name, step=job.step, task=patch_run.task_name(c))
    scores, steps = {}, {"eap": 1, "eap_ig": c.ig_steps, "exact": 0}
    for method in self.methods:
      if method == "exact":
        scores[method], clean_m, corrupt_m = edges.exact(model, p, batch_size=batch)
      else:
        scores[method], clean_m, corrupt_m = edges.scores(model, p, method=method, steps=c.ig_steps,
                                                          batch_size=batch)  # fmt: skip
    frame = edges.edge_frame(g, scores)
    ids = ["upstream", "downstream", "input", "upstream_layer", "upstream_head", "downstream_layer", "downstream_head"]
    edge_rows = [
      key | {k: r[k] for k in ids} | dict(method=m, steps=steps[m], score=float(r[m]))
      for r in frame.to_dict("records")
      for m in scores
    ]
    curve = edges.curve(model, p, scores, self.sizes, random_sets=c.random_sets, seed=c.seed, batch_size=batch)
    faith_rows = [
      key | dict(method=r["method"], steps=steps.get(r["method"], 0), edges=int(r["edges"]), set=int(r["set"]),
                 faithfulness=float(r["faithfulness"]), clean_metric=clean_m, corrupt_metric=corrupt_m)
      for r in curve.to_dict("records")
    ]  # fmt: skip
    return {EDGES: edge_rows, FAITHFULNESS: faith_rows}

  def finish(self, jobs):
    return tables.path_of(self.workdir, FAITHFULNESS)


@provenance.recorded("circuit")
def run(config, workdir):
  """Every requested step; returns RUN/circuit/faithfulness.csv."""
  return jobloop.run(Circuit(config, workdir))
