"""Activation, attribution and path patching over the model's intervention sites (headspec/model/sites.py SITES).

Activation patching (Vig et al. 2020; Meng et al. 2022; Wang et al. 2022): run the `base` input with one
site's activation, at one (layer, head, position), replaced by its value on the `source` input, and read a
metric of the logits: one of `METRICS` (logit difference, probability, loss of the correct answer at each
prompt's last position) or a callable on the logits. Denoising (TransformerLens's convention, the default) runs the corrupted prompt and
patches in the clean activation; noising runs the clean prompt and patches in the corrupted one.

Every patch of a sweep is data (an Edit's one-hot mask), so one compiled program per (model structure,
site, grid, metric, batch shape) does the whole sweep: the base run caches the residual stream entering
every block, then for each layer l the patches of layer l run blocks l..L−1 from it (`Transformer.from_layer`
with l traced, as the ablation sweep; each patch an Edit held at layer l alone), mapped with lax.map inside a
lax.map over the layers, so the program's size does not grow with depth. `TRACES` counts traces (a test
asserts one per shape).

Attribution patching (Nanda 2023; Syed et al. 2023): the first-order estimate of every patch at once,
(a_source − a_base) · ∂metric/∂a at the base run, one forward and one backward pass.

Path patching (Wang et al. 2022, §3.1; Goldowsky-Dill et al. 2023): the effect of a sender head that
travels only through the receivers' queries, keys or values (or to the logits through no other head): run the base input
with the sender's Z_h from the source and every other head's Z_h frozen at its base value (MLPs recompute),
record the receivers' q/k/v (or the logits), then run the base input with only those receivers' inputs
replaced by the recorded ones.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from headspec.model.objectives import token_nll
from headspec.model.sites import SITES, Edit
from headspec.parallel import mesh as mesh_lib
from headspec.parallel.compilations import program_cache

TRACES: collections.Counter = collections.Counter()
PER_HEAD = tuple(name for name, axes in SITES.items() if "H" in axes)  # q, k, v, pattern, z, head_out
PATCHES_PER_STEP = 16  # patches evaluated side by side inside lax.map (its batch_size)


def _logit_diff(logits_BTV, last_B, answers_B2):
  """Mean over prompts of logit(correct) − logit(wrong) at each prompt's last position."""
  rows = logits_BTV[jnp.arange(logits_BTV.shape[0]), last_B]
  return (jnp.take_along_axis(rows, answers_B2[:, :1], 1) - jnp.take_along_axis(rows, answers_B2[:, 1:], 1)).mean()


def _prob(logits_BTV, last_B, answers_B2):
  """Mean over prompts of p(correct) at each prompt's last position (the softmax in float32)."""
  rows_BV = jax.nn.softmax(logits_BTV[jnp.arange(logits_BTV.shape[0]), last_B].astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(rows_BV, answers_B2[:, :1], 1).mean()


def _loss(logits_BTV, last_B, answers_B2):
  """Mean over prompts of −log p(correct) at each prompt's last position (objectives.token_nll)."""
  rows_B1V = logits_BTV[jnp.arange(logits_BTV.shape[0]), last_B][:, None]
  return token_nll(rows_B1V.astype(jnp.float32), answers_B2[:, :1]).mean()


@dataclasses.dataclass(frozen=True)
class Metric:
  """A patching metric of the logits [B,T,V], each prompt's last position last_B and its (correct, wrong)
  answer ids answers_B2: a scalar, the mean over prompts. `label`: what its values are (figures, docs)."""

  function: Callable
  label: str


METRICS = {
  "logit_diff": Metric(_logit_diff, "logit difference logit(correct) − logit(wrong)"),
  "prob": Metric(_prob, "probability of the correct answer"),
  "loss": Metric(_loss, "loss −log p(correct)"),
}
"""The metrics by name (`metric=` of headspec.patch, the `metric` key of `headspec patch`); each reads the
answers at each prompt's last position. A new metric is one entry."""


def metric_value(metric, logits_BTV, last_B, answers_B2):
  """The scalar metric: a name of METRICS or a callable on the float32 logits [B,T,V] (rows right-padded)."""
  if isinstance(metric, str):
    return METRICS[metric].function(logits_BTV, last_B, answers_B2)
  return jnp.asarray(metric(logits_BTV), jnp.float32).reshape(())


def patch_mask(site: str, head, position, T: int, H: int):
  """The one-hot mask of one patch over a layer's site axes (batch axis 1): head −1 = every head (per-layer
  sites have none), position −1 = every position. Positions are the T axis (the query's for `pattern`)."""
  axes = SITES[site]
  pos_T = (jnp.arange(T) == position) | (position < 0)
  head_H = (jnp.arange(H) == head) | (head < 0)
  shape = {"B": 1, "T": T, "H": H, "S": 1, "K": 1, "D": 1, "F": 1}  # a patch spans every feature of a position
  mask = jnp.ones([shape[a] for a in axes], jnp.float32)
  mask = mask * pos_T.reshape([T if a == "T" else 1 for a in axes])
  if "H" in axes:
    mask = mask * head_H.reshape([H if a == "H" else 1 for a in axes])
  return mask


def _layer_edit(site: str, source_L, mask, layer: int, L: int) -> Edit:
  """Edit.patch of `source_L` [L, ...] restricted to `layer` (the other layers' keep 1, add 0)."""
  at_L = (jnp.arange(L) == layer).astype(jnp.float32).reshape([L] + [1] * mask.ndim)
  return Edit.patch(source_L, at_L * mask[None])


@program_cache(32)
def _sweep(graphdef, site: str, metric):
  @mesh_lib.jit
  def sweep(params, base_BT, source_BT, valid_BT, last_B, answers_B2, patches_EX):
    """(base metric, source metric, [L,E] metric with patch e of layer l; NaN where it does not run);
    patches_EX: per patch its head, its position and whether it runs at each layer (`_packed`)."""
    TRACES["sweep"] += 1
    heads_E, positions_E, layer_masks_LE = patches_EX[:, 0], patches_EX[:, 1], patches_EX[:, 2:].T.astype(bool)
    model = nnx.merge(graphdef, params)
    L, H = model.cfg.num_layers, model.cfg.num_heads
    T = base_BT.shape[1]
    source_logits, source_inter = model(source_BT, valid_BT=valid_BT, capture=(site,))
    base_logits, base_inter = model(base_BT, valid_BT=valid_BT, capture=("resid_pre",))
    value = functools.partial(metric_value, metric, last_B=last_B, answers_B2=answers_B2)

    def row(layer, x_BTD, source, run_E):  # layer's patches: blocks layer.. from the base run's stream
      def one(patch):
        head, position, run = patch
        edit = Edit.patch(source, patch_mask(site, head, position, T, H), at=layer)
        logits, _ = model.from_layer(x_BTD, layer, valid_BT=valid_BT, interventions={site: edit})
        return jnp.where(run, value(logits), jnp.nan)

      patches = (heads_E, positions_E, run_E)
      return jax.lax.map(one, patches, batch_size=min(PATCHES_PER_STEP, heads_E.shape[0]))

    layers = (jnp.arange(L), base_inter.resid_pre_LBTD, source_inter.site(site), layer_masks_LE)
    return value(base_logits), value(source_logits), jax.lax.map(lambda a: row(*a), layers)

  return sweep


@program_cache(32)
def _attribution(graphdef, site: str, metric):
  @mesh_lib.jit
  def attribution(params, base_BT, source_BT, valid_BT, last_B, answers_B2):
    """[L, *site axes without B] (a_source − a_base) · ∂metric/∂a at the base run, summed over the batch."""
    TRACES["attribution"] += 1
    model = nnx.merge(graphdef, params)
    _, source_inter = model(source_BT, valid_BT=valid_BT, capture=(site,))

    def run(add):
      logits, inter = model(base_BT, valid_BT=valid_BT, capture=(site,), interventions={site: Edit(add=add)})
      return metric_value(metric, logits, last_B, answers_B2), inter.site(site)

    source_L = source_inter.site(site)
    grad, base_L = jax.grad(run, has_aux=True)(jnp.zeros_like(source_L))
    return ((source_L - base_L) * grad).sum(1)  # over the batch

  return attribution


@program_cache(32)
def _path(graphdef, receiver_site: str, metric):
  @mesh_lib.jit
  def path(params, base_BT, source_BT, valid_BT, last_B, answers_B2, senders_E2, receivers_LH):
    """(base metric, source metric, [E] metric when sender e's effect reaches only the receivers):
    receivers_LH marks them; for receiver_site 'logits', the sender's paths to the logits through no other
    head (its direct path and the downstream MLPs, which recompute: Wang et al.'s convention)."""
    TRACES["path"] += 1
    model = nnx.merge(graphdef, params)
    L, H = model.cfg.num_layers, model.cfg.num_heads
    capture = ("z",) if receiver_site == "logits" else ("z", receiver_site)
    source_logits, source_inter = model(source_BT, valid_BT=valid_BT, capture=("z",))
    base_logits, base_inter = model(base_BT, valid_BT=valid_BT, capture=capture)
    value = functools.partial(metric_value, metric, last_B=last_B, answers_B2=answers_B2)

    def one(sender):
      is_sender_LH = (jnp.arange(L)[:, None] == sender[0]) & (jnp.arange(H)[None] == sender[1])
      # Sender from the source, every other head frozen at its base value: only the sender's paths change.
      z_L = jnp.where(is_sender_LH[:, None, None, :, None], source_inter.z_LBTHK, base_inter.z_LBTHK)
      frozen = {"z": Edit.patch(z_L, jnp.ones((L, 1, 1, H, 1)))}
      logits, inter = model(base_BT, valid_BT=valid_BT, capture=capture, interventions=frozen)
      if receiver_site == "logits":
        return value(logits)
      mask = receivers_LH[:, None, None, :, None] * (jnp.arange(L) > sender[0])[:, None, None, None, None]
      receivers = {receiver_site: Edit.patch(inter.site(receiver_site), mask)}
      logits, _ = model(base_BT, valid_BT=valid_BT, interventions=receivers)
      return value(logits)

    values = jax.lax.map(one, senders_E2, batch_size=min(PATCHES_PER_STEP, senders_E2.shape[0]))
    return value(base_logits), value(source_logits), values

  return path


def grid(cfg, site: str, T: int, by_position: bool, layers, heads, positions):
  """(heads_E, positions_E, layer_masks_LE): the patches of every layer (the same (head, position) grid in
  each; layers not asked for are masked out and report NaN). Heads −1 for per-layer sites, positions −1
  when not by position."""
  head_list = list(heads) if site in PER_HEAD else [-1]
  pos_list = list(positions) if by_position else [-1]
  heads_E = np.repeat(np.asarray(head_list, np.int32), len(pos_list))
  positions_E = np.tile(np.asarray(pos_list, np.int32), len(head_list))
  layer_masks_LE = np.zeros((cfg.num_layers, len(heads_E)), bool)
  layer_masks_LE[list(layers)] = True
  return heads_E, positions_E, layer_masks_LE


def run_sweep(model, site, metric, base_BT, source_BT, valid_BT, last_B, answers_B2, patches):
  """(base metric, source metric, [L,E] values) of one compiled sweep (see `_sweep`)."""
  graphdef, params = nnx.split(model)
  fn, devices = mesh_lib.split_for_current(_sweep(graphdef, site, metric), axis=0, arg=6, outputs=(None, None, 1))
  patches_EX = _packed(*patches, devices)
  args = [jnp.asarray(a) for a in (base_BT, source_BT, valid_BT, last_B, answers_B2, patches_EX)]
  base, source, values = fn(params, *args)
  return float(base), float(source), np.asarray(values)[:, : len(patches[0])]


def _packed(heads_E, positions_E, layer_masks_LE, multiple: int) -> np.ndarray:
  """[E', 2 + L] int32: each patch's head, position and run flag per layer, one array so that a mesh can split
  the patches; padded to a multiple of `multiple` with patches that run nowhere (NaN, dropped after)."""
  patches_EX = np.concatenate(
    [np.stack([heads_E, positions_E], 1), np.asarray(layer_masks_LE).T], axis=1, dtype=np.int32
  )
  pad = (-len(patches_EX)) % multiple
  return np.concatenate([patches_EX, np.zeros((pad, patches_EX.shape[1]), np.int32)])


def run_attribution(model, site, metric, base_BT, source_BT, valid_BT, last_B, answers_B2) -> np.ndarray:
  """[L, *site axes without B]: see `_attribution`."""
  graphdef, params = nnx.split(model)
  fn = _attribution(graphdef, site, metric)
  return np.asarray(fn(params, *[jnp.asarray(a) for a in (base_BT, source_BT, valid_BT, last_B, answers_B2)]))


def run_path(model, receiver_site, metric, base_BT, source_BT, valid_BT, last_B, answers_B2, senders, receivers_LH):
  """(base metric, source metric, [E] values): see `_path`. Under a mesh with several `data` devices each
  maps its share of the senders (`mesh.split_for_current`)."""
  graphdef, params = nnx.split(model)
  fn, devices = mesh_lib.split_for_current(
    _path(graphdef, receiver_site, metric), axis=0, arg=6, outputs=(None, None, 0)
  )
  senders_E2 = mesh_lib.pad_rows(np.asarray(senders, np.int32), devices)
  arrays = (base_BT, source_BT, valid_BT, last_B, answers_B2, senders_E2, receivers_LH)
  base, source, values = fn(params, *[jnp.asarray(a) for a in arrays])
  return float(base), float(source), np.asarray(values)[: len(senders)]


def per_site_loop(model, site, metric, base_BT, source_BT, valid_BT, last_B, answers_B2, patches) -> np.ndarray:
  """[L,E] the values of `run_sweep` by one full forward per patch (the benchmark's reference: one jitted
  call per patch, the source activations computed once, the edit's arrays as data)."""
  graphdef, params = nnx.split(model)
  source_L = _site_values(graphdef, site)(params, jnp.asarray(source_BT), jnp.asarray(valid_BT))
  fn = _one_patch(graphdef, site, metric)
  heads_E, positions_E, layer_masks_LE = patches
  out = np.full(layer_masks_LE.shape, np.nan, np.float32)
  arrays = [jnp.asarray(a) for a in (base_BT, valid_BT, last_B, answers_B2)]
  for layer, e in zip(*np.nonzero(layer_masks_LE)):
    out[layer, e] = float(fn(params, source_L, *arrays, int(layer), int(heads_E[e]), int(positions_E[e])))
  return out


@program_cache(8)
def _site_values(graphdef, site: str):
  @mesh_lib.jit
  def values(params, tokens_BT, valid_BT):
    """[L, *the site's axes] of one forward."""
    return nnx.merge(graphdef, params)(tokens_BT, valid_BT=valid_BT, capture=(site,))[1].site(site)

  return values


@program_cache(8)
def _one_patch(graphdef, site: str, metric):
  @mesh_lib.jit
  def one(params, source_L, base_BT, valid_BT, last_B, answers_B2, layer, head, position):
    TRACES["one_patch"] += 1
    model = nnx.merge(graphdef, params)
    mask = patch_mask(site, head, position, base_BT.shape[1], model.cfg.num_heads)
    edit = _layer_edit(site, source_L, mask, layer, model.cfg.num_layers)
    logits, _ = model(base_BT, valid_BT=valid_BT, interventions={site: edit})
    return metric_value(metric, logits, last_B, answers_B2)

  return one
