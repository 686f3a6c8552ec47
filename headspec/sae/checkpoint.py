"""Orbax checkpoints of SAE training: the state (parameters, Adam's moments, each latent's inputs since it
last fired) and a JSON fingerprint of the options and inputs it was trained with. The latest step only is
kept; resuming from a fingerprint that differs is refused in one line."""

from __future__ import annotations

import jax
import orbax.checkpoint as ocp
from etils import epath

from headspec.errors import UserError


def manager(directory) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(max_to_keep=1, create=True)
  return ocp.CheckpointManager(epath.Path(directory).absolute(), options=options, item_names=("state", "meta"))


def save(mngr: ocp.CheckpointManager, step: int, state: dict, meta: dict) -> None:
  mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))


def resume(mngr: ocp.CheckpointManager, state: dict, meta: dict, directory) -> tuple[int, dict]:
  """(step, state) of the latest checkpoint, or (0, `state`) when there is none."""
  step = mngr.latest_step()
  if step is None:
    return 0, state
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
  try:
    restored = mngr.restore(
      step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore())
    )
  except Exception as e:  # orbax and tensorstore raise many types: one line naming the folder
    raise UserError(f"{directory}: SAE checkpoint of step {step} cannot be read ({type(e).__name__})") from e
  if restored.meta != meta:
    changed = sorted(k for k in meta["options"] if restored.meta.get("options", {}).get(k) != meta["options"][k])
    what = f"options {', '.join(changed)}" if changed else "inputs"
    raise UserError(f"{directory}: holds an SAE trained with other {what}; use another checkpoint_dir or remove it")
  return step, restored.state
