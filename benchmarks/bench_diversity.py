"""Cost of all diversity metrics next to the model's forward pass.

  python -m benchmarks.bench_diversity [--sequences 40 --seq_len 256 --stream_batch 8 --repeats 3]

6-layer, 8-head Transformer (d_model 256, d_head 32) over 40 × 256 = 10,240 tokens. Reports, after
compilation: wall time of (a) the forward pass alone, (b) the forward pass capturing q, probs, z,
head_out, (c) all metrics from captured intermediates in one jit-compiled call, (d) the same streamed
in batches of --stream_batch sequences; and each compiled program's memory (XLA memory_analysis:
arguments + outputs + temporaries, the peak a device must hold for that call).
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
from flax import nnx

from headspec.diversity import metrics as diversity
from headspec.model.config import ModelConfig
from headspec.model.transformer import Transformer


def _memory_mib(compiled) -> str:
  """'total (temporaries)' MiB of a compiled call: arguments + outputs + temporaries, and the temporaries alone."""
  m = compiled.memory_analysis()
  if m is None:
    return "n/a"
  total = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes
  return f"{total / 2**20:.0f} ({m.temp_size_in_bytes / 2**20:.0f})"


def _time(fn, *args, repeats: int) -> float:
  jax.block_until_ready(fn(*args))  # warm up (compile already done via AOT)
  best = float("inf")
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    best = min(best, time.perf_counter() - start)
  return best


def bench_config(kind: str = "encoder") -> ModelConfig:
  return ModelConfig(
    kind=kind, vocab_size=8192, num_layers=6, num_heads=8, d_model=256, d_head=32, d_ff=1024, max_len=512
  )


def forward_cost(cfg: ModelConfig, tokens_BT, valid_BT, *, capture=(), repeats: int = 3):
  """Seconds and MiB of one jit-compiled headspec.model.transformer.Transformer forward pass (and its outputs).

  Returns (seconds, mib, intermediates); intermediates are those of `capture` (None fields otherwise).
  """
  graphdef, state = nnx.split(Transformer(cfg, rngs=nnx.Rngs(0)))

  def forward(state, tokens_BT, valid_BT):
    return nnx.merge(graphdef, state)(tokens_BT, valid_BT=valid_BT, capture=capture)

  compiled = jax.jit(forward).lower(state, tokens_BT, valid_BT).compile()
  seconds = _time(compiled, state, tokens_BT, valid_BT, repeats=repeats)
  _, intermediates = compiled(state, tokens_BT, valid_BT)
  return seconds, _memory_mib(compiled), intermediates


def metrics_cost(intermediates, valid_BT, *, causal: bool, repeats: int = 3):
  """Seconds and MiB of `diversity.compute` (all metrics, all layers, one jit-compiled call)."""
  compiled = (
    jax.jit(diversity.compute.__wrapped__, static_argnames="causal")
    .lower(intermediates, valid_BT, causal=causal)
    .compile()
  )
  seconds = _time(lambda i, v: compiled(i, v), intermediates, valid_BT, repeats=repeats)
  return seconds, _memory_mib(compiled), compiled(intermediates, valid_BT)


def streaming_cost(intermediates, valid_BT, *, causal: bool, stream_batch: int, repeats: int = 3):
  """Seconds (all batches + finalize) and MiB (one `update` call) when streaming `stream_batch` sequences at a time."""
  fields = [getattr(intermediates, f) for f in ("q_LBTHK", "pattern_LBHTS", "z_LBTHK", "head_out_LBTHD")]
  L, B, _, H, K = intermediates.z_LBTHK.shape
  chunks = [
    ([x[:, i : i + stream_batch] for x in fields], valid_BT[i : i + stream_batch]) for i in range(0, B, stream_batch)
  ]
  update = jax.jit(diversity.update, static_argnames="causal")
  state0 = diversity.init(L, H, K)
  compiled = update.lower(state0, *chunks[0][0], chunks[0][1], causal=causal).compile()

  def run():
    state = state0
    for xs, v in chunks:
      state = update(state, *xs, v, causal=causal)
    return diversity.finalize(state)

  seconds = _time(run, repeats=repeats)
  return seconds, _memory_mib(compiled), run()


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sequences", type=int, default=40)
  parser.add_argument("--seq_len", type=int, default=256)
  parser.add_argument("--stream_batch", type=int, default=8)
  parser.add_argument("--kind", default="encoder", choices=("encoder", "decoder"))
  parser.add_argument("--repeats", type=int, default=3)
  parser.add_argument("--json", default="", help="also write the numbers to this file")
  args = parser.parse_args()

  cfg = bench_config(args.kind)
  tokens_BT = jax.random.randint(jax.random.key(0), (args.sequences, args.seq_len), 0, cfg.vocab_size)
  lengths_B = jax.random.randint(jax.random.key(1), (args.sequences, 1), args.seq_len // 2, args.seq_len + 1)
  valid_BT = jnp.arange(args.seq_len)[None, :] < lengths_B  # realistic padding
  causal = args.kind == "decoder"

  fwd_s, fwd_mib, _ = forward_cost(cfg, tokens_BT, valid_BT, repeats=args.repeats)
  cap_s, cap_mib, inter = forward_cost(cfg, tokens_BT, valid_BT, capture=diversity.CAPTURE, repeats=args.repeats)
  met_s, met_mib, metrics = metrics_cost(inter, valid_BT, causal=causal, repeats=args.repeats)
  str_s, str_mib, streamed = streaming_cost(
    inter, valid_BT, causal=causal, stream_batch=args.stream_batch, repeats=args.repeats
  )
  gap = max(float(jnp.max(jnp.abs(metrics[k] - streamed[k]))) for k in metrics)

  results = {
    "device": str(jax.devices()[0].device_kind),
    "tokens": int(valid_BT.sum()),
    "kind": args.kind,
    "forward_s": fwd_s,
    "forward_mib": fwd_mib,
    "forward_capture_s": cap_s,
    "forward_capture_mib": cap_mib,
    "metrics_s": met_s,
    "metrics_mib": met_mib,
    "streamed_s": str_s,
    "streamed_update_mib": str_mib,
    "stream_batch": args.stream_batch,
    "max_abs_gap_streamed_vs_one_pass": gap,
  }
  print(
    f"{cfg.num_layers} layers × {cfg.num_heads} heads, d_model {cfg.d_model}, d_head {cfg.d_head}; "
    f"{args.sequences}×{args.seq_len} ({results['tokens']} valid tokens), {args.kind}, {results['device']}"
  )
  print("| what | seconds | compiled memory, MiB: total (temporaries) |\n|---|---|---|")
  print(f"| forward pass alone | {fwd_s:.3f} | {fwd_mib} |")
  print(f"| forward pass + capture (q, probs, z, head_out) | {cap_s:.3f} | {cap_mib} |")
  print(f"| all metrics, one jit call | {met_s:.3f} | {met_mib} |")
  print(f"| all metrics, streamed {args.stream_batch} seqs/batch | {str_s:.3f} | {str_mib} per update |")
  print(f"streamed vs one pass: max |diff| = {gap:.2e}")
  if args.json:
    with open(args.json, "w") as f:
      json.dump(results, f, indent=1)
  print(json.dumps(results))  # last, for `python -m benchmarks`


if __name__ == "__main__":
  main()
