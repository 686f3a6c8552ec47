"""Training-time head-diversity regularizers: disagreement, query orthogonality, DropHead.

Pure, differentiable JAX; shapes follow headspec/model/transformer.py's glossary (L layers, B batch, T tokens,
S keys, H heads, K head width, D model width). Every loss term is a scalar to ADD to the training
loss (already multiplied by its weight), so `loss = task_loss + sum(terms.values())`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from headspec.errors import UserError
from headspec.model.heads import intermediate, unit

_EPS = 1e-12
_NEEDED_BY = "disagreement regularization"


def _token_mean(x_LBT, valid_BT):
  """Mean over layers and valid tokens."""
  w_BT = valid_BT.astype(x_LBT.dtype)
  return jnp.sum(x_LBT * w_BT) / (x_LBT.shape[0] * jnp.maximum(w_BT.sum(), 1.0))


def cosine_agreement(x_LBTHX, valid_BT, *, off_diagonal: bool = False):
  """(1/H²) Σ_i Σ_j cos(x_i(t), x_j(t)), averaged over valid tokens t and layers: −D of Li et al.

  Li et al. 2018 ("Multi-Head Attention with Disagreement Regularization", EMNLP, §3) define
  D_subspace = −(1/H²) Σ_{i,j} cos(V^i, V^j) on heads' value vectors and D_output the same on heads'
  outputs O^i; the cosine is taken per token position here. The paper's sum includes i = j (a
  constant 1/H, no gradient); `off_diagonal=True` averages over the H(H−1) pairs i ≠ j instead.
  x_LBTHX: [L,B,T,H,·], e.g. v_LBTHK (subspace), z_LBTHK or head_out_LBTHD (output).
  """
  u = unit(x_LBTHX.astype(jnp.float32))
  H = u.shape[-2]
  total_LBT = jnp.sum(jnp.sum(u, axis=-2) ** 2, axis=-1)  # Σ_ij u_i·u_j = ||Σ_i u_i||², O(H) not O(H²)
  if off_diagonal:
    diag_LBT = jnp.sum(u * u, axis=(-2, -1))
    return _token_mean((total_LBT - diag_LBT) / (H * (H - 1)), valid_BT)
  return _token_mean(total_LBT / H**2, valid_BT)


def position_agreement(probs_LBHTS, valid_BT, *, off_diagonal: bool = False):
  """(1/H²) Σ_i Σ_j Σ_s A_i[t,s] A_j[t,s], averaged over valid queries t and layers: −D_position.

  Li et al. 2018, §3: D_position = −(1/H²) Σ_{i,j} |A^i ⊙ A^j| (sum of the elementwise product of
  heads' attention maps); normalised per query row here so each pair's overlap lies in [0,1]. As in
  the paper, i = j terms (Σ_s A_i²) are included by default, which also pushes each head towards
  flatter attention; `off_diagonal=True` keeps only i ≠ j pairs.
  """
  p_LBHTS = probs_LBHTS.astype(jnp.float32)
  H = p_LBHTS.shape[2]
  total_LBT = jnp.sum(jnp.sum(p_LBHTS, axis=2) ** 2, axis=-1)  # Σ_s (Σ_i A_i)² = Σ_ij Σ_s A_i A_j
  if off_diagonal:
    diag_LBT = jnp.sum(p_LBHTS**2, axis=(2, 4))
    return _token_mean((total_LBT - diag_LBT) / (H * (H - 1)), valid_BT)
  return _token_mean(total_LBT / H**2, valid_BT)


def disagreement_terms(
  intermediates,
  valid_BT,
  *,
  w_subspace=0.0,
  w_position=0.0,
  w_output=0.0,
  output: str = "z",
  off_diagonal: bool = False,
) -> dict[str, jax.Array]:
  """Li et al. 2018's three disagreement regularizers as loss terms {name: w · (−D)}.

  The paper maximises L + λD; as loss terms that is + λ·agreement. Terms with weight 0 are omitted
  (their intermediates need not be captured). `output='z'` uses Z_h = A_h V_h, the head output O^h of
  the paper; `output='head_out'` uses Z_h W_O^h (heads compared in the shared D-space). Each term is
  averaged over layers and valid tokens.
  """
  if output not in ("z", "head_out"):
    raise UserError(f"disagreement output must be 'z' or 'head_out', got {output!r}")
  terms = {}
  if w_subspace:
    terms["disagreement/subspace"] = w_subspace * cosine_agreement(
      intermediate(intermediates, "v_LBTHK", _NEEDED_BY), valid_BT, off_diagonal=off_diagonal
    )
  if w_position:
    terms["disagreement/position"] = w_position * position_agreement(
      intermediate(intermediates, "pattern_LBHTS", _NEEDED_BY), valid_BT, off_diagonal=off_diagonal
    )
  if w_output:
    name = "z_LBTHK" if output == "z" else "head_out_LBTHD"
    terms["disagreement/output"] = w_output * cosine_agreement(
      intermediate(intermediates, name, _NEEDED_BY), valid_BT, off_diagonal=off_diagonal
    )
  return terms


def orthogonality_penalty(w_q_DHK, *, mode: str = "inter"):
  """Penalty on non-orthogonal query projections of different heads (sums over any leading axes, e.g. L).

  mode='inter' (default): Σ_{i≠j} ||W̃_iᵀ W̃_j||_F², W̃_h = W_Q^h / ||W_Q^h||_F, W_Q^h ∈ R^{D×K}: the
    off-diagonal (inter-head) blocks of W̃ᵀW̃ only. Zero iff heads read from mutually orthogonal
    subspaces of the residual stream; leaves each head's own geometry free. This is the inter-head
    non-orthogonality penalty of Lee et al. 2019 ("Orthogonality Constrained Multi-Head Attention for
    Keyword Spotting", ASRU) moved from context vectors to the query weights, in the spirit of Li et
    al. 2018's subspace disagreement.
  mode='full': ||W̃ᵀ W̃ − I||_F² with W̃ = [D, H·K] and unit-norm columns: soft orthogonality ("SO") of
    Bansal et al. 2018 ("Can We Gain More from Orthogonality Regularizations in Training Deep
    Networks?", NeurIPS); also forces the K columns within a head apart. Needs H·K <= D to reach 0.
  """
  w = w_q_DHK.astype(jnp.float32)
  H, K = w.shape[-2:]
  if mode == "inter":
    w = w * jax.lax.rsqrt(jnp.maximum(jnp.sum(w * w, axis=(-3, -1), keepdims=True), _EPS))  # ||W̃_h||_F = 1
    gram_HHKK = jnp.einsum("...dhk,...dgl->...hgkl", w, w)
    return jnp.sum(jnp.sum(gram_HHKK**2, axis=(-2, -1)) * (1.0 - jnp.eye(H)))
  if mode == "full":
    w = unit(jnp.swapaxes(w.reshape(*w.shape[:-2], H * K), -1, -2))  # [..., HK, D], unit rows
    gram = jnp.einsum("...id,...jd->...ij", w, w)
    return jnp.sum((gram - jnp.eye(H * K)) ** 2)
  raise UserError(f"orthogonality mode must be 'inter' or 'full', got {mode!r}")


def drophead_mask(rng, p, batch: int, num_layers: int, num_heads: int):
  """DropHead mask_BLH (Zhou et al. 2020, "Scheduled DropHead", Findings of EMNLP, §3.1).

  Each head of each layer of each example is dropped independently with probability p; kept heads are
  rescaled by H / (number kept in that layer and example), so the layer's heads sum to H as at test
  time. If every head of a layer is dropped (probability p^H) we keep them all instead, so the sum is
  always H and, by symmetry, E[mask] = 1 exactly. Pass to the model as `interventions={"z":
  edits.head_mask(mask_BLH)}`; p may be traced (from `drophead_rate`), so changing it never recompiles.
  """
  keep_BLH = jax.random.bernoulli(rng, 1.0 - jnp.asarray(p, jnp.float32), (batch, num_layers, num_heads))
  kept_BL1 = keep_BLH.sum(-1, keepdims=True)
  keep_BLH = jnp.where(kept_BL1 == 0, True, keep_BLH)
  kept_BL1 = keep_BLH.sum(-1, keepdims=True)
  return keep_BLH.astype(jnp.float32) * (num_heads / kept_BL1.astype(jnp.float32))


def drophead_rate(step, total_steps: int, p_max: float, schedule: str = "constant", turn: float = 0.5):
  """DropHead rate at `step` (traceable): 'constant' p_max, or 'v' the scheduled V shape.

  Zhou et al. 2020, §3.2 ("Scheduled DropHead"): the rate decreases linearly from p_max to 0 over the
  early stage of training, then increases linearly back to p_max by the end: p(step) =
  p_max·(1 − step/τ) for step < τ and p_max·(step − τ)/(total − τ) after, τ = turn·total_steps.
  Motivation in the paper: drop heads hard early, while a few heads would otherwise come to dominate
  (Voita et al. 2019), and regularize increasingly late in training (curriculum dropout). The paper's
  turning point is a hyperparameter: `train.regularizers.drophead_turn` (default 0.5, the midpoint).
  """
  if not 0.0 < turn < 1.0:
    raise UserError(f"train.regularizers.drophead_turn must be in (0, 1), got {turn}")
  step = jnp.asarray(step, jnp.float32)
  if schedule == "constant":
    return jnp.full_like(step, p_max)
  if schedule != "v":
    raise UserError(f"drophead schedule must be 'constant' or 'v', got {schedule!r}")
  tau = max(turn * total_steps, 1.0)
  down = p_max * (1.0 - step / tau)
  up = p_max * (step - tau) / max(total_steps - tau, 1.0)
  return jnp.clip(jnp.where(step < tau, down, up), 0.0, p_max)
