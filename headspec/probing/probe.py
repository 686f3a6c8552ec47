"""Linear softmax probes for many feature groups (every head, every layer) and many label sets at once.

A probe for group g and task s is multinomial logistic regression on standardised features
(Clark et al. 2019, "What Does BERT Look At?", probe per attention head; Hewitt & Liang 2019 for
control tasks and selectivity):

  p(y = c | x) = softmax_c(x̂ᵀ W_c + b_c),  x̂ = (x − mean) / std   (mean, std from train)
  W, b = argmin  (1/n) Σ_n −log p(y_n | x_n) + (λ/2) ‖W‖²_F          (bias not penalised)

which is scikit-learn's LogisticRegression(C = 1/(λ n)) on StandardScaler'd features. λ is picked per
(group, task) from `l2_grid` by dev accuracy (ties go to the stronger penalty).

Why not one L-BFGS per probe: every pass over x_NGK costs N·G·K·C multiply-adds and N·G·C exps, and on
a CPU that is the whole bill (scikit-learn's lbfgs makes ~100 such passes per probe). This fit reads
the data about twice in all:
  1. one streaming pass for sufficient statistics shared by every task: per-group mean and std,
     per-task class sums (a sparse one-hot product, no factor C) and a K×K correlation from a strided
     subset. They give a closed-form Fisher-LDA start W₀ = Σ_w⁻¹ μ_c, b₀ = log π_c − ½ μ_cᵀ W₀,c (the
     Gaussian model whose posterior is exactly a softmax-linear probe), within ~1–3 points of the
     logistic-regression optimum;
  2. minibatch Adam on the exact penalised cross-entropy from that start, over `refine_samples`
     shuffled training words (default: about one pass of EWT), with ALL tasks × groups in the same
     matmuls (X_b @ W[K, Σ C]) so each minibatch is read once. Parameters live in whitened coordinates
     (W = R^(-1/2) V, R the feature correlation), which conditions the feature side of the Hessian
     (Böhning 1992 bounds it by ½(I − 11ᵀ/C) ⊗ R). The l2 grid is a warm-started path: all grid values
     share the first (1 − fork_fraction) of the steps at the weakest l2, then each value continues
     from there with its own penalty (so the grid costs 1 + fork_fraction·(L − 1) times one fit).
Groups are independent, so they are split over the local JAX devices and fitted concurrently; a CPU
device runs one program at a time on one core, so on a CPU host set
XLA_FLAGS=--xla_force_host_platform_device_count=<cores> before JAX starts to use every core.
No library provides batched multi-task logistic regression over a group axis in JAX, hence this file.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax
import scipy.sparse

from headspec.errors import UserError

DEFAULT_L2_GRID = (1e-5, 1e-4, 1e-3)
_EMPTY_CLASS_BIAS = -30.0  # log-prior of a class absent from train: never predicted


@dataclasses.dataclass(frozen=True)
class ProbeSpec:
  """One label set over the words: int labels in [0, num_classes), -1 = ignore this word."""

  name: str
  num_classes: int
  y_train_N: np.ndarray
  y_dev_N: np.ndarray


@dataclasses.dataclass(frozen=True)
class FittedProbes:
  """Fitted probes: per task `weights[name]` W_GKC and `biases[name]` b_GC act on standardised x.

  `l2[name]` (G,) is the chosen penalty per group; `dev_accuracy[name]` (G, len(l2_grid)) the dev
  accuracy of every grid value, `dev_accuracy_best[name]` (G,) the chosen one.
  """

  mean_GK: np.ndarray
  std_GK: np.ndarray
  weights: dict
  biases: dict
  l2: dict
  dev_accuracy: dict
  dev_accuracy_best: dict
  l2_grid: tuple


def _check(x_train_NGK, x_dev_NGK, specs):
  if x_train_NGK.ndim != 3 or x_dev_NGK.ndim != 3 or x_train_NGK.shape[1:] != x_dev_NGK.shape[1:]:
    raise UserError(
      f"probe features must be x_NGK with equal G, K for train and dev; got {x_train_NGK.shape} and {x_dev_NGK.shape}"
    )
  names = [s.name for s in specs]
  if not specs or len(set(names)) != len(names):
    raise UserError(f"probe specs need distinct names, got {names}")
  for s in specs:
    for split, y, x in (("train", s.y_train_N, x_train_NGK), ("dev", s.y_dev_N, x_dev_NGK)):
      y = np.asarray(y)
      if y.shape != (x.shape[0],):
        raise UserError(f"probe task {s.name}: {split} labels have shape {y.shape}, features have N={x.shape[0]}")
      if y.size and (y.min() < -1 or y.max() >= s.num_classes):
        raise UserError(f"probe task {s.name}: {split} labels outside [-1, {s.num_classes})")
    if not (np.asarray(s.y_train_N) >= 0).any():
      raise UserError(f"probe task {s.name}: no labelled training word")


@jax.jit
def _second_moment(x_cGK, shift_GK):
  xg_GcK = jnp.transpose(x_cGK - shift_GK, (1, 0, 2))
  return jnp.einsum("gck,gcl->gkl", xg_GcK, xg_GcK)


def _statistics(x_NGK, specs, chunk, cov_samples):
  """mean, std, correlation of x (float64) and per-task standardised class means / priors.

  One streaming pass in NumPy (XLA's CPU reductions and scatters are slower here): shifted sums and
  sums of squares, and class sums as a sparse one-hot product (nnz = N, so no factor C). The K×K
  correlation only whitens and shapes the LDA start, so it uses an evenly strided subset of about
  cov_samples words (a full pass would cost K times more than everything else here).
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
  std = np.sqrt(np.maximum(s2 / n - m1**2, 0.0))
  std = np.where(std > 1e-6 * max(std.max(), 1e-30), std, 1.0)  # constant features stay unscaled
  sub = np.asarray(x_NGK[:: max(1, n // cov_samples)], np.float32)
  sub_m1 = sub.mean(0, dtype=np.float64) - shift_GK
  cov = np.asarray(_second_moment(sub, shift_GK), np.float64) / len(sub) - np.einsum("gk,gl->gkl", sub_m1, sub_m1)
  sub_std = np.sqrt(np.maximum(np.einsum("gkk->gk", cov), 1e-30))
  corr = cov / (sub_std[:, :, None] * sub_std[:, None, :])
  per_task = []
  for spec, cs, cc in zip(specs, sums, counts):
    cs = cs.reshape(spec.num_classes, *mean.shape)
    # class means in standardised coordinates; empty classes get mean 0 and prior 0
    mu_CGK = (cs / np.maximum(cc, 1.0)[:, None, None] - mean) / std * (cc > 0)[:, None, None]
    per_task.append((mu_CGK, cc / cc.sum()))
  return mean, std, corr, per_task


def _chunks(x_NGK, ys, chunk):
  """Yields (x_cGK, weight_c, labels) chunks of equal size (≤ chunk, a multiple of 256 so few shapes
  compile), zero-padding the last one; weight 0 and label -1 mark the padding."""
  n = x_NGK.shape[0]
  # equal chunks of at most `chunk` words, each rounded up to a multiple of 256
  per_chunk = math.ceil(n / math.ceil(n / chunk)) if n else chunk
  size = min(chunk, math.ceil(per_chunk / 256) * 256)
  for start in range(0, n, size):
    stop = min(start + size, n)
    x, w = np.asarray(x_NGK[start:stop], np.float32), np.ones(stop - start, np.float32)
    y = [np.asarray(y_N[start:stop], np.int32) for y_N in ys]
    if stop - start < size:
      pad = size - (stop - start)
      x = np.concatenate([x, np.zeros((pad,) + x.shape[1:], np.float32)])
      w = np.concatenate([w, np.zeros(pad, np.float32)])
      y = [np.concatenate([v, np.full(pad, -1, np.int32)]) for v in y]
    yield x, w, y


def _lda_start(corr_GKK, mu_CGK, prior_C, ridge):
  """Fisher LDA weights in standardised coordinates: W = Σ_w⁻¹ μ_c, b = log π_c − ½ μ_cᵀ W_c."""
  mbar_GK = np.einsum("c,cgk->gk", prior_C, mu_CGK)
  d_CGK = mu_CGK - mbar_GK
  within_GKK = corr_GKK - np.einsum("c,cgk,cgl->gkl", prior_C, d_CGK, d_CGK)
  k = corr_GKK.shape[-1]
  w_GKC = np.linalg.solve(within_GKK + ridge * np.eye(k), np.transpose(mu_CGK, (1, 2, 0)))
  quad_GC = np.einsum("cgk,gkc->gc", mu_CGK, w_GKC)
  b_GC = np.where(prior_C > 0, np.log(np.maximum(prior_C, 1e-300)), _EMPTY_CLASS_BIAS) - 0.5 * quad_GC
  b_GC = b_GC - b_GC.max(-1, keepdims=True)
  return w_GKC, b_GC


def _columns(specs, num_l2):
  """Column layout of the packed weight matrix: task s, l2 index l occupy a block of C_s columns."""
  offsets, off = [], 0
  for s in specs:
    offsets.append(off)
    off += num_l2 * s.num_classes
  return offsets, off


def _logits_GBC(xs_GBK, whiten_GKK, v_GKC, b_GC):
  w_GKC = jnp.einsum("gkl,glc->gkc", whiten_GKK, v_GKC)
  return jnp.einsum("gbk,gkc->gbc", xs_GBK, w_GKC) + b_GC[:, None, :]


def _loss(params, xs_GBK, ys_SB, whiten_GKK, l2_L, label_scale_S, layout):
  """Σ over tasks and L2 values of the mean cross-entropy + (λ/2)‖W‖² (exact, per column block)."""
  v_GKC, b_GC = params
  logits_GBC = _logits_GBC(xs_GBK, whiten_GKK, v_GKC, b_GC)
  w_GKC = jnp.einsum("gkl,glc->gkc", whiten_GKK, v_GKC)
  total = 0.0
  num_l2 = l2_L.shape[0]
  for (off, c), y_B, scale in zip(layout, ys_SB, label_scale_S):
    z_GBLC = logits_GBC[:, :, off : off + num_l2 * c].reshape(*logits_GBC.shape[:2], num_l2, c)
    lse_GBL = jax.nn.logsumexp(z_GBLC, axis=-1)
    picked_GBL = jnp.take_along_axis(z_GBLC, jnp.maximum(y_B, 0)[None, :, None, None], axis=-1)[..., 0]
    nll = ((lse_GBL - picked_GBL) * (y_B >= 0)[None, :, None]).sum() * scale
    w_GKLC = w_GKC[:, :, off : off + num_l2 * c].reshape(*w_GKC.shape[:2], num_l2, c)
    total = total + nll + 0.5 * jnp.einsum("l,gklc->", l2_L, jnp.square(w_GKLC))
  return total


def _optimizer(learning_rate, total_steps):
  return optax.adam(optax.cosine_decay_schedule(learning_rate, max(total_steps, 1)))


@functools.partial(jax.jit, static_argnames=("layout", "learning_rate", "total_steps", "groups"))
def _refine(
  params,
  opt_state,
  x_NGK,
  ys_SN,
  order_TB,
  mean_GK,
  std_GK,
  whiten_GKK,
  l2_L,
  label_scale_S,
  *,
  layout,
  learning_rate,
  total_steps,
  groups,
):
  """Minibatch Adam over the words in order_TB (T steps of B words), cosine-decayed over total_steps,
  for the groups in range(*groups) of x_NGK (params and statistics hold just those groups)."""
  opt = _optimizer(learning_rate, total_steps)
  grad_fn = jax.grad(_loss)

  def step(carry, idx_B):
    params, opt_state = carry
    xs_GBK = jnp.transpose((x_NGK[idx_B, groups[0] : groups[1]] - mean_GK) / std_GK, (1, 0, 2))
    ys_SB = tuple(y_N[idx_B] for y_N in ys_SN)
    grads = grad_fn(params, xs_GBK, ys_SB, whiten_GKK, l2_L, label_scale_S, layout)
    updates, opt_state = opt.update(grads, opt_state, params)
    return (optax.apply_updates(params, updates), opt_state), None

  return jax.lax.scan(step, (params, opt_state), order_TB)[0]


def _fork_columns(tree, layout_one, num_l2, total_one):
  """Copies every task's column block num_l2 times (arrays whose last axis is the packed columns)."""

  def fork(a):
    if getattr(a, "ndim", 0) == 0 or a.shape[-1] != total_one:
      return a
    return jnp.concatenate([jnp.concatenate([a[..., off : off + c]] * num_l2, axis=-1) for off, c in layout_one], -1)

  return jax.tree_util.tree_map(fork, tree)


@functools.partial(jax.jit, static_argnames=("layout", "num_l2"))
def _dev_correct(x_cGK, ys_Sc, mean_GK, std_GK, w_GKC, b_GC, layout, num_l2):
  """Per task: correct-prediction counts (G, L) and labelled-word counts for one chunk."""
  xs_GcK = jnp.transpose((x_cGK - mean_GK) / std_GK, (1, 0, 2))
  logits = jnp.einsum("gbk,gkc->gbc", xs_GcK, w_GKC) + b_GC[:, None, :]
  out = []
  for (off, c), y_c in zip(layout, ys_Sc):
    z = logits[:, :, off : off + num_l2 * c].reshape(*logits.shape[:2], num_l2, c)
    hit = (jnp.argmax(z, -1) == y_c[None, :, None]) & (y_c >= 0)[None, :, None]
    out.append(hit.sum(1))
  return out


def fit_softmax_probes(
  x_train_NGK,
  x_dev_NGK,
  specs: Sequence[ProbeSpec],
  *,
  l2_grid: Sequence[float] = DEFAULT_L2_GRID,
  seed: int = 0,
  refine_samples: int = 200_000,
  batch_size: int = 2048,
  learning_rate: float = 3e-2,
  fork_fraction: float = 0.25,
  cov_samples: int = 32768,
  lda_ridge: float = 1e-3,
  chunk: int = 8192,
  max_devices: int | None = None,
) -> FittedProbes:
  """Fits one softmax probe per (group, task) and picks its L2 on dev; see the module docstring.

  x_train_NGK / x_dev_NGK: float features (numpy or jax), G groups of K dims (heads: K = Dh; the
  residual stream: K = D, call again). Adam takes refine_samples / batch_size steps over shuffled
  training words (several passes only if refine_samples > N); 0 gives the closed-form LDA probe.
  Deterministic given `seed`.
  """
  _check(x_train_NGK, x_dev_NGK, specs)
  specs = tuple(specs)
  l2_L = np.asarray(sorted(l2_grid), np.float32)
  num_l2 = len(l2_L)
  mean, std, corr, per_task = _statistics(x_train_NGK, specs, chunk, cov_samples)
  num_g, k = mean.shape

  # Whitening A = (R + εI)^(-1/2) of the correlation matrix R, per group.
  evals, evecs = np.linalg.eigh(corr + 1e-6 * np.eye(k))
  evals = np.maximum(evals, 1e-4 * evals.max(-1, keepdims=True))
  whiten = np.einsum("gkj,gj,glj->gkl", evecs, evals**-0.5, evecs)
  unwhiten = np.einsum("gkj,gj,glj->gkl", evecs, evals**0.5, evecs)

  # Packed columns: first one block per task (shared phase at the weakest l2), later num_l2 blocks.
  offsets_one, total_one = _columns(specs, 1)
  layout_one = tuple((off, s.num_classes) for off, s in zip(offsets_one, specs))
  offsets, total_c = _columns(specs, num_l2)
  layout = tuple((off, s.num_classes) for off, s in zip(offsets, specs))
  v0 = np.zeros((num_g, k, total_one), np.float32)
  b0 = np.zeros((num_g, total_one), np.float32)
  for (off, c), (mu, prior) in zip(layout_one, per_task):
    w, b = _lda_start(corr, mu, prior, lda_ridge)
    v0[:, :, off : off + c] = np.einsum("gkl,glc->gkc", unwhiten, w)
    b0[:, off : off + c] = b

  n = x_train_NGK.shape[0]
  steps = refine_samples // batch_size
  forked_steps = int(round(steps * fork_fraction)) if num_l2 > 1 else 0
  opt = _optimizer(learning_rate, steps)
  if steps > 0:
    # consecutive shuffles of the training words (more than one pass only when refine_samples > N)
    keys = jax.random.split(jax.random.PRNGKey(seed), -(-steps * batch_size // n))
    order = np.concatenate([np.asarray(jax.random.permutation(key, n)) for key in keys])[: steps * batch_size]
    order = order.reshape(steps, batch_size)
    frac_labelled = [max((np.asarray(s.y_train_N) >= 0).mean(), 1e-12) for s in specs]
    label_scale = np.asarray([1.0 / (batch_size * f) for f in frac_labelled], np.float32)

  def fit_groups(g0, g1, device):
    """Both phases for groups g0..g1-1 on one device (a CPU device runs one program at a time)."""
    put = lambda a: jax.device_put(a, device)
    params = (put(v0[g0:g1]), put(b0[g0:g1]))
    opt_state = opt.init(params)
    if steps == 0:
      return jax.device_get(_fork_columns(params, layout_one, num_l2, total_one))
    stats = tuple(put(np.asarray(a[g0:g1], np.float32)) for a in (mean, std, whiten))
    x_part = put(np.asarray(x_train_NGK[:, g0:g1], np.float32))
    data = (tuple(put(np.asarray(s.y_train_N, np.int32)) for s in specs), put(order), put(label_scale))
    common = dict(learning_rate=learning_rate, total_steps=steps, groups=(0, g1 - g0))
    if steps - forked_steps > 0:
      params, opt_state = _refine(
        params,
        opt_state,
        x_part,
        data[0],
        data[1][: steps - forked_steps],
        *stats,
        put(l2_L[:1]),
        data[2],
        layout=layout_one,
        **common,
      )
    params, opt_state = _fork_columns((params, opt_state), layout_one, num_l2, total_one)
    if forked_steps > 0:
      params, opt_state = _refine(
        params,
        opt_state,
        x_part,
        data[0],
        data[1][steps - forked_steps :],
        *stats,
        put(l2_L),
        data[2],
        layout=layout,
        **common,
      )
    return jax.device_get(params)

  # Groups are independent: split them over the local devices (on a CPU host, run with
  # XLA_FLAGS=--xla_force_host_platform_device_count=<cores> to use every core).
  devices = jax.local_devices()[: max(1, min(num_g, max_devices or num_g))]
  bounds = np.linspace(0, num_g, len(devices) + 1).round().astype(int)
  with concurrent.futures.ThreadPoolExecutor(len(devices)) as pool:
    parts = list(pool.map(fit_groups, bounds[:-1], bounds[1:], devices))
  params = tuple(jnp.concatenate([p[i] for p in parts]) for i in range(2))
  mean_j, std_j = jnp.asarray(mean, jnp.float32), jnp.asarray(std, jnp.float32)
  whiten_j = jnp.asarray(whiten, jnp.float32)
  w_GKC = jnp.einsum("gkl,glc->gkc", whiten_j, params[0])
  b_GC = params[1]

  # Dev accuracy of every (group, task, l2); ties go to the larger l2.
  hits = [np.zeros((num_g, num_l2)) for _ in specs]
  for x, _, ys in _chunks(x_dev_NGK, [s.y_dev_N for s in specs], chunk):
    for h, c in zip(hits, _dev_correct(x, ys, mean_j, std_j, w_GKC, b_GC, layout, num_l2)):
      h += np.asarray(c)
  w_np, b_np = np.asarray(w_GKC), np.asarray(b_GC)
  weights, biases, l2, dev_acc, dev_best = {}, {}, {}, {}, {}
  for s, (off, c), h in zip(specs, layout, hits):
    acc = h / max((np.asarray(s.y_dev_N) >= 0).sum(), 1)
    best = num_l2 - 1 - np.argmax(acc[:, ::-1], axis=1)
    cols = off + best[:, None] * c + np.arange(c)[None, :]  # (G, C)
    weights[s.name] = np.take_along_axis(w_np, cols[:, None, :], axis=2)
    biases[s.name] = np.take_along_axis(b_np, cols, axis=1)
    l2[s.name] = l2_L[best]
    dev_acc[s.name] = acc
    dev_best[s.name] = acc[np.arange(num_g), best]
  return FittedProbes(
    mean.astype(np.float32),
    std.astype(np.float32),
    weights,
    biases,
    l2,
    dev_acc,
    dev_best,
    tuple(float(v) for v in l2_L),
  )


@jax.jit
def _predict_chunk(x_cGK, mean_GK, std_GK, w_GKC, b_GC):
  xs_GcK = jnp.transpose((x_cGK - mean_GK) / std_GK, (1, 0, 2))
  return jnp.argmax(jnp.einsum("gbk,gkc->gbc", xs_GcK, w_GKC) + b_GC[:, None, :], -1).T


def predict(fitted: FittedProbes, x_NGK, spec_name: str, *, chunk: int = 8192) -> np.ndarray:
  """Predicted class pred_NG (int32) of task `spec_name` for every word and group."""
  if spec_name not in fitted.weights:
    raise UserError(f"no fitted probe named {spec_name!r}; have {sorted(fitted.weights)}")
  w, b = jnp.asarray(fitted.weights[spec_name]), jnp.asarray(fitted.biases[spec_name])
  mean, std = jnp.asarray(fitted.mean_GK), jnp.asarray(fitted.std_GK)
  out = [np.asarray(_predict_chunk(x, mean, std, w, b))[: int(wt.sum())] for x, wt, _ in _chunks(x_NGK, [], chunk)]
  return np.concatenate(out).astype(np.int32) if out else np.zeros((0, fitted.mean_GK.shape[0]), np.int32)
