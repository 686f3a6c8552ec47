"""Orbax checkpoints of SAE training: the state (parameters, Adam's moments, each latent's inputs since it
last fired) and a JSON fingerprint of the options and inputs it was trained with. The latest step only is
kept; resuming from a fingerprint that differs is refused in one line."""

from __future__ import annotations

import re

import jax
import orbax.checkpoint as ocp
from etils import epath

from headspec.errors import UserError
from headspec.runs import checkpoints


def manager(directory) -> ocp.CheckpointManager:
  options = ocp.CheckpointManagerOptions(max_to_keep=1, create=True)
  return ocp.CheckpointManager(epath.Path(directory).absolute(), options=options, item_names=("state", "meta"))


def save(mngr: ocp.CheckpointManager, step: int, state: dict, meta: dict) -> None:
  """Saves `step` and waits for orbax to commit it, as training's checkpoints do (headspec/runs/checkpoints.py
  `save`): a failed save (a full disk) is one line naming the step's folder, its temporary removed."""
  checkpoints._drop_late_read_callbacks()  # a failed write's other tensorstore writes: no traceback each
  try:
    mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
    mngr.wait_until_finished()
  except Exception as e:  # orbax and tensorstore raise many types
    raise checkpoints._save_error(mngr, step, e) from e


def resume(mngr: ocp.CheckpointManager, state: dict, meta: dict, directory) -> tuple[int, dict]:
  """(step, state) of the latest checkpoint, or (0, `state`) when there is none."""
  step = mngr.latest_step()
  if step is None:
    return 0, state
  checkpoints._drop_late_read_callbacks()
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
  try:
    restored = mngr.restore(
      step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore())
    )
  except Exception as e:  # orbax and tensorstore raise many types: one line naming the folder, why, and what to do
    raise damaged(directory, step, e) from e
  if restored.meta != meta:
    changed = sorted(k for k in meta["options"] if restored.meta.get("options", {}).get(k) != meta["options"][k])
    what = f"options {', '.join(changed)}" if changed else "inputs"
    raise UserError(f"{directory}: holds an SAE trained with other {what}; use another checkpoint_dir or remove it")
  return step, restored.state


def damaged(directory, step: int, e: BaseException) -> UserError:
  """One line for a checkpoint that cannot be read: the file and the reason (tensorstore's read error
  found along the chain, as for training's checkpoints), and the remedy: move the step aside."""
  step_dir = epath.Path(directory) / str(step)
  where, reason = step_dir, ""
  for link in checkpoints._chain(e):
    first = checkpoints._first_line(link)
    code = checkpoints._READ_FAILURE.search(first)
    if code or isinstance(link, (OSError, ValueError)):
      files = re.findall(r'(?:local )?file "([^"]+)"', first)
      where = files[-1] if files else getattr(link, "filename", None) or step_dir
      reason = f"{code.group(1)}: {first.split(': ')[-1]}" if code else f"{type(link).__name__}: {first}"
      break
  reason = reason or f"{type(e).__name__}: {checkpoints._first_line(e)}"
  return UserError(
    f"{where}: SAE checkpoint of step {step} is damaged ({reason[:200]}); set it aside with "
    f"`mv {step_dir} {epath.Path(directory).parent / f'damaged-{epath.Path(directory).name}-{step}'}` (or remove "
    f"{directory}) and run the same command again: the SAE is trained again from step 0"
  )
