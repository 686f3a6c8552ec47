"""Every supported Hugging Face family against transformers (PyTorch, CPU, float32, eager attention).

For each family a tiny random model (2 layers, d_model 64) is built from its config class, saved with
save_pretrained (safetensors) beside a tiny byte-level BPE tokenizer.json, imported, and compared: logits
within 1e-4, every head's attention probabilities within 1e-5, and each head's Z_h = A_h V_h against the
input of the reference's output projection (a forward pre-hook). Rotary families run at positions far past
their (original) context too, where Llama-3's scaling and GPT-NeoX's partial rotation change the angles.
"""

import functools
import json
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

from headspec import pretrained  # noqa: E402
from headspec.errors import UserError  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

LOGITS_ATOL, PROBS_ATOL, Z_ATOL = 1e-4, 1e-5, 1e-4
TEXTS = ["The quick brown fox jumps over the lazy dog again and again.", "A man, a plan, a canal: Panama!"]
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>", "<mask>"]  # ids 0..4
DECODER = dict(
  hidden_size=64,
  intermediate_size=96,
  num_hidden_layers=2,
  num_attention_heads=4,
  max_position_embeddings=256,
  initializer_range=0.2,
  pad_token_id=0,
  bos_token_id=1,
  eos_token_id=2,
)
LLAMA3 = {
  "rope_type": "llama3",
  "factor": 8.0,
  "low_freq_factor": 1.0,
  "high_freq_factor": 4.0,
  "original_max_position_embeddings": 16,
  "rope_theta": 500.0,
}
# case -> (config class, model class, config arguments, the reference's output projection of layer i): the
# parity cases, at least one per family of headspec.pretrained.FAMILIES (the config class's model_type; checked
# by test_every_registered_family_has_a_parity_case). A new family adds its case here (docs/pretrained.md).
FAMILIES = {
  "bert": (
    "BertConfig",
    "BertForMaskedLM",
    dict(
      hidden_size=64,
      num_hidden_layers=2,
      num_attention_heads=4,
      intermediate_size=96,
      max_position_embeddings=40,
      initializer_range=0.2,
      pad_token_id=0,
    ),
    "bert.encoder.layer.{i}.attention.output.dense",
  ),
  "gpt2": (
    "GPT2Config",
    "GPT2LMHeadModel",
    dict(
      n_embd=64,
      n_layer=2,
      n_head=4,
      n_inner=96,
      n_positions=256,
      initializer_range=0.2,
      pad_token_id=0,
      bos_token_id=1,
      eos_token_id=2,
    ),
    "transformer.h.{i}.attn.c_proj",
  ),
  "llama": (
    "LlamaConfig",
    "LlamaForCausalLM",
    dict(DECODER, num_key_value_heads=2, rope_parameters=LLAMA3, attention_bias=True, mlp_bias=True),
    "model.layers.{i}.self_attn.o_proj",
  ),
  "mistral": (
    "MistralConfig",
    "MistralForCausalLM",
    dict(DECODER, num_key_value_heads=1, sliding_window=5, head_dim=24),
    "model.layers.{i}.self_attn.o_proj",
  ),
  "qwen2": (
    "Qwen2Config",
    "Qwen2ForCausalLM",
    dict(DECODER, num_key_value_heads=2, tie_word_embeddings=True),
    "model.layers.{i}.self_attn.o_proj",
  ),
  "gpt_neox": (
    "GPTNeoXConfig",
    "GPTNeoXForCausalLM",
    dict(DECODER, rope_parameters={"rope_type": "default", "rope_theta": 100.0, "partial_rotary_factor": 0.25}),
    "gpt_neox.layers.{i}.attention.dense",
  ),
  "gpt_neox_serial": (
    "GPTNeoXConfig",
    "GPTNeoXForCausalLM",
    dict(DECODER, use_parallel_residual=False, hidden_act="gelu_new"),
    "gpt_neox.layers.{i}.attention.dense",
  ),
  "qwen3": (
    "Qwen3Config",
    "Qwen3ForCausalLM",
    dict(DECODER, num_key_value_heads=2, head_dim=16),
    "model.layers.{i}.self_attn.o_proj",
  ),
  "gemma": (
    "GemmaConfig",
    "GemmaForCausalLM",
    dict(DECODER, num_key_value_heads=1, head_dim=32),
    "model.layers.{i}.self_attn.o_proj",
  ),
  "gemma2": (
    "Gemma2Config",
    "Gemma2ForCausalLM",
    dict(
      DECODER,
      num_key_value_heads=2,
      head_dim=16,
      sliding_window=4,
      query_pre_attn_scalar=24,
      attn_logit_softcapping=1.5,
      final_logit_softcapping=2.0,
    ),
    "model.layers.{i}.self_attn.o_proj",
  ),
  "olmo": (
    "OlmoConfig",
    "OlmoForCausalLM",
    dict(DECODER, clip_qkv=0.4),
    "model.layers.{i}.self_attn.o_proj",
  ),
  "olmo2": (
    "Olmo2Config",
    "Olmo2ForCausalLM",
    dict(DECODER, num_key_value_heads=2),
    "model.layers.{i}.self_attn.o_proj",
  ),
  "roberta": (
    "RobertaConfig",
    "RobertaForMaskedLM",
    dict(
      hidden_size=64,
      num_hidden_layers=2,
      num_attention_heads=4,
      intermediate_size=96,
      max_position_embeddings=40,
      type_vocab_size=1,
      initializer_range=0.2,
      pad_token_id=0,
    ),
    "roberta.encoder.layer.{i}.attention.output.dense",
  ),
  "distilbert": (
    "DistilBertConfig",
    "DistilBertForMaskedLM",
    dict(
      dim=64, n_layers=2, n_heads=4, hidden_dim=96, max_position_embeddings=40, initializer_range=0.2, pad_token_id=0
    ),
    "distilbert.transformer.layer.{i}.attention.out_lin",
  ),
}


def _save_tokenizer(out_dir: pathlib.Path, family: str) -> int:
  bpe = tokenizers.ByteLevelBPETokenizer()
  bpe.train_from_iterator(TEXTS * 3, vocab_size=200, min_frequency=1, special_tokens=SPECIALS)
  if family in ("roberta",):
    bpe.post_processor = tokenizers.processors.RobertaProcessing(("</s>", 2), ("<s>", 1))
  elif family not in ("bert", "distilbert", "gpt2", "gpt_neox", "gpt_neox_serial", "qwen2", "olmo2"):  # no BOS
    bpe.post_processor = tokenizers.processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
  out_dir.mkdir(parents=True, exist_ok=True)
  bpe.save(str(out_dir / "tokenizer.json"))
  config = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}
  if family in ("roberta", "distilbert", "bert"):
    config.update(mask_token="<mask>", cls_token="<s>", sep_token="</s>")  # (Distil)BERT: BERT's roles
  (out_dir / "tokenizer_config.json").write_text(json.dumps(config))
  return bpe.get_vocab_size()


def _perturb_norms(path: pathlib.Path) -> None:
  """Random init leaves norms at scale 1 (0 for Gemma's offsets) and bias 0: perturb so the mapping shows."""
  file = path / "model.safetensors"
  tensors = safetensors.numpy.load_file(file)
  rng = np.random.default_rng(1)
  for key, value in tensors.items():
    if "norm" in key.lower() or ".ln_" in key or key.endswith("bias"):  # .ln_: GPT-2's ln_1, ln_2, ln_f
      tensors[key] = (value + 0.3 * rng.standard_normal(value.shape)).astype(value.dtype)
  safetensors.numpy.save_file(tensors, file, metadata={"format": "pt"})


@functools.cache
def _tiny(family: str, root: str) -> pathlib.Path:
  config_cls, model_cls, kwargs, _ = FAMILIES[family]
  path = pathlib.Path(root) / family
  V = _save_tokenizer(path, family)
  torch.manual_seed(0)
  config = getattr(transformers, config_cls)(vocab_size=V + (8 if family == "gpt_neox" else 0), **kwargs)
  getattr(transformers, model_cls)(config).save_pretrained(path)
  _perturb_norms(path)
  return path


@pytest.fixture(scope="module")
def root(tmp_path_factory):
  return str(tmp_path_factory.mktemp("families"))


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, ids_BT, valid_BT, positions_BT):
  model = nnx.merge(graphdef, state)
  return model(ids_BT, valid_BT=valid_BT, positions_BT=positions_BT, capture=("pattern", "z"))


def _reference(hf_model, out_proj: str, ids_BT, valid_BT, positions_BT):
  contexts, hooks = [], []
  for i in range(hf_model.config.num_hidden_layers if hasattr(hf_model.config, "num_hidden_layers") else 2):
    module = hf_model.get_submodule(out_proj.format(i=i))
    hooks.append(module.register_forward_pre_hook(lambda m, args: contexts.append(args[0].detach().numpy().copy())))
  kwargs = {} if positions_BT is None else {"position_ids": torch.tensor(positions_BT)}
  try:
    with torch.no_grad():
      out = hf_model(
        torch.tensor(ids_BT), attention_mask=torch.tensor(valid_BT.astype(np.int64)), output_attentions=True, **kwargs
      )
  finally:
    for hook in hooks:
      hook.remove()
  return out, contexts


def _batch(tokenizer, T=None):
  rows = [list(tokenizer.prefix_ids) + tokenizer.encode(t) + list(tokenizer.suffix_ids) for t in TEXTS]
  T = T or max(map(len, rows))
  rows = [(r * 4)[:T] for r in rows[:1]] + [r[:T] for r in rows[1:]]  # row 0 full, row 1 padded
  ids = np.array([r + [tokenizer.pad_id] * (T - len(r)) for r in rows], np.int64)
  valid = np.array([[True] * len(r) + [False] * (T - len(r)) for r in rows])
  return ids, valid


@pytest.mark.parametrize("family", list(FAMILIES))
def test_parity_with_transformers(family, root):
  path = _tiny(family, root)
  model, tokenizer = pretrained.load_pretrained(str(path))
  _, model_cls, _, out_proj = FAMILIES[family]
  hf_model = getattr(transformers, model_cls).from_pretrained(path, attn_implementation="eager").eval()
  ids, valid = _batch(tokenizer, T=24)
  shifts = (0,) if model.cfg.positions != "rotary" else (0, 150)  # 150: far past llama3's original 16
  for shift in shifts:
    positions = None if not shift else np.broadcast_to(np.arange(ids.shape[1]) + shift, ids.shape).copy()
    graphdef, state = nnx.split(model)
    ours_positions = None if positions is None else jnp.asarray(positions)
    logits, inter = jax.tree.map(
      np.asarray, _forward(graphdef, state, jnp.asarray(ids), jnp.asarray(valid), ours_positions)
    )
    out, contexts = _reference(hf_model, out_proj, ids, valid, positions)
    keep = valid[:, :, None]  # padded positions (RoBERTa gives them the padding position) are not compared
    B, T = ids.shape
    for layer in range(model.cfg.num_layers):
      np.testing.assert_allclose(
        inter.pattern_LBHTS[layer] * valid[:, None, :, None],
        out.attentions[layer].numpy() * valid[:, None, :, None],
        atol=PROBS_ATOL,
        rtol=0,
        err_msg=f"{family} shift {shift}: attention probabilities, layer {layer}",
      )
      np.testing.assert_allclose(
        inter.z_LBTHK[layer].reshape(B, T, -1) * keep,
        contexts[layer] * keep,
        atol=Z_ATOL,
        rtol=0,
        err_msg=f"{family} shift {shift}: per-head context, layer {layer}",
      )
    np.testing.assert_allclose(
      logits * keep, out.logits.numpy() * keep, atol=LOGITS_ATOL, rtol=0, err_msg=f"{family}: logits"
    )
    assert np.abs(out.logits.numpy()).max() > 100 * LOGITS_ATOL  # the comparison is not vacuous


def test_every_registered_family_has_a_parity_case():
  """Each model_type of the import's one table (headspec.pretrained.FAMILIES) has a case above, keyed by its
  transformers config class's model_type, so a family registered without a parity case fails here."""
  covered = {getattr(transformers, config_cls).model_type for config_cls, *_ in FAMILIES.values()}
  assert sorted(set(pretrained.FAMILIES) - covered) == [], "registered families without a parity case in FAMILIES"
  assert sorted(covered - set(pretrained.FAMILIES)) == [], "parity cases of families headspec does not register"


def _edited(root, tmp_path, family, **changes) -> pathlib.Path:
  path = tmp_path / family
  path.mkdir()
  for file in _tiny(family, root).iterdir():
    (path / file.name).write_bytes(file.read_bytes())
  config = json.loads((path / "config.json").read_text())
  config.update(changes)
  (path / "config.json").write_text(json.dumps(config))
  return path


@pytest.mark.parametrize(
  "family, changes, message",
  [
    ("llama", dict(model_type="mamba"), r"model_type='mamba' is not supported \(supported: bert, roberta, .*llama"),
    ("llama", dict(rope_parameters={"rope_type": "yarn", "factor": 4.0}), "rope_scaling type 'yarn' is not supported"),
    ("qwen2", dict(rope_parameters=None, rope_scaling={"type": "dynamic", "factor": 2.0}), "type 'dynamic'"),
    ("gemma2", dict(layer_types=["chunked_attention", "full_attention"]), r"layer_types \['chunked_attention'\]"),
    ("gpt_neox", dict(hidden_act="quick_gelu"), "hidden_act='quick_gelu' is not supported"),
    ("llama", dict(head_dim=None, num_attention_heads=5), "hidden_size=64 is not a multiple of num_attention_heads=5"),
    ("llama", dict(num_key_value_heads=3), "num_attention_heads=4 is not a multiple of num_key_value_heads=3"),
    ("distilbert", dict(sinusoidal_pos_embds=True), "sinusoidal_pos_embds=true is not supported"),
  ],
)
def test_refused_configs_are_one_line(root, tmp_path, family, changes, message):
  path = _edited(root, tmp_path, family, **changes)
  with pytest.raises(UserError, match="config.json: .*" + message) as error:
    pretrained.load_pretrained(str(path))
  assert "\n" not in str(error.value)


def test_legacy_rope_keys_and_padded_vocabulary(root, tmp_path):
  """Hub files older than transformers 5 carry rope_theta + rope_scaling; decoders may have more embedding
  rows than tokens (Pythia, OLMo, Qwen pad them)."""
  path = _edited(root, tmp_path, "llama", rope_parameters=None, rope_theta=500.0, rope_scaling=dict(LLAMA3))
  cfg = pretrained.load_pretrained(str(path))[0].cfg
  assert (cfg.rope_scaling, cfg.rope_theta, cfg.rope_original_max_len, cfg.kv_group_of_head) == (
    "llama3",
    500.0,
    16,
    (0, 0, 1, 1),
  )
  gemma = _edited(root, tmp_path, "gemma", hidden_act="gelu", hidden_activation=None)  # the first releases' value
  assert pretrained.load_pretrained(str(gemma))[0].cfg.activation == "gelu_tanh"  # as transformers runs it
  model, tokenizer = pretrained.load_pretrained(str(_tiny("gpt_neox", root)))
  assert model.cfg.vocab_size == tokenizer.vocab_size + 8 and model.cfg.rotary_fraction == 0.25


@pytest.mark.parametrize("family", ["llama", "qwen2", "roberta", "gpt_neox"])
def test_tokenizer_matches_transformers_and_cuts_words(root, family):
  path = _tiny(family, root)
  _, tokenizer = pretrained.load_pretrained(str(path))
  reference = transformers.AutoTokenizer.from_pretrained(path)
  for text in TEXTS:
    ours = list(tokenizer.prefix_ids) + tokenizer.encode(text) + list(tokenizer.suffix_ids)
    assert ours == reference(text)["input_ids"]
  words = TEXTS[0].split()
  pieces = tokenizer.word_pieces(words)
  assert [i for p in pieces for i in p] == tokenizer.encode(" ".join(words)) and all(pieces)
  assert tokenizer.decode(pieces[3]).strip() == words[3]


def test_decoder_tokenizer_saves_into_a_run_and_needs_tokenizer_json(root, tmp_path):
  from headspec.data.tokenizer import load_tokenizer

  path = _tiny("llama", root)
  _, tokenizer = pretrained.load_pretrained(str(path))
  tokenizer.save(tmp_path / "tokenizer")
  again = load_tokenizer(tmp_path / "tokenizer")
  assert (again.prefix_ids, again.suffix_ids, again.eos_id, again.pad_id) == ((1,), (), 2, 0)
  assert again.encode(TEXTS[1]) == tokenizer.encode(TEXTS[1])
  bare = _edited(root, tmp_path, "qwen2")
  (bare / "tokenizer.json").unlink()
  with pytest.raises(UserError, match="qwen2: no tokenizer.json"):
    pretrained.load_pretrained(str(bare))
