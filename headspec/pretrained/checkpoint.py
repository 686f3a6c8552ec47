"""A Hugging Face directory checked before any computation: config.json through its family's translation
(every key), the weight files' headers and the layer count they hold."""

from __future__ import annotations

import dataclasses
import pathlib
import re

from headspec.errors import UserError
from headspec.model.config import ModelConfig
from headspec.pretrained.common import check
from headspec.pretrained.config_checks import HFConfig, read_json_object
from headspec.pretrained.families import FAMILIES
from headspec.pretrained.files import weight_files
from headspec.pretrained.tensors import tensor_names


def read_config(model_dir: pathlib.Path) -> tuple[str, ModelConfig]:
  """(model_type, ModelConfig) of a Hugging Face directory's config.json; every key read is checked (type,
  range) by HFConfig, so a malformed file is one line naming it and the key, before any computation."""
  path = model_dir / "config.json"
  if not path.is_file():
    raise UserError(f"{path}: missing (a Hugging Face model directory needs config.json and model.safetensors)")
  hf = HFConfig(read_json_object(path, "a Hugging Face config (a JSON object)"), path)
  family = hf.raw("model_type")
  if family is not None and not isinstance(family, str):
    hf.fail("model_type", "must be a string")
  check(
    family in FAMILIES,
    path,
    f"model_type={family!r} is not supported (supported: {', '.join(FAMILIES)})",
  )
  try:
    cfg = FAMILIES[family].config(hf)
  except UserError as e:  # ModelConfig's own checks (the keys above should catch all first): name the file
    if str(e).startswith(f"{path}:"):
      raise
    raise UserError(f"{path}: {e}") from None
  for key in ("bos_token_id", "eos_token_id"):  # the tokenizer may take its BOS/EOS from these ids
    hf.token_ids(key, cfg.vocab_size)
  return family, cfg


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
  prefix, pattern = FAMILIES[family].prefix, re.compile(FAMILIES[family].layers)
  found = set()
  for name in names:
    match = pattern.match(name[len(prefix) :] if name.startswith(prefix) else name)
    if match:
      found.add(int(match.group(1)))
  if not set(range(cfg.num_layers)) <= found:  # layers past the count are unexpected tensors, named by Tensors
    held = f"the tensors of {len(found)} layer(s) ({_spans(found)})" if found else "no layer's tensors"
    key = FAMILIES[family].layer_key
    raise UserError(f"{config_path}: {key}={cfg.num_layers}, but {weights_path} holds {held}")


@dataclasses.dataclass(frozen=True)
class Checkpoint:
  """A Hugging Face directory checked before any computation: its config and its weight files' headers."""

  family: str
  cfg: ModelConfig
  files: list[pathlib.Path]
  weights_path: pathlib.Path  # the file errors name (model.safetensors or the index)
  names: list[str]


def inspect(model_dir: pathlib.Path) -> Checkpoint:
  family, cfg = read_config(model_dir)
  files, weights_path = weight_files(model_dir)
  names = tensor_names(files)
  _check_layers(names, family, cfg, model_dir / "config.json", weights_path)
  return Checkpoint(family, cfg, files, weights_path, names)
