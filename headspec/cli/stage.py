"""`python -m headspec.cli.stage MARKER -- COMMAND ARGS`: one resumable stage of an experiment.

Runs `headspec COMMAND ARGS` in this process unless MARKER already holds the same command line, and
writes it to MARKER when the command exits 0 (headspec/launch/experiments.py plans the stages); a second launch
of the same stage waits for the first (the stage's lock, headspec/io/locks.py), then finds it done. A module of its
own so that planning (experiments.py, used by the launcher, used by the CLI) never imports the CLI back.
"""

from __future__ import annotations

import sys

from etils import epath

from headspec.cli import main as cli
from headspec.io import locks, remote


def run_stage(marker: str, argv: list[str]) -> int:
  """Runs `headspec ARGV` unless MARKER holds the same arguments; writes them to MARKER when it exits 0.
  Holds the stage's lock (headspec/io/locks.py: `.NAME.lock` beside MARKER) throughout: a second launch of
  the same stage (two launchers on one experiment folder, or two parts of a setting sharing a reference)
  waits for the first, then finds the stage done."""
  done = epath.Path(marker)
  name = done.name.removesuffix(".done")
  with locks.held(done.parent, name, wait=True, what=f"stage {name}"):
    return _run_stage(done, argv)


def _run_stage(done: epath.Path, argv: list[str]) -> int:
  text = " ".join(argv)
  if done.exists():
    if done.read_text().strip() == text:
      print(f"done already ({done}): headspec {text}", flush=True)
      return 0
    print(f"{done} was written by another command line: running this stage again", flush=True)
  print(f"stage: headspec {text}", flush=True)
  code = cli.main(["headspec", *argv])
  if code == 0:
    done.parent.mkdir(parents=True, exist_ok=True)
    remote.write_bytes_atomic(done, (text + "\n").encode())
  return code


def main(argv: list[str]) -> int:
  if len(argv) < 3 or argv[2] != "--":
    print("usage: python -m headspec.cli.stage MARKER -- COMMAND ARGS", file=sys.stderr)
    return 2
  return run_stage(argv[1], argv[3:])


if __name__ == "__main__":
  sys.exit(main(sys.argv))
