"""Run-with-cache: `headspec.capture` is one jitted forward (compiled once per model structure,
site set and token shape) whose values equal the eager model's, any site q, k, v included; its cache
helpers against direct computations: the residual decomposition sums to the stream, the final norm's
linearisation is the norm at the final stream, per-head direct logit attribution summed with the other
pieces is the logit difference (TransformerLens's definition), the logit lens's last layer is the logits."""

import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import headspec
from headspec.errors import UserError
from headspec.model import capture as cache_lib
from headspec.model.config import ModelConfig
from headspec.model.transformer import random_like

CFG = ModelConfig(kind="decoder", vocab_size=97, num_layers=3, num_heads=4, d_model=32, d_head=8, d_ff=64,
                            max_len=32)  # fmt: skip
TOKENS_BT = np.random.default_rng(0).integers(0, 97, (2, 9)).astype(np.int32)
ANSWERS = [(5, 7), (11, 3)]


def _scaled(net, factor=8.0):
  """Weights scaled up from the 0.02 initialisation, so heads have effects worth comparing."""
  graphdef, state = nnx.split(net)
  return nnx.merge(graphdef, jax.tree.map(lambda x: x * factor if x.ndim >= 2 else x, state))


@pytest.fixture(scope="module")
def net():
  return _scaled(random_like(CFG, 0))


def test_values_equal_the_eager_model(net):
  cache = headspec.capture(net, TOKENS_BT)
  sites = cache_lib.default_sites()
  assert {"q", "k", "v", "z", "pattern", "resid_pre", "head_out", "embeddings"} <= set(cache.keys()) == set(sites)
  logits, inter = net(jnp.asarray(TOKENS_BT), capture=sites)  # eager
  np.testing.assert_allclose(cache.logits_BTV, logits, atol=1e-5, rtol=1e-5)
  for site in sites:
    eager = inter.embeddings_BTD if site == "embeddings" else inter.site(site)
    np.testing.assert_allclose(cache[site], eager, atol=1e-5, rtol=1e-5, err_msg=site)
  np.testing.assert_array_equal(cache["blocks.1.attn.hook_z"], cache["z"][1])  # TransformerLens's names
  np.testing.assert_array_equal(cache["q", 2], cache["q"][2])
  np.testing.assert_allclose(cache["hook_embed"] + cache["hook_pos_embed"], cache["embeddings"], atol=1e-6)
  heads_in = headspec.capture(net, TOKENS_BT, sites=["q_in", "v"])
  assert heads_in.keys() == ["q_in", "v"] and heads_in["q_in"].shape == (3, 2, 9, 4, 32)
  np.testing.assert_allclose(heads_in["v"], cache["v"], atol=1e-6)


def test_compiles_once_per_bucket_and_site_set(net):
  """Rows are right-padded to the next power of two of their length (at least 16), masked, and cut back:
  lengths 5 and 7 share one program, 20 compiles the 32 bucket once; the arrays keep the rows' length."""
  sites = ("z", "resid_post")
  tokens = TOKENS_BT[:, :7]
  count = lambda shape, s=sites: cache_lib.TRACES.get((s, shape), 0)
  before = count((2, 16))
  first = headspec.capture(net, tokens, sites=list(sites))
  headspec.capture(net, tokens + 1, sites=["resid_post", "z"])  # other values, the same site set
  other = _scaled(random_like(CFG, 1))  # other weights, the same structure
  headspec.capture(other, tokens, sites=list(sites))
  short = headspec.capture(net, tokens[:, :5], sites=list(sites))  # another length, the same bucket
  assert count((2, 16)) - before == 1
  assert first["z"].shape == (3, 2, 7, 4, 8) and short["resid_post"].shape == (3, 2, 5, 32)
  assert first.tokens_BT.shape == first.valid_BT.shape == (2, 7) and first.logits_BTV.shape == (2, 7, 97)
  long = np.random.default_rng(2).integers(0, 97, (2, 20)).astype(np.int32)
  headspec.capture(net, long, sites=list(sites))
  headspec.capture(net, long[:, :17], sites=list(sites))
  assert count((2, 32)) == 1 and count((2, 16)) - before == 1
  a = headspec.capture(net, tokens, sites=list(sites))["z"]
  b = headspec.capture(other, tokens, sites=list(sites))["z"]
  assert np.abs(np.asarray(a) - np.asarray(b)).max() > 1e-3  # the weights are an argument, not constants


def test_bucket_padding_is_masked_in_an_encoder():
  """An encoder attends both ways, so the bucket's padding would change every token if it were not masked:
  each site cut back equals the eager model run on the unpadded row (pattern's key axis cut too)."""
  cfg = ModelConfig(kind="encoder", vocab_size=50, num_layers=2, num_heads=2, d_model=16, d_head=8,
                              d_ff=32, max_len=64)  # fmt: skip
  encoder = _scaled(random_like(cfg, 0), 4.0)
  tokens = np.array([[3, 7, 1, 9, 4]], np.int32)
  cache = headspec.capture(encoder, tokens)
  logits, inter = encoder(jnp.asarray(tokens), capture=cache_lib.default_sites())  # eager, 5 tokens, no padding
  np.testing.assert_allclose(cache.logits_BTV, logits, atol=1e-5, rtol=1e-5)
  assert cache["pattern"].shape == (2, 1, 2, 5, 5)
  for site in cache.keys():
    eager = inter.embeddings_BTD if site == "embeddings" else inter.site(site)
    np.testing.assert_allclose(cache[site], eager, atol=1e-5, rtol=1e-5, err_msg=site)


def test_second_call_is_at_least_ten_times_faster(net):
  """The first call of a shape compiles; the second runs the compiled program (milliseconds)."""
  tokens = np.random.default_rng(1).integers(0, 97, (3, 13)).astype(np.int32)  # a shape no other test uses
  sites = ["q", "k", "v", "pattern", "resid_post"]

  def timed():
    start = time.perf_counter()
    jax.block_until_ready(headspec.capture(net, tokens, sites=sites).activations)
    return time.perf_counter() - start

  first = timed()
  second = min(timed() for _ in range(3))
  assert first >= 10 * second, (first, second)


def test_texts_are_padded_and_masked(tmp_path):
  from test_api_tokens import _gpt2_dir

  loaded = headspec.load(_gpt2_dir(tmp_path))
  texts = ["When Mary and John went to the store, John gave a drink to", "café  naïve"]
  both = headspec.capture(loaded, texts, sites="resid_post")
  tokens_BT = headspec.to_tokens(loaded, texts)
  np.testing.assert_array_equal(both.tokens_BT, tokens_BT)
  for b, text in enumerate(texts):
    alone = headspec.capture(loaded, text, sites="resid_post")
    T = alone.tokens_BT.shape[1]
    assert both.valid_BT[b].sum() == T and both.last_B[b] == T - 1
    np.testing.assert_allclose(both["resid_post"][:, b, :T], alone["resid_post"][:, 0], atol=1e-5)
  bos = headspec.capture(loaded, texts[1], sites="z", prepend_bos=True)
  assert bos.tokens_BT[0, 0] == loaded.tokenizer.eos_id and bos.tokens_BT.shape[1] == T + 1


def test_residual_decomposition_and_accumulation(net):
  cache = headspec.capture(net, TOKENS_BT)
  L = CFG.num_layers
  stack, labels = cache.decompose_resid(return_labels=True)
  assert labels == ["embed", "0_attn_out", "0_mlp_out", "1_attn_out", "1_mlp_out", "2_attn_out", "2_mlp_out"]
  np.testing.assert_allclose(stack.sum(0), cache["resid_post", L - 1], atol=1e-4)
  np.testing.assert_allclose(cache.decompose_resid(2).sum(0), cache["resid_pre", 2], atol=1e-4)
  attn = cache.decompose_resid(mode="attn", incl_embeds=False)
  np.testing.assert_array_equal(attn, cache["attn_out"])
  acc, labels = cache.accumulated_resid(incl_mid=True, return_labels=True)
  assert labels == ["0_pre", "0_mid", "1_pre", "1_mid", "2_pre", "2_mid", "final_post"]
  np.testing.assert_array_equal(acc[2], cache["resid_pre", 1])
  np.testing.assert_array_equal(acc[3], cache["resid_mid", 1])
  np.testing.assert_array_equal(acc[-1], cache["resid_post", L - 1])
  upto, labels = cache.accumulated_resid(1, return_labels=True)  # TransformerLens: resid_pre of `layer` included
  assert labels == ["0_pre", "1_pre"] and upto.shape[0] == 2
  np.testing.assert_array_equal(cache.accumulated_resid(0)[0], cache["embeddings"])  # layer 0: the embeddings
  np.testing.assert_allclose(cache.decompose_resid(1).sum(0), upto[-1], atol=1e-4)  # the same stream
  heads, labels = cache.stack_head_results(return_labels=True)
  assert heads.shape == (L * 4, 2, 9, 32) and labels[5] == "L1H1"
  np.testing.assert_array_equal(heads[5], cache["head_out"][1, :, :, 1])


def test_final_norm_linearisation_and_direct_logit_attribution(net):
  cache = headspec.capture(net, TOKENS_BT)
  final_BTD = np.asarray(cache["resid_post", CFG.num_layers - 1], np.float64)
  # By hand (numpy, float64): LayerNorm at the final stream, scale fixed there.
  w, bias = np.asarray(net.ln_final.scale[...]), np.asarray(net.ln_final.bias[...])
  s_BT1 = np.sqrt(final_BTD.var(-1, keepdims=True) + CFG.layer_norm_eps)
  lin = lambda x: (x - x.mean(-1, keepdims=True)) / s_BT1 * w
  np.testing.assert_allclose(cache.apply_ln_to_stack(final_BTD[None])[0], lin(final_BTD), atol=1e-5)
  hidden, _ = net(jnp.asarray(TOKENS_BT), output="hidden")
  np.testing.assert_allclose(lin(final_BTD) + bias, hidden, atol=1e-4)  # linear: the norm at its own point

  w_DV = np.asarray(net.token_embed_VD[...]).T  # tied unembedding
  u_BD = np.stack([w_DV[:, c] - w_DV[:, x] for c, x in ANSWERS])
  dla_LHB = np.asarray(cache.head_dla(ANSWERS))
  head_out = np.asarray(cache["head_out"], np.float64)  # [L, B, T, H, D]
  last = cache.last_B
  for l in range(CFG.num_layers):
    for h in range(CFG.num_heads):
      for b in range(2):
        t = last[b]
        x_D = head_out[l, b, t, h]
        by_hand = (x_D - x_D.mean()) / s_BT1[b, t] * w
        assert dla_LHB[l, h, b] == pytest.approx(float(by_hand @ u_BD[b]), abs=1e-4)
  # Every piece's direct effect, summed, plus the biases' is the logit difference (exactly: the norm is
  # linear at its own point).
  logits = np.asarray(cache.logits_BTV)
  diff_B = np.array([logits[b, last[b], c] - logits[b, last[b], x] for b, (c, x) in enumerate(ANSWERS)])
  assert np.abs(diff_B).max() > 0.5  # an effect worth checking
  pieces = cache.stack_to_logit_diff(cache.decompose_resid(apply_ln=True), ANSWERS).sum(0)
  np.testing.assert_allclose(pieces + cache.logit_diff_constant_B(ANSWERS), diff_B, atol=1e-4)
  b_O = np.stack([np.asarray(block.attention.b_o_D[...]) for block in net.blocks])  # the bias of no head
  b_O_BTD = np.broadcast_to(b_O.sum(0), final_BTD.shape)
  rest = cache.decompose_resid(mode="mlp", apply_ln=True)  # embeddings and MLPs
  total = dla_LHB.sum((0, 1)) + cache.stack_to_logit_diff(rest, ANSWERS).sum(0)
  total = total + cache.stack_to_logit_diff(cache.apply_ln_to_stack(b_O_BTD[None]), ANSWERS)[0]
  np.testing.assert_allclose(total + cache.logit_diff_constant_B(ANSWERS), diff_B, atol=1e-4)


def test_logit_lens(net):
  cache = headspec.capture(net, TOKENS_BT)
  lens, labels = cache.logit_lens(return_labels=True)
  assert lens.shape == (CFG.num_layers + 1, 2, 9, 97) and labels[0] == "0_pre" and labels[-1] == "final_post"
  np.testing.assert_allclose(lens[-1], cache.logits_BTV, atol=1e-4)
  x = cache["resid_pre", 1]  # layer 1's stream through the final norm recomputed on it, then unembedded
  np.testing.assert_allclose(lens[1], net.unembed(net.ln_final(x)), atol=1e-5)
  assert np.abs(np.asarray(lens[1]) - np.asarray(lens[-1])).max() > 1e-2


def test_helpers_refuse_what_has_no_meaning():
  encoder = random_like(
    ModelConfig(
      kind="encoder",
      vocab_size=50,
      num_layers=1,
      num_heads=2,
      d_model=16,
      d_head=8,
      d_ff=32,
      max_len=16,
      pre_layernorm=False,
    ),  # fmt: skip
    0,
  )
  cache = headspec.capture(encoder, [[1, 2, 3]])
  with pytest.raises(UserError, match="post-LN model .* no sum"):
    cache.decompose_resid()
  with pytest.raises(UserError, match="encoder's logits pass its masked-LM head"):
    cache.stack_to_logit_diff(cache["resid_post"], [(1, 2)])


@pytest.mark.parametrize(
  "kwargs,message",
  [
    (dict(sites=["hook_zz"]), "capture: unknown site 'hook_zz'"),
    (dict(sites=[]), "sites=\\(\\) captures nothing"),
    (dict(sites=3), "capture: sites=3 must be a list of texts"),
    (dict(tokens_or_text=[[1, 200]]), r"tokens_or_text\[0\]: token id 200 is outside the vocabulary 0..96"),
    (dict(tokens_or_text=[[]]), r"tokens_or_text\[0\] is empty"),
    (dict(tokens_or_text="a text"), "a text needs a tokenizer"),
    (dict(tokens_or_text=[list(range(40))]), "40 tokens exceed the model's context of 32"),
    (dict(prepend_bos=1), "prepend_bos=1 must be True or False"),
  ],
)
def test_bad_input_is_one_line(net, kwargs, message):
  kwargs = dict(tokens_or_text=TOKENS_BT) | kwargs
  with pytest.raises(UserError, match=message) as e:
    headspec.capture(net, **kwargs)
  assert "\n" not in str(e.value)


def test_a_site_not_captured_is_named(net):
  cache = headspec.capture(net, TOKENS_BT, sites=["z"])
  with pytest.raises(UserError, match=r"decompose_resid: site 'embeddings' was not captured \(captured: z\)"):
    cache.decompose_resid()
  with pytest.raises(UserError, match=r"cache\['q'\]: site 'q' was not captured"):
    cache["q"]


def test_transformer_lens_names_and_layers(net):
  cache = headspec.capture(net, TOKENS_BT, sites=["attn.hook_z", "hook_resid_pre", "hook_embed"])
  assert cache.keys() == ["embed", "resid_pre", "z"]  # TransformerLens's names read as headspec's sites
  np.testing.assert_array_equal(cache["blocks.2.hook_resid_pre"], cache["resid_pre", -1])
  with pytest.raises(UserError, match=r"cache\['embed', 0\]: 'embed' has no layer axis"):
    cache["embed", 0]
  with pytest.raises(UserError, match=r"cache\['z', 3\]: layer out of range 0..2"):
    cache["z", 3]
