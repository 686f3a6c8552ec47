"""The one table of supported Hugging Face families, keyed by config.json's `model_type`.

Every dispatch of the import reads `FAMILIES`: which config translation and weight mapping a checkpoint
gets, the key prefix of its base model, where its tensor names hold the layer index, whether it is an
encoder, and its masked-LM head's tensors. Adding a family is one module (its `config(hf)` and
`load(model, tensors)`) and one row here (docs/pretrained.md, "Adding a family")."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

from headspec.model.config import ModelConfig
from headspec.model.transformer import Transformer
from headspec.pretrained import bert, gpt2, gpt_neox, llama
from headspec.pretrained.config_checks import HFConfig
from headspec.pretrained.tensors import Tensors


@dataclasses.dataclass(frozen=True)
class Family:
  """How one `model_type` imports.

  config: config.json (an HFConfig, every key checked) -> ModelConfig.
  load: sets every parameter of the (abstract) Transformer from the Tensors, popping what it takes.
  prefix: the base model's key prefix (stripped when present, so bare base models load too).
  layers: a regex whose group 1 is the layer index in a tensor name (prefix removed).
  layer_key: config.json's key of the layer count (named when the tensors hold fewer layers).
  encoder: a masked LM (BERT-like); its tokenizer's vocabulary must equal vocab_size exactly.
  lm_head: an encoder's masked-LM head tensor prefix (a BertModel lacks it); None: always has an LM head.
  padded_vocab: the embedding matrix may have more rows than the tokenizer has tokens (Pythia: 50,304 rows
    for 50,277 tokens).
  """

  config: Callable[[HFConfig], ModelConfig]
  load: Callable[[Transformer, Tensors], None]
  prefix: str
  layers: str
  layer_key: str = "num_hidden_layers"
  encoder: bool = False
  lm_head: str | None = None
  padded_vocab: bool = False


def _encoder(family: str, config, prefix: str, layers: str = r"encoder\.layer\.(\d+)\.", **kw) -> Family:
  load = functools.partial(bert.load, family=family)
  return Family(config, load, prefix, layers, encoder=True, lm_head=bert.NAMES[family]["head"], **kw)


def _llama(family: str) -> Family:
  return Family(
    llama.config, functools.partial(llama.load, family=family), "model.", r"layers\.(\d+)\.", padded_vocab=True
  )


# The order is that of the "supported:" list an unknown model_type gets.
FAMILIES: dict[str, Family] = {
  "bert": _encoder("bert", bert.config, "bert."),
  "roberta": _encoder("roberta", bert.roberta_config, "roberta."),
  "distilbert": _encoder(
    "distilbert", bert.distilbert_config, "distilbert.", r"transformer\.layer\.(\d+)\.", layer_key="n_layers"
  ),
  "gpt2": Family(gpt2.config, gpt2.load, "transformer.", r"h\.(\d+)\.", layer_key="n_layer"),
  **{family: _llama(family) for family in llama.LAYOUTS},  # llama, mistral, qwen2, qwen3, gemma(2), olmo(2)
  "gpt_neox": Family(gpt_neox.config, gpt_neox.load, "gpt_neox.", r"layers\.(\d+)\.", padded_vocab=True),
}
