"""A layer's activations, and the LM loss with an SAE's reconstruction spliced into the forward pass.

`capture` runs the model over token rows and returns one layer's site (default z, flattened to [tokens, H·K]
as Kissane et al. 2024 train on hook_z) at the valid tokens. `losses` scores the evaluation set four ways,
each a forward pass with one `Edit` of that layer's site (headspec/model.py, docs/patching.md):
  clean         no edit
  splice        x ← SAE(x), the reconstruction of the pass's own activations (computed from a clean pass)
  zero_ablation x ← 0 (for z: the layer's attention output becomes its bias b_O)
  mean_ablation x ← the mean of x over the evaluation tokens (for z: attn_out becomes its mean, W_O linear)
Losses are the mean next-token cross-entropy (decoders) or the masked-LM cross-entropy on one fixed seeded
mask (encoders) over the scored tokens (headspec/evalset.py).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
from flax import nnx

from headspec import mesh as mesh_lib
from headspec import objectives
from headspec.errors import UserError
from headspec.model import SITES, Edit

PER_TOKEN_SITES = tuple(s for s, axes in SITES.items() if axes in ("BTHK", "BTD"))


def check_site(site: str) -> None:
  if site not in PER_TOKEN_SITES:
    raise UserError(f"sae: site={site!r}; choose a per-token site: {', '.join(PER_TOKEN_SITES)}")


def check_layer(layer: int, num_layers: int) -> int:
  """The 0-based layer (−1: the middle one, L // 2); UserError outside [−1, L)."""
  if not -1 <= layer < num_layers:
    raise UserError(f"sae: layer={layer} is not a layer of this model (0..{num_layers - 1}, or -1 for the middle)")
  return num_layers // 2 if layer == -1 else layer


def site_shape(cfg, site: str) -> tuple[int, ...]:
  """The per-token axes of `site`: (H, K) or (D,)."""
  return (cfg.num_heads, cfg.d_head) if SITES[site] == "BTHK" else (cfg.d_model,)


def site_heads(cfg, site: str) -> int:
  """Heads the flattened width splits into (0 for a site of the residual width)."""
  return cfg.num_heads if SITES[site] == "BTHK" else 0


def _nll(logits_BTV, targets_BT, weights_BT):
  """[B, 2] per-row (Σ_t w_t·NLL_t, Σ_t w_t)."""
  nll_BT = objectives.token_nll(logits_BTV, targets_BT)
  return jnp.stack([(nll_BT * weights_BT).sum(1), weights_BT.sum(1)], -1)


@functools.lru_cache(maxsize=8)
def _capture_program(graphdef, site: str, layer: int):
  @mesh_lib.jit
  def run(params, inputs_BT, valid_BT, targets_BT, weights_BT):
    logits_BTV, inter = nnx.merge(graphdef, params)(inputs_BT, valid_BT=valid_BT, capture=(site,))
    x = inter.site(site)[layer]
    return _nll(logits_BTV, targets_BT, weights_BT), x.reshape(*x.shape[:2], -1).astype(jnp.float32)

  return run


@functools.lru_cache(maxsize=8)
def _edited_program(graphdef, site: str, layer: int, num_layers: int):
  @mesh_lib.jit
  def run(params, inputs_BT, valid_BT, targets_BT, weights_BT, add_BTE):
    model = nnx.merge(graphdef, params)
    shape = (1, *add_BTE.shape[:2], *site_shape(model.cfg, site))
    keep = jnp.ones((num_layers,) + (1,) * (len(shape) - 1)).at[layer].set(0.0)
    add = jnp.zeros((num_layers, *shape[1:])).at[layer].set(add_BTE.reshape(shape[1:]))
    logits_BTV, _ = model(inputs_BT, valid_BT=valid_BT, interventions={site: Edit(keep=keep, add=add)})
    return _nll(logits_BTV, targets_BT, weights_BT)

  return run


def _arrays(batch):
  return tuple(jnp.asarray(a) for a in (batch.inputs_BT, batch.valid_BT, batch.targets_BT, batch.weights_BT))


def capture(model, batches, site: str, layer: int) -> tuple[np.ndarray, np.ndarray]:
  """(x_NE at every valid token of the batches, in order; per-row clean [Σ w·NLL, Σ w] over all batches)."""
  graphdef, params = nnx.split(model)
  program = _capture_program(graphdef, site, layer)
  xs, sums = [], []
  for batch in batches:
    nll_B2, x_BTE = program(params, *_arrays(batch))
    xs.append(np.asarray(x_BTE)[np.asarray(batch.valid_BT, bool)])
    sums.append(np.asarray(nll_B2))
  return np.concatenate(xs), np.concatenate(sums)


def losses(model, batches, site: str, layer: int, sae, mean_E: np.ndarray) -> dict[str, float]:
  """{clean, splice, zero_ablation, mean_ablation}: mean loss over the scored tokens (module docstring)."""
  graphdef, params = nnx.split(model)
  captured = _capture_program(graphdef, site, layer)
  edited = _edited_program(graphdef, site, layer, model.cfg.num_layers)
  totals = dict.fromkeys(("clean", "splice", "zero_ablation", "mean_ablation"), 0.0)
  weight = 0.0
  for batch in batches:
    arrays = _arrays(batch)
    nll_B2, x_BTE = captured(params, *arrays)
    B, T, E = x_BTE.shape
    recon_BTE = sae(x_BTE.reshape(B * T, E)).reshape(B, T, E)
    totals["clean"] += float(nll_B2[:, 0].sum())
    weight += float(nll_B2[:, 1].sum())
    adds = dict(splice=recon_BTE, zero_ablation=jnp.zeros_like(x_BTE),
                mean_ablation=jnp.broadcast_to(jnp.asarray(mean_E, jnp.float32), x_BTE.shape))  # fmt: skip
    for name, add in adds.items():
      totals[name] += float(edited(params, *arrays, add)[:, 0].sum())
  if not weight:
    raise UserError("sae: the evaluation set scores no tokens (too short rows?)")
  return {name: total / weight for name, total in totals.items()}
