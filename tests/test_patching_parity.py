"""Activation patching against TransformerLens 4 (TransformerBridge over the same Hugging Face directory),
on a random-weight GPT-2 and on the tiny random model of every decoder family headspec loads
(tests/test_pretrained_families.py): per-head per-position patching of z (`get_act_patch_attn_head_out_by_pos`,
which patches hook_z) and of the residual stream entering each block (`get_act_patch_resid_pre`), denoising,
to 1e-4. The initializer_range is large (0.3, the families' 0.2 with perturbed norms): the default small one
gives effects too small to compare."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import headspec  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("transformer_lens")
from test_pretrained_families import FAMILIES, _tiny  # noqa: E402  (the families' tiny random models)
from transformer_lens import patching  # noqa: E402
from transformer_lens.model_bridge import TransformerBridge  # noqa: E402

CLEAN = [[5, 9, 14, 20, 33, 7, 61], [8, 2, 40, 41, 12, 3, 90]]
CORRUPT = [[5, 9, 17, 20, 33, 7, 61], [8, 2, 40, 44, 12, 3, 90]]
ANSWERS = [[7, 11], [3, 4]]
DECODERS = [family for family, (_, model_cls, _, _) in FAMILIES.items() if model_cls.endswith("ForCausalLM")]


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
  path = tmp_path_factory.mktemp("gpt2")
  bpe = tokenizers.ByteLevelBPETokenizer()
  text = ["the quick brown fox jumps over the lazy dog, and the dog sleeps"] * 3
  bpe.train_from_iterator(text, vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"])
  bpe.save_model(str(path))
  eos = bpe.token_to_id("<|endoftext|>")
  config = transformers.GPT2Config(
    vocab_size=bpe.get_vocab_size(), n_positions=32, n_embd=24, n_layer=2, n_head=3, n_inner=48,
    initializer_range=0.3, bos_token_id=eos, eos_token_id=eos,
  )  # fmt: skip
  torch.manual_seed(0)
  transformers.GPT2LMHeadModel(config).save_pretrained(path)
  return path


@pytest.fixture(scope="module")
def families_root(tmp_path_factory):
  return str(tmp_path_factory.mktemp("families"))


def _assert_parity(path):
  bridge = TransformerBridge.boot_transformers(str(path), device="cpu")
  answers = torch.tensor(ANSWERS)

  def metric(logits):
    last = logits[:, -1]
    return (last.gather(1, answers[:, :1]) - last.gather(1, answers[:, 1:])).mean()

  _, cache = bridge.run_with_cache(torch.tensor(CLEAN))
  corrupt = torch.tensor(CORRUPT)
  ref_z_LTH = patching.get_act_patch_attn_head_out_by_pos(bridge, corrupt, cache, metric).detach().numpy()
  ref_resid_LT = patching.get_act_patch_resid_pre(bridge, corrupt, cache, metric).detach().numpy()
  loaded = headspec.load(path)
  L, H, T = loaded.model.cfg.num_layers, loaded.model.cfg.num_heads, len(CLEAN[0])
  z = headspec.patch(loaded, CLEAN, CORRUPT, site="z", answers=ANSWERS)
  ours_z_LTH = z["value"].to_numpy().reshape(L, H, T).transpose(0, 2, 1)  # rows: layer, head, position
  resid = headspec.patch(loaded, CLEAN, CORRUPT, site="resid_pre", answers=ANSWERS)
  assert ref_z_LTH.std() > 0.05 and ref_resid_LT.std() > 0.05  # effects large enough to compare
  np.testing.assert_allclose(ours_z_LTH, ref_z_LTH, atol=1e-4)
  np.testing.assert_allclose(resid["value"].to_numpy().reshape(L, T), ref_resid_LT, atol=1e-4)
  with torch.no_grad():
    assert z.attrs["base"] == pytest.approx(float(metric(bridge(corrupt))), abs=1e-4)


def test_patching_equals_transformer_lens(gpt2_dir):
  _assert_parity(gpt2_dir)


@pytest.mark.slow  # ~10 s a family, most of it TransformerLens's one forward per patch
@pytest.mark.parametrize("family", DECODERS)
def test_patching_equals_transformer_lens_for_every_family(family, families_root):
  """Grouped-query (llama, mistral, qwen2/3, gemma, gemma2), sliding windows shorter than the prompts
  (mistral, gemma2), Gemma-2's logit softcaps, OLMo's clip_qkv, GPT-NeoX's partial rotary and parallel block."""
  _assert_parity(_tiny(family, families_root))
