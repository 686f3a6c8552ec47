"""headspec.generate against transformers' generate(do_sample=False), token for token, on a tiny random model of
every decoder family headspec imports (built offline from the config classes as in
tests/test_pretrained_families.py), with and without the KV cache; edits steer what is generated."""

import functools
import os
import pathlib

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import safetensors.numpy  # noqa: E402
from flax import nnx  # noqa: E402

import headspec  # noqa: E402
from headspec import pretrained  # noqa: E402
from headspec.errors import UserError  # noqa: E402
from headspec.model import edits  # noqa: E402
from headspec.model.config import ModelConfig
from headspec.model.sites import Edit
from headspec.model.transformer import Transformer  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
families = pytest.importorskip("test_pretrained_families")

NEW = 20
GPT2 = dict(n_embd=64, n_layer=2, n_head=4, n_positions=64, initializer_range=0.2, bos_token_id=1, eos_token_id=2)
# family -> (config class, causal-LM class, config arguments): every decoder of test_pretrained_families, and GPT-2.
DECODERS = {"gpt2": ("GPT2Config", "GPT2LMHeadModel", GPT2)} | {
  family: spec[:3] for family, spec in families.FAMILIES.items() if spec[1].endswith("ForCausalLM")
}
PROMPT = "A man, a plan, a canal"
OTHER_PROMPT = {"olmo2": "The quick brown fox jumps"}  # the one above sends OLMo-2's tiny model into a 2-cycle


@functools.cache
def _tiny(family: str, root: str) -> pathlib.Path:
  config_cls, model_cls, kwargs = DECODERS[family]
  path = pathlib.Path(root) / family
  V = families._save_tokenizer(path, family)
  torch.manual_seed(0)
  config = getattr(transformers, config_cls)(vocab_size=V + (8 if family == "gpt_neox" else 0), **kwargs)
  getattr(transformers, model_cls)(config).save_pretrained(path)
  families._perturb_norms(path)
  if family == "gemma2":  # its sublayer-output norms at ~1 leave the scaled embedding in charge: one token repeats
    file = path / "model.safetensors"
    tensors = safetensors.numpy.load_file(file)
    for key in tensors:
      if "post_attention_layernorm" in key or "post_feedforward_layernorm" in key:
        tensors[key] = tensors[key] + 3.0
    safetensors.numpy.save_file(tensors, file, metadata={"format": "pt"})
  return path


@pytest.fixture(scope="module")
def root(tmp_path_factory):
  return str(tmp_path_factory.mktemp("generate"))


def _reference(path, family, rows, new=NEW):
  """transformers' greedy generation (eager attention, no EOS stop) of left-padded rows: the new tokens."""
  hf = getattr(transformers, DECODERS[family][1]).from_pretrained(path, attn_implementation="eager").eval()
  hf.generation_config.eos_token_id = None
  hf.generation_config.pad_token_id = 0
  P = max(map(len, rows))
  ids = torch.tensor([[0] * (P - len(r)) + r for r in rows])
  mask = torch.tensor([[0] * (P - len(r)) + [1] * len(r) for r in rows])
  with torch.no_grad():
    out = hf.generate(ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, do_sample=False)
  return out[:, P:].tolist()


@pytest.mark.slow
@pytest.mark.parametrize("family", list(DECODERS))
def test_greedy_equals_transformers_with_and_without_the_cache(family, root):
  path = _tiny(family, root)
  loaded = pretrained.load_pretrained(str(path))
  _, tokenizer = loaded
  prompt = OTHER_PROMPT.get(family, PROMPT)
  ids = list(tokenizer.prefix_ids) + tokenizer.encode(prompt)
  (expected,) = _reference(path, family, [ids])
  assert len(set(expected)) > 2, expected  # a model that repeats one token would hide a wrong position
  assert headspec.generate(loaded, ids, NEW) == expected, family
  assert headspec.generate(loaded, ids, NEW, use_cache=False) == expected, family
  text = headspec.generate(loaded, prompt, NEW)  # a text: tokenized with the tokenizer's BOS, the new text back
  assert text == tokenizer.decode(expected), family


@pytest.mark.slow
def test_left_padded_batches_equal_transformers(root):
  """Rows of different lengths, left-padded (positions count from each row's first token), as transformers
  with an attention mask; Mistral's sliding window (5) is shorter than the rows."""
  for family in ("llama", "mistral"):
    path = _tiny(family, root)
    loaded = pretrained.load_pretrained(str(path))
    tokenizer = loaded[1]
    rows = [list(tokenizer.prefix_ids) + tokenizer.encode(t) for t in (PROMPT, "The quick brown fox", "Panama")]
    expected = _reference(path, family, rows, new=8)
    assert headspec.generate(loaded, rows, 8) == expected, family
    assert headspec.generate(loaded, rows, 8, use_cache=False) == expected, family


def _decoder(**options):
  sizes = dict(kind="decoder", vocab_size=50, num_layers=2, num_heads=4, num_kv_heads=2, d_model=32, d_head=8)
  cfg = ModelConfig(**(sizes | dict(d_ff=64, max_len=40, positions="rotary", norm="rmsnorm") | options))
  model = Transformer(cfg, rngs=nnx.Rngs(params=0))
  params = nnx.state(model, nnx.Param)  # weights 10× the initialisation's: continuations that vary
  nnx.update(model, jax.tree.map(lambda p: p * 10.0 if p.ndim > 1 else p, params))
  return model


def test_the_cache_decodes_what_the_full_forward_does():
  """The cached steps' tokens equal the full forward's on a model with sliding windows and QK-norm; the greedy
  tokens are each the argmax of a plain forward over prompt + the tokens before it."""
  model = _decoder(attention_windows=(3, 0), qk_norm="head")
  prompt = [3, 14, 15, 9, 2, 6]
  new = headspec.generate(model, prompt, 12)
  assert len(set(new)) > 3, new
  assert new == headspec.generate(model, prompt, 12, use_cache=False)
  logits, _ = jax.jit(lambda tokens: model(tokens))(jnp.asarray([prompt + new]))
  np.testing.assert_array_equal(np.asarray(logits[0, len(prompt) - 1 : -1].argmax(-1)), new)


def test_edits_steer_generation():
  """Adding a large multiple of token 7's unembedding to the last residual stream makes every new token 7;
  clamping that direction (an Apply) does the same; with and without the cache alike."""
  model = _decoder(tie_embeddings=True)
  prompt = [3, 14, 15, 9, 2, 6]
  plain = headspec.generate(model, prompt, 10)
  assert plain.count(7) < 10
  u_D = model.token_embed_VD[...][7]
  L = model.cfg.num_layers
  add = jnp.zeros((L, 1, 1, 32)).at[L - 1, 0, 0].set(50.0 * u_D / jnp.linalg.norm(u_D))
  steer = {"resid_post": Edit(add=add)}
  clamp = {"resid_post": edits.clamp(u_D, 60.0, layers=L - 1)}
  for intervention in (steer, clamp):
    for use_cache in (True, False):
      assert headspec.generate(model, prompt, 10, interventions=intervention, use_cache=use_cache) == [7] * 10
  ablated = {"mlp_post": edits.replace(0.0)}  # every neuron off: a different continuation
  assert headspec.generate(model, prompt, 10, interventions=ablated) != plain
  assert headspec.generate(model, prompt, 10, interventions=ablated) == headspec.generate(
    model, prompt, 10, interventions=ablated, use_cache=False
  )


def test_sampling_eos_and_bad_arguments():
  model = _decoder()
  prompt = [3, 14, 15]
  a = headspec.generate(model, prompt, 8, temperature=1.5, top_k=5, seed=3)
  assert a == headspec.generate(model, prompt, 8, temperature=1.5, top_k=5, seed=3)
  assert a == headspec.generate(model, prompt, 8, temperature=1.5, top_k=5, seed=3, use_cache=False)
  assert len(a) == 8 and all(0 <= t < 50 for t in a)
  greedy = headspec.generate(model, prompt, 8)
  assert headspec.generate(model, prompt, 8, top_k=1, temperature=1.0) == greedy  # top-1 sampling is greedy
  stop = greedy[2]
  assert headspec.generate(model, prompt, 8, eos_id=stop) == greedy[: greedy.index(stop) + 1]
  assert headspec.generate(model, [prompt, prompt[1:]], 3)[0] == greedy[:3]
  for kwargs, message in [
    (dict(prompt="text", max_new_tokens=3), "prompt is a text but the model has no tokenizer"),
    (dict(prompt=[3, 99], max_new_tokens=3), "prompt: token id 99 is outside the vocabulary"),
    (dict(prompt=[], max_new_tokens=3), "prompt is empty|give a text"),
    (dict(prompt=prompt, max_new_tokens=38), "exceeds model.max_len=40"),
    (dict(prompt=prompt, max_new_tokens=3, temperature=-1), "temperature=-1 must be a number"),
    (dict(prompt=prompt, max_new_tokens=3, top_k=0), "top_k=0 must be None or an int"),
    (
      dict(prompt=prompt, max_new_tokens=3, interventions={"z": Edit(add=jnp.zeros((2, 1, 3, 4, 8)))}),
      r"interventions\['z'\].add of shape .* position axis",
    ),  # fmt: skip
  ]:
    with pytest.raises(UserError, match=message):
      headspec.generate(model, **kwargs)
  with pytest.raises(UserError, match="encoder"):
    headspec.generate(_decoder(kind="encoder"), prompt, 3)


def test_a_text_prompt_gives_text_and_ids_give_ids(tmp_path):
  """A text gives the new text (the new tokens decoded), token ids give ids, a list gives a list of each
  prompt's kind; the text is the decoding of what the same prompt's ids generate."""
  from headspec.data.tokenizer import train_sentencepiece

  lines = ["the dog saw a cat. the cat saw the dog!", "When Mary went to the store, she gave a drink."] * 40
  tok = train_sentencepiece(lines, tmp_path, vocab_size=300)
  model = _decoder(vocab_size=tok.vocab_size)
  text = "the dog saw"
  ids = list(tok.prefix_ids) + tok.encode(text)
  new_ids = headspec.generate((model, tok), ids, 6)
  assert isinstance(new_ids, list) and all(isinstance(t, int) for t in new_ids)
  new_text = headspec.generate((model, tok), text, 6)
  assert isinstance(new_text, str) and new_text == tok.decode(new_ids)
  assert headspec.generate((model, tok), [text, "a cat"], 6)[0] == new_text
  assert headspec.generate((model, tok), [text, ids], 6) == [new_text, new_ids]
  assert headspec.generate((model, tok), text, 0) == "" and headspec.generate((model, tok), ids, 0) == []
