"""Training an SAE with optax: `fit_sae(x_NK, features=..., kind=..., ...)` -> SAE.

Losses, on scaled inputs (`normalize`), the scales folded back so that the returned SAE encodes and decodes
raw activations:
  global    one number s with E‖x/s‖² = K, x at unit RMS (SAELens's `normalize_activations=
            'expected_average_only_in'` sets E‖x‖ = √K instead); folded into b_enc, b_dec (and θ): f scales by s.
  per_head  each head's block of K/H coordinates divided by its own RMS s_h = √(E‖x_h‖² / (K/H)) on the
            training inputs, so a head whose z is small weighs as much in the loss as any other (with
            one scale, a head's share of the features follows its output scale). With s_K each
            coordinate's s_h and s the global scale (s² = mean_h s_h²): W_enc ← diag(s/s_K) W_enc, b_enc ← s·b_enc,
            W_dec ← W_dec diag(s_K/s), b_dec ← s_K ⊙ b_dec, θ ← s·θ, so f scales by s, as with `global`.
  topk   Gao et al. 2024: NMSE(x, x̂) + α·NMSE(e, ê), NMSE(a, b) = Σ‖a − b‖² / Σ‖a − mean(a)‖² over the batch.
         The AuxK term: e = x − x̂ (no gradient), ê = W_dec·TopK_{k_aux}(pre-activations of the dead latents),
         a latent being dead once it has not fired for `dead_after_tokens` training inputs; α = 1/32, k_aux
         = K/2 by default (Gao et al. use 512 for their widths).
  relu   Bricken et al. 2023: mean ‖x − x̂‖² + λ·mean ‖f‖₁.
  jumprelu  Rajamanoharan et al. 2024: mean ‖x − x̂‖² + λ₀·mean ‖f‖₀ with f = π·H(π − θ), θ = exp(log θ)
         learned per feature through straight-through estimators with a rectangle kernel K of bandwidth ε:
         ∂f/∂θ := −(θ/ε)·K((π − θ)/ε), ∂H(π − θ)/∂θ := −(1/ε)·K((π − θ)/ε), no gradient to π through H
         (their eqs. 11–12); θ starts at `threshold_init`. ε and θ are on the scaled inputs (coordinates of
         unit size): the paper's ε = 0.001 is on inputs of unit norm; 0.2 here trains in a few thousand steps.
Both keep every decoder row at unit norm: the gradient's component along the row is removed before the
optimizer step and the row is renormalised after it (Bricken et al. 2023; Gao et al. 2024 §A.1). The
encoder starts as the decoder's transpose (Gao et al. 2024), b_enc at 0, b_dec at the geometric median
(Weiszfeld's iteration, as Bricken et al.) or the mean of the inputs. Adam, global-norm clipping at 1, a
learning rate with linear warmup and then constant, linear decay to 0 over the last `decay_fraction`
(Bricken et al.'s "linear_decay"), or cosine decay.

One jitted program runs `chunk` steps (`lax.scan` of the jitted step function); batches are drawn with
replacement from a seeded generator per step, so a run resumed from its Orbax checkpoint (every
`checkpoint_every` steps in `checkpoint_dir`) continues exactly as an uninterrupted one.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

from headspec import arguments as args
from headspec.errors import UserError
from headspec.io import locks
from headspec.parallel import compilations
from headspec.sae import model as sae_model

SCHEDULES = ("constant", "linear_decay", "cosine")
NORMALIZATIONS = ("global", "per_head")
B_DEC_INITS = ("geometric_median", "mean")


@dataclasses.dataclass(frozen=True)
class Options:
  """Everything that shapes training (module docstring). aux_k = 0: K // 2."""

  features: int
  kind: str = "topk"
  k: int = 32
  l1: float = 5.0
  l0: float = 1.0
  bandwidth: float = 0.2
  threshold_init: float = 0.5
  steps: int = 2000
  batch_size: int = 1024
  lr: float = 1e-3
  lr_schedule: str = "linear_decay"
  warmup_steps: int = 100
  decay_fraction: float = 0.2
  b_dec_init: str = "geometric_median"
  aux_k: int = 0
  aux_coefficient: float = 1 / 32
  dead_after_tokens: int = 100_000
  seed: int = 0
  chunk: int = 50
  normalize: str = "global"
  heads: int = 0


def check_options(o: Options, where: str = "fit_sae") -> None:
  """UserError naming the first bad option."""
  if isinstance(o.features, bool) or not isinstance(o.features, int | np.integer) or o.features <= 0:
    raise UserError(f"{where}: features={o.features!r} must be a positive number of SAE features")
  from headspec import bounds
  from headspec.sae.config import FIT_BOUNDS

  bounds.check(dataclasses.asdict(o), FIT_BOUNDS, where)  # NaN, inf, absurd sizes
  if o.kind not in sae_model.KINDS:
    raise UserError(f"{where}: kind={o.kind!r}; choose one of {', '.join(sae_model.KINDS)}")
  if o.kind == "topk" and not 1 <= o.k <= o.features:
    raise UserError(f"{where}: k={o.k} must be between 1 and features={o.features} (active features per input)")
  if o.kind == "relu" and not o.l1 >= 0:
    raise UserError(f"{where}: l1={o.l1} must be >= 0")
  if o.kind == "jumprelu" and not (o.l0 >= 0 and o.bandwidth > 0 and o.threshold_init > 0):
    raise UserError(
      f"{where}: l0={o.l0} must be >= 0, bandwidth={o.bandwidth} and threshold_init={o.threshold_init} > 0"
    )
  for name in ("steps", "batch_size", "chunk"):
    if getattr(o, name) < 1:
      raise UserError(f"{where}: {name}={getattr(o, name)} must be at least 1")
  if not o.lr > 0:
    raise UserError(f"{where}: lr={o.lr} must be positive")
  if o.lr_schedule not in SCHEDULES:
    raise UserError(f"{where}: lr_schedule={o.lr_schedule!r}; choose one of {', '.join(SCHEDULES)}")
  if not 0 <= o.decay_fraction <= 1 or o.warmup_steps < 0:
    raise UserError(f"{where}: decay_fraction={o.decay_fraction} must be in [0, 1], warmup_steps={o.warmup_steps} >= 0")
  if o.b_dec_init not in B_DEC_INITS:
    raise UserError(f"{where}: b_dec_init={o.b_dec_init!r}; choose one of {', '.join(B_DEC_INITS)}")
  if o.aux_k < 0 or o.aux_coefficient < 0 or o.dead_after_tokens < 1:
    raise UserError(f"{where}: aux_k, aux_coefficient must be >= 0 and dead_after_tokens >= 1")
  if o.normalize not in NORMALIZATIONS:
    raise UserError(f"{where}: normalize={o.normalize!r}; choose one of {', '.join(NORMALIZATIONS)}")
  if o.normalize == "per_head" and o.heads < 1:
    raise UserError(f"{where}: normalize='per_head' needs heads >= 1 (the heads the input width splits into)")


def check_activations(x_NK, where: str = "activations") -> np.ndarray:
  """x as float32 [N, K]; UserError for another rank, no rows, or a NaN/inf (naming the first row)."""
  x_NK = np.asarray(x_NK, np.float32)
  if x_NK.ndim != 2 or not x_NK.shape[0] or not x_NK.shape[1]:
    raise UserError(f"{where}: shape {x_NK.shape}; give a non-empty [inputs, width] array")
  bad_N = ~np.isfinite(x_NK).all(axis=1)
  if bad_N.any():
    raise UserError(f"{where}: NaN or inf in {int(bad_N.sum())} row(s), the first row {int(np.argmax(bad_N))}")
  return x_NK


def geometric_median(x_NK: np.ndarray, iterations: int = 100, tolerance: float = 1e-6) -> np.ndarray:
  """argmin_m Σ_n ‖x_n − m‖ by Weiszfeld's iteration (float64), from the mean."""
  x = np.asarray(x_NK, np.float64)
  m = x.mean(0)
  for _ in range(iterations):
    w_N = 1.0 / np.maximum(np.linalg.norm(x - m, axis=1), 1e-12)
    new = (w_N[:, None] * x).sum(0) / w_N.sum()
    if np.linalg.norm(new - m) <= tolerance * max(1.0, np.linalg.norm(m)):
      return new
    m = new
  return m


def input_scales(x_NK: np.ndarray, o: Options) -> tuple[float, np.ndarray]:
  """(s, s_K): the global RMS s = √(E‖x‖²/K) and each coordinate's scale (module docstring; 1 for zeros)."""
  sq_NK = x_NK.astype(np.float64) ** 2
  if o.normalize == "per_head":
    s_H = np.sqrt(sq_NK.reshape(len(x_NK), o.heads, -1).mean((0, 2)))
    s_K = np.repeat(np.where(s_H > 0, s_H, 1.0), x_NK.shape[1] // o.heads)
    return float(np.sqrt(np.mean(s_K**2))), s_K
  scale = float(np.sqrt(sq_NK.sum(1).mean() / x_NK.shape[1])) or 1.0
  return scale, np.full(x_NK.shape[1], scale)


def schedule(o: Options) -> optax.Schedule:
  """Linear warmup over `warmup_steps`, then `lr_schedule` (module docstring)."""
  warm = min(o.warmup_steps, o.steps)
  rest = o.steps - warm
  if o.lr_schedule == "constant":
    main = optax.constant_schedule(o.lr)
  elif o.lr_schedule == "cosine":
    main = optax.cosine_decay_schedule(o.lr, max(rest, 1))
  else:
    decay = max(1, min(rest, round(o.steps * o.decay_fraction)))
    main = optax.join_schedules(
      [optax.constant_schedule(o.lr), optax.linear_schedule(o.lr, 0.0, decay)], [max(0, rest - decay)]
    )
  if not warm:
    return main
  return optax.join_schedules([optax.linear_schedule(o.lr / warm, o.lr, warm), main], [warm])


def _nmse(a_BK, b_BK):
  return jnp.sum((a_BK - b_BK) ** 2) / jnp.maximum(jnp.sum((a_BK - a_BK.mean(0)) ** 2), 1e-12)


def _window(pre, threshold, bandwidth):
  """K((π − θ)/ε) with the rectangle kernel K(u) = 1[|u| < 1/2]."""
  return (jnp.abs(pre - threshold) < bandwidth / 2).astype(pre.dtype)


def _to_threshold(g, threshold):
  return g.reshape(-1, threshold.shape[-1]).sum(0)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def jump_relu(pre, threshold, bandwidth):
  """π·H(π − θ), with Rajamanoharan et al. 2024's straight-through gradient for θ."""
  return pre * (pre > threshold)


def _jump_relu_fwd(pre, threshold, bandwidth):
  return jump_relu(pre, threshold, bandwidth), (pre, threshold)


def _jump_relu_bwd(bandwidth, saved, g):
  pre, threshold = saved
  d_threshold = -(threshold / bandwidth) * _window(pre, threshold, bandwidth) * g
  return g * (pre > threshold), _to_threshold(d_threshold, threshold)


jump_relu.defvjp(_jump_relu_fwd, _jump_relu_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def step_function(pre, threshold, bandwidth):
  """H(π − θ), with a straight-through gradient for θ only."""
  return (pre > threshold).astype(pre.dtype)


def _step_fwd(pre, threshold, bandwidth):
  return step_function(pre, threshold, bandwidth), (pre, threshold)


def _step_bwd(bandwidth, saved, g):
  pre, threshold = saved
  return jnp.zeros_like(pre), _to_threshold(-(1.0 / bandwidth) * _window(pre, threshold, bandwidth) * g, threshold)


step_function.defvjp(_step_fwd, _step_bwd)


def loss_terms(params: dict, x_BK, dead_F, o: Options, aux_k: int):
  """(loss, (reconstruction term, AuxK, L1 or L0 term, fired_F)) of one batch of scaled inputs."""
  pre_BF = sae_model.pre_activations(params, x_BK)
  if o.kind == "jumprelu":
    threshold_F = jnp.exp(params["log_threshold_F"])
    f_BF = jump_relu(pre_BF, threshold_F, o.bandwidth)
    recon = jnp.mean(jnp.sum((x_BK - sae_model.reconstruct(params, f_BF)) ** 2, -1))
    l0 = jnp.mean(jnp.sum(step_function(pre_BF, threshold_F, o.bandwidth), -1))
    return recon + o.l0 * l0, (recon, l0, (f_BF > 0).any(0))
  f_BF = sae_model.activate(pre_BF, o.kind, o.k)
  xhat_BK = sae_model.reconstruct(params, f_BF)
  fired_F = (f_BF > 0).any(0)
  if o.kind == "topk":
    recon = _nmse(x_BK, xhat_BK)
    e_BK = jax.lax.stop_gradient(x_BK - xhat_BK)
    aux_BF = sae_model.topk_activation(jnp.where(dead_F, pre_BF, -jnp.inf), aux_k)
    aux = jnp.where(dead_F.any(), _nmse(e_BK, aux_BF @ params["W_dec_FK"]), 0.0)
    return recon + o.aux_coefficient * aux, (recon, aux, fired_F)
  recon = jnp.mean(jnp.sum((x_BK - xhat_BK) ** 2, -1))
  l1 = jnp.mean(jnp.sum(jnp.abs(f_BF), -1))
  return recon + o.l1 * l1, (recon, l1, fired_F)


def unit_rows(w_FK):
  return w_FK / jnp.maximum(jnp.linalg.norm(w_FK, axis=-1, keepdims=True), 1e-12)


def optimizer(o: Options) -> optax.GradientTransformation:
  return optax.chain(optax.clip_by_global_norm(1.0), optax.adam(schedule(o)))


def train_step(state: dict, x_BK, o: Options, aux_k: int):
  """One optimizer step: the gradient, its decoder part made orthogonal to each unit row, Adam, renormalise."""
  params = state["params"]
  dead_F = state["since_fired_F"] >= o.dead_after_tokens
  (loss, (recon, extra, fired_F)), grads = jax.value_and_grad(loss_terms, has_aux=True)(params, x_BK, dead_F, o, aux_k)
  w_FK, g_FK = params["W_dec_FK"], grads["W_dec_FK"]
  grads = dict(grads, W_dec_FK=g_FK - jnp.sum(g_FK * w_FK, -1, keepdims=True) * w_FK)
  updates, opt = optimizer(o).update(grads, state["opt"], params)
  params = optax.apply_updates(params, updates)
  params = dict(params, W_dec_FK=unit_rows(params["W_dec_FK"]))
  since_F = jnp.where(fired_F, 0, state["since_fired_F"] + x_BK.shape[0])
  return dict(params=params, opt=opt, since_fired_F=since_F), jnp.stack([loss, recon, extra])


@compilations.program_cache(maxsize=16)
def _chunk_program(o: Options, aux_k: int):
  """jit(state, x_NK, index_CB, live_C) -> (state, metrics_C3): `chunk` steps; steps with live False are no-ops."""

  def body(x_NK, state, inputs):
    index_B, live = inputs
    new, metrics_3 = train_step(state, x_NK[index_B], o, aux_k)
    return jax.tree.map(lambda a, b: jnp.where(live, a, b), new, state), metrics_3

  @functools.partial(jax.jit, donate_argnums=0)
  def run(state, x_NK, index_CB, live_C):
    return jax.lax.scan(functools.partial(body, x_NK), state, (index_CB, live_C))

  return run


def batch_indices(seed: int, step: int, n: int, batch_size: int) -> np.ndarray:
  """The rows of step `step`'s batch: a function of (seed, step) only, so resuming repeats them."""
  return np.random.default_rng([seed, step]).integers(0, n, batch_size)


def initial_state(x_NK: np.ndarray, o: Options) -> dict:
  """Decoder rows random unit vectors, W_enc = W_decᵀ, b_enc = 0, b_dec the geometric median or mean."""
  F, K = o.features, x_NK.shape[1]
  w_FK = unit_rows(jax.random.normal(jax.random.key(o.seed), (F, K), jnp.float32))
  sample = x_NK[np.random.default_rng(o.seed).permutation(len(x_NK))[:4096]]
  b_dec = geometric_median(sample) if o.b_dec_init == "geometric_median" else sample.astype(np.float64).mean(0)
  params = dict(
    W_enc_KF=w_FK.T, b_enc_F=jnp.zeros(F, jnp.float32), W_dec_FK=w_FK, b_dec_K=jnp.asarray(b_dec, jnp.float32)
  )
  if o.kind == "jumprelu":
    params["log_threshold_F"] = jnp.full(F, np.log(o.threshold_init), jnp.float32)
  return dict(params=params, opt=optimizer(o).init(params), since_fired_F=jnp.zeros(F, jnp.int32))


def fingerprint(x_NK: np.ndarray, o: Options) -> dict:
  """What a checkpoint must match to be resumed: the options and the training inputs."""
  digest = hashlib.sha256(np.ascontiguousarray(x_NK).tobytes()).hexdigest()
  options = dataclasses.asdict(o)
  if o.normalize == "global":  # as before the option: earlier checkpoints still resume
    del options["normalize"], options["heads"]
  return dict(options=options, inputs=digest, shape=list(x_NK.shape))


@args.arguments(
  features=args.integer(),  # types here; ranges by check_options, which names what they must be
  kind=args.text,
  k=args.integer(),
  steps=args.integer(),
  batch_size=args.integer(),
  aux_k=args.integer(),
  warmup_steps=args.integer(),
  dead_after_tokens=args.integer(),
  chunk=args.integer(),
  seed=args.integer(),
  normalize=args.text,
  heads=args.integer(),
  checkpoint_every=args.integer(),
  progress=args.boolean,
)
@locks.holding(lambda checkpoint_dir, **_: locks.checkpoint_folder(checkpoint_dir, "SAE training"))
def fit_sae(
  x_NK,
  *,
  features: int,
  kind: str = "topk",
  k: int = 32,
  l1: float = 5.0,
  l0: float = 1.0,
  bandwidth: float = 0.2,
  threshold_init: float = 0.5,
  steps: int = 2000,
  batch_size: int = 1024,
  lr: float = 1e-3,
  lr_schedule: str = "linear_decay",
  warmup_steps: int = 100,
  decay_fraction: float = 0.2,
  b_dec_init: str = "geometric_median",
  aux_k: int = 0,
  aux_coefficient: float = 1 / 32,
  dead_after_tokens: int = 100_000,
  seed: int = 0,
  chunk: int = 50,
  normalize: str = "global",
  heads: int = 0,
  checkpoint_dir=None,
  checkpoint_every: int = 1000,
  progress: bool = True,
) -> sae_model.SAE:
  """An SAE of `features` features fitted to the rows of x_NK ([inputs, width], e.g. a layer's concatenated z).

  kind 'topk' (Gao et al. 2024; k active features, AuxK against dead latents), 'relu' (Bricken et al.
  2023; L1 coefficient `l1`) or 'jumprelu' (Rajamanoharan et al. 2024; L0 coefficient `l0`, STE `bandwidth`,
  `threshold_init`); the other options are the module docstring's. normalize 'global' (one input scale) or
  'per_head' (each of `heads` equal blocks of the width at unit RMS). `checkpoint_dir`: an Orbax
  checkpoint every `checkpoint_every` steps and at the end; a second call with the same inputs and options
  resumes from it (or returns the finished SAE at once). Bad options or activations with NaN: UserError,
  before any computation.
  """
  o = Options(features, kind, int(k), float(l1), float(l0), float(bandwidth), float(threshold_init), int(steps),
              int(batch_size), float(lr), lr_schedule, int(warmup_steps), float(decay_fraction), b_dec_init,
              int(aux_k), float(aux_coefficient), int(dead_after_tokens), int(seed), int(chunk), normalize,
              int(heads))  # fmt: skip
  check_options(o)
  x_NK = check_activations(x_NK)
  if checkpoint_every < 1:
    raise UserError(f"fit_sae: checkpoint_every={checkpoint_every} must be at least 1")
  N, K = x_NK.shape
  if o.normalize == "per_head" and K % o.heads:
    raise UserError(f"fit_sae: heads={o.heads} does not divide the input width {K}")
  scale, s_K = input_scales(x_NK, o)
  xs_NK = x_NK / (np.float32(scale) if o.normalize == "global" else s_K.astype(np.float32))
  real_aux_k = min(o.features, o.aux_k or max(1, K // 2))
  state = initial_state(xs_NK, o)
  start, mngr, fp = 0, None, None
  if checkpoint_dir is not None:
    from headspec.sae import checkpoint as ckpt

    mngr, fp = ckpt.manager(checkpoint_dir), fingerprint(x_NK, o)
    start, state = ckpt.resume(mngr, state, fp, checkpoint_dir)
  program = _chunk_program(o, real_aux_k)
  x_device = jnp.asarray(xs_NK)
  history = []
  from headspec.words.jobloop import progress as progress_bar

  bar = progress_bar(o.steps, f"sae: {o.kind} F={o.features}", unit="step") if progress else None
  if bar is not None:
    bar.update(start)
  step = start
  while step < o.steps:
    live = min(o.chunk, o.steps - step)
    index_CB = np.stack([batch_indices(o.seed, s, N, o.batch_size) for s in range(step, step + o.chunk)])
    live_C = np.arange(o.chunk) < live
    state, metrics_C3 = program(state, x_device, jnp.asarray(index_CB, jnp.int32), jnp.asarray(live_C))
    loss = float(np.asarray(metrics_C3)[:live, 0].mean())
    if not math.isfinite(loss):  # never saved, never measured, never written
      raise UserError(f"fit_sae: the loss went {loss} by step {step + live} of {o.steps} (lr={o.lr:g}); nothing "
                      "saved: lower lr or check the inputs")  # fmt: skip
    history.append((step + live, loss))
    previous, step = step, step + live
    if bar is not None:
      bar.set_postfix_str(f"loss {loss:.4f}", refresh=False)
      bar.update(live)
    if mngr is not None and (step // checkpoint_every > previous // checkpoint_every or step == o.steps):
      ckpt.save(mngr, step, state, fp)
  if bar is not None:
    bar.close()
  if mngr is not None:
    mngr.wait_until_finished()
    mngr.close()
  info = dict(steps=o.steps, resumed_at=start, scale=scale, aux_k=real_aux_k, history=history,
              final_loss=history[-1][1] if history else math.nan, options=json.loads(json.dumps(dataclasses.asdict(o))))  # fmt: skip
  return _folded(jax.device_get(state["params"]), o, scale, s_K, info)


def _folded(p, o: Options, scale: float, s_K, info: dict) -> sae_model.SAE:
  """The SAE of trained parameters `p` with the input scales folded back (module docstring): it reads raw x."""
  w_enc, w_dec, b_dec, head_scale_K = p["W_enc_KF"], p["W_dec_FK"], p["b_dec_K"] * scale, None
  if o.normalize == "per_head":
    info["head_scales"] = s_K[:: len(s_K) // o.heads].tolist()
    head_scale_K = (s_K / scale).astype(np.float32)
    w_enc, w_dec, b_dec = w_enc / head_scale_K[:, None], w_dec * head_scale_K, p["b_dec_K"] * s_K.astype(np.float32)
  return sae_model.SAE(
    W_enc_KF=jnp.asarray(w_enc),
    b_enc_F=jnp.asarray(p["b_enc_F"] * scale),
    W_dec_FK=jnp.asarray(w_dec),
    b_dec_K=jnp.asarray(b_dec),
    threshold_F=jnp.asarray(np.exp(p["log_threshold_F"]) * scale) if o.kind == "jumprelu" else None,
    head_scale_K=None if head_scale_K is None else jnp.asarray(head_scale_K),
    kind=o.kind,
    k=o.k if o.kind == "topk" else 0,
    info=info,
  )
