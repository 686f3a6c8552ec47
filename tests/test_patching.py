"""Intervention sites (headspec/model/sites.py SITES, Edit) and activation / attribution / path patching
(headspec/patching, headspec.patch) against direct recomputation and known answers."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from test_model import TOKENS, make  # the same tiny encoder/decoder as the model tests

from headspec.errors import UserError
from headspec.model.edits import head_mask
from headspec.model.sites import SITES, Edit

jax.config.update("jax_default_matmul_precision", "highest")

OTHER = jnp.asarray(np.random.default_rng(1).integers(0, 61, (2, 11)), jnp.int32)


# ------------------------------------------------------------------------------ sites in the model


@pytest.mark.parametrize(
  "kind,options",
  [("decoder", {}), ("encoder", {}), ("decoder", {"parallel_residual": True}), ("decoder", {"mlp": False})],
)
def test_sites_are_consistent_with_each_other(kind, options):
  """resid_pre[l+1] = resid_post[l]; attn_out = Σ_h head_out + b_O; resid_post = resid_mid + mlp_out (pre-LN,
  parallel) and resid_mid = resid_pre + attn_out (pre-LN)."""
  model = make(kind, **options)
  _, inter = model(TOKENS, capture=tuple(SITES))
  for name, axes in SITES.items():
    assert inter.site(name).shape[0] == 3 and inter.site(name).ndim == len(axes) + 1, name
  np.testing.assert_allclose(inter.resid_pre_LBTD[1:], inter.resid_post_LBTD[:-1], atol=1e-6)
  b_o = np.stack([np.asarray(b.attention.b_o_D[...]) for b in model.blocks])[:, None, None]
  np.testing.assert_allclose(inter.attn_out_LBTD, inter.head_out_LBTHD.sum(3) + b_o, atol=1e-5)
  if kind == "decoder":
    np.testing.assert_allclose(inter.resid_mid_LBTD, inter.resid_pre_LBTD + inter.attn_out_LBTD, atol=1e-5)
    np.testing.assert_allclose(inter.resid_post_LBTD, inter.resid_mid_LBTD + inter.mlp_out_LBTD, atol=1e-5)
  if not options.get("mlp", True):
    np.testing.assert_array_equal(inter.mlp_out_LBTD, 0.0)
  with pytest.raises(UserError, match="unknown site 'hook_z'"):
    inter.site("hook_z")


def test_capture_takes_site_names_only():
  """The older capture names ('probs', 'residual') are gone: each is one line naming the valid fields, as is
  'hook_z' (a TransformerLens hook, which `headspec.capture` maps but the model's own capture does not)."""
  model = make("decoder")
  for name in ("probs", "residual", "hook_z"):
    with pytest.raises(UserError, match=f"unknown capture field '{name}'"):
      model(TOKENS, capture=(name,))
  assert not hasattr(model(TOKENS, capture=("pattern",))[1], "probs_LBHTS")


def test_head_mask_is_an_edit_of_z():
  """head_mask m with replacement r equals the z Edit keep = m, add = (1 − m)·r, bit for bit."""
  model = make()
  mask = jnp.ones((3, 4)).at[1, 2].set(0.0).at[2, 0].set(0.5)
  repl = jnp.asarray(np.random.default_rng(2).normal(size=(3, 4, 12)), jnp.float32)
  by_mask, _ = model(TOKENS, interventions={"z": head_mask(mask, repl)})
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
  with pytest.raises(UserError, match="give a headspec.model.sites.Edit"):
    model(TOKENS, interventions={"z": jnp.zeros((3, 2, 11, 4, 12))})


# ------------------------------------------------------------------------------ activation patching

from headspec.api import patch as api  # noqa: E402
from headspec.patching import core as patch_core  # noqa: E402
from headspec.patching import patch as patch_lib  # noqa: E402

CLEAN = [[5, 9, 14, 20, 33, 7], [8, 2, 40, 41, 12, 3]]
CORRUPT = [[5, 9, 17, 20, 33, 7], [8, 2, 40, 44, 12, 3]]
ANSWERS = [(7, 11), (3, 4)]


@pytest.mark.parametrize("site", ["z", "resid_pre", "pattern", "mlp_out", "mlp_post", "attn_scores"])
def test_sweep_equals_one_forward_per_patch(site):
  """Every value of the compiled sweep (from_layer over a cached stream, lax.map over patches) equals a full
  forward under that one patch; layers not asked for are NaN; by_position=False patches every position."""
  model = make()
  p = patch_lib.prompts(model.cfg, CLEAN, CORRUPT, ANSWERS, "logit_diff")
  frame = api.patch(model, CLEAN, CORRUPT, site=site, answers=ANSWERS, layers=[0, 2])
  H = 4 if site in patch_core.PER_HEAD else 1
  assert len(frame) == 2 * H * 6 and list(frame.columns) == ["layer", "head", "position", "value"]
  assert (frame["head"] == -1).all() == (site not in patch_core.PER_HEAD)
  patches = patch_core.grid(model.cfg, site, 6, True, [0, 2], range(4), range(6))
  loop = patch_core.per_site_loop(model, site, "logit_diff", p.corrupt_BT, p.clean_BT, p.valid_BT, p.last_B,
                                  p.answers_B2, patches)  # fmt: skip
  np.testing.assert_allclose(frame["value"], loop[[0, 2]].reshape(-1), atol=1e-5)
  assert np.isnan(loop[1]).all()
  base = frame.attrs["base"]
  logits, _ = model(jnp.asarray(p.corrupt_BT))
  expected = np.mean([logits[b, -1, ANSWERS[b][0]] - logits[b, -1, ANSWERS[b][1]] for b in range(2)])
  assert base == pytest.approx(float(expected), abs=1e-5)
  assert frame["value"].std() > 0  # the patches differ
  whole = api.patch(model, CLEAN, CORRUPT, site=site, answers=ANSWERS, by_position=False, layers=[0])
  assert (whole["position"] == -1).all() and len(whole) == H
  if site == "resid_pre":  # the whole clean stream entering block 0: the clean run
    assert whole["value"].iloc[0] == pytest.approx(frame.attrs["source"], abs=1e-4)


def test_positions_that_differ_carry_the_effect_and_noising_mirrors():
  """resid_pre at layer 0 only matters where the prompts differ (before the last position, causal model);
  noising the clean run at the last position gives the corrupted metric."""
  model = make()
  frame = api.patch(model, CLEAN[:1], CORRUPT[:1], site="resid_pre", answers=ANSWERS[:1], layers=[0])
  moved = frame[np.abs(frame["value"] - frame.attrs["base"]) > 1e-6]["position"].tolist()
  assert moved == [2, 5] or moved == [2]  # the changed token, and the last position reads everything
  noised = api.patch(model, CLEAN[:1], CORRUPT[:1], site="resid_pre", answers=ANSWERS[:1], direction="noising",
                     layers=[0], positions=[2])  # fmt: skip
  assert noised.attrs["base"] == pytest.approx(frame.attrs["source"], abs=1e-6)
  assert noised["value"].iloc[0] == pytest.approx(frame.attrs["base"], abs=1e-4)


def test_new_prompts_answers_and_patches_do_not_recompile():
  """Other prompts, answers and patches (a grid of the same size) reuse the compiled sweep."""
  model = make()
  first = api.patch(model, CLEAN, CORRUPT, site="z", answers=ANSWERS, heads=[0, 1], positions=[2, 3])
  before = patch_core.TRACES["sweep"]
  again = api.patch(model, CORRUPT, CLEAN, site="z", answers=[(1, 2), (3, 5)], heads=[3, 1], positions=[0, 5])
  assert patch_core.TRACES["sweep"] == before and len(again) == len(first) == 3 * 4
  assert again[["head", "position"]].drop_duplicates().values.tolist() == [[3, 0], [3, 5], [1, 0], [1, 5]]


def test_sweep_split_over_a_data_mesh_gives_the_one_device_values():
  """Under a mesh of the suite's 2 devices on `data`, each device runs its share of the patches (an odd
  number: padded, the padding dropped): every value, NaN where a patch does not run, equals one device's to
  float32 rounding (each device's lax.map batches its patches in other groups)."""
  from headspec.parallel import mesh

  model = make()
  p = patch_lib.prompts(model.cfg, CLEAN, CORRUPT, ANSWERS, "logit_diff")
  patches = patch_core.grid(model.cfg, "z", 6, True, [0, 2], [0, 1, 3], range(5))
  runs = (p.corrupt_BT, p.clean_BT, p.valid_BT, p.last_B, p.answers_B2)
  alone = patch_core.run_sweep(model, "z", "logit_diff", *runs, patches)
  assert len(patches[0]) % 2 == 1 and jax.device_count() == 2
  with mesh.using(mesh.parse("data=2")):
    split = patch_core.run_sweep(model, "z", "logit_diff", *runs, patches)
  assert split[:2] == alone[:2] and split[2].shape == alone[2].shape == (model.cfg.num_layers, 15)
  np.testing.assert_allclose(split[2], alone[2], rtol=1e-6, atol=1e-7)
  assert np.isnan(alone[2][1]).all() and not np.isnan(alone[2][[0, 2]]).any()


def test_callable_metric_and_texts():
  model = make()
  metric = lambda logits: logits[:, -1, 7].mean()
  frame = api.patch(model, CLEAN, CORRUPT, site="attn_out", metric=metric, layers=[1])
  logits, _ = model(jnp.asarray(CORRUPT))
  assert frame.attrs["base"] == pytest.approx(float(logits[:, -1, 7].mean()), abs=1e-5)


@pytest.mark.parametrize("metric", ["logit_diff", "prob", "loss"])
def test_named_metrics_read_the_answers_at_the_last_token(metric):
  """Each metric of patching/core.py METRICS, on the unpatched runs, against the logits computed here."""
  model = make()
  frame = api.patch(model, CLEAN, CORRUPT, site="z", metric=metric, answers=ANSWERS, layers=[0], heads=[0])
  rows_BV = np.asarray(model(jnp.asarray(CORRUPT))[0][:, -1], np.float64)
  correct, wrong = np.asarray(ANSWERS).T
  p_BV = np.exp(rows_BV - rows_BV.max(1, keepdims=True))
  p_BV /= p_BV.sum(1, keepdims=True)
  b = np.arange(len(rows_BV))
  expected = {
    "logit_diff": (rows_BV[b, correct] - rows_BV[b, wrong]).mean(),
    "prob": p_BV[b, correct].mean(),
    "loss": -np.log(p_BV[b, correct]).mean(),
  }[metric]
  assert frame.attrs["base"] == pytest.approx(expected, rel=1e-5, abs=1e-6)


def test_attribution_agrees_with_exact_patching():
  """Small initial weights make the model nearly linear: attribution patching's estimate tracks the exact
  change for z by head and position (correlation > 0.95) and for the residual stream (> 0.9: its patches are
  whole token swaps, further from linear)."""
  model = make()
  for site, least in (("z", 0.95), ("resid_pre", 0.9)):
    exact = api.patch(model, CLEAN, CORRUPT, site=site, answers=ANSWERS)
    estimate = api.attribution_patch(model, CLEAN, CORRUPT, site=site, answers=ANSWERS)
    assert list(estimate[["layer", "head", "position"]].itertuples(index=False)) == list(
      exact[["layer", "head", "position"]].itertuples(index=False)
    )
    assert patch_lib.agreement(exact, estimate) > least, site
  whole = api.attribution_patch(model, CLEAN, CORRUPT, site="z", answers=ANSWERS, by_position=False)
  by_pos = api.attribution_patch(model, CLEAN, CORRUPT, site="z", answers=ANSWERS)
  np.testing.assert_allclose(whole["value"], by_pos.groupby(["layer", "head"])["value"].sum(), atol=1e-6)


def test_path_patching_known_answers():
  """One attention-only layer: a head's direct path to the logits is its whole effect (= patching its z at
  every position). A sender in the last layer reaches no receiver: the base metric."""
  model = make(num_layers=1, mlp=False)
  direct = api.path_patch(model, CLEAN, CORRUPT, receiver_site="logits", answers=ANSWERS)
  exact = api.patch(model, CLEAN, CORRUPT, site="z", answers=ANSWERS, by_position=False)
  np.testing.assert_allclose(direct["value"], exact["value"], atol=1e-5)
  model = make()
  to_q = api.path_patch(model, CLEAN, CORRUPT, receivers=[(2, 0), (2, 1)], receiver_site="q", answers=ANSWERS)
  assert len(to_q) == 12
  np.testing.assert_allclose(to_q[to_q["layer"] == 2]["value"], to_q.attrs["base"], atol=1e-6)
  assert np.abs(to_q[to_q["layer"] < 2]["value"] - to_q.attrs["base"]).max() > 1e-6


def test_path_patching_split_over_a_data_mesh_gives_the_one_device_values():
  """Under a mesh of the suite's 2 devices on `data`, each device runs its share of the senders (11 of them:
  padded, the padding dropped); every value equals one device's to float32 rounding."""
  from headspec.parallel import mesh

  model = make()
  senders = [(layer, head) for layer in range(3) for head in range(4)][:11]
  ask = dict(receivers=[(2, 0), (2, 1)], receiver_site="q", answers=ANSWERS, senders=senders)
  alone = api.path_patch(model, CLEAN, CORRUPT, **ask)
  with mesh.using(mesh.parse("data=2")):
    split = api.path_patch(model, CLEAN, CORRUPT, **ask)
  assert len(alone) == len(split) == 11 and jax.device_count() == 2
  assert split.attrs["base"] == alone.attrs["base"] and split.attrs["source"] == alone.attrs["source"]
  np.testing.assert_allclose(split["value"], alone["value"], rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
  "kwargs,message",
  [
    (dict(corrupt=CORRUPT[:1]), "clean has 2 prompts and corrupt 1"),
    (dict(corrupt=[[5, 9, 17], CORRUPT[1]]), "prompt pair 0: clean has 6 tokens and corrupt 3"),
    (dict(site="hook_z"), "unknown site 'hook_z'"),
    (dict(layers=[3]), "layer 3 is out of range: the model has layers 0..2"),
    (dict(heads=[4]), "head 4 is out of range: the model has heads 0..3"),
    (dict(positions=[6]), "position 6 is out of range: the model has positions 0..5"),
    (dict(answers=[(7, 61), (3, 4)]), r"answers\[0\]: token id 61 is outside the vocabulary 0..60"),
    (dict(answers=None), "metric='logit_diff' needs answers"),
    (dict(metric="lossy"), "metric='lossy': give one of logit_diff, prob, loss"),
    (dict(metric="prob", answers=None), "metric='prob' needs answers"),
    (dict(direction="both"), "direction='both'"),
    (dict(clean=["a text", "b"], corrupt=["c text", "d"]), r"clean\[0\] is a text but no tokenizer"),
  ],
)
def test_bad_input_is_one_line(kwargs, message):
  args = dict(clean=CLEAN, corrupt=CORRUPT, site="z", answers=ANSWERS) | kwargs
  with pytest.raises(UserError, match=message) as e:
    api.patch(make(), args.pop("clean"), args.pop("corrupt"), **args)
  assert "\n" not in str(e.value)
