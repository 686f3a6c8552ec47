"""Training steps per second of headspec's TopK SAE against a plain PyTorch loop of the same SAE (issue 66).

  python -m benchmarks.bench_sae [--width 256 --heads 8 --features 1024 --k 32 --batch 1024 --steps 100]

The same activations for both: N inputs of a planted-feature z (sparse sums of unit directions, each inside one
head's slice, as tests/test_sae.py plants them), scaled as fit_sae scales them (E‖x‖² = width). The same
SAE and step (headspec/sae/train.py): f = TopK(W_enc(x − b_dec) + b_enc), x̂ = W_dec f + b_dec, loss
NMSE(x, x̂) + α·NMSE(e, ê) with the AuxK term over the dead latents, the decoder gradient's component along
each unit row removed, global-norm clipping at 1, Adam, rows renormalised, the dead-latent counters updated;
the same batches (batch_indices(seed, step)). headspec: the loop of fit_sae, one jitted `lax.scan` program of
`chunk` steps per call with the host drawing each chunk's indices; PyTorch: eager float32 on the CPU with
torch.set_num_threads(every core), the way a plain SAE loop (e.g. SAELens's) runs there. Both are timed
after a warm-up (compilation excluded; `fit_sae_s` is fit_sae end to end at the same size, compilation and
the geometric median included). Prints one JSON object: steps per second of each and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np


def planted(n: int, width: int, heads: int, per_head: int, active: int, seed: int = 0) -> np.ndarray:
  """[n, width] float32: sums of `active` of heads × per_head planted unit directions (each in one head's slice)."""
  rng = np.random.default_rng(seed)
  kh = width // heads
  directions_PK = np.zeros((heads * per_head, width), np.float32)
  for p in range(heads * per_head):
    h = p // per_head
    u = rng.normal(size=kh)
    directions_PK[p, h * kh : (h + 1) * kh] = u / np.linalg.norm(u)
  coef_NP = np.zeros((n, len(directions_PK)), np.float32)
  rows = np.repeat(np.arange(n), active)
  coef_NP[rows, np.concatenate([rng.choice(len(directions_PK), active, replace=False) for _ in range(n)])] = (
    rng.uniform(1, 2, n * active)
  )
  x = coef_NP @ directions_PK + 0.01 * rng.normal(size=(n, width)).astype(np.float32)
  return (x / np.sqrt(np.mean(np.sum(x.astype(np.float64) ** 2, 1)) / width)).astype(np.float32)


def headspec_steps_per_second(x_NK, o, steps: int) -> tuple[float, dict]:
  """fit_sae's loop (headspec/sae/train.py) after one warm-up chunk: (steps/s, the state's first weights)."""
  import jax
  import jax.numpy as jnp

  from headspec.sae import train

  aux_k = min(o.features, o.aux_k or max(1, x_NK.shape[1] // 2))
  program = train._chunk_program(o, aux_k)
  state, x_device = train.initial_state(x_NK, o), jnp.asarray(x_NK)
  N, live_C = len(x_NK), jnp.ones(o.chunk, bool)

  def chunk(state, step):
    index_CB = np.stack([train.batch_indices(o.seed, s, N, o.batch_size) for s in range(step, step + o.chunk)])
    state, metrics = program(state, x_device, jnp.asarray(index_CB, jnp.int32), live_C)
    return state, float(np.asarray(metrics)[-1, 0])  # the host reads the loss, as fit_sae does

  state, _ = chunk(state, 0)  # compiles
  jax.block_until_ready(state)
  t0 = time.perf_counter()
  for step in range(o.chunk, o.chunk + steps, o.chunk):
    state, loss = chunk(state, step)
  jax.block_until_ready(state)
  return steps / (time.perf_counter() - t0), dict(loss=loss)


def torch_steps_per_second(x_NK, o, steps: int, threads: int) -> tuple[float, dict]:
  """The same SAE and step in plain PyTorch (eager), the same batches, after `o.chunk` warm-up steps."""
  import torch

  from headspec.sae import train

  torch.set_num_threads(threads)
  torch.manual_seed(o.seed)
  N, K = x_NK.shape
  F, aux_k = o.features, min(o.features, o.aux_k or max(1, K // 2))
  x = torch.from_numpy(x_NK)
  w_FK = torch.randn(F, K)
  w_FK /= w_FK.norm(dim=1, keepdim=True)
  b_dec = torch.from_numpy(train.geometric_median(x_NK[:4096]).astype(np.float32))
  params = dict(W_enc_KF=w_FK.T.clone(), b_enc_F=torch.zeros(F), W_dec_FK=w_FK.clone(), b_dec_K=b_dec)
  for p in params.values():
    p.requires_grad_(True)
  adam = torch.optim.Adam(params.values(), lr=o.lr)
  since_F = torch.zeros(F, dtype=torch.int64)

  def nmse(a, b):
    return ((a - b) ** 2).sum() / ((a - a.mean(0)) ** 2).sum().clamp_min(1e-12)

  def topk(pre_BF, k):
    values, index = pre_BF.topk(k, dim=-1)
    return torch.zeros_like(pre_BF).scatter_(-1, index, values.relu())

  def step(s):
    nonlocal since_F
    x_BK = x[torch.from_numpy(train.batch_indices(o.seed, s, N, o.batch_size))]
    pre_BF = (x_BK - params["b_dec_K"]) @ params["W_enc_KF"] + params["b_enc_F"]
    f_BF = topk(pre_BF, o.k)
    xhat_BK = f_BF @ params["W_dec_FK"] + params["b_dec_K"]
    loss = nmse(x_BK, xhat_BK)
    dead_F = since_F >= o.dead_after_tokens
    if dead_F.any():
      aux_BF = topk(pre_BF.masked_fill(~dead_F, -torch.inf), aux_k)
      loss = loss + o.aux_coefficient * nmse((x_BK - xhat_BK).detach(), aux_BF @ params["W_dec_FK"])
    adam.zero_grad(set_to_none=True)
    loss.backward()
    with torch.no_grad():
      w, g = params["W_dec_FK"], params["W_dec_FK"].grad
      g -= (g * w).sum(-1, keepdim=True) * w
      torch.nn.utils.clip_grad_norm_(params.values(), 1.0)
      adam.step()
      w /= w.norm(dim=-1, keepdim=True).clamp_min(1e-12)
      fired_F = (f_BF > 0).any(0)
      since_F = torch.where(fired_F, 0, since_F + o.batch_size)
    return float(loss.detach())

  for s in range(o.chunk):
    step(s)
  t0 = time.perf_counter()
  for s in range(o.chunk, o.chunk + steps):
    loss = step(s)
  return steps / (time.perf_counter() - t0), dict(loss=loss)


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--width", type=int, default=256, help="the SAE's input width (heads × d_head of z)")
  parser.add_argument("--heads", type=int, default=8)
  parser.add_argument("--features", type=int, default=1024)
  parser.add_argument("--k", type=int, default=32)
  parser.add_argument("--batch", type=int, default=1024)
  parser.add_argument("--inputs", type=int, default=32768, help="rows of activations the batches are drawn from")
  parser.add_argument(
    "--steps", type=int, default=100, help="timed steps, after one chunk of warm-up (a multiple of --chunk)"
  )
  parser.add_argument("--chunk", type=int, default=50, help="fit_sae's steps per compiled call")
  parser.add_argument("--skip_fit", action="store_true", help="do not time fit_sae end to end")
  args = parser.parse_args(argv)
  if args.width % args.heads or args.steps % args.chunk or min(args.steps, args.k, args.features, args.batch) < 1:
    parser.error("--width must be a multiple of --heads, --steps of --chunk, and every size positive")

  from headspec.sae import train

  threads = os.cpu_count() or 1
  x_NK = planted(args.inputs, args.width, args.heads, per_head=args.features // args.heads // 2 or 1, active=8)
  o = train.Options(features=args.features, kind="topk", k=args.k, steps=args.chunk + args.steps,
                    batch_size=args.batch, lr_schedule="constant", warmup_steps=0, chunk=args.chunk,
                    dead_after_tokens=10 * args.batch)  # fmt: skip
  jax_sps, jax_info = headspec_steps_per_second(x_NK, o, args.steps)
  torch_sps, torch_info = torch_steps_per_second(x_NK, o, args.steps, threads)
  out = dict(
    shape=dict(
      inputs=args.inputs,
      width=args.width,
      heads=args.heads,
      features=args.features,
      k=args.k,
      batch=args.batch,
      timed_steps=args.steps,
      chunk=args.chunk,
    ),  # fmt: skip
    threads=dict(torch=threads, cpu_count=os.cpu_count()),
    headspec_steps_per_second=round(jax_sps, 3),
    torch_steps_per_second=round(torch_sps, 3),
    headspec_over_torch=round(jax_sps / torch_sps, 3),
    final_loss=dict(headspec=round(jax_info["loss"], 5), torch=round(torch_info["loss"], 5)),
    load_average=[round(v, 2) for v in os.getloadavg()],
  )
  if not args.skip_fit:
    import headspec

    t0 = time.perf_counter()
    headspec.fit_sae(x_NK, features=args.features, k=args.k, steps=args.steps, batch_size=args.batch,
                     chunk=args.chunk, progress=False)  # fmt: skip
    out["fit_sae_s"] = round(time.perf_counter() - t0, 2)
  print(json.dumps(out, indent=1))
  return 0


if __name__ == "__main__":
  raise SystemExit(main())
