"""Compiled evaluations under head interventions: every mask is traced data, so nothing recompiles.

Each evaluation returns, per sequence, what its metric needs (`per_sequence_P`):
  'lm'        P = 3: (Σ_t w_t·NLL_t, Σ_t w_t·[argmax = target], Σ_t w_t) over the scored tokens t;
  'embedding' P = D: e = normalise(Σ_t valid_t h_t / Σ_t valid_t), the final hidden state mean-pooled.
An intervention is a head mask m [L,H] and a replacement r [L,H,K]: head h outputs Z_h·m_h + (1 − m_h)·r_h
before W_O (headspec/model/sites.py: an Edit of the intervention site z): m_h = 0, r = 0 is zero ablation
(Michel et al. 2019's mask ξ_h = 0); m_h = 0, r_h = E[Z_h] is mean ablation.

`sweep` is the single-head sweep: one full pass caches the residual stream entering every block, then
for each layer l the masks that touch only layer l run blocks l..L−1 from that cache (the layers below
are unchanged; `Transformer.from_layer` with l traced, the edit held at layer l alone), the masks of a layer
mapped with lax.map inside a lax.map over the layers; one compiled program per batch shape does the whole
sweep, its size independent of depth. `TRACES` counts how often each function was traced (a test asserts
one trace per shape).
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from headspec.model.edits import head_mask
from headspec.model.objectives import token_nll
from headspec.model.sites import Edit
from headspec.parallel import mesh as mesh_lib
from headspec.parallel.compilations import program_cache
from headspec.words.evalset import Batch, EvalSet

TRACES: collections.Counter = collections.Counter()
MASKS_PER_CALL = 8  # masks evaluated per call of `evaluate_masks` (padded), so it compiles once


def _arrays(b: Batch):
  return (jnp.asarray(b.inputs_BT), jnp.asarray(b.valid_BT), jnp.asarray(b.targets_BT), jnp.asarray(b.weights_BT))


def _per_sequence(kind: str, out, valid_BT, targets_BT, weights_BT):
  """[B, P] per-sequence sums (kind 'lm', out = logits_BTV) or embeddings (kind 'embedding', out = h_BTD)."""
  if kind == "lm":
    nll_BT = token_nll(out, targets_BT)
    correct_BT = (jnp.argmax(out, -1) == targets_BT).astype(jnp.float32)
    return jnp.stack([(nll_BT * weights_BT).sum(1), (correct_BT * weights_BT).sum(1), weights_BT.sum(1)], -1)
  v_BT1 = valid_BT[..., None].astype(jnp.float32)
  e_BD = (out.astype(jnp.float32) * v_BT1).sum(1) / jnp.maximum(v_BT1.sum(1), 1.0)
  return e_BD / jnp.maximum(jnp.linalg.norm(e_BD, axis=-1, keepdims=True), 1e-12)


def _output(kind: str) -> str:
  return "logits" if kind == "lm" else "hidden"


def _layer_inputs(model, kind: str, inputs_BT, valid_BT, mask_LH, replacement_LHK):
  """(full output, x_LBTD entering every block: the site resid_pre) of one pass under (mask, replacement)."""
  out, inter = model(
    inputs_BT,
    valid_BT=valid_BT,
    interventions={"z": head_mask(mask_LH, replacement_LHK)},
    capture=("resid_pre",),
    output=_output(kind),
  )
  return out, inter.resid_pre_LBTD


def _row_edit(layer, row_H, replacement_LHK) -> Edit:
  """The head mask of one layer's row (every other row all ones) as an Edit of z held at that layer alone:
  Z_h·m_h + (1 − m_h)·r_h there, the identity elsewhere (`edits.head_mask` of that mask, without the L axis)."""
  removed_BTHK = 1.0 - row_H[None, None, :, None]
  return Edit.patch(replacement_LHK[layer][None, None], removed_BTHK, at=layer)


def _sweep(graphdef, kind: str):
  @mesh_lib.jit
  def sweep(params, inputs_BT, valid_BT, targets_BT, weights_BT, layer_masks_LEH, replacement_LHK):
    """(full [B,P], swept [L,E,B,P]): mask e of layer l replaces row l of an all-ones mask."""
    TRACES["sweep"] += 1
    model = nnx.merge(graphdef, params)
    L, H = model.cfg.num_layers, model.cfg.num_heads
    ones_LH = jnp.ones((L, H), jnp.float32)
    full, x_LBTD = _layer_inputs(model, kind, inputs_BT, valid_BT, ones_LH, replacement_LHK)

    def layer(l, x_BTD, masks_EH):  # one layer's masks, blocks l.. from the cached stream
      def one(row_H):
        out, _ = model.from_layer(
          x_BTD, l, valid_BT=valid_BT, interventions={"z": _row_edit(l, row_H, replacement_LHK)}, output=_output(kind)
        )
        return _per_sequence(kind, out, valid_BT, targets_BT, weights_BT)

      return jax.lax.map(one, masks_EH)

    swept = jax.lax.map(lambda a: layer(*a), (jnp.arange(L), x_LBTD, layer_masks_LEH))
    return _per_sequence(kind, full, valid_BT, targets_BT, weights_BT), swept

  return sweep


def _evaluate(graphdef, kind: str):
  @mesh_lib.jit
  def evaluate(params, inputs_BT, valid_BT, targets_BT, weights_BT, head_masks_ELH, replacement_LHK):
    """[E,B,P]: a full pass per mask (any masks, any layers), mapped with lax.map."""
    TRACES["evaluate"] += 1
    model = nnx.merge(graphdef, params)

    def one(mask_LH):
      out, _ = model(
        inputs_BT, valid_BT=valid_BT, interventions={"z": head_mask(mask_LH, replacement_LHK)}, output=_output(kind)
      )
      return _per_sequence(kind, out, valid_BT, targets_BT, weights_BT)

    return jax.lax.map(one, head_masks_ELH)

  return evaluate


def _forward(graphdef, kind: str):
  @mesh_lib.jit
  def forward(params, inputs_BT, valid_BT, targets_BT, weights_BT, mask_LH, replacement_LHK):
    """[B,P] under one mask: the Python-loop reference of the benchmark and the gates' evaluation."""
    TRACES["forward"] += 1
    model = nnx.merge(graphdef, params)
    out, _ = model(
      inputs_BT, valid_BT=valid_BT, interventions={"z": head_mask(mask_LH, replacement_LHK)}, output=_output(kind)
    )
    return _per_sequence(kind, out, valid_BT, targets_BT, weights_BT)

  return forward


def _lm_gradient(graphdef):
  @mesh_lib.jit
  def lm_gradient(params, inputs_BT, valid_BT, targets_BT, weights_BT, mask_LH, replacement_LHK):
    """[B,L,H] |∂ℓ(x_b)/∂m_h| with ℓ(x) the mean NLL of sequence x (Michel et al. 2019, eq. 2)."""
    TRACES["lm_gradient"] += 1
    model = nnx.merge(graphdef, params)
    B = inputs_BT.shape[0]

    def total(mask_BLH):
      logits, _ = model(inputs_BT, valid_BT=valid_BT, interventions={"z": head_mask(mask_BLH, replacement_LHK)})
      sums = _per_sequence("lm", logits, valid_BT, targets_BT, weights_BT)
      return (sums[:, 0] / jnp.maximum(sums[:, 2], 1.0)).sum()  # per-example masks: grads are per sequence

    return jnp.abs(jax.grad(total)(jnp.broadcast_to(mask_LH, (B, *mask_LH.shape))))

  return lm_gradient


def _embedding_jacobian(graphdef, kind: str):
  @mesh_lib.jit
  def embedding_jacobian(params, inputs_BT, valid_BT, targets_BT, weights_BT, mask_LH, replacement_LHK):
    """[B,L,H] ½‖∂e(x_b)/∂m_h‖²: forward mode, one tangent per head, each layer's from the cached stream."""
    TRACES["embedding_jacobian"] += 1
    model = nnx.merge(graphdef, params)
    L = model.cfg.num_layers
    _, x_LBTD = _layer_inputs(model, kind, inputs_BT, valid_BT, mask_LH, replacement_LHK)

    def layer(l, x_BTD):  # [B,H]: layer l's heads, blocks l.. from the cached stream
      def e_of(row_H):
        h, _ = model.from_layer(
          x_BTD,
          l,
          valid_BT=valid_BT,
          interventions={"z": head_mask(mask_LH.at[l].set(row_H), replacement_LHK)},
          output="hidden",
        )
        return _per_sequence("embedding", h, valid_BT, targets_BT, weights_BT)

      jac_BDH = jax.jacfwd(e_of)(mask_LH[l])
      return 0.5 * (jac_BDH**2).sum(1)

    return jnp.moveaxis(jax.lax.map(lambda a: layer(*a), (jnp.arange(L), x_LBTD)), 0, 1)

  return embedding_jacobian


def _head_statistics(graphdef):
  @mesh_lib.jit
  def head_statistics(params, inputs_BT, valid_BT):
    """(Σ_tokens Z_h [L,H,K], Σ_queries entropy(A_h) [L,H], token count): for means and entropies."""
    TRACES["head_statistics"] += 1
    model = nnx.merge(graphdef, params)
    _, inter = model(inputs_BT, valid_BT=valid_BT, capture=("z", "pattern"))
    v_BT = valid_BT.astype(jnp.float32)
    z_sum = jnp.einsum("lbthk,bt->lhk", inter.z_LBTHK.astype(jnp.float32), v_BT)
    p = inter.pattern_LBHTS
    entropy_LBHT = -(p * jnp.log(jnp.where(p > 0, p, 1.0))).sum(-1)
    entropy_sum = jnp.einsum("lbht,bt->lh", entropy_LBHT, v_BT)
    return z_sum, entropy_sum, v_BT.sum()

  return head_statistics


@program_cache(16)
def compiled(graphdef, kind: str):
  """The jitted evaluations of one model structure and metric kind, by name; cached, so each traces once
  per batch shape (the builders above: one evaluation each)."""
  return dict(
    sweep=_sweep(graphdef, kind),
    evaluate=_evaluate(graphdef, kind),
    forward=_forward(graphdef, kind),
    lm_gradient=_lm_gradient(graphdef),
    embedding_jacobian=_embedding_jacobian(graphdef, kind),
    head_statistics=_head_statistics(graphdef),
  )


def _gather(values, batch: Batch, into: np.ndarray, axis: int = 0) -> None:
  """Writes the rows of real sequences of one batch (axis `axis` of `values`) into `into` by sequence."""
  keep = batch.sequence_B >= 0
  idx = [slice(None)] * into.ndim
  idx[axis] = batch.sequence_B[keep]
  sel = [slice(None)] * values.ndim
  sel[axis] = keep
  into[tuple(idx)] = np.asarray(values)[tuple(sel)]


def _width(model, evalset: EvalSet) -> int:
  return 3 if evalset.kind == "lm" else model.cfg.d_model


def zero_replacement(model) -> jax.Array:
  cfg = model.cfg
  return jnp.zeros((cfg.num_layers, cfg.num_heads, cfg.d_head), jnp.float32)


def _padded(masks: np.ndarray, axis: int, multiple: int) -> np.ndarray:
  """`masks` with all-ones masks appended along `axis` to a multiple of `multiple` (they are dropped after)."""
  pad = (-masks.shape[axis]) % multiple
  shape = list(masks.shape)
  shape[axis] = pad
  return np.concatenate([masks, np.ones(shape, np.float32)], axis=axis)


def run_sweep(model, evalset: EvalSet, layer_masks_LEH, replacement_LHK, progress=None):
  """(full [N,P], swept [L,E,N,P]) over the evaluation set: see `_sweep`."""
  graphdef, params = nnx.split(model)
  fn, devices = mesh_lib.split_for_current(compiled(graphdef, evalset.kind)["sweep"], axis=1, arg=5, outputs=(None, 1))
  L, E = np.shape(layer_masks_LEH)[:2]
  P, N = _width(model, evalset), evalset.num_sequences
  full, swept = np.zeros((N, P), np.float32), np.zeros((L, E, N, P), np.float32)
  masks = jnp.asarray(_padded(np.asarray(layer_masks_LEH, np.float32), 1, devices))
  repl = jnp.asarray(replacement_LHK, jnp.float32)
  for b in evalset.batches:
    f, s = fn(params, *_arrays(b), masks, repl)
    _gather(f, b, full)
    _gather(np.asarray(s)[:, :E], b, swept, axis=2)
    if progress is not None:
      progress.update(1)
  return full, swept


def run_masks(model, evalset: EvalSet, head_masks_ELH, replacement_LHK, progress=None) -> np.ndarray:
  """[E,N,P] per-sequence values under each of E masks [L,H] (evaluated MASKS_PER_CALL at a time)."""
  graphdef, params = nnx.split(model)
  fn, devices = mesh_lib.split_for_current(compiled(graphdef, evalset.kind)["evaluate"], axis=0, arg=5, outputs=0)
  per_call = MASKS_PER_CALL * devices  # MASKS_PER_CALL on each device
  masks = np.asarray(head_masks_ELH, np.float32)
  E = len(masks)
  masks = _padded(masks, 0, per_call)
  out = np.zeros((len(masks), evalset.num_sequences, _width(model, evalset)), np.float32)
  repl = jnp.asarray(replacement_LHK, jnp.float32)
  for start in range(0, len(masks), per_call):
    chunk = jnp.asarray(masks[start : start + per_call])
    for b in evalset.batches:
      _gather(fn(params, *_arrays(b), chunk, repl), b, out[start : start + per_call], axis=1)
    if progress is not None:
      progress.update(devices)
  return out[:E]


def run_one(model, evalset: EvalSet, mask_LH, replacement_LHK) -> np.ndarray:
  """[N,P] per-sequence values under one mask, one jitted call per batch."""
  graphdef, params = nnx.split(model)
  fn = compiled(graphdef, evalset.kind)["forward"]
  out = np.zeros((evalset.num_sequences, _width(model, evalset)), np.float32)
  mask, repl = jnp.asarray(mask_LH, jnp.float32), jnp.asarray(replacement_LHK, jnp.float32)
  for b in evalset.batches:
    _gather(fn(params, *_arrays(b), mask, repl), b, out)
  return out


def head_statistics(model, evalset: EvalSet) -> tuple[np.ndarray, np.ndarray]:
  """(mean Z_h over every valid token [L,H,K], mean attention entropy −Σ_s A log A over queries [L,H])."""
  graphdef, params = nnx.split(model)
  fn = compiled(graphdef, evalset.kind)["head_statistics"]
  z, ent, n = 0.0, 0.0, 0.0
  for b in evalset.batches:
    dz, de, dn = fn(params, jnp.asarray(b.inputs_BT), jnp.asarray(b.valid_BT))
    z, ent, n = z + np.asarray(dz, np.float64), ent + np.asarray(de, np.float64), n + float(dn)
  return (z / max(n, 1.0)).astype(np.float32), (ent / max(n, 1.0)).astype(np.float32)
