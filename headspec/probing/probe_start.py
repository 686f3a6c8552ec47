"""The softmax probes' start: sufficient statistics, whitening and the Fisher-LDA or class-prior start.

One streaming pass gives per-group mean and std, per-task class sums and a K×K correlation from a strided
subset (`statistics`); they give the whitening A = R^(-1/2) of the feature correlation (`whitening`) and a
closed-form Fisher-LDA start W₀ = Σ_w⁻¹ μ_c, b₀ = log π_c − ½ μ_cᵀ W₀,c (`lda_start`: the Gaussian model whose
posterior is exactly a softmax-linear probe), kept per probe only if its objective on the subset beats the
class-prior model's (`starts`). The fit itself: headspec/probing/probe.py.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import scipy.sparse

EMPTY_CLASS_BIAS = -30.0  # log-prior of a class absent from train: never predicted


@jax.jit
def second_moment(x_cGK, shift_GK):
  xg_GcK = jnp.transpose(x_cGK - shift_GK, (1, 0, 2))
  return jnp.einsum("gck,gcl->gkl", xg_GcK, xg_GcK)


def floored_std(mean, std):
  """The one standard deviation used everywhere (standardising, whitening, the LDA start, arc probes).

  A feature is treated as constant (std 1, so x̂ = x − mean ≈ 0) only when its spread is below float
  resolution of its own magnitude (std ≤ 1e-6·|mean|, or exactly 0); anything else keeps its own std,
  however small, so standardised logistic regression stays invariant to rescaling a feature (a feature
  multiplied by 1e-7 is standardised to the same x̂ as before).
  """
  mean, std = np.asarray(mean, np.float64), np.asarray(std, np.float64)
  return np.where(std > 1e-6 * np.abs(mean) + 1e-30, std, 1.0)


def statistics(x_NGK, specs, chunk, cov_samples):
  """mean, floored std (float64), the correlation of x̂ and per-task standardised class means / priors.

  One streaming pass in NumPy (XLA's CPU reductions and scatters are slower here): shifted sums and
  sums of squares, and class sums as a sparse one-hot product (nnz = N, so no factor C). The K×K
  second moment of x̂ = (x − mean)/std only whitens and shapes the LDA start, so it uses an evenly
  strided subset of about cov_samples words (a full pass would cost K times more than everything else
  here); it is standardised with the SAME mean and std as everything else (not the subset's own), so
  a near-constant feature cannot blow up one matrix and not the others. Also returns the subset's
  indices (the start is checked on them).
  """
  n = x_NGK.shape[0]
  shift_GK = np.asarray(x_NGK[: min(n, 1024)], np.float64).mean(0).astype(np.float32)
  s1, s2 = 0.0, 0.0
  sums = [0.0] * len(specs)
  counts = [
    np.bincount(np.asarray(s.y_train_N)[np.asarray(s.y_train_N) >= 0], minlength=s.num_classes).astype(np.float64)
    for s in specs
  ]
  for start in range(0, n, chunk):
    x = np.asarray(x_NGK[start : start + chunk], np.float32)
    xc = x - shift_GK
    s1 = s1 + xc.sum(0, dtype=np.float64)
    s2 = s2 + np.square(xc).sum(0, dtype=np.float64)
    flat = x.reshape(len(x), -1)
    for i, spec in enumerate(specs):
      y = np.asarray(spec.y_train_N[start : start + chunk])
      keep = np.flatnonzero(y >= 0)
      onehot = scipy.sparse.csr_matrix(
        (np.ones(len(keep), np.float32), (y[keep], keep)), shape=(spec.num_classes, len(x))
      )
      sums[i] = sums[i] + np.asarray(onehot @ flat, np.float64)
  m1 = s1 / n
  mean = shift_GK + m1
  std = floored_std(mean, np.sqrt(np.maximum(s2 / n - m1**2, 0.0)))
  sub_idx = np.arange(0, n, max(1, n // cov_samples))
  sub = np.asarray(x_NGK[sub_idx], np.float32)
  sub_m1 = (sub.mean(0, dtype=np.float64) - mean) / std
  scale = (1.0 / std).astype(np.float32)
  cov = np.asarray(second_moment(sub * scale, (mean * scale).astype(np.float32)), np.float64) / len(sub)
  corr = cov - np.einsum("gk,gl->gkl", sub_m1, sub_m1)  # covariance of x̂ on the subset (≈ correlation)
  per_task = []
  for spec, cs, cc in zip(specs, sums, counts):
    cs = cs.reshape(spec.num_classes, *mean.shape)
    # class means in standardised coordinates; empty classes get mean 0 and prior 0
    mu_CGK = (cs / np.maximum(cc, 1.0)[:, None, None] - mean) / std * (cc > 0)[:, None, None]
    per_task.append((mu_CGK, cc / cc.sum()))
  return mean, std, corr, per_task, sub_idx


def lda_start(corr_GKK, mu_CGK, prior_C, ridge):
  """Fisher LDA weights in standardised coordinates: W = Σ_w⁻¹ μ_c, b = log π_c − ½ μ_cᵀ W_c.

  Σ_w = Σ − Σ_c π_c (μ_c − μ̄)(μ_c − μ̄)ᵀ is a difference of two estimates (the total from a subset,
  the class means from every word), so it can come out indefinite: its eigenvalues are clipped at 0
  before the ridge is added (a negative one would flip or blow up the start)."""
  mbar_GK = np.einsum("c,cgk->gk", prior_C, mu_CGK)
  d_CGK = mu_CGK - mbar_GK
  # optimize=True: NumPy otherwise contracts these naively (seconds per 384-dim group; MDL refits often)
  within_GKK = corr_GKK - np.einsum("c,cgk,cgl->gkl", prior_C, d_CGK, d_CGK, optimize=True)
  evals, evecs = np.linalg.eigh(0.5 * (within_GKK + np.swapaxes(within_GKK, -1, -2)))
  inv = 1.0 / (np.maximum(evals, 0.0) + ridge)
  w_GKC = np.einsum("gkj,gj,glj,cgl->gkc", evecs, inv, evecs, mu_CGK, optimize=True)
  quad_GC = np.einsum("cgk,gkc->gc", mu_CGK, w_GKC)
  b_GC = prior_bias(prior_C)[None, :] - 0.5 * quad_GC
  b_GC = b_GC - b_GC.max(-1, keepdims=True)
  return w_GKC, b_GC


def prior_bias(prior_C):
  """log π_c: the class-prior-only model (W = 0), the start the LDA start must beat."""
  return np.where(prior_C > 0, np.log(np.maximum(prior_C, 1e-300)), EMPTY_CLASS_BIAS)


@functools.partial(jax.jit, static_argnames=("num_classes",))
def objective_G(xs_GnK, y_n, w_GKC, b_GC, l2, *, num_classes):
  """Penalised objective per group on a (sub)set of words: mean CE over labelled words + (λ/2)‖W‖²."""
  z = jnp.einsum("gnk,gkc->gnc", xs_GnK, w_GKC) + b_GC[:, None, :]
  nll = jax.nn.logsumexp(z, -1) - jnp.take_along_axis(z, jnp.maximum(y_n, 0)[None, :, None], -1)[..., 0]
  mask = (y_n >= 0).astype(z.dtype)
  return (nll * mask).sum(1) / jnp.maximum(mask.sum(), 1.0) + 0.5 * l2 * jnp.square(w_GKC).sum((1, 2))


def whitening(corr_GKK):
  """A = (R + εI)^(-1/2) of the feature correlation R (of x̂) per group, and its inverse."""
  k = corr_GKK.shape[-1]
  evals, evecs = np.linalg.eigh(corr_GKK + 1e-6 * np.eye(k))
  evals = np.maximum(evals, 1e-4 * np.maximum(evals.max(-1, keepdims=True), 1e-12))
  whiten = np.einsum("gkj,gj,glj->gkl", evecs, evals**-0.5, evecs)
  unwhiten = np.einsum("gkj,gj,glj->gkl", evecs, evals**0.5, evecs)
  return whiten, unwhiten


def starts(x_train_NGK, cols, corr, per_task, sub_idx, mean, std, unwhiten, lda_ridge):
  """The start of every probe (whitened coordinates, one block per task): the Fisher-LDA start where its
  objective on the strided subset is below the class-prior model's, else the class prior (W = 0).
  cols: the packed columns (probe._Columns: specs, l2_P, layout_one, total_one). Returns v0, b0 and per
  task which start each group got ('lda' or 'prior')."""
  num_g, k = mean.shape
  v0 = np.zeros((num_g, k, cols.total_one), np.float32)
  b0 = np.zeros((num_g, cols.total_one), np.float32)
  xs_sub = np.transpose((np.asarray(x_train_NGK[sub_idx], np.float32) - mean) / std, (1, 0, 2))
  xs_sub = jax.device_put(xs_sub.astype(np.float32))
  kinds = {}
  for s, (off, c), (mu, prior) in zip(cols.specs, cols.layout_one, per_task):
    w, b = lda_start(corr, mu, prior, lda_ridge)
    prior_b = np.broadcast_to(prior_bias(prior), b.shape)
    y_sub = jax.device_put(np.asarray(s.y_train_N)[sub_idx].astype(np.int32))
    f_lda, f_prior = (
      np.asarray(
        objective_G(
          xs_sub, y_sub, np.asarray(ww, np.float32), np.asarray(bb, np.float32), float(cols.l2_P[0]), num_classes=c
        )
      )
      for ww, bb in ((w, b), (np.zeros_like(w), prior_b))
    )
    use_lda = np.isfinite(f_lda) & (f_lda <= f_prior)  # else the class-prior start (W = 0)
    kinds[s.name] = np.where(use_lda, "lda", "prior")
    v0[:, :, off : off + c] = np.einsum("gkl,glc->gkc", unwhiten, w) * use_lda[:, None, None]
    b0[:, off : off + c] = np.where(use_lda[:, None], b, prior_b)
  return v0, b0, kinds
