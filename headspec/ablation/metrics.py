"""From per-sequence values (headspec/ablation/core.py) to the numbers in the tables, with CIs.

LM metrics are ratios over scored tokens: loss = Σ NLL / Σ w, accuracy = Σ correct / Σ w (w = 1 on a
scored token), and a `*_delta` is the ablated value minus the unablated one on the same tokens.
embedding_shift = (1/N) Σ_x (1 − cos(e_ablated(x), e_full(x))) (e L2-normalised, so cos = e·e').
95% CIs: percentile bootstrap over evaluation sequences (Efron & Tibshirani 1993), the same resamples
(headspec.words.resampling.bootstrap_resample_counts) for every mask, so intervals of different heads are
paired; a ratio metric is recomputed from the resampled sums.

Head scores:
  importance (Michel et al. 2019, eq. 2 and §4.1): I_h = E_x |∂ℓ(x)/∂m_h| at the current mask,
    ℓ(x) the mean NLL of sequence x, then I_h / ‖I_layer‖₂ (L2 norm over that layer's heads).
    Without an LM head: I_h = E_x ½‖∂e(x)/∂m_h‖², normalised per layer the same way.
  magnitude: ‖W_O^h‖_F, the Frobenius norm of head h's block of the output projection.
"""

from __future__ import annotations

import numpy as np
from flax import nnx

from headspec.ablation import core
from headspec.parallel import mesh as mesh_lib
from headspec.words.evalset import EvalSet
from headspec.words.resampling import bootstrap_resample_counts

LM_METRICS = ("loss", "accuracy")


def values(kind: str, per_sequence_NP, full_NP=None) -> dict[str, float]:
  """{'loss', 'accuracy'} ('lm') or {'embedding_shift'} against `full_NP` ('embedding')."""
  x = np.asarray(per_sequence_NP, np.float64)
  if kind == "lm":
    n = max(x[:, 2].sum(), 1.0)
    return {"loss": x[:, 0].sum() / n, "accuracy": x[:, 1].sum() / n}
  return {"embedding_shift": float(np.mean(1.0 - (x * np.asarray(full_NP, np.float64)).sum(-1)))}


def deltas(kind: str, full_NP, ablated_ENP, *, resamples: int, seed: int, confidence=0.95, return_boot=False):
  """{metric: (value_E, low_E, high_E)}: loss_delta and accuracy_delta ('lm') or embedding_shift;
  with `return_boot`, each tuple also holds the [R,E] bootstrap replicates (for paired comparisons)."""
  full, ablated = np.asarray(full_NP, np.float64), np.asarray(ablated_ENP, np.float64)
  counts_RN = bootstrap_resample_counts(full.shape[0], resamples, seed)
  q = [50 * (1 - confidence), 50 * (1 + confidence)]
  out = {}
  if kind == "lm":
    n, n_R = max(full[:, 2].sum(), 1.0), np.maximum(counts_RN @ full[:, 2], 1.0)
    for p, name in ((0, "loss_delta"), (1, "accuracy_delta")):
      diff_NE = (ablated[:, :, p] - full[None, :, p]).T
      value_E = diff_NE.sum(0) / n
      boot_RE = (counts_RN @ diff_NE) / n_R[:, None]
      low, high = np.percentile(boot_RE, q, axis=0)
      out[name] = (value_E, low, high) + ((boot_RE,) if return_boot else ())
    return out
  shift_NE = (1.0 - (ablated * full[None]).sum(-1)).T
  boot_RE = (counts_RN @ shift_NE) / full.shape[0]
  low, high = np.percentile(boot_RE, q, axis=0)
  out["embedding_shift"] = (shift_NE.mean(0), low, high) + ((boot_RE,) if return_boot else ())
  return out


def raw_importance(model, evalset: EvalSet, mask_LH=None, replacement_LHK=None, progress=None) -> np.ndarray:
  """[L,H] E_x |∂ℓ(x)/∂m_h| ('lm') or E_x ½‖∂e(x)/∂m_h‖² ('embedding') at `mask_LH` (default all ones)."""
  cfg = model.cfg
  mask = np.ones((cfg.num_layers, cfg.num_heads), np.float32) if mask_LH is None else mask_LH
  repl = core.zero_replacement(model) if replacement_LHK is None else replacement_LHK
  graphdef, params = nnx.split(model)
  fns = core.compiled(graphdef, evalset.kind)
  fn = fns["lm_gradient"] if evalset.kind == "lm" else fns["embedding_jacobian"]
  total, count = np.zeros(mask.shape, np.float64), 0
  for b in evalset.batches:
    g_BLH = np.asarray(fn(params, *core._arrays(b), np.asarray(mask, np.float32), repl), np.float64)
    real = b.sequence_B >= 0
    if evalset.kind == "lm":
      real &= b.weights_BT.sum(1) > 0
    total += g_BLH[real].sum(0)
    count += int(real.sum())
    if progress is not None:
      progress.update(1)
  return total / max(count, 1)


def normalise_per_layer(scores_LH) -> np.ndarray:
  """Michel et al. 2019 §4.1: each layer's scores divided by their L2 norm over the layer's heads."""
  scores = np.asarray(scores_LH, np.float64)
  return scores / np.maximum(np.linalg.norm(scores, axis=1, keepdims=True), 1e-30)


def magnitude(model) -> np.ndarray:
  """[L,H] ‖W_O^h‖_F: the Frobenius norm of each head's [K,D] block of the output projection."""
  return np.stack([np.linalg.norm(mesh_lib.to_host(b.attention.w_o_HKD[...]), axis=(1, 2)) for b in model.blocks])
