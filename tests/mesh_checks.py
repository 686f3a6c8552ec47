"""The mesh checks of tests/test_mesh.py, run in a process of its own on 8 fake CPU devices (the XLA flag
must be set before JAX starts): `python tests/mesh_checks.py WORKDIR [CHECK ...]` prints one JSON object
{check: its figures}."""

from __future__ import annotations

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import functools  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from headspec.model.config import ModelConfig
from headspec.model.objectives import Objective  # noqa: E402
from headspec.model.transformer import Transformer, cast, random_like  # noqa: E402
from headspec.parallel import mesh  # noqa: E402
from headspec.runs import checkpoints  # noqa: E402
from headspec.train.config import train_config  # noqa: E402
from headspec.train.loop import TrainState, jit_step, make_optimizer, train_step  # noqa: E402

MESHES = ("data=8", "data=2,fsdp=4", "data=2,fsdp=2,tensor=2", "tensor=8")
CFG = ModelConfig(
  kind="decoder", vocab_size=128, num_layers=2, num_heads=8, d_model=64, d_head=8, d_ff=128, max_len=16,
  positions="rotary", num_kv_heads=4,
)  # fmt: skip


def _tokens(B=8, T=16, seed=0):
  return np.random.default_rng(seed).integers(0, CFG.vocab_size, (B, T), dtype=np.int32)


def _forward(model, tokens):
  @jax.jit
  def run(state, tokens_BT):
    logits, inter = nnx.merge(graphdef, state)(tokens_BT, capture=("z", "pattern"))
    return logits, inter.z_LBTHK, inter.pattern_LBHTS

  graphdef, state = nnx.split(model)
  return run(state, tokens)


def forward_parity() -> dict:
  """Logits, z and pattern on each mesh against one device; the layout of every parameter and capture."""
  model = random_like(CFG, 0)
  tokens = _tokens()
  alone = jax.device_get(_forward(model, tokens))
  out = {}
  for spec in MESHES:
    grid = mesh.parse(spec)
    with mesh.using(grid):
      placed = mesh.place_model(model, grid)
      logits, z, pattern = _forward(placed, mesh.put_batch(tokens, grid))
    state = nnx.state(placed, nnx.Param)
    out[spec] = {
      "diff": [float(np.abs(np.asarray(a) - b).max()) for a, b in zip((logits, z, pattern), alone)],
      "w_q": str(state["blocks"][0]["attention"]["w_q_DHK"].get_value().sharding.spec),
      "w_in": str(state["blocks"][0]["mlp"]["w_in_DF"].get_value().sharding.spec),
      "embed": str(state["token_embed_VD"].get_value().sharding.spec),
      "z": str(z.sharding.spec),
      "pattern": str(pattern.sharding.spec),
    }
  return out


def _train_setup(spec: str):
  train = train_config().train
  train.steps, train.warmup_steps = 100, 5
  graphdef, params = nnx.split(Transformer(CFG, rngs=nnx.Rngs(0)))
  tx = make_optimizer(train)
  obj = Objective(
    kind="decoder", vocab_size=CFG.vocab_size, mask_id=0, num_layers=CFG.num_layers, num_heads=CFG.num_heads
  )
  grid = mesh.parse("", jax.devices()[:1]) if spec == "one" else mesh.parse(spec)
  state = mesh.place(TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params)), grid)
  step = jit_step(functools.partial(train_step, graphdef=graphdef, tx=tx, obj=obj), state, grid)
  return grid, state, step


def _losses(spec: str, steps: int = 20) -> list[float]:
  grid, state, step = _train_setup(spec)
  key, losses = jax.random.key(0), []
  with mesh.using(grid):
    for i in range(steps):
      batch = {"tokens": _tokens(seed=i), "example_id": np.arange(8, dtype=np.int32)}
      state, metrics = step(state, mesh.put_batch(batch, grid), key)
      losses.append(metrics["loss"])
  return [float(x) for x in jax.device_get(losses)]


def train_curves() -> dict:
  """20 steps on one device and on two meshes (twice on one of them)."""
  return {
    "one": _losses("one"),
    "data=2,fsdp=2,tensor=2": _losses("data=2,fsdp=2,tensor=2"),
    "again": _losses("data=2,fsdp=2,tensor=2"),
    "fsdp=8": _losses("fsdp=8"),
  }


def memory() -> dict:
  """Argument bytes per device of the compiled training step, and the largest replicated parameter."""
  out = {}
  for spec in ("data=8", "fsdp=8", "fsdp=4,tensor=2", "data=2,fsdp=2,tensor=2"):
    grid, state, step = _train_setup(spec)
    batch = mesh.put_batch({"tokens": _tokens(), "example_id": np.arange(8, dtype=np.int32)}, grid)
    with mesh.using(grid):
      compiled = step.lower(state, batch, jax.random.key(0)).compile()
    analysis = compiled.memory_analysis()
    replicated = [
      int(np.prod(x.shape)) for x in jax.tree.leaves(state.params) if x.sharding.is_fully_replicated and x.ndim > 1
    ]
    out[spec] = {
      "argument_bytes": int(analysis.argument_size_in_bytes),
      "temp_bytes": int(analysis.temp_size_in_bytes),
      "state_bytes": int(sum(x.nbytes for x in jax.tree.leaves(state))),
      "largest_replicated_matrix": max(replicated, default=0),
    }
  return out


def checkpoint_across_meshes(workdir: str) -> dict:
  """Parameters saved under one mesh restore bit for bit under another and on one device."""
  grid = mesh.parse("data=2,fsdp=2,tensor=2")
  model = mesh.place_model(random_like(CFG, 3), grid)
  state = nnx.state(model, nnx.Param)
  mngr = checkpoints.manager(workdir, keep_last=1, keep_steps=())
  checkpoints.save(mngr, 7, {"params": state}, None)
  mngr.wait_until_finished()
  mngr.close()
  expected = jax.device_get(state)
  abstract = nnx.state(nnx.eval_shape(lambda: Transformer(CFG, rngs=nnx.Rngs(0))), nnx.Param)
  out = {}
  for spec in ("fsdp=8", "tensor=8", None):
    target = mesh.parse(spec) if spec else None
    restored = checkpoints.restore_params(workdir, 7, abstract, mesh=target)
    same = jax.tree.map(lambda a, b: bool(np.array_equal(np.asarray(a), b)), restored, expected)
    w_q = restored["blocks"][0]["attention"]["w_q_DHK"].get_value()
    out[str(spec)] = {
      "equal": all(jax.tree.leaves(same)),
      "w_q": str(getattr(w_q.sharding, "spec", "one device")),
      "devices": len(w_q.devices()),
    }
  return out


def bf16() -> dict:
  """Parameter bytes and logits of the bfloat16 cast against float32."""
  model = random_like(CFG, 0)
  half = cast(model, "bfloat16")
  tokens = _tokens()
  full_logits = np.asarray(_forward(model, tokens)[0])
  half_logits = np.asarray(_forward(half, tokens)[0], np.float32)
  nbytes = lambda m: int(sum(x.nbytes for x in jax.tree.leaves(nnx.state(m, nnx.Param))))
  return {
    "float32_bytes": nbytes(model),
    "bfloat16_bytes": nbytes(half),
    "max_abs_logit_diff": float(np.abs(half_logits - full_logits).max()),
    "logit_scale": float(np.abs(full_logits).max()),
  }


def _rss_now() -> int:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def streaming_import(workdir: str) -> dict:
  """Peak host memory of importing WORKDIR/llama (a multi-shard bfloat16 checkpoint the test wrote) in
  bfloat16 onto fsdp=8, against its size and its largest tensor; and its parameters' layout. The import runs
  twice, the first model kept: the second's growth is sampled (every 2 ms), without the first's one-time
  compilations and allocator pools."""
  import threading

  from headspec import pretrained

  path = os.path.join(workdir, "llama")
  grid = mesh.parse("fsdp=8")
  first, _ = pretrained.load_pretrained(path, mesh=grid, dtype="bfloat16")
  before, peak, done = _rss_now(), [0], threading.Event()

  def sample():
    while not done.is_set():
      peak[0] = max(peak[0], _rss_now())
      done.wait(0.002)

  sampler = threading.Thread(target=sample)
  sampler.start()
  model, _ = pretrained.load_pretrained(path, mesh=grid, dtype="bfloat16")
  done.set()
  sampler.join()
  peak = max(peak[0], _rss_now())
  params = jax.tree.leaves(nnx.state(model, nnx.Param))
  files = [os.path.join(path, f) for f in os.listdir(path) if f.endswith(".safetensors")]
  w_q = nnx.state(model, nnx.Param)["blocks"][0]["attention"]["w_q_DHK"].get_value()
  return {
    "files": len(files),
    "checkpoint_bytes": sum(os.path.getsize(f) for f in files),
    "param_bytes": int(sum(x.nbytes for x in params)),
    "largest_tensor_bytes": int(max(x.size for x in params) * 4),  # read and checked in float32
    "peak_growth_bytes": int(max(peak - before, 0)),
    "dtype": str(w_q.dtype),
    "w_q": str(w_q.sharding.spec),
  }


# streaming_import first: it reads the process's peak RSS, which the other checks' compilations would raise.
CHECKS = {
  f.__name__: f for f in (streaming_import, forward_parity, train_curves, memory, checkpoint_across_meshes, bf16)
}
WITH_WORKDIR = ("checkpoint_across_meshes", "streaming_import")

if __name__ == "__main__":  # python tests/mesh_checks.py WORKDIR [CHECK ...] (default: every check)
  workdir, *names = sys.argv[1:]
  assert jax.device_count() == 8, jax.devices()
  run = lambda name: CHECKS[name](workdir) if name in WITH_WORKDIR else CHECKS[name]()
  print(json.dumps({name: run(name) for name in names or CHECKS}))
