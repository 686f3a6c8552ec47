"""Reading a site never changes the forward pass (headspec/model/sites.py, transformer.py): capturing the per-head input sites
q_in, k_in, v_in returns each head's copy of the stream, and the logits are those of the pass without it."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from headspec.model.config import ModelConfig
from headspec.model.transformer import Transformer


def _model(**options):
  sizes = dict(kind="decoder", vocab_size=40, num_layers=2, num_heads=4, num_kv_heads=2, d_model=32, d_head=8)
  cfg = ModelConfig(**(sizes | dict(d_ff=64, max_len=16, positions="rotary", norm="rmsnorm") | options))
  return Transformer(cfg, rngs=nnx.Rngs(params=0))


def test_capturing_the_input_sites_leaves_the_pass_as_it_is():
  """Bit for bit the logits of the plain pass (the per-head projections ran before, rounding them), and a
  grouped-query model with one RMS over all keys (qk_norm='full') can be read too (it raised, naming an
  intervention that was never given)."""
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 40, (2, 7)), jnp.int32)
  for qk_norm in ("head", "full"):
    model = _model(qk_norm=qk_norm)
    plain, _ = model(tokens)
    read, inter = model(tokens, capture=("q_in", "k_in", "v_in", "resid_pre"))
    np.testing.assert_array_equal(np.asarray(read), np.asarray(plain))
    per_head = jnp.broadcast_to(inter.resid_pre_LBTD[:, :, :, None], (2, 2, 7, 4, 32))
    for name in ("q_in", "k_in", "v_in"):
      np.testing.assert_array_equal(np.asarray(inter.site(name)), np.asarray(per_head))


def test_edits_of_one_heads_query_or_key_input_under_a_full_qk_norm_are_refused():
  """qk_norm='full' takes one RMS over all heads' queries (keys), so an edit of head h's q_in or k_in would
  change every head's queries (measured: 0.18-0.21 on the others against 1.56 on h): refused in one line,
  while v_in (no norm) still reaches its head only."""
  from headspec.errors import UserError
  from headspec.model.sites import Edit

  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 40, (2, 7)), jnp.int32)
  model = _model(qk_norm="full", num_kv_heads=4)
  add = jnp.zeros((2, 2, 7, 4, 32)).at[:, :, :, 3].set(1.0)
  for name in ("q_in", "k_in"):
    with pytest.raises(UserError, match=rf"interventions\['{name}'\]: with qk_norm='full'"):
      model(tokens, interventions={name: Edit(add=add)})
  layer0 = jnp.zeros((2, 2, 7, 4, 32)).at[0, :, :, 3].set(1.0)  # layer 0's head 3 (layer 1 reads its output)
  _, inter = model(tokens, interventions={"v_in": Edit(add=layer0)}, capture=("v",))
  _, plain = model(tokens, capture=("v",))
  changed = np.abs(np.asarray(inter.site("v"))[0] - np.asarray(plain.site("v"))[0]).max(axis=(0, 1, 3))
  assert changed[3] > 0.1 and np.all(changed[:3] < 1e-6), changed  # (the per-head projections round: 6e-8)


def _scaled_model(**options):
  """The grouped-query rotary model with weights 10× the initialisation's, so edits move the logits."""
  model = _model(**options)
  params = nnx.state(model, nnx.Param)
  nnx.update(model, jax.tree.map(lambda p: p * 10.0 if p.ndim > 1 else p, params))
  return model


TOKENS = jnp.asarray(np.random.default_rng(1).integers(0, 40, (2, 7)), jnp.int32)


def test_projection_ablation_equals_its_closed_form():
  """project_out(u) at resid_post of layer 0 is x − (x·û)û: what layer 1 then reads (its resid_pre) is that,
  and the logits equal those of the affine Edit adding −(x·û)û computed from the clean run (per head at z too)."""
  from headspec.model import edits
  from headspec.model.sites import Edit

  model = _scaled_model(qk_norm="head")
  u_D = jnp.asarray(np.random.default_rng(2).normal(size=32), jnp.float32)
  unit_D = np.asarray(u_D) / np.linalg.norm(np.asarray(u_D))
  _, clean = model(TOKENS, capture=("resid_post", "z"))
  x_BTD = np.asarray(clean.resid_post_LBTD[0])
  closed_BTD = x_BTD - (x_BTD @ unit_D)[..., None] * unit_D
  logits, inter = model(TOKENS, interventions={"resid_post": edits.project_out(u_D, layers=0)}, capture=("resid_pre",))
  np.testing.assert_allclose(np.asarray(inter.resid_pre_LBTD[1]), closed_BTD, atol=1e-5)
  add = jnp.zeros((2, 2, 7, 32)).at[0].set(jnp.asarray(closed_BTD - x_BTD))
  affine, _ = model(TOKENS, interventions={"resid_post": Edit(add=add)})
  np.testing.assert_allclose(np.asarray(logits), np.asarray(affine), atol=1e-4)
  assert np.abs(np.asarray(logits) - np.asarray(model(TOKENS)[0])).max() > 1e-2  # the ablation does something
  u_HK = jnp.asarray(np.random.default_rng(3).normal(size=(4, 8)), jnp.float32)  # a direction per head
  _, inter = model(TOKENS, interventions={"z": edits.project_out(u_HK, layers=1)}, capture=("z",))
  z_BTHK = np.asarray(clean.z_LBTHK[1])
  unit_HK = np.asarray(u_HK) / np.linalg.norm(np.asarray(u_HK), axis=-1, keepdims=True)
  expected = z_BTHK - (z_BTHK * unit_HK).sum(-1, keepdims=True) * unit_HK
  ablated_logits, _ = model(TOKENS, interventions={"z": edits.project_out(u_HK, layers=1)})
  by_edit, _ = model(TOKENS, interventions={"z": Edit(add=jnp.zeros((2, 2, 7, 4, 8)).at[1].set(expected - z_BTHK))})
  np.testing.assert_allclose(np.asarray(ablated_logits), np.asarray(by_edit), atol=1e-4)


def test_identity_splice_leaves_the_logits_unchanged():
  """An SAE (headspec's, JumpReLU with θ = −∞ and identity weights: x̂ = x) spliced into z of every layer,
  and identity encode/decode functions, leave the logits as they are (1e-6); clamp and replace do what they
  say; a bad function's output shape is one line."""
  from headspec.errors import UserError
  from headspec.model import edits
  from headspec.sae.model import SAE

  model = _scaled_model()
  plain, clean = model(TOKENS, capture=("z", "mlp_post"))
  E = 4 * 8
  identity = SAE(jnp.eye(E), jnp.zeros(E), jnp.eye(E), jnp.zeros(E), jnp.full(E, -jnp.inf), kind="jumprelu")
  for splice in (edits.splice(identity), edits.splice(encode=lambda x: x, decode=lambda f: f)):
    spliced, _ = model(TOKENS, interventions={"z": splice})
    np.testing.assert_allclose(np.asarray(spliced), np.asarray(plain), atol=1e-6, rtol=0)
  u_F = jnp.zeros(64).at[5].set(2.0)
  _, inter = model(TOKENS, interventions={"mlp_post": edits.clamp(u_F, 3.0, layers=0)}, capture=("mlp_post",))
  edited = np.asarray(clean.mlp_post_LBTF[0]).copy()
  edited[..., 5] = 3.0
  _, after = model(TOKENS, interventions={"mlp_post": edits.replace(edited, layers=0)}, capture=("mlp_post",))
  np.testing.assert_allclose(np.asarray(after.mlp_post_LBTF[1]), np.asarray(inter.mlp_post_LBTF[1]), atol=1e-5)
  with pytest.raises(UserError, match=r"interventions\['z'\]: .* returned shape \(2, 7\)"):
    model(TOKENS, interventions={"z": lambda z: z.sum((2, 3))})
  with pytest.raises(UserError, match=r"layers=\(5,\) must be layers of the model"):
    model(TOKENS, interventions={"z": edits.replace(0.0, layers=5)})


def test_functional_edits_compile_once_per_function_not_per_value():
  """A jitted forward given project_out / clamp / an SAE splice traces once per function, whatever the
  direction, value or SAE weights (a trace counter), and the outputs follow the new values; and the
  logits are differentiable in an edit's values."""
  from headspec.model import edits
  from headspec.sae.model import SAE

  model = _scaled_model()
  graphdef, state = nnx.split(model)
  traces = []

  @jax.jit
  def forward(state, interventions):
    traces.append(1)
    return nnx.merge(graphdef, state)(TOKENS, interventions=interventions)[0]

  rng = np.random.default_rng(4)
  outputs = []
  for make in (
    lambda: {"resid_mid": edits.project_out(jnp.asarray(rng.normal(size=32), jnp.float32))},
    lambda: {"mlp_post": edits.clamp(jnp.asarray(rng.normal(size=64), jnp.float32), float(rng.normal()), layers=1)},
    lambda: {"z": edits.splice(SAE(*(jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((32, 48), 48, (48, 32), 32)), kind="relu"))},
  ):  # fmt: skip
    before = len(traces)
    outputs = [np.asarray(forward(state, make())) for _ in range(3)]
    assert len(traces) == before + 1, "a new value recompiled"
    assert np.abs(outputs[0] - outputs[1]).max() > 1e-4  # the values are used
  grad = jax.grad(lambda v: forward(state, {"resid_mid": edits.clamp(jnp.ones(32), v, layers=0)}).sum())(1.0)
  assert np.isfinite(grad) and abs(grad) > 0


def test_new_sites_read_what_they_name():
  """mlp_post is the MLP's hidden activation (mlp_out = mlp_post W_out + b_out); softmax(attn_scores) is the
  pattern, masked entries at float32's minimum; ln1_scale / ln2_scale / ln_final_scale are sqrt(mean x² + eps)
  of what the RMSNorms read (sqrt(var + eps) for LayerNorm); an attn_scores edit constant along the keys
  changes nothing (softmax shift), and ln1_scale patched with its own value leaves the logits."""
  from headspec.model.sites import Edit

  for options in (dict(gated_mlp=True, activation="silu"), dict(norm="layernorm", positions="learned")):
    model = _scaled_model(**options)
    names = ("mlp_post", "mlp_out", "attn_scores", "pattern", "ln1_scale", "ln2_scale", "resid_pre", "resid_mid")
    plain, inter = model(TOKENS, capture=(*names, "resid_post", "ln_final_scale"))
    for layer in range(2):
      mlp = model.blocks[layer].mlp
      out = np.asarray(inter.mlp_post_LBTF[layer]) @ np.asarray(mlp.w_out_FD[...]) + np.asarray(mlp.b_out_D[...])
      np.testing.assert_allclose(out, np.asarray(inter.mlp_out_LBTD[layer]), atol=1e-4)
    scores = np.asarray(inter.attn_scores_LBHTS)
    assert (scores[..., 0, 1:] == np.finfo(np.float32).min).all()  # the first query sees only key 0
    np.testing.assert_allclose(np.asarray(jax.nn.softmax(scores, -1)), np.asarray(inter.pattern_LBHTS), atol=1e-6)

    def scale(x, layernorm=options.get("norm") == "layernorm", eps=model.cfg.layer_norm_eps):  # noqa: B008
      x = np.asarray(x, np.float64)
      x = x - x.mean(-1, keepdims=True) if layernorm else x
      return np.sqrt((x * x).mean(-1) + eps)

    np.testing.assert_allclose(np.asarray(inter.ln1_scale_LBT), scale(inter.resid_pre_LBTD), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(inter.ln2_scale_LBT), scale(inter.resid_mid_LBTD), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(inter.ln_final_scale_BT), scale(inter.resid_post_LBTD[-1]), rtol=1e-5)
    shifted, _ = model(TOKENS, interventions={"attn_scores": Edit(add=jnp.full((2, 2, 4, 7, 1), 3.0))})
    np.testing.assert_allclose(np.asarray(shifted), np.asarray(plain), atol=1e-4)
    own, _ = model(TOKENS, interventions={"ln1_scale": Edit.patch(inter.ln1_scale_LBT, jnp.ones((2, 1, 1)))})
    np.testing.assert_allclose(np.asarray(own), np.asarray(plain), atol=1e-4)
    doubled, _ = model(TOKENS, interventions={"ln2_scale": Edit(keep=jnp.full((2, 1, 1), 2.0))})
    assert np.abs(np.asarray(doubled) - np.asarray(plain)).max() > 1e-2


@pytest.mark.slow  # two TransformerBridge boots: ~15 s of CPU
def test_new_sites_equal_transformer_lens(tmp_path):
  """mlp_post, attn_scores, ln1/ln2/ln_final scales equal TransformerLens 4's hook_post, hook_attn_scores and
  hook_scale (TransformerBridge over the same directory) on test_patching_parity's random GPT-2 (LayerNorm)
  and the families' Llama (RMSNorm, grouped-query, llama3 rotary): 1e-5 (absolute and relative) where the key is visible (TL masks
  with −inf, headspec with float32's lowest value)."""
  torch = pytest.importorskip("torch")
  pytest.importorskip("transformer_lens")
  from test_pretrained_families import _tiny
  from transformer_lens.model_bridge import TransformerBridge

  import headspec

  transformers = pytest.importorskip("transformers")
  gpt2 = tmp_path / "gpt2"  # as test_patching_parity's gpt2_dir
  bpe = pytest.importorskip("tokenizers").ByteLevelBPETokenizer()
  bpe.train_from_iterator(["the quick brown fox jumps over the lazy dog, and the dog sleeps"] * 3, vocab_size=300,
                          min_frequency=1, special_tokens=["<|endoftext|>"])  # fmt: skip
  gpt2.mkdir()
  bpe.save_model(str(gpt2))
  config = transformers.GPT2Config(vocab_size=bpe.get_vocab_size(), n_positions=32, n_embd=24, n_layer=2, n_head=3,
                                   n_inner=48, initializer_range=0.3, bos_token_id=0, eos_token_id=0)  # fmt: skip
  torch.manual_seed(0)
  transformers.GPT2LMHeadModel(config).save_pretrained(gpt2)
  names = ("mlp_post", "attn_scores", "ln1_scale", "ln2_scale", "ln_final_scale")
  CLEAN = [[5, 9, 14, 20, 33, 7, 61], [8, 2, 40, 41, 12, 3, 90]]  # test_patching_parity's prompts
  for path in (gpt2, _tiny("llama", str(tmp_path / "families"))):
    bridge = TransformerBridge.boot_transformers(str(path), device="cpu")
    _, cache = bridge.run_with_cache(torch.tensor(CLEAN))
    model = headspec.load(path).model
    _, inter = jax.jit(lambda tokens, model=model: model(tokens, capture=names))(jnp.asarray(CLEAN))
    reference = {name: value.detach().numpy() for name, value in cache.items()}
    T = len(CLEAN[0])
    visible = np.tril(np.ones((T, T), bool))
    for layer in range(2):
      block = {name.removeprefix(f"blocks.{layer}."): v for name, v in reference.items() if f"blocks.{layer}." in name}
      np.testing.assert_allclose(np.asarray(inter.mlp_post_LBTF[layer]), block["mlp.hook_post"], atol=1e-5, rtol=1e-5)
      np.testing.assert_allclose(
        np.asarray(inter.attn_scores_LBHTS[layer])[..., visible],
        block["attn.hook_attn_scores"][..., visible],
        atol=1e-5,
      )
      np.testing.assert_allclose(np.asarray(inter.ln1_scale_LBT[layer]), block["ln1.hook_scale"][..., 0], rtol=1e-5)
      np.testing.assert_allclose(np.asarray(inter.ln2_scale_LBT[layer]), block["ln2.hook_scale"][..., 0], rtol=1e-5)
    ln_final = reference["ln_final.hook_scale"][..., 0]
    np.testing.assert_allclose(np.asarray(inter.ln_final_scale_BT), ln_final, rtol=1e-5)
