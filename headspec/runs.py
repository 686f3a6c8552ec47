"""A run directory: its config.json, the model it describes, and loading that model at a saved step."""

from __future__ import annotations

import json

import jax
import ml_collections
from flax import nnx

from headspec import checkpoints, remote
from headspec.data.tokenizer import Tokenizer, load_tokenizer
from headspec.errors import UserError
from headspec.model import ModelConfig, Transformer

# Config keys that fix the parameters' shapes: a workdir's checkpoints only fit a config that agrees.
SHAPE_KEYS = (
  "kind",
  "num_layers",
  "num_heads",
  "d_model",
  "d_head",
  "d_ff",
  "positions",
  "tie_embeddings",
  "pre_layernorm",
  "mlp",
)
# What a key means in a config.json written before the key existed.
SHAPE_DEFAULTS = {"mlp": True}


def model_config(model: ml_collections.ConfigDict, vocab_size: int, max_len: int) -> ModelConfig:
  """The ModelConfig described by a run config's `model` section."""
  return ModelConfig(
    kind=model.kind,
    vocab_size=vocab_size,
    num_layers=model.num_layers,
    num_heads=model.num_heads,
    d_model=model.d_model,
    d_head=model.d_head,
    d_ff=model.d_ff,
    max_len=max_len,
    dropout=model.dropout,
    attention_dropout=model.attention_dropout,
    pre_layernorm=model.pre_layernorm,
    positions=model.positions,
    tie_embeddings=model.tie_embeddings,
    activation=model.activation,
    dtype=model.dtype,
    mlp=model.get("mlp", SHAPE_DEFAULTS["mlp"]),  # run configs written before the option have MLPs
  )


def write_config(workdir, config: ml_collections.ConfigDict, *, is_lead: bool = True) -> None:
  """Writes WORKDIR/config.json, refusing a workdir whose checkpoints belong to a different model shape.

  Every process checks; only the lead process (`is_lead`) writes, so processes of one run never race.
  """
  workdir = remote.run_path(workdir)
  path = workdir / "config.json"
  if path.is_file() and checkpoints.saved_steps(workdir):
    old = json.loads(path.read_text())["model"]
    for key in SHAPE_KEYS:
      there, here = old.get(key, SHAPE_DEFAULTS.get(key)), config.model.get(key, SHAPE_DEFAULTS.get(key))
      if there != here:
        raise UserError(
          f"{workdir} holds checkpoints of a different model: model.{key} is {there!r} there, "
          f"{here!r} in this config (use a new --workdir)"
        )
  if is_lead:
    workdir.mkdir(parents=True, exist_ok=True)
    remote.write_bytes_atomic(path, (config.to_json_best_effort(indent=1, sort_keys=True) + "\n").encode())


def read_config(workdir) -> ml_collections.ConfigDict:
  path = remote.run_path(workdir) / "config.json"
  if not path.is_file():
    raise UserError(f"{path}: not a headspec run directory (no config.json); train one first")
  return ml_collections.ConfigDict(json.loads(path.read_text()))


def load_run_model(workdir, step: int) -> tuple[Transformer, Tokenizer]:
  """The model of a `headspec train` workdir with the parameters saved at `step`, and its tokenizer."""
  config = read_config(workdir)
  tokenizer = load_tokenizer(remote.run_path(workdir) / "tokenizer")
  cfg = model_config(config.model, tokenizer.vocab_size, config.train.seq_len)
  abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  graphdef, abstract_params = nnx.split(abstract)
  params = checkpoints.restore_params(workdir, step, abstract_params)
  return nnx.merge(graphdef, params), tokenizer


def resolve_steps(workdir, steps: str) -> list[int]:
  """'all' | 'last' | a comma-separated list of steps -> saved steps, each checked to exist."""
  saved = checkpoints.saved_steps(workdir)
  if not saved:
    raise UserError(f"{checkpoints.checkpoint_dir(workdir)}: no checkpoint (run `headspec train` first)")
  if steps == "all":
    return saved
  if steps == "last":
    return saved[-1:]
  try:
    wanted = [int(s) for s in str(steps).split(",") if s.strip()]
  except ValueError:
    raise UserError(f"steps={steps!r}: use 'all', 'last' or a comma-separated list of integers") from None
  missing = [s for s in wanted if s not in saved]
  if missing or not wanted:
    raise UserError(f"step(s) {missing or steps} not saved in {workdir}/checkpoints (saved: {saved})")
  return wanted


def abstract_like(tree):
  """ShapeDtypeStructs (with shardings) of a pytree of arrays, the target layout for a restore."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)
