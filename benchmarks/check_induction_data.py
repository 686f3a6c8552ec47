"""Check: which training data lets a small decoder form an induction head within a CPU budget (issue 37).

  headspec data synthetic --out=DATA --seed=0 --text-sentences=200000 --treebank-sentences=500,200,200 --repeats=1
  python -m benchmarks.check_induction_data --data_dir=DATA --name=E --synthetic=1 --seq_len=32 --batch=64 \
      --positions=rotary --steps=2000

Trains the induction setting's smallest model (configs/experiments/induction.py: 2 attention-only layers,
4 heads of 16, d_model 64; headspec's own `train_step` and AdamW schedule) on rows of the setting's text
(`--corpus`, tokenized by a 1,000-piece SentencePiece model trained on it once and kept, with the token
streams, in DATA/check_induction_data/<corpus>/), with a fraction `--synthetic`
of each batch's rows replaced by repeated random sequences: rows of `--chunk` tokens `BOS p r r f`
(headspec.data.repeats.repeat_chunks: every token of a chunk distinct, r of 5..min(30,
chunk/2) tokens, so r's second copy is predictable only in context), concatenated to `--seq_len`. The ids
are the text's own (`--pool` most frequent of them, or all that occur in its validation rows).

At log-spaced steps it prints one JSON line: the mean training loss of the last 50 steps, the best head's
previous-token, duplicate-token and induction scores (Olsson et al. 2022; headspec.attention.induction, on
100 sequences BOS r r of n = min(50, seq_len/2) ids the text uses), and the mean loss of predicting
r_2..r_n in the first copy and in the second (an induction head takes the second towards 0); the last line
is one JSON object with every step. Measured rows: docs/study.md, "Induction".
"""

from __future__ import annotations

import functools
import json
import math
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import app, flags
from flax import nnx

_FLAGS = dict(
  data_dir=flags.DEFINE_string("data_dir", None, "a data folder holding text/<corpus>/ (headspec data synthetic)"),
  corpus=flags.DEFINE_string("corpus", "synthetic_repeats", "the text corpus under data_dir/text/"),
  name=flags.DEFINE_string("name", "run", "a label printed on every line"),
  synthetic=flags.DEFINE_float("synthetic", 0.0, "fraction of each batch's rows that are repeated random sequences"),
  chunk=flags.DEFINE_integer("chunk", 0, "tokens of one repeated-sequence row before concatenation (0: seq_len)"),
  pool=flags.DEFINE_integer("pool", 0, "draw the repeated sequences from the text's N most frequent ids (0: all)"),
  max_repeat=flags.DEFINE_integer("max_repeat", 30, "the longest repeated sequence r"),
  positions=flags.DEFINE_enum("positions", "learned", ["learned", "sinusoidal", "rotary"], "position encoding"),
  tie=flags.DEFINE_bool("tie", True, "tie the unembedding to the embeddings"),
  lr=flags.DEFINE_float("lr", 3e-3, "peak learning rate (AdamW, 100 warmup steps, cosine decay)"),
  weight_decay=flags.DEFINE_float("weight_decay", 0.01, "AdamW weight decay"),
  batch=flags.DEFINE_integer("batch", 16, "rows a step"),
  seq_len=flags.DEFINE_integer("seq_len", 128, "tokens a row"),
  steps=flags.DEFINE_integer("steps", 2000, "training steps"),
  seed=flags.DEFINE_integer("seed", 0, "initialisation and data order"),
)


def _tokenizer_and_rows(data_dir: str, corpus: str, seq_len: int):
  from headspec.data import lm_pipeline, text_tfds
  from headspec.data import tokenizer as tokenizer_lib

  def documents(split):
    return text_tfds.load_documents(data_dir, corpus, split, tfds_dir=f"{data_dir}/tfds")

  tok_dir = f"{data_dir}/check_induction_data/{corpus}"
  try:
    tokenizer = tokenizer_lib.load_tokenizer(tok_dir)
  except Exception:  # not trained yet: train it once for every run on this corpus
    tokenizer = tokenizer_lib.train_sentencepiece(documents("train"), tok_dir, vocab_size=1000, seed=0)
  rows = {
    split: lm_pipeline.pack_tokens(documents(split), tokenizer, seq_len, cache_path=f"{tok_dir}/{split}_tokens.npy")
    for split in ("train", "valid")
  }
  return tokenizer, rows


def eval_steps(steps: int) -> list[int]:
  """0, four log-spaced steps a decade from 10, and the last."""
  return sorted({0, steps} | {round(10 ** (k / 4)) for k in range(4, int(4 * math.log10(max(steps, 10))) + 1)})


def main(_):
  from headspec.attention import induction as ind
  from headspec.data.repeats import repeat_chunks
  from headspec.model.config import ModelConfig
  from headspec.model.objectives import Objective
  from headspec.model.transformer import Transformer
  from headspec.train.loop import TrainState, make_optimizer, train_step

  f = {k: v.value for k, v in _FLAGS.items()}
  tokenizer, rows = _tokenizer_and_rows(f["data_dir"], f["corpus"], f["seq_len"])
  specials = ind.special_ids(tokenizer)
  text_ids = np.setdiff1d(np.unique(rows["valid"]), specials)
  counts = np.bincount(rows["train"].ravel(), minlength=tokenizer.vocab_size)
  in_text = set(text_ids.tolist())
  by_count = [i for i in np.argsort(-counts, kind="stable") if i in in_text]
  pool = np.asarray(by_count[: f["pool"]] if f["pool"] else text_ids)
  not_drawn = np.setdiff1d(np.arange(tokenizer.vocab_size), pool)  # varied_repeat_batch's `specials`
  cfg = ModelConfig(
    kind="decoder", vocab_size=tokenizer.vocab_size, num_layers=2, num_heads=4, d_model=64, d_head=16, d_ff=256,
    max_len=f["seq_len"], mlp=False, positions=f["positions"], tie_embeddings=f["tie"],
  )  # fmt: skip
  graphdef, params = nnx.split(Transformer(cfg, rngs=nnx.Rngs(params=f["seed"])))
  tx = make_optimizer(
    ml_collections.ConfigDict(
      dict(steps=f["steps"], learning_rate=f["lr"], warmup_steps=100, weight_decay=f["weight_decay"], grad_clip=1.0)
    )
  )
  state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
  obj = Objective(kind="decoder", vocab_size=tokenizer.vocab_size, mask_id=tokenizer.mask_id)
  step = jax.jit(functools.partial(train_step, graphdef=graphdef, tx=tx, obj=obj), donate_argnums=0)
  rng, key = np.random.default_rng(f["seed"]), jax.random.key(f["seed"])
  n = min(50, (f["seq_len"] - 1) // 2)
  probe_NT = ind.repeated_random_tokens(
    tokenizer.vocab_size, specials, n=n, count=100, seed=0, bos=ind.bos_ids(tokenizer), among=text_ids
  )
  chunk, bos = f["chunk"] or f["seq_len"], tuple(ind.bos_ids(tokenizer))

  def repeat_rows(count):
    return repeat_chunks(rng, count, f["seq_len"], chunk, tokenizer.vocab_size, not_drawn, bos, f["max_repeat"])

  records, losses, t0 = [], [], time.perf_counter()
  evals = set(eval_steps(f["steps"]))
  for s in range(f["steps"] + 1):
    if s in evals:
      p = ind.run(nnx.merge(graphdef, state.params), probe_NT, np.ones(probe_NT.shape, bool), specials)
      score_3LH = p.num_3LHN.sum(-1) / p.den_3N.sum(-1)[:, None, None]
      record = dict(
        name=f["name"], step=s, train_loss=round(float(np.mean(losses[-50:])), 3) if losses else None,
        **{role: round(float(score_3LH[c].max()), 3) for c, role in enumerate(ind.ATTENTION_ROLES)},
        first_copy_loss=round(float(p.nll_NT[:, 1:n].mean()), 3),
        second_copy_loss=round(float(p.nll_NT[:, n + 1 : 2 * n].mean()), 3), seconds=round(time.perf_counter() - t0),
      )  # fmt: skip
      records.append(record)
      print(json.dumps(record), flush=True)
    if s == f["steps"]:
      break
    k = round(f["synthetic"] * f["batch"])
    batch_BT = repeat_rows(k) if k == f["batch"] else rows["train"][rng.integers(0, len(rows["train"]), f["batch"])]
    if 0 < k < f["batch"]:
      batch_BT = np.concatenate([repeat_rows(k), batch_BT[k:]])
    state, metrics = step(state, {"tokens": jnp.asarray(batch_BT), "example_id": np.arange(f["batch"])}, key)
    losses.append(float(metrics["loss"]))
  print(json.dumps(dict(flags=f, records=records)))


if __name__ == "__main__":
  flags.mark_flag_as_required("data_dir")
  app.run(main)
