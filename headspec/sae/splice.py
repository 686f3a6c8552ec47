"""A layer's activations, and the LM loss with an SAE's reconstruction spliced into the forward pass.

`capture` runs the model over token rows and returns one layer's site (default z, flattened to [tokens, H·K]
as Kissane et al. 2024 train on hook_z) at the valid tokens. `losses` scores the evaluation set four ways,
each a forward pass with one `Edit` of that layer's site (headspec/model/sites.py, docs/patching.md):
  clean         no edit
  splice        x ← SAE(x), the reconstruction of the pass's own activations (computed from a clean pass)
  zero_ablation x ← 0 (for z: the layer's attention output becomes its bias b_O)
  mean_ablation x ← the mean of x over the evaluation tokens (for z: attn_out becomes its mean, W_O linear)
Losses are the mean next-token cross-entropy (decoders) or the masked-LM cross-entropy on one fixed seeded
mask (encoders) over the scored tokens (headspec/words/evalset.py). `scores` adds, per edit and over the same
tokens, the mean KL(p_clean ‖ p_edit) = Σ_v p_clean(v) (log p_clean(v) − log p_edit(v)) of the predicted
distributions (SAELens's `kl_div_with_sae`) and the fraction of tokens whose argmax prediction is unchanged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from headspec.errors import UserError
from headspec.model import objectives
from headspec.model.sites import SITES, Edit
from headspec.parallel import mesh as mesh_lib
from headspec.parallel.compilations import program_cache

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


def _fidelity(logits_BTV, clean_BTV, weights_BT):
  """[B, 2] per-row (Σ_t w_t·KL(p_clean ‖ p)_t, Σ_t w_t·[argmax p = argmax p_clean]) (module docstring)."""
  logp_BTV = jax.nn.log_softmax(logits_BTV.astype(jnp.float32), -1)
  logq_BTV = jax.nn.log_softmax(clean_BTV.astype(jnp.float32), -1)
  kl_BT = jnp.sum(jnp.where(logq_BTV > -jnp.inf, jnp.exp(logq_BTV) * (logq_BTV - logp_BTV), 0.0), -1)  # 0·log 0 = 0
  agree_BT = (jnp.argmax(logits_BTV, -1) == jnp.argmax(clean_BTV, -1)).astype(jnp.float32)
  return jnp.stack([(kl_BT * weights_BT).sum(1), (agree_BT * weights_BT).sum(1)], -1)


@program_cache(8)
def _capture_program(graphdef, site: str, layer: int, logits: bool = False):
  """jit -> (nll_B2, x_BTE) read by the host, and the clean logits_BTV (left on the device) when `logits`."""

  @jax.jit
  def run(params, inputs_BT, valid_BT, targets_BT, weights_BT):
    logits_BTV, inter = nnx.merge(graphdef, params)(inputs_BT, valid_BT=valid_BT, capture=(site,))
    x = inter.site(site)[layer]
    read = mesh_lib.readable(
      (_nll(logits_BTV, targets_BT, weights_BT), x.reshape(*x.shape[:2], -1).astype(jnp.float32))
    )
    return (*read, logits_BTV) if logits else read

  return run


@program_cache(8)
def _edited_program(graphdef, site: str, layer: int):
  @mesh_lib.jit
  def run(params, inputs_BT, valid_BT, targets_BT, weights_BT, add_BTE, clean_BTV):
    """[B, 4] per-row (Σ w·NLL, Σ w, Σ w·KL, Σ w·agreement) with the layer's site set to add_BTE."""
    model = nnx.merge(graphdef, params)
    value = add_BTE.reshape(*add_BTE.shape[:2], *site_shape(model.cfg, site))
    edit = Edit.patch(value, jnp.ones((1,) * value.ndim), at=layer)  # the layer's site replaced, the others kept
    logits_BTV, _ = model(inputs_BT, valid_BT=valid_BT, interventions={site: edit})
    return jnp.concatenate([_nll(logits_BTV, targets_BT, weights_BT), _fidelity(logits_BTV, clean_BTV, weights_BT)], -1)

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


EDITS = ("splice", "zero_ablation", "mean_ablation")


def scores(model, batches, site: str, layer: int, sae, mean_E: np.ndarray) -> dict[str, dict[str, float]]:
  """{'loss': {clean, *EDITS}, 'kl': {*EDITS}, 'agreement': {*EDITS}}: per edit, the mean loss, KL(p_clean ‖
  p_edit) and argmax agreement with the clean pass over the scored tokens (module docstring)."""
  graphdef, params = nnx.split(model)
  captured = _capture_program(graphdef, site, layer, logits=True)
  edited = _edited_program(graphdef, site, layer)
  totals = {name: np.zeros(3) for name in EDITS}
  clean = weight = 0.0
  for batch in batches:
    arrays = _arrays(batch)
    nll_B2, x_BTE, clean_BTV = captured(params, *arrays)
    B, T, E = x_BTE.shape
    recon_BTE = sae(x_BTE.reshape(B * T, E)).reshape(B, T, E)
    clean += float(nll_B2[:, 0].sum())
    weight += float(nll_B2[:, 1].sum())
    adds = dict(splice=recon_BTE, zero_ablation=jnp.zeros_like(x_BTE),
                mean_ablation=jnp.broadcast_to(jnp.asarray(mean_E, jnp.float32), x_BTE.shape))  # fmt: skip
    for name, add in adds.items():
      totals[name] += np.asarray(edited(params, *arrays, add, clean_BTV), np.float64)[:, [0, 2, 3]].sum(0)
  if not weight:
    raise UserError("sae: the evaluation set scores no tokens (too short rows?)")
  out = dict(loss=dict(clean=clean / weight), kl={}, agreement={})
  for name, (nll, kl, agree) in totals.items():
    out["loss"][name], out["kl"][name], out["agreement"][name] = nll / weight, kl / weight, agree / weight
  return out


def losses(model, batches, site: str, layer: int, sae, mean_E: np.ndarray) -> dict[str, float]:
  """{clean, splice, zero_ablation, mean_ablation}: mean loss over the scored tokens (module docstring)."""
  return scores(model, batches, site, layer, sae, mean_E)["loss"]
