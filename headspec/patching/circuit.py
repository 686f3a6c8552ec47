"""`headspec circuit`: edge scores (EAP, EAP-IG, exact edge patching) and faithfulness curves of a built-in
patching task (headspec/patching/tasks.py) or of prompt pairs from a file (`task='pairs'`, `read_pairs`) at
every requested step, through the one job loop. Writes RUN/circuit/edges.csv, RUN/circuit/faithfulness.csv
(docs/outputs.md, docs/circuits.md) and per method a figure of its top edges:
circuit/<task>_<method>_<model>_step<step>.png (`figure`; the task and model's names one file-name
component each, headspec/io/filenames.py)."""

from __future__ import annotations

import json

import ml_collections
import numpy as np
from etils import epath

from headspec import bounds
from headspec.errors import UserError
from headspec.io import filenames, provenance, remote, tables, textfiles
from headspec.patching import tasks
from headspec.runs import targets
from headspec.runs.target_config import add_target_keys
from headspec.words import jobloop

EDGES, FAITHFULNESS = tables.CIRCUIT_EDGES, tables.CIRCUIT_FAITHFULNESS
METHODS = ("eap", "eap_ig", "exact", "eap_denoising", "eap_ig_denoising", "exact_denoising")


def circuit_config() -> ml_collections.ConfigDict:
  """Every `headspec circuit` key with its default (configs/circuit.py starts from it)."""
  c = ml_collections.ConfigDict()
  add_target_keys(c)  # mesh, multihost, steps, model_name, model.pretrained, model.dtype
  c.task = "induction"  # 'induction' | 'ioi' (headspec/patching/tasks.py) | 'pairs' (the prompt pairs of `pairs`)
  c.pairs = ""  # task 'pairs': a JSON Lines file, one {"clean", "corrupt", "answer", "wrong"} per line (read_pairs)
  c.corruption = "abc"  # ioi: 'abc' | 's2' (table task `ioi` | `ioi_s2`)
  c.metric = "logit_diff"  # 'logit_diff' | 'prob' | 'loss' (the patching registry, patching/core.py METRICS)
  c.count = 32  # prompt pairs
  c.induction_n = 6  # induction: [BOS] r_1..r_n r_1..r_{n-1}
  c.methods = "eap,eap_ig,exact"  # EAP, EAP-IG, exact edge patching (one forward per edge), noising; *_denoising
  c.ig_steps = 5  # EAP-IG's interpolation points (Hanna et al. 2024 use 5)
  c.sizes = "5,10,20,40"  # circuit sizes (edges kept) of the faithfulness curve; each at most the graph's E
  c.random_sets = 3  # random edge sets of each size
  c.batch_size = 0  # prompt pairs per batch; 0 = all at once
  c.figure_edges = 20  # the top edges drawn per method, circuit/<task>_<method>_<model>_step<step>.png; 0: none
  c.seed = 0  # the prompt pairs' random tokens and the random edge sets
  return c


def check_config(c) -> tuple[list[str], list[int]]:
  """(methods, sizes); UserError naming the first bad key."""
  bounds.check(c, BOUNDS, "circuit")  # NaN, inf, negative seeds, absurd sizes: before any work
  if c.task not in ("induction", "ioi", "pairs"):
    raise UserError(f"circuit: task={c.task!r}; choose 'induction', 'ioi' or 'pairs' (with pairs=FILE.jsonl)")
  if c.task == "pairs":
    read_pairs(c.pairs)  # the file's own faults, before any work
  elif c.get("pairs", ""):
    raise UserError(f"circuit: pairs={c.pairs!r} is read only with task='pairs' (task={c.task!r})")
  if c.get("corruption", "abc") not in tasks.CORRUPTIONS:
    raise UserError(f"circuit: corruption={c.corruption!r}; choose one of {', '.join(map(repr, tasks.CORRUPTIONS))}")
  from headspec.patching import core  # JAX: read once the command runs, not by --help

  if c.metric not in core.METRICS:
    raise UserError(f"circuit: metric={c.metric!r}; choose one of {', '.join(core.METRICS)}")
  methods = [m.strip() for m in str(c.methods).split(",") if m.strip()]
  bad = [m for m in methods if m not in METHODS]
  if bad or not methods:
    raise UserError(f"circuit: methods={c.methods!r}; name one or more of {', '.join(METHODS)}")
  try:
    sizes = [int(s) for s in str(c.sizes).split(",") if s.strip()]
  except ValueError:
    raise UserError(f"circuit: sizes={c.sizes!r}; give comma-separated edge counts, e.g. '5,10,20'") from None
  if not sizes or min(sizes) < 1:
    raise UserError(f"circuit: sizes={c.sizes!r}; give edge counts of at least 1 (an empty circuit has nothing)")
  return methods, sizes


BOUNDS = (  # every numeric option's kind and range (headspec/bounds.py), checked first by `headspec circuit`
  bounds.Bound("seed", "int", 0, 2**63 - 1),
  bounds.Bound("count", "int", 1, 2**20),
  bounds.Bound("induction_n", "int", 1, 2**16),
  bounds.Bound("ig_steps", "int", 1, 10000),
  bounds.Bound("random_sets", "int", 0, 10000),
  bounds.Bound("batch_size", "int", 0, 2**20),
  bounds.Bound("figure_edges", "int", 0, 10000),
)
bounds.declare("circuit", BOUNDS, defaults=circuit_config, check=check_config)


PAIR_KEYS = ("clean", "corrupt", "answer", "wrong")


def read_pairs(path) -> list[dict]:
  """The prompt pairs of a JSON Lines file: one object per line with `clean` and `corrupt` (texts, or lists of
  token ids) and `answer` and `wrong` (the correct and the wrong next token: a text that is one token after
  the prompt, or a token id); blank lines skipped. Each row also gets `line` (its line number). UserError
  naming file:line for the first fault."""
  if not path:
    raise UserError("circuit: task='pairs' needs pairs=FILE.jsonl (one {clean, corrupt, answer, wrong} per line)")
  path = epath.Path(path)
  if not path.is_file():
    raise UserError(f"circuit: pairs={str(path)!r} is not a file")
  rows = []
  for number, line in enumerate(textfiles.read_text(path).splitlines(), start=1):
    if not line.strip():
      continue
    where = f"{path}:{number}"
    try:
      row = json.loads(line)
    except json.JSONDecodeError as e:
      raise UserError(f"{where}: not JSON ({e.msg})") from None
    if not isinstance(row, dict) or sorted(row) != sorted(PAIR_KEYS):
      got = sorted(row) if isinstance(row, dict) else type(row).__name__
      raise UserError(f"{where}: give an object with keys {', '.join(PAIR_KEYS)} (got {got})")
    for key in ("clean", "corrupt"):
      value = row[key]
      ids = isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)
      if not (isinstance(value, str) or ids) or not value:
        raise UserError(f"{where}: {key} must be a non-empty text or list of token ids")
    for key in ("answer", "wrong"):
      if isinstance(row[key], bool) or not isinstance(row[key], str | int) or row[key] == "":
        raise UserError(f"{where}: {key} must be a text (one token after the prompt) or a token id")
    rows.append(row | {"line": number})
  if not rows:
    raise UserError(f"circuit: {path} holds no prompt pairs")
  return rows


def pair_ids(rows, tokenizer, path, vocab_size: int):
  """(clean, corrupt, answers) token ids of `read_pairs`' rows: texts encoded after the tokenizer's prefix
  (BOS), an answer text the one token it adds after the clean prompt. UserError naming file:line when a
  clean and its corrupted prompt differ in token count, or an answer is not one token."""
  from headspec.patching import patch as patch_lib

  clean, corrupt, answers = [], [], []
  for row in rows:
    where = f"{path}:{row['line']}"
    encoded = {}
    for key in ("clean", "corrupt"):
      value = row[key]
      encoded[key] = list(tokenizer.prefix_ids) + tokenizer.encode(value) if isinstance(value, str) else value
    if len(encoded["clean"]) != len(encoded["corrupt"]):
      raise UserError(
        f"{where}: clean has {len(encoded['clean'])} tokens and corrupt {len(encoded['corrupt'])}; they must be equal"
      )
    pair = []
    for key in ("answer", "wrong"):
      value = row[key]
      if isinstance(value, str):
        if not isinstance(row["clean"], str):
          raise UserError(f"{where}: {key} is a text but clean is token ids; give {key} as a token id")
        value = patch_lib.answer_id(tokenizer, row["clean"], value, f"{where}: {key}")
      if not 0 <= value < vocab_size:
        raise UserError(f"{where}: {key}={value} is outside the vocabulary 0..{vocab_size - 1}")
      pair.append(int(value))
    clean.append(encoded["clean"])
    corrupt.append(encoded["corrupt"])
    answers.append(tuple(pair))
  return clean, corrupt, answers


def task_name(c) -> str:
  """The tables' `task`: the patching tasks' (patching/run.py's task_name), or `pairs:<file stem>`; either
  with `_<metric>` after it for a metric other than the logit difference."""
  from headspec.patching import run as patch_run

  if c.task != "pairs":
    return patch_run.task_name(c)
  return f"pairs:{epath.Path(c.pairs).stem}" + ("" if c.metric == "logit_diff" else f"_{c.metric}")


def figure(g, scores_E, *, top_n: int = 20, title: str = "", path=None):
  """The circuit of the top_n edges by |score| (Hanna et al. 2024's selection) as a matplotlib Figure: a
  networkx graph laid out by layer (embeddings, each layer's heads left to right, its MLP, the logits bottom
  to top; networkx's multipartite_layout does not keep the heads' order, so the rows are placed here),
  every node drawn, the kept edges' width proportional to |score| and colour its sign (blue +, red −), a
  head's query, key and value inputs told apart by line style (solid, dashed, dotted); an edge into a K/V
  group of a grouped-query model is drawn into each of its heads. Saved whole to `path` when given."""
  import networkx as nx
  from matplotlib.lines import Line2D

  from headspec.patching import edges
  from headspec.words import figures

  scores_E = np.asarray(scores_E, np.float64)
  keep_E = edges.circuit(scores_E, top_n=min(int(top_n), g.E))
  graph = nx.MultiDiGraph()
  heads = [f"L{a}H{b}" for a in range(g.L) for b in range(g.H)]
  graph.add_node("embed", layer=0)
  for a in range(g.L):
    for b in range(g.H):
      graph.add_node(f"L{a}H{b}", layer=2 * a + 1)
    if g.mlp:
      graph.add_node(f"MLP{a}", layer=2 * a + 2)
  graph.add_node("logits", layer=2 * g.L + 1)
  per_group = g.H // g.G
  for e in np.flatnonzero(keep_E):
    i, n = g.edges_E2[e]
    kind, layer, head = g.input_kind_I[i], g.input_layer_I[i], g.input_head_I[i]
    if kind in ("k", "v"):
      targets_ = [heads[layer * g.H + h] for h in range(head * per_group, (head + 1) * per_group)]
    else:
      targets_ = [g.input_name(i)]
    for v in targets_:
      graph.add_edge(g.node_name(n), v, key=str(kind), score=float(scores_E[e]))
  by_layer = {}
  for v, layer in graph.nodes(data="layer"):  # insertion order: heads 0..H-1, then the MLP
    by_layer.setdefault(layer, []).append(v)
  pos = {v: (i - (len(row) - 1) / 2, layer) for layer, row in by_layer.items() for i, v in enumerate(row)}
  fig, ax = figures.new_figure(figsize=(max(5.0, 1.1 * g.H + 2), 1.2 + 0.9 * (2 * g.L + 2)))
  used = {u for u, v in graph.edges()} | {v for u, v in graph.edges()}
  colour = {"embed": "#d9d9d9", "logits": "#d9d9d9"}
  nodes = list(graph.nodes)
  nx.draw_networkx_nodes(graph, pos, ax=ax, nodelist=nodes, node_size=650, edgecolors="0.3",
                         node_color=[colour.get(v, "#fdd49e" if v.startswith("MLP") else "#c6dbef") for v in nodes],
                         alpha=[1.0 if v in used else 0.35 for v in nodes])  # fmt: skip
  nx.draw_networkx_labels(graph, pos, ax=ax, font_size=7)
  largest = max(float(np.abs(scores_E[keep_E]).max()), 1e-12)
  styles = {"q": ("solid", 0.0), "k": ("dashed", 0.25), "v": ("dotted", -0.25), "mlp": ("solid", 0.1),
            "logits": ("solid", 0.1)}  # fmt: skip
  for kind, (style, rad) in styles.items():
    chosen = [(u, v, d) for u, v, k, d in graph.edges(keys=True, data=True) if k == kind]
    if chosen:
      nx.draw_networkx_edges(
        graph, pos, ax=ax, edgelist=[(u, v) for u, v, _ in chosen], style=style, arrows=True, arrowsize=9,
        width=[0.6 + 4.0 * abs(d["score"]) / largest for _, _, d in chosen], node_size=650,
        edge_color=["#2166ac" if d["score"] >= 0 else "#b2182b" for _, _, d in chosen],
        connectionstyle=f"arc3,rad={rad}",
      )  # fmt: skip
  handles = [Line2D([], [], color="0.3", linestyle=styles[k][0], label=f"into {k}") for k in ("q", "k", "v")]
  handles += [Line2D([], [], color=c, label=label) for c, label in (("#2166ac", "score > 0"), ("#b2182b", "score < 0"))]
  ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
  ax.set_title(title or f"top {int(keep_E.sum())} of {g.E} edges by |score|", fontsize=9)
  ax.axis("off")
  fig.tight_layout()
  if path is not None:
    remote.save_figure(fig, path, dpi=100)  # whole or not at all
  return fig


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
    if c.task == "pairs":
      clean, corrupt, answers = pair_ids(read_pairs(c.pairs), tokenizer, c.pairs, model.cfg.vocab_size)
    else:
      clean, corrupt, answers = patch_run.task_pairs(c, model, tokenizer)
    p = patch_lib.prompts(model.cfg, clean, corrupt, answers, c.metric, tokenizer, tokenizer.pad_id)
    batch = c.batch_size or None
    key = dict(model=job.name, step=job.step, task=task_name(c))
    scores = {}
    steps = lambda m: c.ig_steps if m.startswith("eap_ig") else 1 if m.startswith("eap") else 0
    for method in self.methods:
      if method.startswith("exact"):
        scores[method], clean_m, corrupt_m = edges.exact(model, p, metric=c.metric, batch_size=batch,
                                                         direction=edges.direction_of(method))  # fmt: skip
      else:
        scores[method], clean_m, corrupt_m = edges.scores(model, p, method=method, steps=c.ig_steps,
                                                          metric=c.metric, batch_size=batch)  # fmt: skip
    frame = edges.edge_frame(g, scores)
    ids = ["upstream", "downstream", "input", "upstream_layer", "upstream_head", "downstream_layer", "downstream_head"]
    edge_rows = [
      key | {k: r[k] for k in ids} | dict(method=m, direction=edges.direction_of(m), steps=steps(m), score=float(r[m]))
      for r in frame.to_dict("records")
      for m in scores
    ]
    curve = edges.curve(model, p, scores, self.sizes, random_sets=c.random_sets, seed=c.seed, metric=c.metric,
                        batch_size=batch)  # fmt: skip
    faith_rows = [
      key | dict(method=r["method"], direction=r["direction"], steps=steps(r["method"]), edges=int(r["edges"]),
                 set=int(r["set"]), faithfulness=float(r["faithfulness"]), clean_metric=clean_m,
                 corrupt_metric=corrupt_m, small_gap=int(r["small_gap"]))
      for r in curve.to_dict("records")
    ]  # fmt: skip
    self.drawn = (g, scores)  # drawn once the tables hold them
    return {EDGES: edge_rows, FAITHFULNESS: faith_rows}

  def merged(self, job):
    """A figure per scored method of its top `figure_edges` edges (`figure`)."""
    c, task = self.config, task_name(self.config)
    if not c.figure_edges:
      return
    g, scores = self.drawn
    name = f"{filenames.component(task)}_{{}}_{filenames.component(job.name)}_step{job.step}.png"
    for method, values in scores.items():
      title = f"{task}: top {min(c.figure_edges, g.E)} edges by {method}, {job.name} step {job.step}"
      figure(g, values, top_n=c.figure_edges, title=title, path=self.workdir / "circuit" / name.format(method))

  def finish(self, jobs):
    return tables.path_of(self.workdir, FAITHFULNESS)


@provenance.recorded("circuit")
def run(config, workdir):
  """Every requested step; returns RUN/circuit/faithfulness.csv."""
  return jobloop.run(Circuit(config, workdir))
