"""Head-diversity metrics, per layer, streamed over an evaluation set with H×H-sized memory.

Shapes follow the glossary in headspec/model/transformer.py (B batch, T query tokens, S key tokens, L layers,
H heads, K head width, D model width, M head pairs i < j). Inputs are the stacked `Intermediates`
fields of a forward pass: `q_LBTHK`, `pattern_LBHTS` (rows sum to 1 over the attendable keys, 0
elsewhere), `z_LBTHK` (Z_h = A_h V_h), `head_out_LBTHD` (Z_h W_O^h), and `valid_BT` (True for real
tokens). Only valid tokens count as queries; a query's *support* is the set of valid keys it may
attend to (keys s <= t as well when `causal`).

Every metric is ONE `Metric` entry of `REGISTRY`: its running sums (`init`), one layer's contribution
of one batch to them (`batch`, run for every layer under `jax.lax.map`), how that contribution joins
the sums (`merge`, addition unless given) and the finished value (`finalize`). The state is a dict:
`n_tokens` (valid query tokens seen) and, per metric name, that metric's sums with a leading L axis;
it never holds per-token data. `update` adds one batch, `finalize` divides, so streaming over batches
equals one pass over the concatenated data; `compute` does init → update → finalize in one
jit-compiled call. docs/diversity.md, "Adding a diversity metric", shows an entry and its test.

Metrics (`finalize` returns [L,H,H] for 'pair' metrics, [L,H] for 'head' metrics):
  query_orthogonality       [L,H,H] mean_t cos²(q_i(t), q_j(t))             (lower = more diverse)
  context_nonorthogonality  [L,H,H] mean_t cos²(Z_i(t), Z_j(t))             (higher = more redundant)
  output_nonorthogonality   [L,H,H] mean_t cos²(Z_i W_O^i(t), Z_j W_O^j(t)) (its basis-free counterpart)
  output_dissimilarity      [L,H,H] −mean_t cos(Z_i W_O^i(t), Z_j W_O^j(t)) (higher = more diverse)
  js_distance               [L,H,H] mean_t sqrt(JS₂(A_i[t,:], A_j[t,:]))    (in [0,1])
  linear_cka                [L,H,H] linear CKA between Z_i and Z_j over tokens
  query_cca                 [L,H,H] mean squared canonical correlation of q_i, q_j over tokens
  context_cca               [L,H,H] mean squared canonical correlation of Z_i, Z_j (= of Z_h W_O^h)
  attention_variance        [L,H]   mean_t Var_{s∈supp(t)} A_h[t,s]         (0 = uniform)
  attention_entropy         [L,H]   mean_t −Σ_s A_h[t,s] ln A_h[t,s]        (nats)
  attention_distance        [L,H]   mean_t Σ_s A_h[t,s] |t − s|
where mean_t is over valid query tokens of the whole evaluation set. query_orthogonality,
context_nonorthogonality and linear_cka (on Z_h) are BASIS-DEPENDENT (Metric.basis_dependent): they
change under the invertible reparameterisations that leave the model's function unchanged; the
attention metrics, output_dissimilarity and output_nonorthogonality (on Z_h W_O^h) and the two CCA
metrics (invariant to any invertible map of a head) do not. Each formula's source is in the docstring
of the function computing it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import entr

from headspec.model.heads import intermediate, unit
from headspec.parallel import mesh as mesh_lib

_EPS = 1e-12
CAPTURE = ("q", "pattern", "z", "head_out")  # the model's `capture` fields the metrics read (Batch below)


class Batch(NamedTuple):
  """One layer of one batch, as every metric's `batch` function reads it."""

  q_BTHK: jax.Array
  probs_BHTS: jax.Array
  z_BTHK: jax.Array
  head_out_BTHD: jax.Array
  w_BT: jax.Array  # 1.0 for valid query tokens, else 0.0
  supp_BTS: jax.Array  # True where query t may attend key s


def _add(sums, contribution, n_seen, n_batch):
  return jax.tree.map(jnp.add, sums, contribution)


@dataclasses.dataclass(frozen=True)
class Metric:
  """One diversity metric: everything the streaming update needs to know about it.

  name: its name in the results table and in logs. kind: 'pair' ([L,H,H], one value per head pair)
    or 'head' ([L,H]).
  init(L, H, K) -> {sum name: zeros with a leading L axis}: the running sums.
  batch(Batch) -> {sum name: this layer's contribution, without the L axis} (traced under lax.map).
  finalize(sums, n) -> [L,H,H] or [L,H]: the metric from its sums and n = max(valid tokens seen, 1).
  merge(sums, contribution, n_seen, n_batch) -> sums: how a batch joins the sums (default: addition).
  basis_dependent: True if the value can change between two parameterisations of the SAME model. A
    head's (W_V, W_O) is fixed only up to an invertible M: Z_h → Z_h M, W_O^h → M⁻¹ W_O^h (and (W_Q, W_K)
    likewise: q → q M, k → k M⁻ᵀ), which leaves attention and Z_h W_O^h unchanged; metrics on q or Z_h
    (cosines, and linear CKA, which is invariant to orthogonal M and isotropic scaling only) change
    with M, so they compare coordinates, not what heads compute. Metrics on attention maps, on the
    head outputs Z_h W_O^h, and canonical correlations (invariant to any invertible M) are basis-free.
  doc: one line, shown in docs and figures.
  """

  name: str
  kind: str
  init: Callable[[int, int, int], dict]
  batch: Callable[[Batch], dict]
  finalize: Callable[[dict, jax.Array], jax.Array]
  merge: Callable = _add
  basis_dependent: bool = False
  doc: str = ""

  def __post_init__(self):
    if self.kind not in ("pair", "head"):
      raise ValueError(f"diversity metric {self.name!r}: kind must be 'pair' or 'head', got {self.kind!r}")


def _cosine_sum(x_BTHX, w_BT, *, squared: bool):
  """Σ_t w_t cos(x_i(t), x_j(t)), or of cos², [H,H], for heads i, j at the same token.

  query_orthogonality and context_nonorthogonality are mean_t cos² between heads' queries q_h(t) and
  contexts Z_h(t): the inter-head (contextual) non-orthogonality that Lee et al. 2019 ("Orthogonality
  Constrained Multi-Head Attention for Keyword Spotting", ASRU, arXiv:1910.04500) penalise between
  heads' context vectors, written here as squared cosines (Σ_{i≠j} cos² = ||ÛÛᵀ − I||_F² for the
  unit-normalised head vectors Û); measured here, not penalised. cos² ignores sign, so anti-aligned
  heads count as redundant too.
  output_dissimilarity is −mean_t cos(Z_i W_O^i, Z_j W_O^j): the output disagreement D_output of
  Li et al. 2018 ("Multi-Head Attention with Disagreement Regularization", EMNLP, §3), measured on each
  head's contribution to the residual stream. Unlike Z_h (each head in its own K-dim basis), these
  live in one shared D-space, so their cosine is comparable across heads.
  """
  u_BTHX = unit(x_BTHX.astype(jnp.float32))
  cos_BTHH = jnp.einsum("bthk,btgk->bthg", u_BTHX, u_BTHX)
  return jnp.einsum("bthg,bt->hg", cos_BTHH**2 if squared else cos_BTHH, w_BT)


def support_mask(valid_BT, causal: bool):
  """[B,T,S] True where query t may attend key s: s is a valid token (and s <= t when causal)."""
  supp_BTS = jnp.broadcast_to(valid_BT[:, None, :], valid_BT.shape + valid_BT.shape[-1:])
  if causal:
    T = valid_BT.shape[1]
    supp_BTS = supp_BTS & jnp.tril(jnp.ones((T, T), bool))[None]
  return supp_BTS


def attention_variance(probs_BHTS, supp_BTS):
  """[B,H,T] (1/n_t) Σ_{s∈supp(t)} (A[t,s] − 1/n_t)², n_t = |supp(t)|.

  Zero iff attention is uniform over the support; it equals (Σ_s A² − 1/n_t)/n_t, an affine map of the
  collision probability Σ_s A² (Rényi-2 entropy), i.e. a peakedness ("intra-head diversity") measure.
  No single source.
  """
  p_BHTS = probs_BHTS.astype(jnp.float32)
  supp_B1TS = supp_BTS[:, None]
  n_B1T = jnp.maximum(jnp.sum(supp_BTS, -1, dtype=jnp.float32), 1.0)[:, None]
  p_in_BHTS = jnp.where(supp_B1TS, p_BHTS, 0.0)
  mean_BHT = jnp.sum(p_in_BHTS, -1) / n_B1T
  return jnp.sum(jnp.where(supp_B1TS, p_BHTS - mean_BHT[..., None], 0.0) ** 2, -1) / n_B1T  # exact 0 if uniform


def attention_entropy(probs_BHTS):
  """[B,H,T] −Σ_s A[t,s] ln A[t,s] in nats, max ln n_t (Clark et al. 2019, "What Does BERT Look At?", §3)."""
  return jnp.sum(entr(probs_BHTS.astype(jnp.float32)), -1)  # entr(0) = 0: the 0 log 0 convention


def attention_distance(probs_BHTS):
  """[B,H,T] Σ_s A[t,s] |t − s|, the attention-weighted token distance (Vig & Belinkov 2019, "Analyzing
  the Structure of Attention in a Transformer Language Model", §4; Clark et al. 2019)."""
  p_BHTS = probs_BHTS.astype(jnp.float32)
  T, S = p_BHTS.shape[-2:]
  dist_TS = jnp.abs(jnp.arange(T)[:, None] - jnp.arange(S)[None, :]).astype(jnp.float32)
  return jnp.sum(p_BHTS * dist_TS, -1)


def js_distance_sums(probs_BHTS, w_BT):
  """Σ_t w_t sqrt(JS(A_i[t,:] || A_j[t,:])) for every head pair, [H,H] (symmetric, zero diagonal).

  JS(P||Q) = ½ KL(P||M) + ½ KL(Q||M) = H(M) − ½H(P) − ½H(Q), M = (P+Q)/2, in bits (base-2 logs) so
  JS ∈ [0,1]; its square root is a metric (Endres & Schindelin 2003). Clark et al. 2019, "What Does
  BERT Look At?", §6 use this distance between heads' attention maps (averaged over tokens) to
  cluster heads. The entropy form costs one log per pair element (H(P) is shared by all pairs); only
  the M = H(H−1)/2 pairs i < j are computed, one at a time with lax.map, so the largest intermediate
  is [B,T,S]. In float32 the distance resolves differences down to about 1e-3 (JS ~ 1e-7).
  """
  p_BHTS = probs_BHTS.astype(jnp.float32)
  H = p_BHTS.shape[1]
  if H < 2:
    return jnp.zeros((H, H), jnp.float32)
  entropy_BHT = jnp.sum(entr(p_BHTS), -1)
  i_M, j_M = np.triu_indices(H, 1)

  def pair(ij):
    i, j = ij
    m_BTS = 0.5 * (p_BHTS[:, i] + p_BHTS[:, j])
    js_BT = (jnp.sum(entr(m_BTS), -1) - 0.5 * (entropy_BHT[:, i] + entropy_BHT[:, j])) / jnp.log(2.0)
    return jnp.sum(jnp.sqrt(jnp.clip(js_BT, 0.0, 1.0)) * w_BT)

  sums_M = jax.lax.map(pair, (jnp.asarray(i_M), jnp.asarray(j_M)))
  return jnp.zeros((H, H), jnp.float32).at[i_M, j_M].set(sums_M).at[j_M, i_M].set(sums_M)


def _moments_batch(z_BTHK, w_BT):
  """Batch mean [H,K] and centred co-moment [H,H,K,K] of per-head vectors (Z or q) over valid tokens."""
  z_NHK = z_BTHK.astype(jnp.float32).reshape(-1, *z_BTHK.shape[2:])
  w_N = w_BT.reshape(-1)
  n = w_N.sum()
  mean_HK = jnp.einsum("nhk,n->hk", z_NHK, w_N) / jnp.maximum(n, 1.0)
  zc_NHK = (z_NHK - mean_HK) * w_N[:, None, None]
  return {"mean": mean_HK, "comoment": jnp.einsum("nhk,ngl->hgkl", zc_NHK, zc_NHK)}


def _merge_moments(sums, batch, n_a, n_b):
  """Pooled mean and co-moment of two token sets (Chan, Golub & LeVeque 1979 parallel update).

  Equals centring the concatenated data at its own mean, but never subtracts two large sums, so it
  stays accurate in float32 when |mean| >> std (plain Σzzᵀ − n·μμᵀ would cancel catastrophically).
  """
  n = n_a + n_b
  delta_LHK = batch["mean"] - sums["mean"]
  frac = n_b / jnp.maximum(n, 1.0)
  mean = sums["mean"] + delta_LHK * frac
  com = sums["comoment"] + batch["comoment"] + jnp.einsum("...hk,...gl->...hgkl", delta_LHK, delta_LHK) * (n_a * frac)
  return {"mean": mean, "comoment": com}


def linear_cka(comoment_HHKK):
  """Linear CKA between every pair of heads from their centred co-moments, [H,H].

  CKA(X, Y) = ||Yᵀ X||_F² / (||Xᵀ X||_F ||Yᵀ Y||_F), X = Z_i, Y = Z_j ∈ R^{N×K} column-centred over
  the N tokens (Kornblith et al. 2019, "Similarity of Neural Network Representations Revisited",
  ICML, Eq. for linear CKA). Yᵀ X is the centred co-moment block C_ji, so streaming only needs the
  K×K blocks for every head pair. Why CKA for head redundancy: each head's basis is arbitrary (W_V^h
  can be rotated, with W_O^h counter-rotated, without changing the model) and its scale trades off
  against W_O^h; CKA is invariant to orthogonal transforms and isotropic scaling of each side, so it
  compares what heads represent rather than how their coordinates happen to be laid out, which a
  per-coordinate cosine cannot. It is 1 for identical heads (or heads equal up to rotation/scale).
  """
  cross_HH = jnp.sum(comoment_HHKK**2, axis=(-2, -1))  # ||C_ij||_F²
  self_H = jnp.sqrt(jnp.diagonal(cross_HH))  # ||C_ii||_F
  return cross_HH / jnp.maximum(self_H[:, None] * self_H[None, :], _EPS)


def _whitener(comoment_KK, floor: float = 1e-5):
  """A whitener W of the co-moment C (W C Wᵀ = I on C's retained span, 0 off it) and that span's rank.

  C is first scaled to unit diagonal (so coordinates of very different scale do not cost float32
  precision); then directions whose eigenvalue is <= `floor` × the largest count as absent: a head
  that (nearly) never uses a direction of its K-space is whitened on its own subspace instead of
  having float32 rounding noise blown up to unit variance.
  """
  scale_K = jax.lax.rsqrt(jnp.maximum(jnp.diagonal(comoment_KK), _EPS))
  lam_K, vec_KK = jnp.linalg.eigh(comoment_KK * scale_K[:, None] * scale_K[None, :])
  keep_K = lam_K > floor * jnp.maximum(lam_K[-1], _EPS)
  inv_sqrt_K = jnp.where(keep_K, jax.lax.rsqrt(jnp.maximum(lam_K, _EPS)), 0.0)
  return ((vec_KK * inv_sqrt_K) @ vec_KK.T) * scale_K[None, :], keep_K.sum()  # W with W C Wᵀ = I on the span


def mean_squared_cca(comoment_HHKK):
  """Mean squared canonical correlation R²_CCA between every pair of heads from their co-moments, [H,H].

  R²_CCA(X, Y) = Σ_k ρ_k² / min(rank X, rank Y) = ||C_ii^(-1/2) C_ij C_jj^(-1/2)||_F² / min(r_i, r_j),
  where ρ_k are the canonical correlations of the column-centred token matrices X = Z_i, Y = Z_j
  (Hotelling 1936; R²_CCA as in Kornblith et al. 2019, ICML, §2.2 and Table 1). The ρ_k are the cosines
  of the principal angles between the column spaces of X and Y in token space (Björck & Golub 1973),
  so R²_CCA is invariant to ANY invertible linear map of either head (Z_h → Z_h M): the basis-free
  counterpart of linear CKA and of the cosines, which a head's (W_V, W_O) or (W_Q, W_K) freedom
  changes. 1 = one head's vectors are a linear function of the other's (same information), 0 =
  uncorrelated. On Z_h it equals R²_CCA of the head outputs Z_h W_O^h whenever W_O^h has rank K.
  With N tokens, r_i + r_j − (N − 1) of the ρ_k are 1 by construction: use N >> 2K tokens. Clipped to
  [0, 1], its range: float32 whitening of a near-singular co-moment overshoots 1 by up to ~1e-3 (a head
  with itself, 15 tokens, K = 8, on an AMD EPYC CPU: 1.00102).
  """
  whiten_HKK, rank_H = jax.vmap(_whitener)(jnp.diagonal(comoment_HHKK, axis1=0, axis2=1).transpose(2, 0, 1))
  corr_HHKK = jnp.einsum("hab,hgbc,gdc->hgad", whiten_HKK, comoment_HHKK, whiten_HKK)
  rank_HH = jnp.minimum(rank_H[:, None], rank_H[None, :]).astype(jnp.float32)
  return jnp.clip(jnp.sum(corr_HHKK**2, axis=(-2, -1)) / jnp.maximum(rank_HH, 1.0), 0.0, 1.0)


def _moments_init(L, H, K):
  return {"mean": jnp.zeros((L, H, K)), "comoment": jnp.zeros((L, H, H, K, K))}


def _cca_metric(name: str, vectors: Callable[[Batch], jax.Array], doc: str) -> Metric:
  """A `mean_squared_cca` metric on per-head vectors `vectors(batch)` [B,T,H,K], streamed as co-moments."""
  return Metric(
    name,
    "pair",
    init=_moments_init,
    batch=lambda b: _moments_batch(vectors(b), b.w_BT),
    merge=_merge_moments,
    finalize=lambda sums, n: jax.vmap(mean_squared_cca)(sums["comoment"]),
    doc=doc,
  )


def _pair_sum(L, H, K):
  return {"sum": jnp.zeros((L, H, H))}


def _head_sum(L, H, K):
  return {"sum": jnp.zeros((L, H))}


def _mean(sums, n):
  return sums["sum"] / n


def _per_head(x_BHT, w_BT):
  return {"sum": jnp.einsum("bht,bt->h", x_BHT, w_BT)}


REGISTRY: dict[str, Metric] = {
  m.name: m
  for m in (
    Metric(
      "query_orthogonality",
      "pair",
      init=_pair_sum,
      batch=lambda b: {"sum": _cosine_sum(b.q_BTHK, b.w_BT, squared=True)},
      finalize=_mean,
      basis_dependent=True,
      doc="mean_t cos²(q_i(t), q_j(t)); lower = more diverse",
    ),
    Metric(
      "context_nonorthogonality",
      "pair",
      init=_pair_sum,
      batch=lambda b: {"sum": _cosine_sum(b.z_BTHK, b.w_BT, squared=True)},
      finalize=_mean,
      basis_dependent=True,
      doc="mean_t cos²(Z_i(t), Z_j(t)); higher = more redundant",
    ),
    Metric(
      "output_dissimilarity",
      "pair",
      init=_pair_sum,
      batch=lambda b: {"sum": _cosine_sum(b.head_out_BTHD, b.w_BT, squared=False)},
      finalize=lambda sums, n: -sums["sum"] / n,
      doc="−mean_t cos(Z_i W_O^i(t), Z_j W_O^j(t)); higher = more diverse",
    ),
    Metric(
      "output_nonorthogonality",
      "pair",
      init=_pair_sum,
      batch=lambda b: {"sum": _cosine_sum(b.head_out_BTHD, b.w_BT, squared=True)},
      finalize=_mean,
      doc="mean_t cos²(Z_i W_O^i(t), Z_j W_O^j(t)); basis-free counterpart of context_nonorthogonality",
    ),
    Metric(
      "js_distance",
      "pair",
      init=_pair_sum,
      batch=lambda b: {"sum": js_distance_sums(b.probs_BHTS, b.w_BT)},
      finalize=_mean,
      doc="mean_t sqrt(JS₂(A_i[t,:], A_j[t,:])); 0 identical, 1 disjoint",
    ),
    Metric(
      "linear_cka",
      "pair",
      init=_moments_init,
      batch=lambda b: _moments_batch(b.z_BTHK, b.w_BT),
      merge=_merge_moments,
      finalize=lambda sums, n: jax.vmap(linear_cka)(sums["comoment"]),
      basis_dependent=True,
      doc="linear CKA between Z_i and Z_j over tokens; 1 = same representation (basis-dependent: see Metric)",
    ),
    _cca_metric(
      "query_cca",
      lambda b: b.q_BTHK,
      "mean squared canonical correlation of q_i and q_j over tokens; basis-free counterpart of query_orthogonality",
    ),
    _cca_metric(
      "context_cca",
      lambda b: b.z_BTHK,
      "mean squared canonical correlation of Z_i and Z_j (= of Z_h W_O^h); basis-free counterpart of linear_cka",
    ),
    Metric(
      "attention_variance",
      "head",
      init=_head_sum,
      batch=lambda b: _per_head(attention_variance(b.probs_BHTS, b.supp_BTS), b.w_BT),
      finalize=_mean,
      doc="mean_t Var_{s∈supp(t)} A_h[t,s]; 0 = uniform",
    ),
    Metric(
      "attention_entropy",
      "head",
      init=_head_sum,
      batch=lambda b: _per_head(attention_entropy(b.probs_BHTS), b.w_BT),
      finalize=_mean,
      doc="mean_t −Σ_s A_h[t,s] ln A_h[t,s] (nats)",
    ),
    Metric(
      "attention_distance",
      "head",
      init=_head_sum,
      batch=lambda b: _per_head(attention_distance(b.probs_BHTS), b.w_BT),
      finalize=_mean,
      doc="mean_t Σ_s A_h[t,s] |t − s|",
    ),
  )
}
"""Every metric by name; add one with `REGISTRY[metric.name] = metric` (before `init` builds a state)."""

PAIR_METRICS = tuple(name for name, m in REGISTRY.items() if m.kind == "pair")
HEAD_METRICS = tuple(name for name, m in REGISTRY.items() if m.kind == "head")
METRICS = PAIR_METRICS + HEAD_METRICS

State = dict  # {"n_tokens": [], metric name: {sum name: [L, ...]}}


def init(num_layers: int, num_heads: int, d_head: int) -> State:
  """Empty accumulator of every registered metric, for a model with L layers, H heads of width K.

  Memory O(L·H²·K²) (the co-moments of linear_cka and the CCA metrics), independent of the data size.
  """
  state = {"n_tokens": jnp.zeros(())}
  state.update({name: m.init(num_layers, num_heads, d_head) for name, m in REGISTRY.items()})
  return state


def update(state: State, q_LBTHK, probs_LBHTS, z_LBTHK, head_out_LBTHD, valid_BT, *, causal: bool = False) -> State:
  """Adds one batch (all layers) to the sums of every metric in `state`. Pure; jit it (or use `update_jit`)."""
  w_BT = valid_BT.astype(jnp.float32)
  supp_BTS = support_mask(valid_BT.astype(bool), causal)
  names = [name for name in state if name != "n_tokens"]

  def layer(xs):
    batch = Batch(*xs, w_BT, supp_BTS)
    return {name: REGISTRY[name].batch(batch) for name in names}

  # lax.map, not vmap, over layers: same work, 1/L of the temporary memory.
  contributions = jax.lax.map(layer, (q_LBTHK, probs_LBHTS, z_LBTHK, head_out_LBTHD))
  n_b = w_BT.sum()
  new = {"n_tokens": state["n_tokens"] + n_b}
  for name in names:
    new[name] = REGISTRY[name].merge(state[name], contributions[name], state["n_tokens"], n_b)
  return new


update_jit = mesh_lib.jit(update, static_argnames="causal")


def finalize(state: State) -> dict[str, jax.Array]:
  """Means over all valid query tokens seen: {metric: [L,H,H] or [L,H]} (see module docstring)."""
  n = jnp.maximum(state["n_tokens"], 1.0)
  return {name: REGISTRY[name].finalize(sums, n) for name, sums in state.items() if name != "n_tokens"}


def update_from(state: State, intermediates, valid_BT, *, causal: bool = False) -> State:
  """`update` reading `q_LBTHK, pattern_LBHTS, z_LBTHK, head_out_LBTHD` from an Intermediates or dict."""
  fields = ("q_LBTHK", "pattern_LBHTS", "z_LBTHK", "head_out_LBTHD")
  return update(state, *(intermediate(intermediates, f, "diversity") for f in fields), valid_BT, causal=causal)


@functools.partial(mesh_lib.jit, static_argnames="causal")
def compute(intermediates, valid_BT, *, causal: bool = False) -> dict[str, jax.Array]:
  """Every metric for every layer of one batch of Intermediates, in one jit-compiled pass."""
  L, _, _, H, K = intermediate(intermediates, "z_LBTHK", "diversity").shape
  return finalize(update_from(init(L, H, K), intermediates, valid_BT, causal=causal))


def summarize(metrics: Mapping[str, jax.Array]) -> dict[str, jax.Array]:
  """Per-layer mean and (population) variance over heads, or over off-diagonal head pairs (i ≠ j).

  Returns {"diversity/<metric>/mean": [L], "diversity/<metric>/var": [L]} for every metric given.
  """
  out = {}
  for name, value in metrics.items():
    if value.ndim == 3:  # [L,H,H]
      H = value.shape[-1]
      off = ~jnp.eye(H, dtype=bool)
      vals = value[:, off]  # [L, H(H−1)]
    else:
      vals = value
    out[f"diversity/{name}/mean"] = vals.mean(-1)
    out[f"diversity/{name}/var"] = vals.var(-1)
  return out


def rows(metrics: Mapping[str, jax.Array], step: int) -> list[tuple[int, int, int, int, str, float]]:
  """Table rows `step,layer,head_i,head_j,metric,value` for diversity/results.csv (head_j = −1 per head)."""
  table = []
  for name, value in metrics.items():
    value = jax.device_get(value)
    for layer in range(value.shape[0]):
      for i in range(value.shape[1]):
        if value.ndim == 3:
          table.extend((step, layer, i, j, name, float(value[layer, i, j])) for j in range(value.shape[2]))
        else:
          table.append((step, layer, i, -1, name, float(value[layer, i])))
  return table
