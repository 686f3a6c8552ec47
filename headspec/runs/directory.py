"""A run directory: its config.json, the model it describes, and loading that model at a saved step."""

from __future__ import annotations

import dataclasses

import jax
import ml_collections
from flax import nnx

from headspec.data.tokenizer import INFO_FILE, Tokenizer, load_tokenizer
from headspec.errors import UserError
from headspec.io import remote
from headspec.model.config import ModelConfig, from_section
from headspec.model.transformer import Transformer
from headspec.parallel import mesh as mesh_lib
from headspec.runs import checkpoints

# Config keys that fix the parameters' shapes (train.seq_len sizes the learned positions, data.vocab_size
# the embeddings; norm, K/V heads, gated MLP, sublayer norms, QK-norm and biases add, resize or drop
# parameters): a workdir's checkpoints only fit a config that agrees on each. tests/test_model_keys.py
# checks that every ModelConfig option that changes a parameter's shape is here.
SHAPE_KEYS = (
  "model.kind",
  "model.num_layers",
  "model.num_heads",
  "model.d_model",
  "model.d_head",
  "model.d_ff",
  "model.positions",
  "model.tie_embeddings",
  "model.pre_layernorm",
  "model.mlp",
  "model.norm",
  "model.num_kv_heads",
  "model.gated_mlp",
  "model.sublayer_norm",
  "model.qk_norm",
  "model.attention_bias",
  "model.attention_out_bias",
  "model.mlp_bias",
  "train.seq_len",
  "data.vocab_size",
)
# Keys that fix what the checkpoints' data position counts: WORKDIR/cache holds that corpus's tokens.
DATA_KEYS = ("data.corpus",)
# What a key means in a config.json written before the key existed: ModelConfig's default (the model
# such a run trained).
SHAPE_DEFAULTS = {
  f"model.{f.name}": f.default
  for f in dataclasses.fields(ModelConfig)
  if f"model.{f.name}" in SHAPE_KEYS and f.default is not dataclasses.MISSING
}


def _get(config, key: str):
  section, name = key.split(".")
  value = (config.get(section) or {}).get(name, SHAPE_DEFAULTS.get(key))
  if key == "model.num_kv_heads" and not value:  # 0: a K/V head per head, the same shapes as num_heads
    return _get(config, "model.num_heads")
  return value


def kv_groups(workdir) -> tuple[int, ...]:
  """Each head's K/V group in a `headspec train` run (read from WORKDIR/config.json, no model loaded):
  head h's group is kv_groups(run)[h]; (0, 1, ..., H-1) without grouped-query attention. Join it to any
  per-head table on `head` (docs/outputs.md); a loaded model's own is `model.cfg.kv_group_of_head`."""
  return from_section(read_config(workdir).model, vocab_size=1, max_len=1).kv_group_of_head


def check_resume(workdir, config: ml_collections.ConfigDict) -> list[int]:
  """The saved steps of `workdir` after checking that `config` may resume them; reads, never writes.

  Refuses (one line) a workdir whose checkpoints belong to another model shape or corpus, one whose
  checkpoints lost the tokenizer they were trained with (a new one would give the ids other meanings),
  and one whose token cache (cache/, kept with no checkpoint yet) is of another corpus.
  """
  workdir = remote.run_path(workdir)
  saved = checkpoints.saved_steps(workdir)
  tokenizer = workdir / "tokenizer" / INFO_FILE
  if saved and not tokenizer.is_file():
    raise UserError(
      f"{tokenizer}: missing, but {checkpoints.checkpoint_dir(workdir)} holds steps {saved}: they only fit the "
      "tokenizer they were trained with (restore tokenizer/, or use a new --workdir)"
    )
  if not (workdir / "config.json").is_file():
    return saved  # the restore still checks every parameter's shape
  keys = SHAPE_KEYS + DATA_KEYS if saved else DATA_KEYS if (workdir / "cache").is_dir() else ()
  old = read_config(workdir) if keys else None
  for key in keys:
    there, here = _get(old, key), _get(config, key)
    if there != here:
      what = "checkpoints of a different model" if key in SHAPE_KEYS else "checkpoints trained on other data"
      if not saved:
        what = "a token cache (cache/) of other data"
      raise UserError(
        f"{workdir} holds {what}: {key} is {there!r} there, {here!r} in this config (use a new --workdir)"
      )
  return saved


def write_config(workdir, config: ml_collections.ConfigDict, *, is_lead: bool = True) -> None:
  """Writes WORKDIR/config.json (whole), refusing a workdir whose checkpoints `config` may not resume.

  Every process checks; only the lead process (`is_lead`) writes, so processes of one run never race.
  """
  workdir = remote.run_path(workdir)
  check_resume(workdir, config)
  save_config(workdir, config, is_lead=is_lead)


def save_config(workdir, config: ml_collections.ConfigDict, *, is_lead: bool = True) -> None:
  """Writes WORKDIR/config.json (whole) on the lead process, unchecked: for a run that called check_resume."""
  workdir = remote.run_path(workdir)
  if is_lead:
    workdir.mkdir(parents=True, exist_ok=True)
    text = config.to_json_best_effort(indent=1, sort_keys=True) + "\n"
    remote.write_bytes_atomic(workdir / "config.json", text.encode())


def read_config(workdir) -> ml_collections.ConfigDict:
  """WORKDIR/config.json; one line naming the file when it is missing or damaged."""
  path = remote.run_path(workdir) / "config.json"
  if not path.is_file():
    raise UserError(f"{path}: not a headspec run directory (no config.json); train one first")
  data = remote.read_json(path)
  for section in ("model", "train"):
    if not isinstance(data, dict) or not isinstance(data.get(section), dict):
      raise UserError(f"{path}: no {section!r} section; not a headspec run config (or a damaged one)")
  return ml_collections.ConfigDict(data)


def load_run_model(workdir, step: int) -> tuple[Transformer, Tokenizer]:
  """The model of a `headspec train` workdir with the parameters saved at `step`, and its tokenizer."""
  config = read_config(workdir)
  tokenizer = load_tokenizer(remote.run_path(workdir) / "tokenizer")
  cfg = from_section(config.model, tokenizer.vocab_size, config.train.seq_len)
  abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  graphdef, abstract_params = nnx.split(abstract)
  params = checkpoints.restore_params(workdir, step, abstract_params, mesh=mesh_lib.current())
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
