"""`headspec.ablate`: head ablations on texts or a corpus (what `headspec ablate` runs), as an Ablation.

Part of the notebook API (docs/api.md); `import headspec` reaches it lazily (headspec/__init__.py).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence

import jax.numpy as jnp
import numpy as np

from headspec import arguments as check
from headspec.ablation import core, metrics
from headspec.ablation.config import ablate_config
from headspec.ablation.run import check_config, evaluation_set
from headspec.api.load import Head, Loaded, as_loaded, check_heads, set_option
from headspec.api.tokens import padded, text_or_texts
from headspec.data import text_tfds
from headspec.errors import UserError
from headspec.model import tokens as tokens_lib
from headspec.runs import evaltext, targets
from headspec.words import evalset as evalset_lib


@dataclasses.dataclass(frozen=True)
class Ablation:
  """One ablation of a set of heads, scored as `headspec ablate` scores it (docs/ablation.md).

  metric: 'loss_delta' (a model with a trained LM head: ablated − unablated LM loss on the same tokens)
  or 'embedding_shift' (without one: mean 1 − cos between ablated and unablated sentence embeddings);
  value, ci_low, ci_high: it with its 95% bootstrap CI over evaluation sequences. before / after: the
  unablated and ablated LM loss and accuracy (or embedding_shift 0 and value); deltas: every delta metric
  as (value, ci_low, ci_high); evaluation: what was scored.
  """

  heads: tuple[Head, ...]
  method: str
  metric: str
  value: float
  ci_low: float
  ci_high: float
  before: dict
  after: dict
  deltas: dict
  evaluation: str


def _ablate_config(loaded: Loaded, config, options: dict):

  c = ablate_config() if config is None else config.copy_and_resolve_references()
  for key, value in options.items():
    if value is None:
      continue
    if key not in c:
      raise UserError(f"ablate: unknown option {key!r}; options are the keys of ablation/config.py")
    set_option(c, key, os.fspath(value) if key == "data_dir" else value, "ablate")
  if loaded.target is not None and "pretrained" in loaded.target.identity:
    c.model.pretrained = loaded.target.identity["pretrained"]
  check_config(c)
  return c


def _text_set(loaded: Loaded, texts: Sequence[str], c):
  """The evaluation set of your own texts: each one row, tokenized as written with the tokenizer's
  specials (`to_tokens`), scored as `headspec ablate` scores its rows (LM loss, or embedding_shift)."""

  tokenizer, cfg = loaded.tokenizer, loaded.model.cfg
  rows = []
  for i, text in enumerate(texts):
    ids = tokens_lib.token_ids(tokenizer, text)
    if not tokenizer.encode(text):
      raise UserError(f"ablate: texts[{i}]={check.short(text)} has no tokens")
    if len(ids) > cfg.max_len:
      raise UserError(f"ablate: texts[{i}]: {len(ids)} tokens exceed the model's context of {cfg.max_len}; split it")
    rows.append(ids)
  if loaded.lm_head:
    tokens_NT, valid_NT = padded(rows, getattr(tokenizer, "pad_id", 0))
    es = evalset_lib.lm_eval_set(tokens_NT, valid_NT, model_kind=cfg.kind, tokenizer=tokenizer,
                                 batch_size=c.batch_size, seed=c.seed)  # fmt: skip
    if not sum(b.weights_BT.sum() for b in es.batches):
      raise UserError(
        f"ablate: the {len(texts)} text(s) give no token to score (a decoder scores each next token, a masked "
        "LM its masked ones: give longer texts)"
      )
  else:
    windows = [np.asarray(r, np.int32) for r in rows]
    es = evalset_lib.sentence_embedding_set(windows, pad_id=tokenizer.pad_id, max_len=cfg.max_len,
                                            batch_tokens=c.batch_tokens)  # fmt: skip
  return dataclasses.replace(es, description=f"your {len(texts)} text(s): {es.description}")


ABLATE_CORPORA = ("wikitext_103", "english_mix")  # a pretrained LM's default evaluation text: the first present


def _corpus_set(loaded: Loaded, c, corpus_given: bool):
  """A pretrained LM's evaluation set: the valid split of `corpus` as evaltext.evaluation_tokens cuts it,
  read from DATA_DIR/text/<corpus>/valid.txt directly (the documents TFDS's TextCorpus would prepare from
  it), so nothing is written into the data directory. Without corpus= (or a config) the
  first of ABLATE_CORPORA that the data directory holds."""

  data_dir = targets.data_dir(c, purpose="the evaluation text of a pretrained LM; or give ablate(..., texts=[...])")
  if not corpus_given:
    c.corpus = next((n for n in ABLATE_CORPORA if (data_dir / "text" / n / "valid.txt").is_file()), c.corpus)
  if c.corpus.startswith(text_tfds.CATALOG_PREFIX):  # a TFDS catalog dataset: as the command reads it
    tokens_NT, valid_NT = evaltext.evaluation_tokens(c, "", loaded.tokenizer)
  else:
    path = data_dir / "text" / c.corpus / "valid.txt"
    if not path.is_file():
      raise UserError(
        f"ablate: {path}: no such file; give your own text (ablate(model, heads, texts=[...])) or get the corpus "
        f"(`headspec data download text {c.corpus}`, or corpus='english_mix')"
      )
    documents = text_tfds.read_text_documents(path)
    tokens_NT, valid_NT = evaltext.evaluation_tokens(c, "", loaded.tokenizer, documents)
  cfg = loaded.model.cfg
  es = evalset_lib.lm_eval_set(tokens_NT, valid_NT, model_kind=cfg.kind, tokenizer=loaded.tokenizer,
                               batch_size=c.batch_size, seed=c.seed)  # fmt: skip
  return dataclasses.replace(es, description=f"{c.corpus} valid split: {es.description}")


@check.arguments(
  model=as_loaded,
  heads=check.pairs,
  texts=check.optional(text_or_texts),
  method=check.text,
  num_tokens=check.optional(check.integer(1)),
  data_dir=check.optional(check.path),
  seed=check.optional(check.seed),
  config=check.optional(check.config),
)
def ablate(
  model,
  heads: Sequence[Head],
  texts: str | Sequence[str] | None = None,
  *,
  method: str = "zero",
  num_tokens: int | None = None,
  data_dir: str | os.PathLike | None = None,
  seed: int | None = None,
  config=None,
  **options,
) -> Ablation:
  """Removes `heads` (a list of (layer, head), together) and measures the change on your `texts` or on
  `headspec ablate`'s evaluation set: LM loss change for a model with a trained LM head, embedding_shift
  otherwise (MiniLM).

  texts: a text or a list of texts, each one evaluation row tokenized as written (`to_tokens`): no data
  directory needed, and `model` may then be a (model, tokenizer) pair. Without texts, model is
  `load(...)`'s result and the evaluation set is the command's: the run's validation rows, the treebank
  sentences for a model without LM head, or for a pretrained LM the valid split of `corpus` (default the
  first of wikitext_103, english_mix in the data directory; read from its valid.txt, nothing written).
  method: 'zero' (Z_h = 0) or 'mean' (Z_h = its mean over the evaluation tokens). config: an ablate
  config to start from (ablation/config.py); num_tokens, data_dir, seed and any other of its keys given
  as keywords (num_sentences=, bootstrap_resamples=, batch_size=, ...) override it. The result for one
  head equals that head's `zero`/`mean` row of ablation/heads.csv up to float32 rounding (the command's
  sweep runs the layers above the head from a cached residual stream; see tests/test_api.py).
  """

  loaded = as_loaded(model)
  if loaded.target is None and texts is None:
    raise UserError(
      "ablate: without texts=[...] it needs headspec.load(...)'s result (its evaluation set depends on where the "
      "model is from); give your own text as texts= to ablate a (model, tokenizer) pair"
    )
  texts = [texts] if isinstance(texts, str) else texts
  if texts is not None and not texts:
    raise UserError("ablate: texts=[] is empty; give a text or a list of texts (or leave texts out)")
  if method not in ("zero", "mean"):
    raise UserError(f"ablate: method={method!r}; use 'zero' or 'mean'")
  net, cfg = loaded.model, loaded.model.cfg
  chosen = check_heads(cfg, heads)
  if not chosen:
    raise UserError("ablate: no heads given; heads=[(layer, head), ...]")
  corpus_given = config is not None or options.get("corpus") is not None
  options.update(num_tokens=num_tokens, data_dir=data_dir, seed=seed)
  c = _ablate_config(loaded, config, options)
  key = ("texts", tuple(texts)) if texts is not None else ("evalset", corpus_given)
  key += (c.to_json(sort_keys=True),)
  if key not in loaded._cache:
    if texts is not None:
      es = _text_set(loaded, texts, c)
    elif c.model.pretrained and loaded.lm_head:
      es = _corpus_set(loaded, c, corpus_given)
    else:
      es = evaluation_set(c, loaded.target.identity.get("run", ""), loaded.target, loaded.tokenizer, cfg)
    loaded._cache[key] = (es, core.head_statistics(net, es)[0])
  es, mean_z = loaded._cache[key]
  zero = core.zero_replacement(net)
  ones = np.ones((cfg.num_layers, cfg.num_heads), np.float32)
  mask = ones.copy()
  for l, h in chosen:
    mask[l, h] = 0.0
  full = core.run_one(net, es, ones, zero)
  ablated = core.run_one(net, es, mask, zero if method == "zero" else jnp.asarray(mean_z))
  d = metrics.deltas(es.kind, full, ablated[None], resamples=c.bootstrap_resamples, seed=c.seed)
  deltas = {name: tuple(float(v[0]) for v in values) for name, values in d.items()}
  metric = "loss_delta" if es.kind == "lm" else "embedding_shift"
  before = metrics.values(es.kind, full, full)
  after = metrics.values(es.kind, ablated, full)
  return Ablation(
    heads=tuple(chosen),
    method=method,
    metric=metric,
    value=deltas[metric][0],
    ci_low=deltas[metric][1],
    ci_high=deltas[metric][2],
    before={k: float(v) for k, v in before.items()},
    after={k: float(v) for k, v in after.items()},
    deltas=deltas,
    evaluation=es.description,
  )
