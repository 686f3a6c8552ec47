"""An SAE's quality and its features' heads (NumPy, float64; docs/sae.md states each formula).

Quality (the set of Gao et al. 2024 and Kissane et al. 2024):
  L0            mean over inputs of #{f : a_f(x) > 0}
  FVU           Σ_n ‖x_n − x̂_n‖² / Σ_n ‖x_n − x̄‖² (fraction of variance unexplained; 1 − R²)
  dead          fraction of features that fire on none of the evaluation inputs (metrics.csv's eval_tokens of them)
  dense         fraction of features that fire on more than `dense_min` of them (Rajamanoharan et al. 2024
                count those above 10% as dense)
  loss recovered (L_ablate − L_splice) / (L_ablate − L_clean): 1 when splicing the reconstruction in costs
                nothing, 0 when it is as bad as ablating the layer (Bricken et al. 2023; Kissane et al. 2024)
  KL            mean over scored tokens of KL(p_clean ‖ p_splice) = Σ_v p_clean(v) (log p_clean(v) − log p_splice(v)),
                nats (SAELens's `kl_div_with_sae`, whose `kl_div_score` sets it against zero ablation's)
  agreement     fraction of scored tokens where argmax_v p_splice = argmax_v p_clean (splice.py computes both)
Heads (Kissane et al. 2024 attribute a feature of the concatenated z to heads by its decoder norm):
  a_fh          ‖W_dec[f, slice h]‖² / ‖W_dec[f]‖²: the share of feature f's decoder direction in head h, in
                the coordinates the SAE trained in (`SAE.trained_decoder_FK`: with per-head normalisation each
                head's z at unit RMS, so a head's output scale does not enter the shares)
  z RMS         √(mean over inputs and the head's K coordinates of z²): the head's output scale, to set S_h against
  entropy       H_f = −Σ_h a_fh log2 a_fh bits: 0 for a feature of one head, log2 H for one spread evenly
  carries       head h carries feature f when a_fh ≥ `carry_min`
  specialization S_h = Σ_f a_fh² / Σ_f a_fh over live features: the a_fh of a feature drawn in proportion to
                its share in h, i.e. how much of what h writes belongs to features that are h's alone
                (1: every feature h writes lies in h only; 1/H: every feature it writes is spread evenly)
"""

from __future__ import annotations

import numpy as np

from headspec import arguments as args
from headspec.errors import UserError


def head_fractions(w_dec_FK, heads: int) -> np.ndarray:
  """[F, H] a_fh = ‖W_dec[f, h·K/H:(h+1)·K/H]‖² / ‖W_dec[f]‖² (rows sum to 1; a zero row is spread evenly)."""
  w = np.asarray(w_dec_FK, np.float64)
  F, K = w.shape
  if isinstance(heads, bool) or int(heads) != heads or heads < 1 or K % heads:
    raise UserError(f"sae_head_fractions: heads={heads!r} must be a positive divisor of the SAE width {K}")
  sq_FH = (w.reshape(F, int(heads), K // int(heads)) ** 2).sum(-1)
  total_F1 = sq_FH.sum(1, keepdims=True)
  return np.where(total_F1 > 0, sq_FH / np.where(total_F1 > 0, total_F1, 1.0), 1.0 / heads)


def _sae(value):
  """An SAE (anything with a 2-D `W_dec_FK`), as fit_sae returns."""
  if getattr(getattr(value, "W_dec_FK", None), "ndim", None) != 2:
    raise args.Wrong(f"={args.short(value)} must be an SAE (as headspec.fit_sae returns), not {type(value).__name__}")
  return value


@args.arguments(sae=_sae, heads=args.integer(1))
def sae_head_fractions(sae, *, heads: int) -> np.ndarray:
  """[F, H]: each feature's squared decoder norm in each head's slice of the concatenated z over its total, in
  the coordinates it trained in (per-head normalisation: each head's z at unit RMS; module docstring)."""
  return head_fractions(getattr(sae, "trained_decoder_FK", sae.W_dec_FK), heads)


def head_rms(x_NK, heads: int) -> np.ndarray:
  """[H] √(mean over rows and the head's K/H coordinates of x²): each head's block's RMS."""
  x = np.asarray(x_NK, np.float64)
  return np.sqrt((x.reshape(len(x), heads, -1) ** 2).mean((0, 2)))


def l0(f_NF) -> float:
  return float((np.asarray(f_NF) > 0).sum(1).mean())


def fvu(x_NK, xhat_NK) -> float:
  x, xhat = np.asarray(x_NK, np.float64), np.asarray(xhat_NK, np.float64)
  return float(((x - xhat) ** 2).sum() / ((x - x.mean(0)) ** 2).sum())


def firing_rates(f_NF) -> np.ndarray:
  """[F] fraction of inputs on which each feature is > 0."""
  return (np.asarray(f_NF) > 0).mean(0)


def dead_fraction(rates_F) -> float:
  return float((np.asarray(rates_F) == 0).mean())


def dense_fraction(rates_F, dense_min: float) -> float:
  return float((np.asarray(rates_F) > dense_min).mean())


def loss_recovered(clean: float, splice: float, ablated: float) -> float:
  """(L_ablate − L_splice) / (L_ablate − L_clean); NaN when ablating costs nothing."""
  gap = ablated - clean
  return float((ablated - splice) / gap) if gap != 0 else float("nan")


def entropy_bits(a_FH) -> np.ndarray:
  """[F] −Σ_h a_fh log2 a_fh."""
  a = np.asarray(a_FH, np.float64)
  return -(np.where(a > 0, a * np.log2(np.where(a > 0, a, 1.0)), 0.0)).sum(1)


def specialization(a_FH, live_F) -> np.ndarray:
  """[H] S_h = Σ_f a_fh² / Σ_f a_fh over the live features (NaN for a head no live feature touches)."""
  a = np.asarray(a_FH, np.float64)[np.asarray(live_F, bool)]
  total_H = a.sum(0)
  return np.where(total_H > 0, (a**2).sum(0) / np.where(total_H > 0, total_H, 1.0), np.nan)
