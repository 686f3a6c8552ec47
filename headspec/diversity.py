"""Head-diversity metrics, per layer, streamed over an evaluation set with H×H-sized memory.

Shapes follow the glossary in headspec/model.py (B batch, T query tokens, S key tokens, L layers,
H heads, K head width, D model width). Inputs are the stacked `Intermediates` fields of a forward
pass: `q_LBTHK`, `probs_LBHTS` (rows sum to 1 over the attendable keys, 0 elsewhere), `z_LBTHK`
(Z_h = A_h V_h), `head_out_LBTHD` (Z_h W_O^h), and `valid_BT` (True for real tokens). Only valid
tokens count as queries; a query's *support* is the set of valid keys it may attend to (keys
s <= t as well when `causal`).

Streaming: `State` holds sums and counts (never per-token data); `update` adds one batch,
`finalize` divides, so streaming over batches equals one pass over the concatenated data.
`compute` does init → update → finalize for all layers in one jit-compiled call.

Metrics (`finalize` returns [L,H,H] for pairs, [L,H] for single heads):
  query_orthogonality       [L,H,H] mean_t cos²(q_i(t), q_j(t))             (lower = more diverse)
  context_nonorthogonality  [L,H,H] mean_t cos²(Z_i(t), Z_j(t))             (higher = more redundant)
  output_dissimilarity      [L,H,H] −mean_t cos(Z_i W_O^i(t), Z_j W_O^j(t)) (higher = more diverse)
  attention_variance        [L,H]   mean_t Var_{s∈supp(t)} A_h[t,s]         (0 = uniform)
  attention_entropy         [L,H]   mean_t −Σ_s A_h[t,s] ln A_h[t,s]        (nats)
  attention_distance        [L,H]   mean_t Σ_s A_h[t,s] |t − s|
  js_distance               [L,H,H] mean_t sqrt(JS₂(A_i[t,:], A_j[t,:]))    (in [0,1])
  linear_cka                [L,H,H] linear CKA between Z_i and Z_j over tokens
where mean_t is over valid query tokens of the whole evaluation set. Each formula's source is in
the docstring of the function computing it.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import entr

from headspec.errors import UserError

PAIR_METRICS = ("query_orthogonality", "context_nonorthogonality", "output_dissimilarity", "js_distance", "linear_cka")
HEAD_METRICS = ("attention_variance", "attention_entropy", "attention_distance")
METRICS = PAIR_METRICS + HEAD_METRICS
_EPS = 1e-12


class State(NamedTuple):
  """Running sums over valid query tokens (leading L axis); memory O(L·H²·K²), independent of data size."""

  n_tokens: jax.Array  # [] valid query tokens seen
  q_cos2_LHH: jax.Array  # Σ_t cos²(q_i, q_j)
  z_cos2_LHH: jax.Array  # Σ_t cos²(Z_i, Z_j)
  out_cos_LHH: jax.Array  # Σ_t cos(Z_i W_O^i, Z_j W_O^j)
  js_LHH: jax.Array  # Σ_t JS distance
  var_LH: jax.Array  # Σ_t attention variance
  entropy_LH: jax.Array  # Σ_t attention entropy
  distance_LH: jax.Array  # Σ_t attention distance
  z_mean_LHK: jax.Array  # running mean of Z_h
  z_comoment_LHHKK: jax.Array  # Σ_t (Z_i − mean_i)(Z_j − mean_j)ᵀ, centred (Chan et al. merge)


def init(num_layers: int, num_heads: int, d_head: int) -> State:
  """Empty accumulator for a model with L layers, H heads of width K."""
  L, H, K = num_layers, num_heads, d_head
  z = jnp.zeros
  return State(
    z(()),
    z((L, H, H)),
    z((L, H, H)),
    z((L, H, H)),
    z((L, H, H)),
    z((L, H)),
    z((L, H)),
    z((L, H)),
    z((L, H, K)),
    z((L, H, H, K, K)),
  )


def _unit(x):
  """x / ||x|| along the last axis; zero vectors stay zero (their cosines count as 0)."""
  return x * jax.lax.rsqrt(jnp.maximum(jnp.sum(x * x, axis=-1, keepdims=True), _EPS))


def _cosine_sums(x_BTHK, w_BT):
  """Σ_t w_t cos(x_i(t), x_j(t)) and Σ_t w_t cos²(...), both [H,H], for heads i, j at the same token.

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
  u_BTHK = _unit(x_BTHK.astype(jnp.float32))
  cos_BTHH = jnp.einsum("bthk,btgk->bthg", u_BTHK, u_BTHK)
  return jnp.einsum("bthg,bt->hg", cos_BTHH, w_BT), jnp.einsum("bthg,bt->hg", cos_BTHH**2, w_BT)


def support_mask(valid_BT, causal: bool):
  """[B,T,S] True where query t may attend key s: s is a valid token (and s <= t when causal)."""
  supp_BTS = jnp.broadcast_to(valid_BT[:, None, :], valid_BT.shape + valid_BT.shape[-1:])
  if causal:
    T = valid_BT.shape[1]
    supp_BTS = supp_BTS & jnp.tril(jnp.ones((T, T), bool))[None]
  return supp_BTS


def attention_stats(probs_BHTS, supp_BTS):
  """Per-query variance, entropy and distance of each head's attention, each [B,H,T].

  variance: (1/n_t) Σ_{s∈supp(t)} (A[t,s] − 1/n_t)², n_t = |supp(t)|. Zero iff attention is uniform
    over the support; it equals (Σ_s A² − 1/n_t)/n_t, an affine map of the collision probability
    Σ_s A² (Rényi-2 entropy), i.e. a peakedness ("intra-head diversity") measure. No single source.
  entropy: −Σ_s A[t,s] ln A[t,s] in nats, max ln n_t (Clark et al. 2019, "What Does BERT Look At?", §3).
  distance: Σ_s A[t,s] |t − s|, the attention-weighted token distance (Vig & Belinkov 2019,
    "Analyzing the Structure of Attention in a Transformer Language Model", §4; Clark et al. 2019).
  """
  p_BHTS = probs_BHTS.astype(jnp.float32)
  supp_B1TS = supp_BTS[:, None]
  n_B1T = jnp.maximum(jnp.sum(supp_BTS, -1, dtype=jnp.float32), 1.0)[:, None]
  p_in_BHTS = jnp.where(supp_B1TS, p_BHTS, 0.0)
  mean_BHT = jnp.sum(p_in_BHTS, -1) / n_B1T
  var_BHT = (
    jnp.sum(jnp.where(supp_B1TS, p_BHTS - mean_BHT[..., None], 0.0) ** 2, -1) / n_B1T
  )  # centred: exact 0 if uniform
  entropy_BHT = jnp.sum(entr(p_BHTS), -1)  # entr(0) = 0: the 0 log 0 convention
  T, S = p_BHTS.shape[-2:]
  dist_TS = jnp.abs(jnp.arange(T)[:, None] - jnp.arange(S)[None, :]).astype(jnp.float32)
  distance_BHT = jnp.sum(p_BHTS * dist_TS, -1)
  return var_BHT, entropy_BHT, distance_BHT


def js_distance_sums(probs_BHTS, w_BT):
  """Σ_t w_t sqrt(JS(A_i[t,:] || A_j[t,:])) for every head pair, [H,H] (symmetric, zero diagonal).

  JS(P||Q) = ½ KL(P||M) + ½ KL(Q||M) = H(M) − ½H(P) − ½H(Q), M = (P+Q)/2, in bits (base-2 logs) so
  JS ∈ [0,1]; its square root is a metric (Endres & Schindelin 2003). Clark et al. 2019, "What Does
  BERT Look At?", §6 use this distance between heads' attention maps (averaged over tokens) to
  cluster heads. The entropy form costs one log per pair element (H(P) is shared by all pairs); only
  the H(H−1)/2 pairs i < j are computed, one at a time with lax.map, so the largest intermediate is
  [B,T,S]. In float32 the distance resolves differences down to about 1e-3 (JS ~ 1e-7).
  """
  p_BHTS = probs_BHTS.astype(jnp.float32)
  H = p_BHTS.shape[1]
  if H < 2:
    return jnp.zeros((H, H), jnp.float32)
  entropy_BHT = jnp.sum(entr(p_BHTS), -1)
  i_P, j_P = np.triu_indices(H, 1)

  def pair(ij):
    i, j = ij
    m_BTS = 0.5 * (p_BHTS[:, i] + p_BHTS[:, j])
    js_BT = (jnp.sum(entr(m_BTS), -1) - 0.5 * (entropy_BHT[:, i] + entropy_BHT[:, j])) / jnp.log(2.0)
    return jnp.sum(jnp.sqrt(jnp.clip(js_BT, 0.0, 1.0)) * w_BT)

  sums_P = jax.lax.map(pair, (jnp.asarray(i_P), jnp.asarray(j_P)))
  return jnp.zeros((H, H), jnp.float32).at[i_P, j_P].set(sums_P).at[j_P, i_P].set(sums_P)


def _cka_batch(z_BTHK, w_BT):
  """Batch count, mean [H,K] and centred co-moment [H,H,K,K] of Z over valid tokens."""
  z_NHK = z_BTHK.astype(jnp.float32).reshape(-1, *z_BTHK.shape[2:])
  w_N = w_BT.reshape(-1)
  n = w_N.sum()
  mean_HK = jnp.einsum("nhk,n->hk", z_NHK, w_N) / jnp.maximum(n, 1.0)
  zc_NHK = (z_NHK - mean_HK) * w_N[:, None, None]
  return n, mean_HK, jnp.einsum("nhk,ngl->hgkl", zc_NHK, zc_NHK)


def _merge_moments(n_a, mean_a, com_a, n_b, mean_b, com_b):
  """Pooled mean and co-moment of two token sets (Chan, Golub & LeVeque 1979 parallel update).

  Equals centring the concatenated data at its own mean, but never subtracts two large sums, so it
  stays accurate in float32 when |mean| >> std (plain Σzzᵀ − n·μμᵀ would cancel catastrophically).
  """
  n = n_a + n_b
  delta_HK = mean_b - mean_a
  frac = n_b / jnp.maximum(n, 1.0)
  mean = mean_a + delta_HK * frac
  com = com_a + com_b + jnp.einsum("...hk,...gl->...hgkl", delta_HK, delta_HK) * (n_a * frac)
  return mean, com


def _layer_sums(q_BTHK, probs_BHTS, z_BTHK, out_BTHD, w_BT, supp_BTS):
  """One layer's batch contributions to every running sum."""
  _, q_cos2 = _cosine_sums(q_BTHK, w_BT)
  _, z_cos2 = _cosine_sums(z_BTHK, w_BT)
  out_cos, _ = _cosine_sums(out_BTHD, w_BT)
  var_BHT, entropy_BHT, distance_BHT = attention_stats(probs_BHTS, supp_BTS)
  per_head = [jnp.einsum("bht,bt->h", x, w_BT) for x in (var_BHT, entropy_BHT, distance_BHT)]
  js = js_distance_sums(probs_BHTS, w_BT)
  _, z_mean, z_com = _cka_batch(z_BTHK, w_BT)
  return q_cos2, z_cos2, out_cos, js, *per_head, z_mean, z_com


def update(state: State, q_LBTHK, probs_LBHTS, z_LBTHK, head_out_LBTHD, valid_BT, *, causal: bool = False) -> State:
  """Adds one batch (all layers) to the running sums. Pure; jit it (or use `update_jit`)."""
  w_BT = valid_BT.astype(jnp.float32)
  supp_BTS = support_mask(valid_BT.astype(bool), causal)
  # lax.map, not vmap, over layers: same work, 1/L of the temporary memory.
  sums = jax.lax.map(lambda xs: _layer_sums(*xs, w_BT, supp_BTS), (q_LBTHK, probs_LBHTS, z_LBTHK, head_out_LBTHD))
  q_cos2, z_cos2, out_cos, js, var, entropy, distance, z_mean_b, z_com_b = sums
  n_b = w_BT.sum()
  z_mean, z_com = _merge_moments(state.n_tokens, state.z_mean_LHK, state.z_comoment_LHHKK, n_b, z_mean_b, z_com_b)
  return State(
    state.n_tokens + n_b,
    state.q_cos2_LHH + q_cos2,
    state.z_cos2_LHH + z_cos2,
    state.out_cos_LHH + out_cos,
    state.js_LHH + js,
    state.var_LH + var,
    state.entropy_LH + entropy,
    state.distance_LH + distance,
    z_mean,
    z_com,
  )


update_jit = jax.jit(update, static_argnames="causal")


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


def finalize(state: State) -> dict[str, jax.Array]:
  """Means over all valid query tokens seen: {metric: [L,H,H] or [L,H]} (see module docstring)."""
  n = jnp.maximum(state.n_tokens, 1.0)
  return {
    "query_orthogonality": state.q_cos2_LHH / n,
    "context_nonorthogonality": state.z_cos2_LHH / n,
    "output_dissimilarity": -state.out_cos_LHH / n,
    "js_distance": state.js_LHH / n,
    "linear_cka": jax.vmap(linear_cka)(state.z_comoment_LHHKK),
    "attention_variance": state.var_LH / n,
    "attention_entropy": state.entropy_LH / n,
    "attention_distance": state.distance_LH / n,
  }


def _field(intermediates: Any, name: str):
  value = intermediates[name] if isinstance(intermediates, Mapping) else getattr(intermediates, name)
  if value is None:
    raise UserError(
      f"diversity needs Intermediates.{name}; run the model with capture including {name.split('_')[0]!r}"
    )
  return value


CAPTURE = ("q", "probs", "z", "head_out")  # the model's `capture` fields the metrics need


def update_from(state: State, intermediates, valid_BT, *, causal: bool = False) -> State:
  """`update` reading `q_LBTHK, probs_LBHTS, z_LBTHK, head_out_LBTHD` from an Intermediates or dict."""
  return update(
    state,
    *(_field(intermediates, f) for f in ("q_LBTHK", "probs_LBHTS", "z_LBTHK", "head_out_LBTHD")),
    valid_BT,
    causal=causal,
  )


@functools.partial(jax.jit, static_argnames="causal")
def compute(intermediates, valid_BT, *, causal: bool = False) -> dict[str, jax.Array]:
  """Every metric for every layer of one batch of Intermediates, in one jit-compiled pass."""
  L, _, _, H, K = _field(intermediates, "z_LBTHK").shape
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
