"""Linear softmax probes for many feature groups (every head, every layer) and many label sets at once.

A probe for group g and task s is multinomial logistic regression on standardised features
(Clark et al. 2019, "What Does BERT Look At?", probe per attention head; Hewitt & Liang 2019 for
control tasks and selectivity):

  p(y = c | x) = softmax_c(x̂ᵀ W_c + b_c),  x̂ = (x − mean) / std   (mean, std from train)
  W, b = argmin  (1/n) Σ_n −log p(y_n | x_n) + (λ/2) ‖W‖²_F          (bias not penalised)

which is scikit-learn's LogisticRegression(C = 1/(λ n)) on StandardScaler'd features. λ is picked per
(group, task) from `l2_grid` by dev accuracy (ties go to the stronger penalty).

How: every pass over x_NGK costs N·G·K·C multiply-adds and N·G·C exps, and on a CPU that is the
whole bill, so every (group, task, λ) probe shares each pass, in three stages:
  1. one streaming pass for sufficient statistics shared by every task: per-group mean and std,
     per-task class sums (a sparse one-hot product, no factor C) and a K×K correlation from a strided
     subset. They give a closed-form Fisher-LDA start W₀ = Σ_w⁻¹ μ_c, b₀ = log π_c − ½ μ_cᵀ W₀,c (the
     Gaussian model whose posterior is exactly a softmax-linear probe; within-class eigenvalues
     clipped at zero), kept per probe only if its objective on a subset beats the class-prior start
     (headspec/probing/probe_start.py);
  2. minibatch Adam on the exact penalised cross-entropy from that start, over `refine_samples`
     shuffled training words, with ALL tasks × groups in the same matmuls (X_b @ W[K, Σ C])
     (headspec/probing/probe_adam.py). Parameters live in whitened coordinates (W = R^(-1/2) V, R the
     feature correlation), which conditions the feature side of the Hessian (Böhning 1992 bounds it by
     ½(I − 11ᵀ/C) ⊗ R). The l2 grid is a warm-started path: all grid values share the first
     (1 − fork_fraction) of the steps at the weakest l2, then each value continues with its own penalty;
  3. full-batch L-BFGS per probe (the batched engine headspec/probing/lbfgs.py, which knows nothing of
     probes, on `ProbeProblem`: the objective, its preconditioner and the narrowing, in
     headspec/probing/probe_objective.py) until its relative decrease and its quasi-Newton decrement
     are both below `tol` (or `max_iter`), every probe with its own direction, curvature pairs, step and
     stopping test, all sharing each pass. Its initial inverse Hessian is each class's exact Hessian
     block, inverted, refreshed every PRECONDITION_EVERY iterations (`_preconditioner`), where that
     pays: on word-level features the weak-λ probes are nearly separable, and this cut the Hessian's
     condition number 150-fold and the iterations about threefold. Groups too wide for a block per
     column (384-wide residual streams) get one block per probe, its classes' average, each column
     scaled by its own curvature (`_SharedBlocks`). One iteration, line search
     included, is one compiled call and one read; stopped probes are masked (fixed shapes), and the pass narrows to the groups and
     (task, λ) column blocks still running only when that pays for a compile. A probe that ends above
     min(its start's objective, the class-prior model's) is refitted from the class prior, and the fit
     fails loudly if that does not help either.
Groups are independent, so on accelerators they are split over the local JAX devices and fitted
concurrently, one thread per device taking turns (headspec/probing/fanout.py); on a CPU host they are
fitted on one device in the calling thread (fit threads crashed jaxlib 0.10.2's CPU backend).
No library provides batched multi-task logistic regression over a group axis in JAX, hence these modules.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from headspec.errors import UserError
from headspec.probing import fanout, lbfgs, probe_adam, probe_objective, probe_start
from headspec.probing.probe_start import floored_std

__all__ = [
  "CHUNK_LOGITS",
  "DEFAULT_L2_GRID",
  "DEFAULT_MAX_ITER",
  "DEFAULT_TOL",
  "FittedProbes",
  "ProbeSpec",
  "fit_softmax_probes",
  "floored_std",
  "pass_chunk_words",
  "predict",
]

DEFAULT_L2_GRID = (1e-5, 1e-4, 1e-3)
DEFAULT_TOL = 1e-5  # L-BFGS stops a probe when its objective changes (and is predicted to change) by less, relatively
DEFAULT_MAX_ITER = 500  # L-BFGS iterations at most (each one pass over the training words; XPOS needs up to ~400)
# L-BFGS narrows its pass to the probes still running when the multiply-adds that saves (estimated) are
# worth more than compiling the step for the narrower shape (~1.4 s of a 2-core CPU). 2e11 measured best
# with preconditioning, whose probes need fewer iterations than the rule's "as many again" (issue 33)
NARROWING_COST = 2e11
CHUNK_LOGITS = 1 << 21  # logits per chunk of a full-batch pass, at most (see pass_chunk_words)


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
  accuracy of every grid value, `dev_accuracy_best[name]` (G,) the chosen one. For the chosen probe:
  `train_objective[name]` (G,) its final penalised train objective (nats per word + penalty),
  `iterations[name]` (G,) its L-BFGS iterations, `converged[name]` (G,) whether it met the tolerance;
  `start[name]` (G,) 'lda' or 'prior' (the start that scored the lower objective on a subset).
  `profile`: where the fit's time went (start_s, adam_s, lbfgs_s, dev_s seconds; group_columns: Σ over
  the full-batch passes of groups × packed weight columns in the pass, the passes' arithmetic is
  about 4·N·K·group_columns; words N, groups G, width K and columns T of the full pass), for benchmarks.
  """

  mean_GK: np.ndarray
  std_GK: np.ndarray
  weights: dict
  biases: dict
  l2: dict
  dev_accuracy: dict
  dev_accuracy_best: dict
  l2_grid: tuple
  train_objective: dict = dataclasses.field(default_factory=dict)
  iterations: dict = dataclasses.field(default_factory=dict)
  converged: dict = dataclasses.field(default_factory=dict)
  start: dict = dataclasses.field(default_factory=dict)
  profile: dict = dataclasses.field(default_factory=dict)

  def lbfgs_arithmetic(self) -> dict:
    """The L-BFGS passes' matmul arithmetic, 4·N·K·group_columns (logits xs·W and gradient xsᵀ·Z, two
    multiply-adds per weight per word), their seconds (compilation included) and the full pass's shape:
    what a benchmark needs to set the fit beside a plain matmul of the same shapes."""
    p = self.profile
    return {
      "gflop": round(4.0 * p["words"] * p["width"] * p["group_columns"] / 1e9, 3),
      "seconds": round(p["lbfgs_s"], 2),
      **{key: p[key] for key in ("words", "groups", "width", "columns")},
    }


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


def _columns(specs, num_l2):
  """Column layout of the packed weight matrix: task s, l2 index l occupy a block of C_s columns."""
  offsets, off = [], 0
  for s in specs:
    offsets.append(off)
    off += num_l2 * s.num_classes
  return offsets, off


@functools.partial(jax.jit, static_argnames=("layout", "num_l2"))
def _dev_correct(x_cGK, ys_Ac, mean_GK, std_GK, w_GKC, b_GC, layout, num_l2):
  """Per task: correct-prediction counts (G, P) and labelled-word counts for one chunk."""
  xs_GcK = jnp.transpose((x_cGK - mean_GK) / std_GK, (1, 0, 2))
  logits = jnp.einsum("gbk,gkc->gbc", xs_GcK, w_GKC) + b_GC[:, None, :]
  out = []
  for (off, c), y_c in zip(layout, ys_Ac):
    z = logits[:, :, off : off + num_l2 * c].reshape(*logits.shape[:2], num_l2, c)
    hit = (jnp.argmax(z, -1) == y_c[None, :, None]) & (y_c >= 0)[None, :, None]
    out.append(hit.sum(1))
  return out


def _lbfgs(data, params, done_GQ, *, cols, tol, max_iter, precondition=True, fetch=jax.device_get) -> lbfgs.Result:
  """L-BFGS of every probe from `params` (probes marked done_GQ stay where they are): headspec/probing/lbfgs.py
  on `probe_objective.ProbeProblem`, narrowing when the multiply-adds saved are worth NARROWING_COST."""
  problem = probe_objective.ProbeProblem(data, cols, precondition)
  return lbfgs.minimize(
    problem, params, done_GQ, tol=tol, max_iter=max_iter, fetch=fetch, narrowing_cost=NARROWING_COST
  )


@dataclasses.dataclass(frozen=True)
class _Columns:
  """The packed weight matrix: one block of C_s columns per task (the shared Adam phase at the weakest
  λ: `layout_one`), later num_l2 blocks per task (`layout`); the probe q = task·P + λ index of each
  column (block_T), its λ (l2_T), and per probe the class-prior model's objective and bias."""

  specs: tuple
  l2_P: np.ndarray
  layout_one: tuple
  total_one: int
  layout: tuple
  block_T: np.ndarray
  l2_T: np.ndarray
  onehot_TQ: np.ndarray
  inv_count_A: np.ndarray
  prior_objective_Q: np.ndarray
  prior_b_T: np.ndarray

  @classmethod
  def make(cls, specs, l2_P, per_task):
    num_l2 = len(l2_P)
    offsets_one, total_one = _columns(specs, 1)
    offsets, _ = _columns(specs, num_l2)
    layout = tuple((off, s.num_classes) for off, s in zip(offsets, specs))
    block_T = probe_objective.block_map(layout, num_l2)
    entropy = [-(pr[pr > 0] * np.log(pr[pr > 0])).sum() for _, pr in per_task]  # the prior model's objective
    return cls(
      specs,
      l2_P,
      tuple((off, s.num_classes) for off, s in zip(offsets_one, specs)),
      total_one,
      layout,
      block_T,
      l2_P[block_T % num_l2],
      np.eye(len(specs) * num_l2, dtype=np.float32)[block_T],
      np.asarray([1.0 / max((np.asarray(s.y_train_N) >= 0).sum(), 1) for s in specs], np.float32),
      np.asarray(entropy, np.float64).repeat(num_l2),
      np.concatenate([np.tile(probe_start.prior_bias(pr), num_l2) for _, pr in per_task]).astype(np.float32),
    )

  @property
  def num_l2(self):
    return len(self.l2_P)

  @property
  def pass_layout(self):
    """(first column, classes, probes) per task, as probe_objective.py's `_full_objective` reads it."""
    return tuple((off, c, self.num_l2) for off, c in self.layout)


@dataclasses.dataclass(frozen=True)
class _Fit:
  """Everything the per-device fits share: the features, statistics, starts and settings."""

  x_train_NGK: object
  cols: _Columns
  mean: np.ndarray
  std: np.ndarray
  whiten: np.ndarray
  v0: np.ndarray
  b0: np.ndarray
  order: np.ndarray | None  # (steps, batch) word indices of Adam's minibatches
  forked_steps: int
  learning_rate: float
  label_scale_A: np.ndarray
  tol: float
  max_iter: int
  pass_chunk: int
  precondition: bool


def pass_chunk_words(n: int, groups: int, columns: int, most: int = 2048) -> int:
  """Words per chunk of a full-batch pass (see _pass_data): the fewest chunks of at most L words, L the
  power of two at or below CHUNK_LOGITS / (groups·columns) kept within [256, most], each chunk a
  multiple of 64 words (the pass timings per chunk size: docs/probing_core.md, "Measurements behind the
  constants")."""
  fit = CHUNK_LOGITS // (groups * columns)
  largest = max(1, min(most, max(1 << (max(fit, 1).bit_length() - 1), 256), n))
  chunks = -(-n // largest)
  return min(largest, 64 * -(-n // (64 * chunks)))


def _pass_data(fit, g0, g1, put):
  """The device arrays of a full pass for groups g0..g1-1: standardised features in chunks (the last
  padded), group-major, words last. A chunk's logits, softmax and their gradient are a few G·T·c
  arrays, at most CHUNK_LOGITS floats so they stay in cache (pass_chunk_words), and the words are
  spread evenly over the chunks."""
  mean, std = (np.asarray(a[g0:g1], np.float32) for a in (fit.mean, fit.std))
  xs = (np.asarray(fit.x_train_NGK[:, g0:g1], np.float32) - mean) / std
  n = xs.shape[0]
  c = pass_chunk_words(n, g1 - g0, len(fit.cols.block_T), fit.pass_chunk)
  pad = -n % c
  xs = np.concatenate([xs, np.zeros((pad,) + xs.shape[1:], np.float32)]).reshape(-1, c, *xs.shape[1:])
  ys = tuple(
    np.concatenate([np.asarray(s.y_train_N, np.int32), np.full(pad, -1, np.int32)]).reshape(-1, c)
    for s in fit.cols.specs
  )
  cols = fit.cols
  return probe_objective.Pass(
    put(np.ascontiguousarray(xs.transpose(0, 2, 3, 1))),
    put(np.asarray(fit.whiten[g0:g1], np.float32)),
    tuple(put(y) for y in ys),
    put(cols.l2_T),
    put(cols.inv_count_A),
    put(cols.block_T),
    put(cols.onehot_TQ),
  )


def _lbfgs_with_refit(fit, params, data, g0, fetch, profile):
  """L-BFGS from the Adam result; a probe that ends above min(its start's objective, the class-prior
  model's) is refitted from the class prior, and if that fails too the fit fails loudly. Success is
  decided on the penalised objective, never on accuracy (an uninformative group legitimately sits at
  the majority rate)."""
  cols = fit.cols
  run = functools.partial(
    _lbfgs, data, cols=cols, tol=fit.tol, max_iter=fit.max_iter, precondition=fit.precondition, fetch=fetch
  )
  params, f, iters, conv, f_start, passes = run(
    params, np.zeros((params[1].shape[0], len(cols.prior_objective_Q)), bool)
  )
  profile["group_columns"] += passes
  bound = np.minimum(f_start, cols.prior_objective_Q[None, :])
  failed = ~(f <= bound + 1e-4 * np.abs(bound) + 1e-6)
  if failed.any() and fit.max_iter > 0:
    fail_T = failed[:, cols.block_T]
    restart = (np.where(fail_T[:, None, :], 0.0, params[0]), np.where(fail_T, cols.prior_b_T[None, :], params[1]))
    params2, f2, iters2, conv2, _, passes = run(jax.device_put(restart, data.l2_T.device), ~failed)
    profile["group_columns"] += passes
    params = (np.where(fail_T[:, None, :], params2[0], params[0]), np.where(fail_T, params2[1], params[1]))
    f, iters, conv = np.where(failed, f2, f), np.where(failed, iters + iters2, iters), np.where(failed, conv2, conv)
    failed = ~(f <= bound + 1e-4 * np.abs(bound) + 1e-6)
  if failed.any():
    g_bad, q_bad = np.argwhere(failed)[0]
    raise RuntimeError(
      f"softmax probe fit failed for {failed.sum()} probe(s), e.g. group {g0 + g_bad}, task "
      f"{cols.specs[q_bad // cols.num_l2].name}, l2 {cols.l2_P[q_bad % cols.num_l2]:g}: objective {f[g_bad, q_bad]:.6g} "
      f"is above min(start {f_start[g_bad, q_bad]:.6g}, class prior {cols.prior_objective_Q[q_bad]:.6g})"
    )
  return params, f, iters, conv


def _fit_groups(fit, g0, g1, device, fetch, profile):
  """Adam, then L-BFGS, for groups g0..g1-1 on one device: (v, b, f_GQ, iterations_GQ, converged_GQ)."""
  put = lambda a: jax.device_put(a, device)
  clock = time.perf_counter()
  params = probe_adam.adam(fit, g0, g1, put)
  jax.block_until_ready(params)
  profile["adam_s"] += time.perf_counter() - clock
  clock = time.perf_counter()
  params, f, iters, conv = _lbfgs_with_refit(fit, params, _pass_data(fit, g0, g1, put), g0, fetch, profile)
  profile["lbfgs_s"] += time.perf_counter() - clock
  return (np.asarray(params[0]), np.asarray(params[1]), f, iters, conv)


def _fit_all_groups(fit, num_g, max_devices, profile):
  """Groups are independent: split over the local devices (headspec/probing/fanout.py)."""
  return fanout.over_devices(
    lambda g0, g1, device, fetch: _fit_groups(fit, g0, g1, device, fetch, profile), num_g, max_devices
  )


def _choose_on_dev(x_dev_NGK, cols, mean, std, whiten, v, b, chunk):
  """Dev accuracy of every (group, task, λ) and per task the chosen λ (ties go to the larger λ):
  {name: (acc_GP, best_G)}, and W_GKT, b_GT in standardised coordinates."""
  w_GKT = np.einsum("gkl,glc->gkc", whiten.astype(np.float32), v)
  mean_j, std_j, b_j = mean.astype(np.float32), std.astype(np.float32), b
  hits = [np.zeros((mean.shape[0], cols.num_l2)) for _ in cols.specs]
  for x, _, ys in _chunks(x_dev_NGK, [s.y_dev_N for s in cols.specs], chunk):
    for h, c in zip(hits, _dev_correct(x, ys, mean_j, std_j, w_GKT, b_j, cols.layout, cols.num_l2)):
      h += np.asarray(c)
  chosen = {}
  for s, h in zip(cols.specs, hits):
    acc = h / max((np.asarray(s.y_dev_N) >= 0).sum(), 1)
    chosen[s.name] = (acc, cols.num_l2 - 1 - np.argmax(acc[:, ::-1], axis=1))
  return chosen, np.asarray(w_GKT), np.asarray(b_j)


def _fitted(cols, mean, std, chosen, w, b, f_GQ, iters_GQ, conv_GQ, starts, profile):
  """FittedProbes of the chosen λ per (group, task)."""
  num_g = mean.shape[0]
  out = {
    key: {}
    for key in (
      "weights",
      "biases",
      "l2",
      "dev_accuracy",
      "dev_accuracy_best",
      "train_objective",
      "iterations",
      "converged",
    )
  }
  for a, (s, (off, c)) in enumerate(zip(cols.specs, cols.layout)):
    acc, best = chosen[s.name]
    col_GC = off + best[:, None] * c + np.arange(c)[None, :]
    q = a * cols.num_l2 + best
    out["weights"][s.name] = np.take_along_axis(w, col_GC[:, None, :], axis=2)
    out["biases"][s.name] = np.take_along_axis(b, col_GC, axis=1)
    out["l2"][s.name] = cols.l2_P[best]
    out["dev_accuracy"][s.name] = acc
    out["dev_accuracy_best"][s.name] = acc[np.arange(num_g), best]
    out["train_objective"][s.name] = f_GQ[np.arange(num_g), q]
    out["iterations"][s.name] = iters_GQ[np.arange(num_g), q]
    out["converged"][s.name] = conv_GQ[np.arange(num_g), q]
  return FittedProbes(
    mean.astype(np.float32),
    std.astype(np.float32),
    l2_grid=tuple(float(v) for v in cols.l2_P),
    start=starts,
    profile=profile,
    **out,
  )


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
  tol: float = DEFAULT_TOL,
  max_iter: int = DEFAULT_MAX_ITER,
  pass_chunk: int = 2048,
  precondition: bool = True,
  choose_with: dict[str, str] | None = None,
) -> FittedProbes:
  """Fits one softmax probe per (group, task) and picks its L2 on dev; see the module docstring.

  x_train_NGK / x_dev_NGK: float features (numpy or jax), G groups of K dims (heads: K = Dh; the
  residual stream: K = D, call again). Adam takes refine_samples / batch_size steps over shuffled
  training words (several passes only if refine_samples > N; 0: none), then full-batch L-BFGS runs
  every (group, task, l2) probe until an iteration lowers its penalised objective by less than
  tol (relative), at most max_iter iterations (0: no L-BFGS). A probe whose final objective is above
  its start's or the class-prior-only model's is refitted from the class prior; if that fails too,
  RuntimeError. precondition: L-BFGS with the class-block preconditioner (where it fits in memory;
  False: the plain γ·I start, for comparisons). choose_with {name: other}: the probe `name` keeps, per group,
  the λ chosen on `other`'s dev accuracy (Hewitt & Liang 2019: a control fitted at its task's λ).
  Deterministic given `seed`.
  """
  _check(x_train_NGK, x_dev_NGK, specs)
  names = {s.name for s in specs}
  for name, other in (choose_with or {}).items():
    if name not in names or other not in names:
      raise UserError(f"choose_with {name!r}: {other!r}: both must name one of the specs {sorted(names)}")
  specs = tuple(specs)
  profile = dict(adam_s=0.0, lbfgs_s=0.0, group_columns=0)
  clock = time.perf_counter()
  l2_P = np.asarray(sorted(l2_grid), np.float32)
  mean, std, corr, per_task, sub_idx = probe_start.statistics(x_train_NGK, specs, chunk, cov_samples)
  whiten, unwhiten = probe_start.whitening(corr)
  cols = _Columns.make(specs, l2_P, per_task)
  v0, b0, kinds = probe_start.starts(x_train_NGK, cols, corr, per_task, sub_idx, mean, std, unwhiten, lda_ridge)
  profile["start_s"] = time.perf_counter() - clock
  n = x_train_NGK.shape[0]
  profile.update(words=n, groups=x_train_NGK.shape[1], width=x_train_NGK.shape[2], columns=len(cols.block_T))
  steps = refine_samples // batch_size
  frac_labelled = [max((np.asarray(s.y_train_N) >= 0).mean(), 1e-12) for s in specs]
  fit = _Fit(
    x_train_NGK,
    cols,
    mean,
    std,
    whiten,
    v0,
    b0,
    probe_adam.adam_order(n, steps, batch_size, seed),
    int(round(steps * fork_fraction)) if len(l2_P) > 1 else 0,
    learning_rate,
    np.asarray([1.0 / (batch_size * f) for f in frac_labelled], np.float32),
    tol,
    max_iter,
    pass_chunk,
    precondition,
  )
  v, b, f_GQ, iters_GQ, conv_GQ = _fit_all_groups(fit, mean.shape[0], max_devices, profile)
  clock = time.perf_counter()
  chosen, w, b = _choose_on_dev(x_dev_NGK, cols, mean, std, whiten, v, b, chunk)
  chosen |= {name: (chosen[name][0], chosen[other][1]) for name, other in (choose_with or {}).items()}
  profile["dev_s"] = time.perf_counter() - clock
  return _fitted(cols, mean, std, chosen, w, b, f_GQ, iters_GQ, conv_GQ, kinds, profile)


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
