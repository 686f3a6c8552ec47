"""Orbax checkpoints of a run: training state plus the data iterator's position, for exact resume.

Kept: the last `keep_last` checkpoints and every step listed in `train.keep_steps` (to study
specialization over training), through orbax's preservation policies.

A step folder counts as a checkpoint only when it holds orbax's commit marker (`_CHECKPOINT_METADATA`,
or `commit_success.txt` on object stores), written last: an empty or half-copied `checkpoints/N/` is
not a step. A damaged checkpoint (truncated data file, garbage metadata) is a one-line UserError naming
the file, never orbax's or tensorstore's traceback.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import sys
from collections.abc import Iterator, Sequence

import jax
import orbax.checkpoint as ocp
from etils import epath
from orbax.checkpoint import checkpoint_managers

from headspec.errors import UserError
from headspec.io import library_logs, remote
from headspec.parallel import mesh as mesh_lib

# Written when orbax commits a step: locally _CHECKPOINT_METADATA (inside the folder renamed into
# place), on object stores commit_success.txt (the last object written).
COMMIT_MARKERS = ("_CHECKPOINT_METADATA", "commit_success.txt")
# JSON files of a committed step that restoring reads.
_METADATA_FILES = ("state/_METADATA", "data/metadata")


def checkpoint_dir(workdir) -> epath.Path:
  """WORKDIR/checkpoints; gs:// and other remote workdirs stay URLs (orbax writes them natively)."""
  return remote.run_path(workdir) / "checkpoints"


def is_committed(step_dir) -> bool:
  """Whether a step folder holds orbax's commit marker (an empty or half-copied folder does not)."""
  step_dir = epath.Path(step_dir)
  return any((step_dir / marker).exists() for marker in COMMIT_MARKERS)


@dataclasses.dataclass(frozen=True)
class _CommittedSteps:
  """orbax's standard step names (`checkpoints/<step>`), finding only committed step folders."""

  single_host_load_and_broadcast: bool = False

  @property
  def _standard(self):
    return ocp.path.step.standard_name_format()

  def build_name(self, step: int) -> str:
    return self._standard.build_name(step)

  def find_all(self, base_path) -> Iterator:
    return (m for m in self._standard.find_all(base_path) if is_committed(m.path))

  def find_step(self, base_path, step: int):
    metadata = self._standard.find_step(base_path, step)
    if not is_committed(metadata.path):
      raise ValueError(f"{metadata.path}: no commit marker ({' or '.join(COMMIT_MARKERS)})")
    return metadata


def check_keep_last(keep_last) -> None:
  """train.keep_last must keep at least the last checkpoint: orbax's LatestN(0) deletes every one."""
  if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
    raise UserError(
      f"train.keep_last={keep_last!r}: must be an integer >= 1 (the number of latest checkpoints kept; "
      "0 would delete every checkpoint, the last one too)"
    )


def manager(
  workdir, *, keep_last: int = 3, keep_steps: Sequence[int] = (), read_only: bool = False
) -> ocp.CheckpointManager:
  """A CheckpointManager over WORKDIR/checkpoints with items 'state' (pytree) and 'data' (JSON)."""
  check_keep_last(keep_last)
  policy = checkpoint_managers.AnyPreservationPolicy(
    [
      checkpoint_managers.LatestN(keep_last),
      checkpoint_managers.CustomSteps(list(keep_steps)),
    ]
  )
  with library_logs.quiet():  # orbax's two warnings on opening read-only, as loading does on purpose
    options = ocp.CheckpointManagerOptions(
      preservation_policy=policy,
      create=not read_only,
      read_only=read_only,
      step_name_format=_CommittedSteps(),
    )
    return ocp.CheckpointManager(checkpoint_dir(workdir), options=options, item_names=("state", "data"))


def save(mngr: ocp.CheckpointManager, step: int, state, data_state: dict | None) -> None:
  """Saves `step` and waits until orbax has committed it, so a save that fails (a full disk, a quota, a
  read-only mount) stops training at that step: orbax writes in a background thread and would only
  raise at the next save, the run training and logging on meanwhile. The failure is one UserError
  naming the step's folder; the step's half-written temporary folder is removed (no step of a run
  ever lists it: it has no commit marker). The wait, measured on the 2-core CPU at load average 14 (an
  upper bound): 0.4-2.0 s for the quickstart decoder, 3.2-4.4 s for base_decoder's 6.8M parameters with
  their Adam state, once every `train.checkpoint_every` steps (1,000 by default)."""
  _drop_late_read_callbacks()  # a failed write's other tensorstore writes finish into a closed event loop
  try:
    mngr.save(
      step, args=ocp.args.Composite(state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state or {}))
    )
    mngr.wait_until_finished()
  except Exception as e:  # orbax and tensorstore raise many types; each becomes one line naming the step
    raise _save_error(mngr, step, e) from e


# An OS error in a tensorstore message: `... No space left on device [os_error_code='28']`.
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")


def os_errno(e: BaseException) -> int | None:
  """The errno of an OSError in `e`'s chain (its causes and contexts), or the os_error_code tensorstore
  puts in its messages; None if there is none."""
  seen = set()
  while e is not None and id(e) not in seen:
    seen.add(id(e))
    if isinstance(e, OSError) and e.errno is not None:
      return e.errno
    code = _OS_ERROR_CODE.search(str(e))
    if code:
      return int(code.group(1))
    e = e.__cause__ or e.__context__
  return None


def _save_error(mngr: ocp.CheckpointManager, step: int, e: Exception) -> UserError:
  """The UserError of a failed save of `step`, after removing what orbax left of it: its temporary
  folder(s) `<step>.orbax-checkpoint-tmp*` and an uncommitted `<step>/`."""
  folder = epath.Path(mngr.directory)
  with contextlib.suppress(Exception):  # a failed cleanup must not hide why the save failed
    mngr.close()  # joins orbax's threads: nothing writes into the folders removed next
  if jax.process_index() == 0:
    partial = list(folder.glob(f"{step}.orbax-checkpoint-tmp*"))  # never a step, whatever it holds
    if (folder / str(step)).is_dir() and not is_committed(folder / str(step)):
      partial.append(folder / str(step))
    for leftover in partial:
      with contextlib.suppress(OSError):
        leftover.rmtree()
  code = os_errno(e)
  text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
  reason = os.strerror(code) if code is not None else re.sub(r"\s*\[tensorstore_spec.*", "", text)[:200]
  kept = [s for s in saved_steps_of(folder) if s != step]
  resume = f"resumes from step {kept[-1]}" if kept else "starts again from step 0"
  return UserError(
    f"{folder / str(step)}: saving the checkpoint of step {step} failed ({reason}); training stopped there and "
    f"its partial files were removed. Free space (or fix the folder) and run the same command again: it {resume}"
  )


def restore(mngr: ocp.CheckpointManager, step: int, abstract_state):
  """Returns (state, data_state) of `step`, laid out like `abstract_state` (shapes and shardings)."""
  step_dir = epath.Path(mngr.directory) / str(step)
  _check_metadata(step_dir)
  _drop_late_read_callbacks()
  try:
    restored = mngr.restore(
      step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore())
    )
  except Exception as e:  # orbax and tensorstore raise many types; each becomes one line naming the file
    raise _restore_error(step_dir, e) from e
  return restored.state, restored.data


def restore_params(workdir, step: int, abstract_params, *, mesh=None):
  """Only the model parameters of a saved step (for probing and analysis): on `mesh`, each device reading
  only its shards (headspec/parallel/mesh.py's rules, whatever mesh saved them), else on the first device."""
  mngr = manager(workdir, read_only=True)
  if step not in mngr.all_steps():
    raise UserError(f"no checkpoint for step {step} in {checkpoint_dir(workdir)} (have {sorted(mngr.all_steps())})")
  step_dir = checkpoint_dir(workdir) / str(step)
  _check_metadata(step_dir)
  _drop_late_read_callbacks()
  abstract = {"params": abstract_params}
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])  # this process's (several: each its own)
  shardings = mesh_lib.param_shardings(abstract, mesh) if mesh is not None else jax.tree.map(lambda _: device, abstract)
  try:
    restored = mngr.restore(
      step,
      args=ocp.args.Composite(
        state=ocp.args.PyTreeRestore(
          abstract,
          restore_args=jax.tree.map(lambda s: ocp.ArrayRestoreArgs(sharding=s), shardings),
          partial_restore=True,
        )
      ),
    )
  except Exception as e:  # as in `restore`
    raise _restore_error(step_dir, e) from e
  return restored.state["params"]


def saved_steps(workdir) -> list[int]:
  """The committed steps under WORKDIR/checkpoints, ascending."""
  return saved_steps_of(checkpoint_dir(workdir))


def saved_steps_of(folder) -> list[int]:
  """The committed steps in a checkpoint folder, ascending."""
  folder = epath.Path(folder)
  if not folder.is_dir():
    return []
  return sorted(m.step for m in _CommittedSteps().find_all(folder))  # no manager: no multi-host sync


def _check_metadata(step_dir: epath.Path) -> None:
  """One line for a committed step whose metadata files are missing or not JSON (and for orbax's per-process
  array metadata, where the step has it)."""
  optional = sorted((step_dir / "state" / "array_metadatas").glob("*")) if (step_dir / "state").is_dir() else []
  for path in [step_dir / name for name in _METADATA_FILES] + optional:
    if not path.is_file():
      raise UserError(f"{path}: missing from checkpoint {step_dir} (the checkpoint is incomplete)")
    try:
      json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise UserError(
        f"{path}: corrupt checkpoint metadata (not JSON: {e}); step {step_dir.name} is damaged: {set_aside(step_dir)}"
      ) from None


def set_aside(step_dir) -> str:
  """How to set a damaged step aside, as docs/scale.md promises: move its folder out of checkpoints/ (a
  folder there without a step's name is no step) and the run resumes from the step before."""
  step_dir = epath.Path(step_dir)
  try:
    before = [s for s in saved_steps_of(step_dir.parent) if s < int(step_dir.name)]
  except (OSError, ValueError):
    before = []
  then = f"training then resumes from step {before[-1]}" if before else "training then starts again from step 0"
  n = step_dir.name
  return f"set it aside with `mv checkpoints/{n} damaged-step-{n}` in the run folder ({then})"


# Tensorstore's status codes for a file it cannot read (as opposed to a tree or shape mismatch).
_READ_FAILURE = re.compile(r"\b(DATA_LOSS|OUT_OF_RANGE|NOT_FOUND|INTERNAL|UNKNOWN|FAILED_PRECONDITION)\b")
# What tensorstore appends to a message: a spec, or (orbax) the repr of a pybind method of the TensorStore.
_TENSORSTORE_DETAILS = re.compile(r"\s*(\[tensorstore_spec.*|See full TensorStore details:.*)", re.DOTALL)


def _chain(e: BaseException) -> list[BaseException]:
  """`e` and its causes and contexts, outermost first."""
  out = []
  while e is not None and all(e is not x for x in out):
    out.append(e)
    e = e.__cause__ or e.__context__
  return out


def _first_line(e: BaseException) -> str:
  text = _TENSORSTORE_DETAILS.sub("", str(e)).strip().strip("'\"")
  return text.splitlines()[0] if text else type(e).__name__


def _restore_error(step_dir: epath.Path, e: Exception) -> UserError:
  """A one-line UserError for an orbax restore failure: a damaged file (named, with the step and how to set
  it aside), or a checkpoint of another model. Orbax wraps tensorstore's read error in an exception whose
  text is the repr of a pybind method: the read error is looked for along the whole chain."""
  chain = _chain(e)
  for link in chain:
    first = _first_line(link)
    code = _READ_FAILURE.search(first)
    if code or isinstance(link, (OSError, json.JSONDecodeError, UnicodeDecodeError)):
      files = re.findall(r'(?:local )?file "([^"]+)"', first)
      array = re.search(r'(?:reading|writing) "([^"/]+?)(?:\.value)?/', first)
      where = files[-1] if files else getattr(link, "filename", None) or step_dir
      detail = first.split(": ")[-1] if code else first
      kind = code.group(1) if code else type(link).__name__
      return UserError(
        f"{where}: checkpoint file unreadable ({kind}: {detail[:160]}{', array ' + array.group(1) if array else ''}); "
        f"step {step_dir.name} is damaged: {set_aside(step_dir)}"
      )
  return UserError(f"checkpoint {step_dir} does not match this model: {_first_line(e)[:300]}")


def _drop_late_read_callbacks() -> None:
  """When a restore fails on a damaged file, tensorstore's other reads still finish: asyncio logs each
  failed read ("Task exception was never retrieved") and Python prints a traceback for each callback
  into orbax's event loop, closed by then: dozens of tracebacks around the one-line error. Those, and
  only those, are dropped, from the first restore on."""
  if getattr(sys.unraisablehook, "headspec_drops_late_reads", False):
    return
  previous = sys.unraisablehook

  def hook(unraisable):
    if not (isinstance(unraisable.exc_value, RuntimeError) and str(unraisable.exc_value) == "Event loop is closed"):
      previous(unraisable)

  hook.headspec_drops_late_reads = True
  sys.unraisablehook = hook
  logging.getLogger("asyncio").addFilter(
    lambda record: (
      not (
        str(record.msg).startswith("Task exception was never retrieved")
        and ("tensorstore" in str(record.msg) or "orbax" in str(record.msg))
      )
    )
  )
