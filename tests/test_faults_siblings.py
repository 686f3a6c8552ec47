"""Issue 38, the siblings: faults fixed in one place and found again elsewhere (temporaries of killed
writers, a read-modify-write outside the table lock, a grid sized by a stray row, a config of another
command, `$` in study figures, damaged metrics.jsonl lines, CSVs read without the row checks)."""

import os
import subprocess
import sys
import threading
import time

from headspec import remote, tables


def _dead_pid() -> int:
  """The pid of a process that has exited."""
  out = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
  return int(out.stdout)


def _stale(folder, name: str) -> "os.PathLike":
  """A temporary a writer killed a while ago left beside `name` (kill -9 between write and rename)."""
  tmp = folder / f".{name}.tmp-{_dead_pid()}"
  tmp.write_bytes(b"half")
  os.utime(tmp, (1e9, 1e9))
  return tmp


# --- b: temporaries of killed writers of tables, files and figures ----------------------------------------


def test_writes_remove_the_temporaries_of_killed_writers(tmp_path):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  table = tables.path_of(tmp_path, tables.LABELS)
  table.parent.mkdir()
  stale = [_stale(table.parent, "labels.csv"), _stale(table.parent, "roles.csv")]
  fresh = table.parent / f".icl.csv.tmp-{_dead_pid()}"  # just written: maybe another host's live writer
  fresh.write_bytes(b"half")
  tables.check_writable(tmp_path, tables.LABELS)  # a check writes nothing, so removes nothing
  assert all(p.exists() for p in stale)
  tables.write(table, [dict(model="m", step=0, layer=0, head=0, label="none", rule="x")], tables.LABELS)
  assert sorted(p.name for p in table.parent.iterdir()) == sorted(["labels.csv", fresh.name])

  stale = _stale(tmp_path, "summary.md")
  remote.write_bytes_atomic(tmp_path / "summary.md", b"# summary\n")
  assert not stale.exists() and (tmp_path / "summary.md").read_bytes() == b"# summary\n"

  figures = tmp_path / "figures"
  figures.mkdir()
  stale = _stale(figures, "heatmap.png")
  fig = plt.figure()
  remote.save_figure(fig, figures / "loss.png")
  plt.close(fig)
  assert [p.name for p in figures.iterdir()] == ["loss.png"]


# --- c: attention/labels.csv read, combined and written under the table's lock --------------------------


def test_induction_labels_keep_a_concurrent_writers_rows(tmp_path):
  from headspec.attention import induction_run

  path = tables.path_of(tmp_path, tables.LABELS)
  none = [dict(model="m", step=0, layer=0, head=h, label="none", rule="no rule met") for h in range(2)]
  tables.write(path, none, tables.LABELS)
  held, done = threading.Event(), threading.Event()

  def other_writer():  # `headspec attention`'s treebank step of another process, labelling head 0
    with tables.locked(path) as check:
      held.set()
      time.sleep(0.5)  # the induction step starts meanwhile and waits for the lock
      clark = dict(none[0], label="nsubj", rule="Clark accuracy")
      tables._write(path, [clark, none[1]], tables.LABELS, check)
    done.set()

  thread = threading.Thread(target=other_writer)
  thread.start()
  held.wait()
  induction = dict(none[1], label="induction", rule="induction score")
  induction_run.write(tmp_path, {"roles": [], "labels": [induction]}, 1, 2, "m", 0)
  thread.join()
  assert done.is_set()
  got = [(r["head"], r["label"]) for r in tables.read(path, tables.LABELS)]
  assert got == [("0", "nsubj"), ("1", "induction")]  # the other writer's label is kept
