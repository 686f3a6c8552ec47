"""The arithmetic floor of softmax-probe fits: their L-BFGS passes' matmuls at the rate of a plain matmul
of the same shapes, measured in the same run (issue 33: "the limit is the arithmetic of the passes").

A pass over N words of G groups × K features and T packed weight columns is two matmuls, logits xs·W and
the weight gradient xsᵀ·Z: 4·N·K·G·T FLOPs (headspec/probing/probe.py, FittedProbes.lbfgs_arithmetic).
`gflops` times those two matmuls alone, in the pass's layout and chunks, with no softmax; `floor` divides
a run's passes (probes/run_info.json `lbfgs_passes`) by that rate, shape by shape.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from headspec.probing import probe


def gflops(g: int, n: int, k: int, t: int, chunk: int) -> float:
  """GFLOP/s of the pass's two matmuls alone (logits xs·W, gradient xsᵀ·Z) over n words in chunks."""
  xs = jnp.asarray(np.random.default_rng(0).standard_normal((max(1, n // chunk), g, k, chunk)), jnp.float32)
  w = jnp.asarray(np.random.default_rng(1).standard_normal((g, k, t)) / np.sqrt(k), jnp.float32)

  @jax.jit
  def two_matmuls(xs, w):  # the pass's layout: features and logits words last
    def body(acc, x):
      return acc + jnp.einsum("gkb,gtb->gkt", x, jnp.einsum("gkt,gkb->gtb", w, x)), None

    return jax.lax.scan(body, jnp.zeros_like(w), xs)[0]

  jax.block_until_ready(two_matmuls(xs, w))
  reps, wall = 3, time.perf_counter()
  for _ in range(reps):
    jax.block_until_ready(two_matmuls(xs, w))
  return 4.0 * xs.shape[0] * chunk * g * k * t / ((time.perf_counter() - wall) / reps) / 1e9


def floor(lbfgs_passes: dict) -> dict:
  """Per full-pass shape ('G 12 × K 32 × T 624 at N 40000'): the fits' L-BFGS GFLOP and seconds
  (compilation included), their achieved GFLOP/s, a plain matmul's GFLOP/s at that shape measured now,
  and `floor_s`, the seconds the passes' matmuls alone take at the plain rate; with the totals. Narrowed
  passes (fewer groups or columns) are counted at the full shape's rate and preconditioner refreshes not
  at all, so the floor is an estimate from below."""
  shapes: dict[tuple, dict] = {}
  for rec in lbfgs_passes.values():
    key = (rec["groups"], rec["width"], rec["columns"], rec["words"])
    agg = shapes.setdefault(key, {"fits": 0, "gflop": 0.0, "seconds": 0.0})
    agg["fits"] += 1
    agg["gflop"] += rec["gflop"]
    agg["seconds"] += rec["seconds"]
  out, total = {}, {"gflop": 0.0, "seconds": 0.0, "floor_s": 0.0}
  for (g, k, t, n), agg in sorted(shapes.items()):
    plain = gflops(g, n, k, t, probe.pass_chunk_words(n, g, t))
    floor_s = agg["gflop"] / plain
    out[f"G {g} x K {k} x T {t} at N {n}"] = {
      "fits": agg["fits"],
      "gflop": round(agg["gflop"], 1),
      "seconds": round(agg["seconds"], 1),
      "gflop_per_s": round(agg["gflop"] / max(agg["seconds"], 1e-9), 1),
      "plain_matmul_gflop_per_s": round(plain, 1),
      "floor_s": round(floor_s, 1),
    }
    total = {"gflop": total["gflop"] + agg["gflop"], "seconds": total["seconds"] + agg["seconds"],
             "floor_s": total["floor_s"] + floor_s}  # fmt: skip
  return {"by_shape": out, "total": {key: round(v, 1) for key, v in total.items()}}
