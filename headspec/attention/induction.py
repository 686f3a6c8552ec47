"""Induction heads (Olsson et al. 2022) and their parts: previous-token, duplicate-token, induction and
copying scores per head, the in-context-learning (ICL) score, and when they form over training.

Attention scores, from captured attention A (query i, key j) of every head (docs/attention.md):
  On repeated random tokens `[BOS] r_1 … r_n r_1 … r_n` (r drawn without replacement from the
  vocabulary minus the special tokens, or from the ids that occur in the run's evaluation text when
  induction.draw='text'; `repeated_random_tokens`):
    previous_token   mean over i = 1 … 2n of A[i, i−1]
    duplicate_token  mean over i = n+1 … 2n of A[i, i−n]        (the same token, one repeat back)
    induction        mean over i = n+1 … 2n of A[i, i−n+1]      (the token AFTER it: prefix matching)
  Computed from token matches, so the same code scores natural text (`pattern_masks`): for query i,
    duplicate_i = Σ_{j<i, x_j = x_i} A[i, j],   induction_i = Σ_{j<i, x_{j−1} = x_i} A[i, j],
  averaged over the queries that have such a j (and, natural text, whose token is not special); on
  repeated random tokens each such query has exactly one j, and this is the formula above.
Copying (Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits"; `copying_scores`):
  Re(Σλ)/Σ|λ| over the eigenvalues λ of the OV circuit W_E W_V^h W_O^h W_U (V×V), computed through the
  K×K matrix W_O^h W_U W_E W_V^h (the same non-zero eigenvalues, ABᵀ vs BᵀA). LayerNorm gains are
  folded in (the gain γ_l of the LayerNorm before layer l's attention into W_V, the final gain into W_U),
  its centring, scaling and every bias ignored; W_E is the token embedding without positions, and a tied
  unembedding is W_U = diag(γ_final) W_Eᵀ. For layers above the first this is the direct path from
  tokens only (what earlier layers add to the residual stream is ignored).
ICL score (Olsson et al. 2022 §2; `icl_positions`): mean loss at a late token minus at an early token
  of the same context, theirs the 500th minus the 50th of 512 tokens, here positions scaled to the context.
Bootstrap CIs: percentile, over sequences (headspec/words/resampling.py resamples, as roles.py).

One compiled function per model structure and batch shape (`_scorer`) runs the model, reduces the
attention of every head to per-sequence sums on device and returns those and the per-token losses.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np
from flax import nnx

from headspec.attention.roles import ratio_ci
from headspec.data.repeats import varied_repeat_batch as varied_repeat_batch  # public here too (notebooks)
from headspec.data.tokenizer import bos_ids as bos_ids  # the ids r_i is never drawn from, and what opens a row
from headspec.data.tokenizer import special_ids as special_ids
from headspec.errors import UserError
from headspec.model.objectives import token_nll
from headspec.parallel import mesh as mesh_lib
from headspec.parallel.compilations import program_cache

ATTENTION_ROLES = ("previous_token", "duplicate_token", "induction")
ROLES = ATTENTION_ROLES + ("copying",)
DATA = ("repeated_random", "natural_text", "weights")
LABELS = ROLES
SOURCES = {
  "previous_token": "Olsson et al. 2022",
  "duplicate_token": "Olsson et al. 2022; Wang et al. 2023",
  "induction": "Olsson et al. 2022",
  "copying": "Elhage et al. 2021",
}


def repeated_random_tokens(
  vocab_size: int, specials, *, n: int, count: int, seed: int, bos=(2,), among=None
) -> np.ndarray:
  """[count, len(bos) + 2n] rows `BOS r_1 … r_n r_1 … r_n`, r drawn without replacement from the
  vocabulary (or the ids `among`) minus `specials`, each row with its own draw from one seeded generator."""
  pool = np.arange(vocab_size) if among is None else np.unique(np.asarray(among, np.int64))
  allowed = np.setdiff1d(pool, np.asarray(specials, np.int64))
  if n < 1 or n > len(allowed):
    what = "the non-special vocabulary" if among is None else "the non-special ids drawn from"
    raise UserError(f"induction.n={n}: must be in 1..{len(allowed)} ({what})")
  rng = np.random.default_rng(seed)
  r_NR = np.stack([rng.choice(allowed, n, replace=False) for _ in range(count)])
  bos_NB = np.broadcast_to(np.asarray(bos, np.int64), (count, len(bos)))
  return np.concatenate([bos_NB, r_NR, r_NR], axis=1).astype(np.int32)


def pattern_masks(tokens_BT, valid_BT, ordinary_BT):
  """[3, B, T, S] which keys each score sums over, and [3, B, T] which queries it averages over
  (previous_token, duplicate_token, induction; module docstring). `ordinary_BT`: not a special token."""
  T = tokens_BT.shape[1]
  q_T1, k_1S = jnp.arange(T)[:, None], jnp.arange(T)[None, :]
  vv_BTS = valid_BT[:, :, None] & valid_BT[:, None, :]
  prev_BTS = vv_BTS & (k_1S == q_T1 - 1)[None]
  earlier_BTS = vv_BTS & (k_1S < q_T1)[None] & ordinary_BT[:, :, None]
  same_BTS = tokens_BT[:, :, None] == tokens_BT[:, None, :]
  before_BS = jnp.concatenate([jnp.full_like(tokens_BT[:, :1], -1), tokens_BT[:, :-1]], axis=1)
  prefix_BTS = (tokens_BT[:, :, None] == before_BS[:, None, :]) & (k_1S >= 1)[None]
  keys_3BTS = jnp.stack([prev_BTS, earlier_BTS & same_BTS, earlier_BTS & prefix_BTS])
  queries_3BT = keys_3BTS.any(-1)
  return keys_3BTS, queries_3BT


def pattern_sums(probs_LBHTS, keys_3BTS, queries_3BT):
  """(num [3, L, H, B]: Σ over a sequence's queries of the attention on the score's keys, den [3, B])."""
  on_3LBHT = jnp.einsum("lbhts,cbts->clbht", probs_LBHTS.astype(jnp.float32), keys_3BTS.astype(jnp.float32))
  num = jnp.einsum("clbht,cbt->clhb", on_3LBHT, queries_3BT.astype(jnp.float32))
  return num, queries_3BT.sum(-1).astype(jnp.float32)


@program_cache(8)
def _scorer(graphdef):
  """The jitted forward of one model structure: (num [3,L,H,B], den [3,B], nll_BT) of a batch."""

  @mesh_lib.jit
  def score(params, tokens_BT, valid_BT, ordinary_BT):
    model = nnx.merge(graphdef, params)
    logits_BTV, inter = model(tokens_BT, valid_BT=valid_BT, capture=("pattern",))
    keys, queries = pattern_masks(tokens_BT, valid_BT, ordinary_BT)
    num, den = pattern_sums(inter.pattern_LBHTS, keys, queries)
    targets_BT = jnp.concatenate([tokens_BT[:, 1:], tokens_BT[:, -1:]], axis=1)
    nll_BT = token_nll(logits_BTV, targets_BT)
    return num, den, nll_BT

  return score


@dataclasses.dataclass
class Pass:
  """Per-sequence results of `run`: attention sums num_3LHN / den_3N, and nll_NT (token t predicts t+1)."""

  num_3LHN: np.ndarray
  den_3N: np.ndarray
  nll_NT: np.ndarray


def run(model, tokens_NT, valid_NT, specials, *, batch_size: int = 50) -> Pass:
  """Every sequence through the model in fixed-shape batches (the last one padded with invalid rows)."""
  graphdef, params = nnx.split(model)
  fn = _scorer(graphdef)
  tokens_NT, valid_NT = np.asarray(tokens_NT, np.int32), np.asarray(valid_NT, bool)
  N, T = tokens_NT.shape
  B = max(1, min(batch_size, N))
  ordinary_NT = ~np.isin(tokens_NT, np.asarray(specials))
  nums, dens, nlls = [], [], []
  for start in range(0, N, B):
    sl = slice(start, start + B)
    parts = [tokens_NT[sl], valid_NT[sl], ordinary_NT[sl]]
    real = len(parts[0])
    if real < B:
      parts = [np.concatenate([p, np.zeros((B - real, T), p.dtype)]) for p in parts]
    num, den, nll = fn(params, *(jnp.asarray(p) for p in parts))
    nums.append(np.asarray(num)[..., :real])
    dens.append(np.asarray(den)[:, :real])
    nlls.append(np.asarray(nll)[:real])
  return Pass(np.concatenate(nums, -1), np.concatenate(dens, -1), np.concatenate(nlls))


def subset(p: Pass, index_N) -> Pass:
  """The sequences `index_N` of a `run` pass (e.g. the causal check's selection half)."""
  index_N = np.asarray(index_N)
  return Pass(p.num_3LHN[..., index_N], p.den_3N[:, index_N], p.nll_NT[index_N])


def causal_split(num_sequences: int, num_measured: int) -> tuple[np.ndarray, np.ndarray]:
  """(select_S, measure_M): disjoint halves of the repeated sequences for the causal check of induction heads,
  so that the top-k heads are chosen on other sequences than those their ablation is measured on (the
  maximum of noisy scores is biased upwards on the sequences that chose it): the first half selects, the
  second measures (its first `num_measured`)."""
  half = num_sequences // 2
  if half < 1 or num_sequences - half < 2:
    raise UserError(f"induction.num_sequences={num_sequences}: the causal check needs 3 or more (half select)")
  return np.arange(half), np.arange(half, num_sequences)[:num_measured]


def attention_scores(p: Pass, *, resamples: int, seed: int) -> dict:
  """{role: (score_LH, low_LH, high_LH)}: Σ over sequences of num / Σ of den, CIs resampling sequences.
  A role no query qualifies for (no repeated token at all) is NaN."""
  out = {}
  _, L, H, N = p.num_3LHN.shape
  for c, role in enumerate(ATTENTION_ROLES):
    if p.den_3N[c].sum() == 0:
      out[role] = tuple(np.full((L, H), np.nan) for _ in range(3))
      continue
    keep = p.den_3N[c] > 0
    num_NG = p.num_3LHN[c].reshape(L * H, N).T[keep]
    value, low, high = ratio_ci(
      num_NG, p.den_3N[c][keep], np.arange(int(keep.sum())), num_resamples=resamples, seed=seed
    )
    out[role] = tuple(x.reshape(L, H) for x in (value, low, high))
  return out


def pattern_scores_of_maps(probs_LBHTS, tokens_BT, specials=()) -> dict:
  """{role: [L, H]} straight from attention maps (every row valid): the known-answer tests' entry."""
  tokens_BT = jnp.asarray(tokens_BT)
  valid = jnp.ones(tokens_BT.shape, bool)
  ordinary = ~jnp.isin(tokens_BT, jnp.asarray(np.asarray(specials, np.int32)))
  num, den = pattern_sums(jnp.asarray(probs_LBHTS), *pattern_masks(tokens_BT, valid, ordinary))
  num, den = np.asarray(num, np.float64), np.asarray(den, np.float64)
  return {role: num[c].sum(-1) / max(den[c].sum(), 1.0) for c, role in enumerate(ATTENTION_ROLES)}


# --- copying (weights only) ---


def copying_score(eigenvalues) -> float:
  """Re(Σλ) / Σ|λ| (Elhage et al. 2021): 1 for a positive (copying) map, −1 for a negated one."""
  lam = np.asarray(eigenvalues)
  total = np.abs(lam).sum()
  return float(np.real(lam.sum()) / total) if total > 0 else float("nan")


def ov_eigenvalues(w_e_VD, w_v_DK, w_o_KD, w_u_DV) -> np.ndarray:
  """The K eigenvalues of W_O W_U W_E W_V [K×K]: the non-zero ones of the V×V OV circuit W_E W_V W_O W_U."""
  m_KK = (np.asarray(w_o_KD, np.float64) @ np.asarray(w_u_DV, np.float64)) @ (
    np.asarray(w_e_VD, np.float64) @ np.asarray(w_v_DK, np.float64)
  )
  return np.linalg.eigvals(m_KK)


def ov_eigenvalues_full(w_e_VD, w_v_DK, w_o_KD, w_u_DV) -> np.ndarray:
  """Eigenvalues of the V×V OV circuit itself (small vocabularies only: the tests' reference)."""
  f = lambda x: np.asarray(x, np.float64)
  return np.linalg.eigvals(f(w_e_VD) @ f(w_v_DK) @ f(w_o_KD) @ f(w_u_DV))


def _gain(layernorm, D: int) -> np.ndarray:
  scale = getattr(layernorm, "scale", None)
  return np.ones(D) if scale is None else mesh_lib.to_host(scale[...], np.float64)


def copying_scores(model) -> np.ndarray:
  """[L, H] copying score of every head (module docstring: LN gains folded in, biases ignored)."""
  cfg = model.cfg
  D = cfg.d_model
  w_e_VD = mesh_lib.to_host(model.token_embed_VD[...], np.float64)
  final = _gain(model.ln_final, D) if cfg.final_norm else np.ones(D)
  w_u_DV = w_e_VD.T if cfg.tie_embeddings else mesh_lib.to_host(model.unembed_DV[...], np.float64)
  w_u_DV = final[:, None] * w_u_DV
  ue_DD = w_u_DV @ w_e_VD  # W_U W_E, shared by every head
  out = np.zeros((cfg.num_layers, cfg.num_heads))
  for l, block in enumerate(model.blocks):
    gain = _gain(block.ln_attention, D) if cfg.pre_layernorm else np.ones(D)
    # grouped-query: G K/V heads, repeated per head
    w_v_DGK = mesh_lib.to_host(block.attention.w_v_DHK[...], np.float64)
    w_v_DHK = gain[:, None, None] * np.repeat(w_v_DGK, cfg.num_heads // w_v_DGK.shape[1], axis=1)
    w_o_HKD = mesh_lib.to_host(block.attention.w_o_HKD[...], np.float64)
    m_HKK = np.einsum("hkd,de,ehj->hkj", w_o_HKD, ue_DD, w_v_DHK)
    for h, lam in enumerate(np.linalg.eigvals(m_HKK)):
      out[l, h] = copying_score(lam)
  return out


# --- in-context learning ---


def icl_positions(T: int) -> tuple[int, int]:
  """(early, late) token indices of Olsson et al.'s 50th and 500th of 512, scaled to a context of T:
  round(T·50/512) and round(T·500/512), clipped to 1..T−1 (index t is predicted from tokens < t)."""
  early = min(max(1, round(T * 50 / 512)), T - 1)
  late = min(max(early + 1, round(T * 500 / 512)), T - 1)
  return early, late


def loss_by_position(nll_NT, valid_NT, *, resamples: int, seed: int):
  """(positions P, mean, low, high): the loss of predicting token t (1 ≤ t < T) from tokens < t, over
  sequences in which t is valid; CIs resample sequences. nll_NT[:, t − 1] is that token's loss."""
  nll_NT, valid_NT = np.asarray(nll_NT, np.float64), np.asarray(valid_NT, bool)
  T = nll_NT.shape[1]
  scored_NP = valid_NT[:, 1:]  # token t exists (its predictor t − 1 then does too)
  loss_NP = np.where(scored_NP, nll_NT[:, : T - 1], 0.0)
  keep = scored_NP.any(1)
  value, low, high = ratio_ci(
    loss_NP[keep], scored_NP[keep].astype(np.float64), np.arange(int(keep.sum())), num_resamples=resamples, seed=seed
  )
  return np.arange(1, T), value, low, high


def icl_score(nll_NT, valid_NT, early: int, late: int, *, resamples: int, seed: int):
  """(value, low, high): mean over sequences holding token `late` of loss(late) − loss(early)."""
  nll_NT, valid_NT = np.asarray(nll_NT, np.float64), np.asarray(valid_NT, bool)
  keep = valid_NT[:, late]
  if not keep.any():
    return float("nan"), float("nan"), float("nan")
  diff_N = nll_NT[keep, late - 1] - nll_NT[keep, early - 1]
  value, low, high = ratio_ci(
    diff_N[:, None], np.ones(len(diff_N)), np.arange(len(diff_N)), num_resamples=resamples, seed=seed
  )
  return float(value[0]), float(low[0]), float(high[0])


def repeat_losses(nll_NT, n: int, prefix: int = 1):
  """(first_N, second_N): mean loss per sequence on tokens r_2 … r_n of the first repeat and of the second
  (each predicted from the token before it; r_1 is never predictable, so it is left out of both)."""
  nll_NT = np.asarray(nll_NT, np.float64)
  first = nll_NT[:, prefix : prefix + n - 1].mean(1)  # predictors of r_2..r_n (first repeat)
  second = nll_NT[:, prefix + n : prefix + 2 * n - 1].mean(1)  # predictors of r_2..r_n (second repeat)
  return first, second


def repeat_loss_cis(first_N, second_N, *, resamples: int, seed: int) -> dict:
  """{kind: (value, low, high)} over sequences of `repeat_losses`' per-sequence means: `repeat_first`, the
  loss on r_2 … r_n of the first copy (≈ ln of the ids r is drawn from: nothing to copy yet),
  `repeat_second`, of the second copy, and `repeat_drop` = first − second, the in-context loss drop that
  prefix matching and copying give (Olsson et al. 2022's in-context learning on repeated tokens; ≈ 0 before
  induction heads form). Percentile bootstrap CIs over sequences (headspec/words/resampling.py, as icl_score)."""
  first_N, second_N = np.asarray(first_N, np.float64), np.asarray(second_N, np.float64)
  v_N3 = np.stack([first_N, second_N, first_N - second_N], 1)  # one bootstrap: the three CIs share resamples
  value, low, high = ratio_ci(v_N3, np.ones(len(v_N3)), np.arange(len(v_N3)), num_resamples=resamples, seed=seed)
  kinds = ("repeat_first", "repeat_second", "repeat_drop")
  return {kind: (float(value[g]), float(low[g]), float(high[g])) for g, kind in enumerate(kinds)}


# --- formation over training ---


def formation_window(steps, best_scores, threshold: float):
  """(last step below `threshold`, first step at or above it) of the best head's score over steps, for
  the first crossing after which it stays at or above; (None, None) when it never crosses (or starts
  above: then (None, first step))."""
  steps, best = np.asarray(steps), np.asarray(best_scores, np.float64)
  order = np.argsort(steps)
  steps, best = steps[order], best[order]
  above = best >= threshold
  if not above.any():
    return None, None
  stays = np.flatnonzero([above[i:].all() for i in range(len(above))])
  first = int(stays[0]) if len(stays) else int(np.flatnonzero(above)[0])
  return (int(steps[first - 1]) if first > 0 else None), int(steps[first])
