"""Benchmark: per-word feature extraction, headspec (JAX) against Hugging Face transformers (PyTorch).

  HEADSPEC_DATA_DIR=... python -m benchmarks.bench_extract [--split dev] [--max_sentences 0]

Same model (all-MiniLM-L6-v2), same sentences (UD English EWT, one split), same device (this host's),
both after a warm-up pass over the same sentences:
- headspec: `probing.features.extract_features` into an empty cache, first sub-word pooling, float16
  on disk, batches over every local device (and once more on one device, to show what data parallelism
  gives). It keeps every head's Z_h (L×H×K), every layer's residual stream (L×D) and the embeddings per
  word: 13 vectors of 384 for MiniLM.
- transformers: `AutoModel` with sdpa attention, batches of 64 sentences sorted by length (padding is
  the only waste), `output_hidden_states`, the first sub-word of every word gathered from the 7 hidden
  states and kept on the host as float16 (7 vectors of 384: it has no Z_h to give).
The residual streams of the two are compared (max |Δ|), so the outputs are known to be the same.
Then a scaling table: tokens/s of the jitted forward alone (headspec) and of the PyTorch forward at
window lengths 16-128, batches of 4,096 tokens of random ids. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={os.cpu_count()}")

import numpy as np  # noqa: E402


def _hf_extract(model, tokenizer, sentences, batch_size: int):
  """[L+1, N, D] float16 first-sub-word hidden states of every word (sentence order) from transformers."""
  import torch

  order = np.argsort([len(s) for s in sentences], kind="stable")
  offsets = np.concatenate([[0], np.cumsum([len(s) for s in sentences])])
  out = None
  with torch.inference_mode():
    for i in range(0, len(order), batch_size):
      idx = order[i : i + batch_size]
      enc = tokenizer([list(sentences[j]) for j in idx], is_split_into_words=True, padding=True, return_tensors="pt")
      hidden = torch.stack(model(**enc, output_hidden_states=True).hidden_states)  # [L+1, B, T, D]
      rows, cols, dest = [], [], []
      for b, j in enumerate(idx):
        seen = set()
        for t, w in enumerate(enc.word_ids(b)):
          if w is not None and w not in seen:
            seen.add(w)
            rows.append(b)
            cols.append(t)
            dest.append(offsets[j] + w)
      picked = hidden[:, rows, cols].to(torch.float16).numpy()
      if out is None:
        out = np.zeros((hidden.shape[0], offsets[-1], hidden.shape[-1]), np.float16)
      out[:, dest] = picked
  return out


def _scaling(model, hf_model, lengths, batch_tokens: int, repeats: int):
  """Tokens per second of both forwards on random ids at each window length (compiled / warmed first)."""
  import jax
  import torch
  from flax import nnx

  from headspec.probing.features import CAPTURE
  from headspec.words.batches import pooled_forward

  graphdef, state = nnx.split(model)
  forward = pooled_forward(graphdef, CAPTURE)
  rng = np.random.default_rng(0)
  rows = []
  for T in lengths:
    B = max(1, batch_tokens // T)
    tokens = rng.integers(1000, 20000, (B, T)).astype(np.int32)
    positions, segment = np.arange(T, dtype=np.int32)[None].repeat(B, 0), np.ones((B, T), np.int32)
    pool = np.eye(T, dtype=np.float32)[None].repeat(B, 0)  # every token its own "word"
    jax.block_until_ready(forward(state, tokens, positions, segment, pool, None))
    t = time.perf_counter()
    for _ in range(repeats):
      jax.block_until_ready(forward(state, tokens, positions, segment, pool, None))
    jax_s = (time.perf_counter() - t) / repeats
    ids, mask = torch.from_numpy(tokens.astype(np.int64)), torch.ones(B, T, dtype=torch.long)
    with torch.inference_mode():
      hf_model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
      t = time.perf_counter()
      for _ in range(repeats):
        hf_model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
      torch_s = (time.perf_counter() - t) / repeats
    rows.append(
      dict(
        length=T,
        batch=B,
        headspec_tokens_per_s=round(B * T / jax_s),
        torch_tokens_per_s=round(B * T / torch_s),
        ratio=round(torch_s / jax_s, 2),
      )
    )
  return rows


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--split", default="dev", help="EWT split: train (204,577 words), dev or test")
  parser.add_argument("--max_sentences", type=int, default=0, help="0: every sentence of the split")
  parser.add_argument("--hf_batch", type=int, default=64)
  parser.add_argument("--lengths", default="16,32,64,128")
  parser.add_argument("--repeats", type=int, default=3)
  args = parser.parse_args()

  import jax
  import torch
  import transformers

  from headspec import pretrained
  from headspec.data.treebank import load_split
  from headspec.probing import features
  from headspec.runs import targets

  torch.set_num_threads(os.cpu_count())
  sentences = [s.words for s in load_split(targets.data_dir(), "en_ewt", args.split)]
  if args.max_sentences:
    sentences = sentences[: args.max_sentences]
  num_words = sum(len(s) for s in sentences)
  model, tokenizer = pretrained.load_pretrained("minilm")
  result = {
    "device": f"{len(jax.local_devices())} × {jax.devices()[0].device_kind}; torch on {torch.get_num_threads()} threads",
    "sentences": f"en_ewt/{args.split}: {len(sentences)} sentences, {num_words} words",
  }

  def headspec_run(tmp, tag, devices=None):
    t = time.perf_counter()
    f = features.extract_features(
      model, tokenizer, sentences, cache_dir=tmp, identity={"bench": tag}, pooling="first", log=None, devices=devices
    )
    return f, time.perf_counter() - t

  with tempfile.TemporaryDirectory() as tmp:
    headspec_run(tmp, "warm-up")
    feats, seconds = headspec_run(tmp, "timed")
    _, seconds_one = headspec_run(tmp, "one-device", jax.local_devices()[:1])
    residual_LND = np.stack([feats.residual(l) for l in range(-1, model.cfg.num_layers)])

  hf_dir = pretrained.minilm_dir()
  hf_tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
  hf_model = transformers.AutoModel.from_pretrained(hf_dir, attn_implementation="sdpa").eval()
  _hf_extract(hf_model, hf_tokenizer, sentences, args.hf_batch)  # warm-up
  t = time.perf_counter()
  hf_LND = _hf_extract(hf_model, hf_tokenizer, sentences, args.hf_batch)
  hf_seconds = time.perf_counter() - t

  result.update(
    headspec_s=round(seconds, 2),
    headspec_words_per_s=round(num_words / seconds),
    headspec_one_device_s=round(seconds_one, 2),
    devices_speedup=round(seconds_one / seconds, 2),
    torch_s=round(hf_seconds, 2),
    torch_words_per_s=round(num_words / hf_seconds),
    ratio=round(hf_seconds / seconds, 2),
    ratio_means="torch seconds / headspec seconds: above 1 means headspec is faster",
    max_abs_diff_residual=float(np.abs(residual_LND - hf_LND.astype(np.float32)).max()),
    kept_per_word="headspec: Z_h of 72 heads + 7 residual streams (13 x 384 floats); torch: 7 hidden states (7 x 384)",
    scaling=_scaling(
      model, hf_model, [int(v) for v in args.lengths.split(",")], batch_tokens=4096, repeats=args.repeats
    ),
  )
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  main()
