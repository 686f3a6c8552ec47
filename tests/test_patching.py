"""Intervention sites (headspec/model.py SITES, Edit) and activation / attribution / path patching
(headspec/patching, headspec.patch) against direct recomputation and known answers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from headspec.errors import UserError
from headspec.model import SITES, Edit, ModelConfig, Transformer

jax.config.update("jax_default_matmul_precision", "highest")


def make(kind="decoder", **overrides):
  fields = dict(kind=kind, vocab_size=61, num_layers=3, num_heads=4, d_model=32, d_head=12, d_ff=48, max_len=16)
  if kind == "encoder":
    fields.update(pre_layernorm=False, type_vocab_size=2, embedding_layernorm=True, activation="gelu_exact")
  fields.update(overrides)
  return Transformer(ModelConfig(**fields), rngs=nnx.Rngs(0))


TOKENS = jnp.asarray(np.random.default_rng(0).integers(0, 61, (2, 11)), jnp.int32)
OTHER = jnp.asarray(np.random.default_rng(1).integers(0, 61, (2, 11)), jnp.int32)


# ------------------------------------------------------------------------------ sites in the model


@pytest.mark.parametrize(
  "kind,options",
  [("decoder", {}), ("encoder", {}), ("decoder", {"parallel_residual": True}), ("decoder", {"mlp": False})],
)
def test_sites_are_consistent_with_each_other(kind, options):
  """resid_pre[l+1] = resid_post[l]; attn_out = Σ_h head_out + b_O; resid_post = resid_mid + mlp_out (pre-LN,
  parallel) and resid_mid = resid_pre + attn_out (pre-LN); the older names read the same arrays."""
  model = make(kind, **options)
  _, inter = model(TOKENS, capture=tuple(SITES) + ("residual", "probs"))
  for name, axes in SITES.items():
    assert inter.site(name).shape[0] == 3 and inter.site(name).ndim == len(axes) + 1, name
  np.testing.assert_array_equal(inter.site("resid_post"), inter.residual_LBTD)
  np.testing.assert_array_equal(inter.site("pattern"), inter.probs_LBHTS)
  np.testing.assert_allclose(inter.resid_pre_LBTD[1:], inter.residual_LBTD[:-1], atol=1e-6)
  b_o = np.stack([np.asarray(b.attention.b_o_D[...]) for b in model.blocks])[:, None, None]
  np.testing.assert_allclose(inter.attn_out_LBTD, inter.head_out_LBTHD.sum(3) + b_o, atol=1e-5)
  if kind == "decoder":
    np.testing.assert_allclose(inter.resid_mid_LBTD, inter.resid_pre_LBTD + inter.attn_out_LBTD, atol=1e-5)
    np.testing.assert_allclose(inter.residual_LBTD, inter.resid_mid_LBTD + inter.mlp_out_LBTD, atol=1e-5)
  if not options.get("mlp", True):
    np.testing.assert_array_equal(inter.mlp_out_LBTD, 0.0)
  with pytest.raises(UserError, match="unknown site 'hook_z'"):
    inter.site("hook_z")


def test_head_mask_is_an_edit_of_z():
  """head_mask m with replacement r equals the z Edit keep = m, add = (1 − m)·r, bit for bit."""
  model = make()
  mask = jnp.ones((3, 4)).at[1, 2].set(0.0).at[2, 0].set(0.5)
  repl = jnp.asarray(np.random.default_rng(2).normal(size=(3, 4, 12)), jnp.float32)
  by_mask, _ = model(TOKENS, head_mask=mask, head_replacement=repl)
  keep = mask[:, None, None, :, None]
  edit = Edit(keep=keep, add=((1 - mask)[..., None] * repl)[:, None, None])
  by_edit, _ = model(TOKENS, interventions={"z": edit})
  np.testing.assert_array_equal(by_mask, by_edit)


@pytest.mark.parametrize("site", list(SITES))
def test_patching_a_site(site):
  """A site patched with its own base values, or with mask 0, leaves the run unchanged; with the source
  run's values it changes it; the residual stream patched everywhere turns the base run into the source run."""
  model = make()
  base, base_inter = model(TOKENS, capture=(site,))
  source, inter = model(OTHER, capture=(site,))
  ones = jnp.ones((3,) + (1,) * len(SITES[site]))
  same, _ = model(TOKENS, interventions={site: Edit.patch(base_inter.site(site), ones)})
  np.testing.assert_allclose(same, base, atol=1e-4)
  unpatched, _ = model(TOKENS, interventions={site: Edit.patch(inter.site(site), 0 * ones)})
  np.testing.assert_allclose(unpatched, base, atol=1e-5)
  patched, _ = model(TOKENS, interventions={site: Edit.patch(inter.site(site), ones)})
  assert np.abs(np.asarray(patched - base)).max() > 1e-3
  if site.startswith("resid"):
    np.testing.assert_allclose(patched, source, atol=1e-4)


def test_edits_are_data_and_differentiable():
  """New edit values never recompile; the logits are differentiable in an edit (d logits / d add = the
  gradient with respect to the activation)."""
  model = make()
  graphdef, params = nnx.split(model)
  traces = []

  @jax.jit
  def f(params, add):
    traces.append(1)
    logits, _ = nnx.merge(graphdef, params)(TOKENS, interventions={"resid_mid": Edit(add=add)})
    return logits[:, -1, 0].sum()

  zero = jnp.zeros((3, 2, 11, 32))
  f(params, zero), f(params, zero + 1.0)
  assert len(traces) == 1 and f(params, zero) != f(params, zero + 1.0)
  g = jax.grad(f, argnums=1)(params, zero)
  assert np.abs(np.asarray(g[:, :, -1])).sum() > 0 and np.all(np.asarray(g[2, :, :-1]) == 0)  # causal


def test_bad_interventions_are_one_line():
  model = make()
  with pytest.raises(UserError, match="unknown site 'hook_z'"):
    model(TOKENS, interventions={"hook_z": Edit()})
  with pytest.raises(UserError, match=r"interventions\['z'\].add of shape \(2, 11, 4, 12\) does not broadcast"):
    model(TOKENS, interventions={"z": Edit(add=jnp.zeros((2, 11, 4, 12)))})
  with pytest.raises(UserError, match="give a headspec.model.Edit"):
    model(TOKENS, interventions={"z": jnp.zeros((3, 2, 11, 4, 12))})
