"""Benchmark of edge scores against exact edge patching (prints JSON; not a test).

  python -m benchmarks.bench_circuit [--layers=4] [--heads=4] [--d_model=64] [--prompts=16] [--n=6] [--steps=5]
  python -m benchmarks.bench_circuit --model=induction [--cache=FILE.npz] [--sizes=5,10,20,40]

Every edge of a random-weight GPT-2-style decoder (pre-LN, MLPs, learned positions; weights scaled to std
0.3 as the parity tests' initializer_range, so the metric moves) on induction prompt pairs
(patching/tasks.py): EAP (one forward and one backward pass for every edge at once), EAP-IG (`steps`
backward passes) and exact edge patching (one forward per edge, `lax.map` in one compiled program), all
from headspec/patching/edges.py. First calls (compilation included) are reported apart; steady-state
times are the best of 2. The ratio exact/EAP is the speed-up the issue asks for; the Spearman rank
correlation of each estimate with the exact scores is reported beside it. The load average is read before
and after (the machine is shared: under load every time is an upper bound).

Every score is in both directions (docs/circuits.md): `eap`, `eap_ig`, `exact` noise (the papers'
convention, timed), `*_denoising` denoise; `eap_ig_other_end` is EAP-IG at hannamw/EAP-IG's points (ig_from
'other'). `spearman` holds every method's agreement with exact noising and with exact denoising;
`exact_top_edge` each method's score of exact noising's largest edge and its rank there (0: first).
`--model=induction`: tests/induction_recipe.py's trained 2-layer attention-only decoder (the model of
tests/test_circuits.py's known answer; trained here, about 90 s on 2 cores, or read from `--cache`) on 32
induction pairs (seed 2), with the faithfulness (noising) of the top-n circuits of each method and of
`random_sets` random sets (the largest over them) and the exact scores' largest edges: docs/circuits.md's
numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np


def _best(fn, repeats=2) -> float:
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    fn()
    times.append(time.perf_counter() - t0)
  return min(times)


def spearman(a, b) -> float:
  """Rank correlation (average ranks for ties), without SciPy."""
  import pandas as pd

  return float(pd.Series(a).rank().corr(pd.Series(b).rank()))


def _induction(cache: str):
  """(model, cfg, clean, corrupt, answers): tests/induction_recipe.py's trained 2-layer decoder (read from /
  written to `cache` when given) and tests/test_circuits.py's 32 induction pairs."""
  import pathlib
  import sys

  import jax
  from flax import nnx

  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "tests"))
  import induction_recipe as recipe

  from headspec.patching import tasks

  if cache and pathlib.Path(cache).is_file():
    graphdef, params = recipe.initial(2)
    leaves, treedef = jax.tree.flatten(params)
    with np.load(cache) as saved:
      params = jax.tree.unflatten(treedef, [saved[f"a{i}"] for i in range(len(leaves))])
  else:
    graphdef, params = recipe.train_attention_only(2)
    if cache:
      np.savez(cache, **{f"a{i}": np.asarray(a) for i, a in enumerate(jax.tree.leaves(params))})
  model = nnx.merge(graphdef, params)
  clean, corrupt, answers = tasks.induction_pairs(recipe.INDUCTION_VOCAB, recipe.INDUCTION_SPECIALS,
                                                  n=recipe.INDUCTION_N, count=32, seed=2, bos=(2,))  # fmt: skip
  return model, model.cfg, clean, corrupt, answers


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--layers", type=int, default=4)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--d_model", type=int, default=64)
  parser.add_argument("--prompts", type=int, default=16)
  parser.add_argument("--n", type=int, default=6, help="induction: [BOS] r_1..r_n r_1..r_{n-1}")
  parser.add_argument("--steps", type=int, default=5, help="EAP-IG's interpolation points")
  parser.add_argument("--model", default="random", choices=("random", "induction"))
  parser.add_argument("--cache", default="", help="induction: the trained parameters (.npz), written if absent")
  parser.add_argument("--sizes", default="", help="faithfulness of the top-n circuits (induction default 5,10,20,40)")
  parser.add_argument("--random_sets", type=int, default=3)
  args = parser.parse_args()
  import jax
  from flax import nnx

  from headspec.model.config import ModelConfig
  from headspec.model.transformer import random_like
  from headspec.patching import edges, tasks
  from headspec.patching import patch as patch_lib

  out = {"machine": f"{platform.machine()}, {os.cpu_count()} CPU cores", "load_average_before": os.getloadavg()}
  if args.model == "induction":
    model, cfg, clean, corrupt, answers = _induction(args.cache)
    sizes = [int(n) for n in (args.sizes or "5,10,20,40").split(",")]
    L, H, B = cfg.num_layers, cfg.num_heads, len(clean)
    what = f"tests/induction_recipe.py's attention-only decoder {L}x{H}, d_model {cfg.d_model}"
  else:
    L, H, D, B = args.layers, args.heads, args.d_model, args.prompts
    cfg = ModelConfig(kind="decoder", vocab_size=200, num_layers=L, num_heads=H, d_model=D, d_head=D // H,
                      d_ff=4 * D, max_len=2 * args.n + 2, positions="learned")  # fmt: skip
    graphdef, params = nnx.split(random_like(cfg, 0))
    scaled = lambda a: a * (0.3 / max(float(np.std(a)), 1e-12)) if a.ndim > 1 else a
    model = nnx.merge(graphdef, jax.tree.map(scaled, params))
    clean, corrupt, answers = tasks.induction_pairs(cfg.vocab_size, (0, 1, 2), n=args.n, count=B, seed=0, bos=(2,))
    sizes = [int(n) for n in args.sizes.split(",") if n]
    what = f"decoder {L}x{H}, d_model {D}, MLPs"
  p = patch_lib.prompts(cfg, clean, corrupt, answers, "logit_diff")
  g = edges.graph(cfg)
  out["model"] = f"{what}, {B} induction pairs x {len(clean[0])} tokens, {g.E} edges"
  runs = {
    "eap": lambda: edges.scores(model, p, method="eap")[0],
    "eap_ig": lambda: edges.scores(model, p, method="eap_ig", steps=args.steps)[0],
    "exact": lambda: edges.exact(model, p)[0],
  }
  values, seconds = {}, {}
  for name, fn in runs.items():
    t0 = time.perf_counter()
    values[name] = fn()
    out[f"{name}_first_call_seconds_incl_compile"] = round(time.perf_counter() - t0, 2)
    seconds[name] = _best(fn)
  out["seconds"] = {k: round(v, 4) for k, v in seconds.items()}
  out["exact_over_eap"] = round(seconds["exact"] / seconds["eap"], 1)
  out["exact_over_eap_ig"] = round(seconds["exact"] / seconds["eap_ig"], 1)
  out["spearman_with_exact"] = {k: round(spearman(values[k], values["exact"]), 3) for k in ("eap", "eap_ig")}
  out["direction"] = "noising"  # the timed scores and spearman_with_exact; the others below name theirs
  values["eap_ig_other_end"], _, _ = edges.scores(model, p, method="eap_ig", steps=args.steps, ig_from="other")
  values["eap_denoising"], _, _ = edges.scores(model, p, method="eap_denoising")
  values["eap_ig_denoising"], _, _ = edges.scores(model, p, method="eap_ig_denoising", steps=args.steps)
  values["exact_denoising"], clean_m, corrupt_m = edges.exact_denoising(model, p)
  out["metric"] = {"clean": round(clean_m, 4), "corrupt": round(corrupt_m, 4)}
  out["spearman"] = {
    f"{k}~{ref}": round(spearman(values[k], values[ref]), 3) for ref in ("exact", "exact_denoising") for k in values
    if not k.startswith("exact")
  }  # fmt: skip
  out["spearman"]["exact~exact_denoising"] = round(spearman(values["exact"], values["exact_denoising"]), 3)
  out["pearson_with_exact"] = {k: round(float(np.corrcoef(values[k], values["exact"])[0, 1]), 3) for k in values}
  top5 = lambda v: set(np.argsort(-np.abs(v))[:5].tolist())
  out["top5_shared_with_exact"] = {k: len(top5(v) & top5(values["exact"])) for k, v in values.items()}
  first = int(np.argmax(np.abs(values["exact"])))  # exact noising's largest edge: each method's score and rank
  out["exact_top_edge"] = {
    k: [round(float(v[first]), 3), int((np.abs(v) > abs(v[first])).sum())] for k, v in values.items()
  }
  for ref in ("exact", "exact_denoising"):
    order = np.argsort(-np.abs(values[ref]))[:6]
    out[f"top_{ref}"] = [
      [g.node_name(int(g.edges_E2[e, 1])), g.input_name(int(g.edges_E2[e, 0])), str(g.input_kind_I[g.edges_E2[e, 0]]),
       round(float(values[ref][e]), 3)] for e in order
    ]  # fmt: skip
  if sizes:
    chosen = {k: values[k] for k in ("eap", "eap_ig", "eap_ig_other_end", "exact", "eap_denoising")}
    curve = edges.curve(model, p, chosen, sizes, random_sets=args.random_sets)
    best = curve.groupby(["method", "edges"])["faithfulness"].max()
    out["faithfulness_noising"] = {
      m: {int(n): round(float(best[(m, n)]), 2) for n in sizes} for m in [*chosen, "random"]
    }
  out["eap_ig_steps"] = args.steps
  out["compilations"] = dict(edges.TRACES)
  out["load_average_after"] = os.getloadavg()
  print(json.dumps(out, indent=1))


if __name__ == "__main__":
  main()
