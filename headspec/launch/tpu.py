"""Cloud TPU: optionally create the VM, install headspec from a wheel built here, stage the data on every
worker, then train and analyse on all workers (one program over the slice, `--config.multihost=True`; an
experiment's resumable analysis stages and its report run on worker 0) (gcloud compute tpus tpu-vm ...)."""

from __future__ import annotations

import importlib.metadata
import re
import shlex
import sys

import headspec
from headspec.errors import UserError
from headspec.io import remote
from headspec.launch.plan import Step, headspec_argv, multihost_extra, train_extra

REMOTE_HOME = "~/headspec"  # on TPU workers: the wheel (configs inside) and data/ go here
TPU = ("gcloud", "compute", "tpus", "tpu-vm")


def wheel_name() -> str:
  """The file `pip wheel .` writes for this package: its distribution's name from the installed metadata
  (normalized as wheel file names are) and the version the wheel is built from (headspec.__version__, which
  pyproject.toml reads), pure Python."""
  try:
    name = importlib.metadata.packages_distributions().get("headspec", ["headspec"])[0]
    name = importlib.metadata.metadata(name)["Name"]
  except importlib.metadata.PackageNotFoundError:  # run from a checkout that was never installed
    name = "headspec"
  return f"{re.sub(r'[-_.]+', '_', name).lower()}-{headspec.__version__}-py3-none-any.whl"


def _check(opts) -> None:
  missing = [
    f"--{n} (or {e})" for n, e, v in (("tpu-name", "TPU_NAME", opts.tpu_name), ("zone", "ZONE", opts.zone)) if not v
  ]
  if opts.create:
    missing += [
      f"--{n} (or {e})"
      for n, e, v in (
        ("accelerator-type", "ACCELERATOR_TYPE", opts.accelerator_type),
        ("runtime-version", "RUNTIME_VERSION", opts.runtime_version),
      )
      if not v
    ]
  if missing:
    raise UserError(f"tpu launcher needs {', '.join(missing)}")
  if not opts.data:
    raise UserError("tpu launcher needs --data (a gs:// bucket folder or a local folder), or HEADSPEC_DATA_DIR")
  remote.check_url(opts.data, "--data")


def _ssh(opts, where: list[str], command: str, worker: str = "all") -> Step:
  return Step(
    "every TPU worker" if worker == "all" else f"TPU worker {worker}",
    (*TPU, "ssh", opts.tpu_name, *where, f"--worker={worker}", f"--command={command}"),
  )


def _setup_steps(opts, where: list[str]) -> list[Step]:
  """Create the VM (--create), build the wheel here and install it on every worker, stage the data."""
  steps = []
  if opts.create:
    create = [*TPU, "create", opts.tpu_name, *where, f"--accelerator-type={opts.accelerator_type}"]
    create += [f"--version={opts.runtime_version}"] + (["--spot"] if opts.spot else [])
    steps.append(Step("local", tuple(create)))
  wheel = wheel_name()
  steps.append(Step("local", (sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", "dist", ".")))
  steps.append(_ssh(opts, where, f"mkdir -p {REMOTE_HOME}"))
  scp = (*TPU, "scp", "--recurse", f"dist/{wheel}", f"{opts.tpu_name}:{REMOTE_HOME}/", *where, "--worker=all")
  steps.append(Step("local", scp))
  steps.append(_ssh(opts, where, f"pip install -q -U 'jax[tpu]' {REMOTE_HOME}/{wheel}"))
  if remote.is_remote(opts.data):  # staged on every worker's disk (TFDS and treebank readers want local files)
    data = shlex.quote(opts.data)  # the remote shell reads this line: a value is one word, never a command
    steps.append(
      _ssh(opts, where, f"mkdir -p {REMOTE_HOME}/data && gcloud storage rsync --recursive {data} {REMOTE_HOME}/data")
    )
  else:
    target = f"{opts.tpu_name}:{REMOTE_HOME}/data"
    steps.append(Step("local", (*TPU, "scp", "--recurse", opts.data.rstrip("/"), target, *where, "--worker=all")))
  return steps


def tpu_steps(opts, plans) -> list[Step]:
  _check(opts)
  where = ["--zone", opts.zone] + (["--project", opts.project] if opts.project else [])
  steps = _setup_steps(opts, where)
  for stages in plans:
    for stage in stages:
      argv = headspec_argv(stage, "python3") + train_extra(stage, ["--config.model.dtype=bfloat16"])
      argv += multihost_extra(stage)
      command = f"cd {REMOTE_HOME} && HEADSPEC_DATA_DIR={REMOTE_HOME}/data {shlex.join(argv)}"
      steps.append(_ssh(opts, where, command, "all" if stage.distributed else "0"))
  return steps
