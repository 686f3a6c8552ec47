"""Orbax checkpoints of a run: training state plus the data iterator's position, for exact resume.

Kept: the last `keep_last` checkpoints and every step listed in `train.keep_steps` (to study
specialization over training), through orbax's preservation policies.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import checkpoint_managers

from headspec import remote
from headspec.errors import UserError


def checkpoint_dir(workdir) -> epath.Path:
  """WORKDIR/checkpoints; gs:// and other remote workdirs stay URLs (orbax writes them natively)."""
  return remote.run_path(workdir) / "checkpoints"


def manager(
  workdir, *, keep_last: int = 3, keep_steps: Sequence[int] = (), read_only: bool = False
) -> ocp.CheckpointManager:
  """A CheckpointManager over WORKDIR/checkpoints with items 'state' (pytree) and 'data' (JSON)."""
  policy = checkpoint_managers.AnyPreservationPolicy(
    [
      checkpoint_managers.LatestN(keep_last),
      checkpoint_managers.CustomSteps(list(keep_steps)),
    ]
  )
  options = ocp.CheckpointManagerOptions(preservation_policy=policy, create=not read_only, read_only=read_only)
  return ocp.CheckpointManager(checkpoint_dir(workdir), options=options, item_names=("state", "data"))


def save(mngr: ocp.CheckpointManager, step: int, state, data_state: dict | None) -> None:
  """Asynchronous save; call `mngr.wait_until_finished()` before the process exits."""
  mngr.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state or {})))


def restore(mngr: ocp.CheckpointManager, step: int, abstract_state):
  """Returns (state, data_state) of `step`, laid out like `abstract_state` (shapes and shardings)."""
  try:
    restored = mngr.restore(
      step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore())
    )
  except (ValueError, KeyError) as e:  # orbax reports tree or shape mismatches as these
    raise UserError(f"checkpoint {mngr.directory}/{step} does not match this model: {str(e).splitlines()[0]}") from e
  return restored.state, restored.data


def restore_params(workdir, step: int, abstract_params):
  """Only the model parameters of a saved step (for probing and analysis)."""
  mngr = manager(workdir, read_only=True)
  if step not in mngr.all_steps():
    raise UserError(f"no checkpoint for step {step} in {checkpoint_dir(workdir)} (have {sorted(mngr.all_steps())})")
  abstract = {"params": abstract_params}
  device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
  restored = mngr.restore(
    step,
    args=ocp.args.Composite(
      state=ocp.args.PyTreeRestore(
        abstract,
        restore_args=jax.tree.map(lambda _: ocp.ArrayRestoreArgs(sharding=device), abstract),
        partial_restore=True,
      )
    ),
  )
  return restored.state["params"]


def saved_steps(workdir) -> list[int]:
  if not checkpoint_dir(workdir).is_dir():
    return []
  return sorted(manager(workdir, read_only=True).all_steps())
