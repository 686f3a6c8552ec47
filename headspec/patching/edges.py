"""Edges between components, their attribution scores, exact edge patching and circuits (docs/circuits.md).

The graph (Elhage et al. 2021's residual-stream view; Conmy et al. 2023, ACDC): in a pre-LN model the stream
a component reads is the sum of the outputs of the components before it (plus biases, equal in every run), so
each downstream input v is split into one edge per upstream node u. Nodes (upstream, N): the embeddings,
every head's output Z_h W_O^h, every MLP's output. Inputs (downstream, I): every query head's query input,
every K/V group's key and value inputs (a group's heads read one key and one value input), every MLP's input
and the logits (the final stream). An edge u → v exists when u comes before v.

Every computation takes an edge as data: `_edits` turns per-input additions x_IBTD into the model's sites
q_in, k_in, v_in, mlp_in (headspec/model/sites.py) and resid_post of the last layer (the logits' input), so the
scores of every edge come from one einsum over gradients and output differences, and the exact sweep and
the circuits run under lax.map over one compiled program.

Direction. By default every score is *noising*, the papers' convention (Syed, Rager & Conmy 2023; Hanna,
Pezzelle & Belinkov 2024; their code, hannamw/EAP-IG src/eap/attribute.py `get_scores_eap`,
`get_scores_eap_ig`, `get_scores_exact`): the clean run is the base, Δa(u) = a_corrupt(u) − a_clean(u), and
a score estimates m(clean run, edge u → v corrupted) − m(clean). The *denoising* forms (Nanda's attribution
patching: the corrupted run is the base, Δa(u) = a_clean(u) − a_corrupt(u), the score estimates m(corrupted
run, edge given its clean value) − m(corrupt)) are methods of their own: `eap_denoising`, `eap_ig_denoising`,
`exact(direction="denoising")` (`exact_denoising`). Faithfulness always noises.

EAP: score(u→v) = Δa(u) · ∂m/∂(input of v) at the base run (noising: the clean tokens). EAP-IG: the same
with the gradient averaged over `steps` points x_base + (k/steps)(x_other − x_base), k = 0..steps−1, of the
input embeddings (noising: from the clean run towards the corrupted one; k = 0 is the base run, so steps=1
is EAP). hannamw/EAP-IG's get_scores_eap_ig takes the mirrored points x_corrupt + (k/steps)(x_clean −
x_corrupt), k = 0..steps−1 (the corrupted end included, the clean one not): `ig_from="other"`. Exact edge
patching (get_scores_exact): the base run with v's input given u's other value in place of its own,
everything else recomputing; its score is m(that run) − m(base). Faithfulness of a circuit C: (m(C) −
m(corrupt)) / (m(clean) − m(corrupt)), where the clean run has every edge outside C carrying its corrupted
value, input(v) = Σ_{u→v ∈ C} a(u) + Σ_{u→v ∉ C} a_corrupt(u) (hannamw/EAP-IG evaluate_graph); when
|m(clean) − m(corrupt)| is small (`small_gap`) the ratio is noise and a warning names the gap.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from headspec.errors import UserError
from headspec.model.sites import Edit
from headspec.parallel import mesh as mesh_lib
from headspec.parallel.compilations import program_cache
from headspec.patching.core import PATCHES_PER_STEP, metric_value

TRACES: collections.Counter = collections.Counter()
METHODS = ("eap", "eap_ig", "eap_denoising", "eap_ig_denoising")
DIRECTIONS = ("noising", "denoising")  # the base run: clean (the papers'), corrupted (Nanda's attribution patching)
SMALL_GAP = 1e-2  # |m(clean) − m(corrupt)| below this × max(1, |m(clean)|, |m(corrupt)|): faithfulness is noise
INPUTS = ("q", "k", "v", "mlp", "logits")  # what an edge enters


@dataclasses.dataclass(frozen=True, eq=False)
class Graph:
  """The nodes, the downstream inputs and which edges exist, as arrays.

  Nodes, in order: embeddings, then per layer its H heads and its MLP (if any). Inputs, in order: the L·H
  query inputs (l·H + h), the L·G key inputs and the L·G value inputs (l·G + g, g the K/V group), the L MLP
  inputs, the logits. allowed_IN: input i reads node n. Edges (E) are allowed_IN's nonzeros, input-major.
  """

  L: int
  H: int
  G: int
  mlp: bool
  node_kind_N: np.ndarray  # 'embed' | 'head' | 'mlp'
  node_layer_N: np.ndarray  # -1 for the embeddings
  node_head_N: np.ndarray  # -1 but for heads
  input_kind_I: np.ndarray  # INPUTS
  input_layer_I: np.ndarray  # L for the logits
  input_head_I: np.ndarray  # the query head (q), the K/V group (k, v), -1 (mlp, logits)
  allowed_IN: np.ndarray

  @property
  def N(self) -> int:
    return len(self.node_kind_N)

  @property
  def I(self) -> int:  # noqa: E743
    return len(self.input_kind_I)

  @functools.cached_property
  def edges_E2(self) -> np.ndarray:
    """[E, 2] (input index, upstream node index) of every edge."""
    return np.argwhere(self.allowed_IN).astype(np.int32)

  @property
  def E(self) -> int:
    return int(self.allowed_IN.sum())

  def node_name(self, n: int) -> str:
    kind, layer, head = self.node_kind_N[n], self.node_layer_N[n], self.node_head_N[n]
    return {"embed": "embed", "head": f"L{layer}H{head}", "mlp": f"MLP{layer}"}[kind]

  def input_name(self, i: int) -> str:
    """The downstream node: L1H2 (a query head), L1G0 (a K/V group, grouped-query models), MLP1, logits."""
    kind, layer, head = self.input_kind_I[i], self.input_layer_I[i], self.input_head_I[i]
    if kind == "q" or (kind in ("k", "v") and self.G == self.H):
      return f"L{layer}H{head}"
    return {"k": f"L{layer}G{head}", "v": f"L{layer}G{head}", "mlp": f"MLP{layer}", "logits": "logits"}[kind]


def check_model(cfg) -> None:
  """UserError unless the stream each component reads is the sum of the outputs before it."""
  if not cfg.pre_layernorm or cfg.sublayer_norm:
    what = "post-LN (the norms follow the residual adds)" if not cfg.pre_layernorm else "sublayer-output norms"
    raise UserError(
      f"circuits: this model has {what}, so its residual stream is not a sum of its components' outputs; "
      "edges need a pre-LN model without sublayer norms"
    )


def graph(cfg) -> Graph:
  """The graph of a model config (see `Graph`); E = Σ_l (H + 2G)(1 + l·(H + M)) + M·Σ_l (1 + l(H+1) + H·[not
  parallel]) + 1 + L(H + M), M = 1 with MLPs, 0 without."""
  check_model(cfg)
  L, H, G, mlp = cfg.num_layers, cfg.num_heads, cfg.kv_heads, cfg.mlp
  kind, layer, head, depth = ["embed"], [-1], [-1], [0]  # depth: embeddings 0, layer l's heads 2l+1, MLP 2l+2
  for a in range(L):
    kind += ["head"] * H + (["mlp"] if mlp else [])
    layer += [a] * (H + mlp)
    head += list(range(H)) + ([-1] if mlp else [])
    depth += [2 * a + 1] * H + ([2 * a + 2] if mlp else [])
  ikind, ilayer, ihead, reads = [], [], [], []  # reads: an input reads the nodes of depth < this
  for name, width in (("q", H), ("k", G), ("v", G)):
    for a in range(L):
      ikind += [name] * width
      ilayer += [a] * width
      ihead += list(range(width))
      reads += [2 * a + 1] * width
  if mlp:
    ikind += ["mlp"] * L
    ilayer += list(range(L))
    ihead += [-1] * L
    reads += [2 * a + (1 if cfg.parallel_residual else 2) for a in range(L)]
  ikind, ilayer, ihead, reads = ikind + ["logits"], ilayer + [L], ihead + [-1], reads + [2 * L + 1]
  allowed_IN = np.asarray(depth)[None, :] < np.asarray(reads)[:, None]
  return Graph(L, H, G, mlp, np.asarray(kind), np.asarray(layer), np.asarray(head), np.asarray(ikind),
               np.asarray(ilayer), np.asarray(ihead), allowed_IN)  # fmt: skip


NODE_SITES = ("embeddings", "head_out", "mlp_out")


def _nodes(g: Graph, inter) -> jax.Array:
  """[N,B,T,D] every node's output of a run captured with NODE_SITES."""
  heads_LHBTD = jnp.transpose(inter.head_out_LBTHD, (0, 3, 1, 2, 4))
  if g.mlp:
    heads_LHBTD = jnp.concatenate([heads_LHBTD, inter.mlp_out_LBTD[:, None]], axis=1)
  per_layer = heads_LHBTD.reshape(-1, *heads_LHBTD.shape[2:])
  return jnp.concatenate([inter.embeddings_BTD[None], per_layer.astype(inter.embeddings_BTD.dtype)], axis=0)


def _edits(g: Graph, x_IBTD) -> dict:
  """The interventions that add x_IBTD[i] to input i: sites q_in, k_in, v_in (a K/V group's addition on each of
  its heads), mlp_in, and resid_post of the last layer (the logits' input)."""
  L, H, G = g.L, g.H, g.G
  _, B, T, D = x_IBTD.shape
  per_head = lambda x, width: jnp.transpose(
    jnp.repeat(x.reshape(L, width, B, T, D), H // width, axis=1), (0, 2, 3, 1, 4)
  )  # fmt: skip
  q, k, v = x_IBTD[: L * H], x_IBTD[L * H : L * (H + G)], x_IBTD[L * (H + G) : L * (H + 2 * G)]
  edits = {"q_in": Edit(add=per_head(q, H)), "k_in": Edit(add=per_head(k, G)), "v_in": Edit(add=per_head(v, G))}
  offset = L * (H + 2 * G)
  if g.mlp:
    edits["mlp_in"] = Edit(add=x_IBTD[offset : offset + L])
  last_L = (jnp.arange(L) == L - 1).astype(x_IBTD.dtype)[:, None, None, None]
  edits["resid_post"] = Edit(add=last_L * x_IBTD[-1][None])
  return edits


def _runs(model, g, base_BT, other_BT, valid_BT):
  """(base logits, other logits, base nodes [N,B,T,D], other nodes): the two runs captured with NODE_SITES."""
  base_logits, bi = model(base_BT, valid_BT=valid_BT, capture=NODE_SITES)
  other_logits, oi = model(other_BT, valid_BT=valid_BT, capture=NODE_SITES)
  return base_logits, other_logits, _nodes(g, bi), _nodes(g, oi)


@program_cache(16)
def _scores(graphdef, metric, interpolate: bool):
  @mesh_lib.jit
  def scores(params, base_BT, other_BT, valid_BT, last_B, answers_B2, alphas_S):
    """([E] edge scores Δa(u) · ∂m/∂(input of v), Δa = a_other − a_base, m(base), m(other)): the gradient at
    the base run of the tokens (interpolate False: EAP) or averaged over the embeddings x_base + α(x_other −
    x_base), α in alphas_S (EAP-IG). Noising: base clean, other corrupted; denoising the reverse."""
    TRACES["eap_ig" if interpolate else "eap"] += 1
    model = nnx.merge(graphdef, params)
    g = graph(model.cfg)
    value = functools.partial(metric_value, metric, last_B=last_B, answers_B2=answers_B2)
    base_logits, other_logits, base_NBTD, other_NBTD = _runs(model, g, base_BT, other_BT, valid_BT)
    zero_IBTD = jnp.zeros((g.I, *base_NBTD.shape[1:]), base_NBTD.dtype)

    def grad_at(alpha):
      def m(x_IBTD):
        if not interpolate:
          logits, _ = model(base_BT, valid_BT=valid_BT, interventions=_edits(g, x_IBTD))
        else:
          x_BTD = base_NBTD[0] + alpha * (other_NBTD[0] - base_NBTD[0])
          logits, _ = model.from_embeddings(x_BTD, valid_BT=valid_BT, interventions=_edits(g, x_IBTD))
        return value(logits)

      return jax.grad(m)(zero_IBTD)

    grad_IBTD = jax.lax.map(grad_at, alphas_S).mean(0)
    scores_IN = jnp.einsum("ibtd,nbtd->in", grad_IBTD, other_NBTD - base_NBTD)
    edges_E2 = jnp.asarray(g.edges_E2)
    return scores_IN[edges_E2[:, 0], edges_E2[:, 1]], value(base_logits), value(other_logits)

  return scores


@program_cache(16)
def _exact(graphdef, metric):
  @mesh_lib.jit
  def exact(params, base_BT, other_BT, valid_BT, last_B, answers_B2, edges_E2, scale):
    """([E] m(base run, v's input + scale·(a_other(u) − a_base(u))), m(base), m(other))."""
    TRACES["exact"] += 1
    model = nnx.merge(graphdef, params)
    g = graph(model.cfg)
    value = functools.partial(metric_value, metric, last_B=last_B, answers_B2=answers_B2)
    base_logits, other_logits, base_NBTD, other_NBTD = _runs(model, g, base_BT, other_BT, valid_BT)
    delta_NBTD = (other_NBTD - base_NBTD) * scale

    def one(edge):
      at_I = (jnp.arange(g.I) == edge[0]).astype(delta_NBTD.dtype)[:, None, None, None]
      logits, _ = model(base_BT, valid_BT=valid_BT, interventions=_edits(g, at_I * delta_NBTD[edge[1]][None]))
      return value(logits)

    values_E = jax.lax.map(one, edges_E2, batch_size=min(PATCHES_PER_STEP, edges_E2.shape[0]))
    return values_E, value(base_logits), value(other_logits)

  return exact


@program_cache(16)
def _circuits(graphdef, metric):
  @mesh_lib.jit
  def circuits(params, clean_BT, corrupt_BT, valid_BT, last_B, answers_B2, keep_CE):
    """([C] m(C) of each circuit keep_CE[c] (a mask over the edges), m(clean), m(corrupt)): the clean run with
    input(v) += Σ_{u→v ∉ C} (a_corrupt(u) − a(u)), a(u) this run's own outputs. The additions depend on the
    run's outputs, so the run iterates: a node of depth d is exact after d passes (max depth 2L)."""
    TRACES["circuits"] += 1
    model = nnx.merge(graphdef, params)
    g = graph(model.cfg)
    value = functools.partial(metric_value, metric, last_B=last_B, answers_B2=answers_B2)
    clean_logits, corrupt_logits, clean_NBTD, corrupt_NBTD = _runs(model, g, clean_BT, corrupt_BT, valid_BT)
    edges_E2 = jnp.asarray(g.edges_E2)

    def one(keep_E):
      outside_IN = jnp.zeros((g.I, g.N), clean_NBTD.dtype).at[edges_E2[:, 0], edges_E2[:, 1]].set(1.0 - keep_E)

      def run(nodes_NBTD):
        x_IBTD = jnp.einsum("in,nbtd->ibtd", outside_IN, corrupt_NBTD - nodes_NBTD)
        return model(clean_BT, valid_BT=valid_BT, interventions=_edits(g, x_IBTD), capture=NODE_SITES)

      nodes_NBTD = jax.lax.fori_loop(0, 2 * g.L, lambda _, a: _nodes(g, run(a)[1]), clean_NBTD)
      return value(run(nodes_NBTD)[0])

    return jax.lax.map(one, keep_CE.astype(clean_NBTD.dtype)), value(clean_logits), value(corrupt_logits)

  return circuits


def _call(fn_of, model, p, metric, *extra, batch_size=None, split=False, direction="noising"):
  """fn(params, base, other, valid, last, answers, *extra) over prompt batches, the base the clean prompts
  (direction 'noising') or the corrupted ones ('denoising'): each output the mean over batches weighted by
  their rows (the metric is a mean over prompts). split: extra[0]'s rows (edges or circuits, the first
  output's axis) are split over a current mesh's `data` devices (`mesh.split_for_current`)."""
  check_model(model.cfg)
  graphdef, params = nnx.split(model)
  B = len(p.clean_BT)
  size = B if batch_size is None else int(batch_size)
  if size < 1:
    raise UserError(f"batch_size={batch_size} must be at least 1")
  fn = fn_of(graphdef, metric)
  asked = len(extra[0]) if split else None
  if split:
    fn, devices = mesh_lib.split_for_current(fn, axis=0, arg=6, outputs=(0, None, None))
    extra = (jnp.asarray(mesh_lib.pad_rows(extra[0], devices)), *extra[1:])
  total = None
  for start in range(0, B, size):
    rows = slice(start, start + size)
    base_other = (p.clean_BT, p.corrupt_BT) if direction == "noising" else (p.corrupt_BT, p.clean_BT)
    arrays = [jnp.asarray(a[rows]) for a in (*base_other, p.valid_BT, p.last_B, p.answers_B2)]
    out = [np.asarray(o, np.float64) * (len(p.clean_BT[rows]) / B) for o in fn(params, *arrays, *extra)]
    total = out if total is None else [a + b for a, b in zip(total, out)]
  if split:
    total[0] = total[0][:asked]  # the padding's rows dropped
  return total


def direction_of(method: str) -> str:
  """'denoising' for the methods named so (eap_denoising, eap_ig_denoising, exact_denoising), else 'noising'."""
  return "denoising" if method.endswith("_denoising") else "noising"


def _check_direction(direction) -> None:
  if direction not in DIRECTIONS:
    raise UserError(f"direction={direction!r}: choose one of {', '.join(DIRECTIONS)}")


def _ordered(direction, values, base, other):
  """(values, m(clean), m(corrupt)) from a compiled call's (values, m(base), m(other))."""
  clean, corrupt = (base, other) if direction == "noising" else (other, base)
  return values, float(clean), float(corrupt)


def scores(model, p, *, method="eap_ig", steps=5, metric="logit_diff", batch_size=None, ig_from="base"):
  """([E] every edge's score, m(clean), m(corrupt)) by EAP or EAP-IG (module docstring); `p` from
  headspec.patching.patch.prompts. Edge e is graph(model.cfg).edges_E2[e]. 'eap', 'eap_ig' noise (the
  papers': gradient at the clean run, Δa = a_corrupt − a_clean, score ≈ m(clean, edge corrupted) −
  m(clean)); 'eap_denoising', 'eap_ig_denoising' denoise. ig_from: EAP-IG's points x_base + (k/steps)(x_other
  − x_base) ('base', k = 0 the base run: steps=1 is EAP) or x_other + (k/steps)(x_base − x_other) ('other',
  as hannamw/EAP-IG's get_scores_eap_ig), k = 0..steps−1."""
  if method not in METHODS:
    raise UserError(f"method={method!r}: choose one of {', '.join(METHODS)}")
  if isinstance(steps, bool) or not isinstance(steps, int | np.integer) or steps < 1:
    raise UserError(f"steps={steps!r} must be an integer of at least 1 (the interpolation points of EAP-IG)")
  if ig_from not in ("base", "other"):
    raise UserError(f"ig_from={ig_from!r}: choose 'base' (k = 0 the base run) or 'other' (hannamw/EAP-IG's points)")
  interpolate, direction = method.startswith("eap_ig"), direction_of(method)
  n = steps if interpolate else 1
  alphas = jnp.arange(n, dtype=jnp.float32) / n
  if ig_from == "other" and interpolate:
    alphas = 1.0 - alphas
  fn_of = lambda graphdef, m: _scores(graphdef, m, interpolate)
  return _ordered(direction, *_call(fn_of, model, p, metric, alphas, batch_size=batch_size, direction=direction))


def exact(model, p, *, metric="logit_diff", edges=None, scale=1.0, batch_size=None, direction="noising"):
  """([E'] each asked edge's exact score (default every edge, as indices into edges_E2), m(clean),
  m(corrupt)). Noising (hannamw/EAP-IG's get_scores_exact): m(clean run, v's input given a_corrupt(u) in
  place of a_clean(u)) − m(clean); denoising: m(corrupted run, v's input given a_clean(u)) − m(corrupt).
  scale < 1 patches that fraction of the difference, a_base + scale·(a_other − a_base) (a check of the
  first-order scores: exact(scale=ε)/ε → EAP of the same direction)."""
  _check_direction(direction)
  g = graph(model.cfg)
  if edges is not None:
    edges = np.asarray(edges)
    if edges.ndim != 1 or not len(edges) or edges.dtype.kind not in "iu" or not ((0 <= edges) & (edges < g.E)).all():
      raise UserError(f"exact: edges={edges.tolist()!r}; give edge indices in 0..{g.E - 1} (graph(cfg).edges_E2)")
  edges_E2 = g.edges_E2 if edges is None else g.edges_E2[edges.astype(np.int64)]
  values, base, other = _call(_exact, model, p, metric, edges_E2, jnp.float32(scale), batch_size=batch_size,
                              split=True, direction=direction)  # fmt: skip
  return _ordered(direction, values - base, base, other)


def exact_denoising(model, p, **options):
  """`exact` with direction='denoising': m(corrupted run, edge given its clean value) − m(corrupt)."""
  return exact(model, p, direction="denoising", **options)


def small_gap(clean: float, corrupt: float) -> bool:
  """True when |m(clean) − m(corrupt)| < SMALL_GAP · max(1, |m(clean)|, |m(corrupt)|): faithfulness divides
  by that gap, so its values are then noise (4e-4 on one prompt pair gave −2.29..1.43)."""
  return abs(clean - corrupt) < SMALL_GAP * max(1.0, abs(clean), abs(corrupt))


def faithfulness(model, p, keep_CE, *, metric="logit_diff", batch_size=None):
  """([C] faithfulness of each circuit keep_CE[c] (a bool mask over the E edges), m(clean), m(corrupt)):
  (m(C) − m(corrupt)) / (m(clean) − m(corrupt)), noising (module docstring); the full graph gives 1, the
  empty circuit 0. A RuntimeWarning names a small gap (`small_gap`); equal metrics are a UserError."""
  g = graph(model.cfg)
  keep_CE = np.atleast_2d(np.asarray(keep_CE, bool))
  if keep_CE.shape[1] != g.E:
    raise UserError(f"circuits: a mask over {keep_CE.shape[1]} edges for a graph of {g.E}")
  values, clean, corrupt = _call(_circuits, model, p, metric, keep_CE, batch_size=batch_size, split=True)
  if clean == corrupt:
    raise UserError("circuits: the clean and corrupted runs give the same metric; faithfulness is undefined")
  if small_gap(clean, corrupt):
    warnings.warn(
      f"faithfulness: m(clean) − m(corrupt) = {clean - corrupt:.3g} (m(clean) {clean:.4g}, m(corrupt) "
      f"{corrupt:.4g}) is a small gap; faithfulness divides by it, so its values are noise",
      RuntimeWarning,
      stacklevel=2,
    )
  return (values - corrupt) / (clean - corrupt), float(clean), float(corrupt)


def circuit(scores_E, *, top_n=None, threshold=None, absolute=True) -> np.ndarray:
  """[E] bool: the top_n edges by score (|score| when absolute, as Hanna et al.), or those with score (|score|)
  at least threshold. UserError when both or neither are given, or when the circuit would be empty."""
  scores_E = np.asarray(scores_E, np.float64)
  if (top_n is None) == (threshold is None):
    raise UserError("circuit: give one of top_n= and threshold=")
  key_E = np.abs(scores_E) if absolute else scores_E
  if top_n is not None:
    if isinstance(top_n, bool) or not isinstance(top_n, int | np.integer) or not 1 <= top_n <= len(scores_E):
      raise UserError(f"circuit: top_n={top_n!r} must be an integer in 1..{len(scores_E)} (the graph's edges)")
    keep = np.zeros(len(scores_E), bool)
    keep[np.argsort(-key_E, kind="stable")[:top_n]] = True
    return keep
  keep = key_E >= threshold
  if not keep.any():
    raise UserError(f"circuit: threshold={threshold} keeps no edge (the largest score is {key_E.max():.4g})")
  return keep


def curve(model, p, scores_by_method: dict, sizes, *, random_sets=3, seed=0, metric="logit_diff", batch_size=None):
  """A DataFrame method, edges, set, faithfulness, direction ('noising': the faithfulness's), small_gap
  (`small_gap`): for each method's scores and each size n, the circuit of the top n edges by |score|; method
  'random': `random_sets` random edge sets of each size (set 0, 1, ...). Every circuit runs in one compiled
  call."""
  import pandas as pd

  g = graph(model.cfg)
  sizes = [int(n) for n in sizes]
  for n in sizes:
    if not 1 <= n <= g.E:
      raise UserError(f"curve: {n} edges asked for; sizes are 1..{g.E} (the graph's edges)")
  rows, masks = [], []
  for method, values in scores_by_method.items():
    for n in sizes:
      rows.append((method, n, 0))
      masks.append(circuit(values, top_n=n))
  rng = np.random.default_rng(seed)
  for r in range(random_sets):
    order = rng.permutation(g.E)
    for n in sizes:
      keep = np.zeros(g.E, bool)
      keep[order[:n]] = True
      rows.append(("random", n, r))
      masks.append(keep)
  values, clean, corrupt = faithfulness(model, p, np.stack(masks), metric=metric, batch_size=batch_size)
  frame = pd.DataFrame(rows, columns=["method", "edges", "set"]).assign(faithfulness=values)
  frame = frame.assign(direction="noising", small_gap=small_gap(clean, corrupt))
  frame.attrs.update(clean=clean, corrupt=corrupt)
  return frame


def edge_frame(g: Graph, values_by_method: dict):
  """A DataFrame upstream, downstream, input, upstream_layer, upstream_head, downstream_layer,
  downstream_head, then one column per method (the edges in edges_E2 order); attrs['direction'] maps each
  method to 'noising' or 'denoising' (`direction_of`)."""
  import pandas as pd

  i_E, n_E = g.edges_E2[:, 0], g.edges_E2[:, 1]
  frame = pd.DataFrame({
    "upstream": [g.node_name(n) for n in n_E],
    "downstream": [g.input_name(i) for i in i_E],
    "input": g.input_kind_I[i_E],
    "upstream_layer": g.node_layer_N[n_E],
    "upstream_head": g.node_head_N[n_E],
    "downstream_layer": g.input_layer_I[i_E],
    "downstream_head": g.input_head_I[i_E],
  })  # fmt: skip
  for method, values in values_by_method.items():
    frame[method] = np.asarray(values, np.float64)
  frame.attrs["direction"] = {method: direction_of(method) for method in values_by_method}
  return frame
