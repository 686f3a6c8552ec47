"""Writers and readers shared by every command, each checked where it is used (temporaries of killed
writers, a read-modify-write outside the table lock, a grid sized by a stray row, a config of another
command, `$` in study figures, damaged metrics.jsonl lines, CSVs read without the row checks)."""

import importlib
import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import threading
import time

import pytest
from test_atlas_fixtures import write_run

from headspec.io import remote, tables


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


# --- a: analysis/probe_heatmaps.py sizes its grids by the model, not by the table's rows -------------------


def _analysis(name: str):
  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "analysis"))
  return importlib.import_module(name)


def test_probe_heatmaps_grid_is_the_models_and_rows_outside_are_left_out(tmp_path, capsys, monkeypatch):
  probe_heatmaps = _analysis("probe_heatmaps")
  run = write_run(tmp_path / "run", layers=2, heads=3, steps=(0,), diversity=False, ablation=False, attention=False)
  path = tables.path_of(run, tables.PROBES)
  rows = tables.read(path, tables.PROBES)
  mine = next(r for r in rows if r["model"] == "run" and r["head"] == "0" and r["split"].endswith("/dev"))
  stray = dict(mine, layer="100000")  # a 10^5 × 3 array at least; with a stray head, 10^10 cells
  tables.write(path, rows + [stray, dict(stray, layer="0", head="100000")], tables.PROBES)
  (run / "config.json").write_text(json.dumps({"model": {"num_layers": 2, "num_heads": 3, "pretrained": ""}}))
  grids = []

  def grid(*args, _grid=probe_heatmaps.grid):  # every array drawn
    grids.append(_grid(*args))
    return grids[-1]

  monkeypatch.setattr(probe_heatmaps, "grid", grid)
  capsys.readouterr()
  probe_heatmaps.main([str(run), "--out", str(tmp_path / "out")])
  assert grids and all(g.shape == (2, 3) for g in grids)
  warnings = capsys.readouterr().err.strip().splitlines()
  assert len(warnings) == 1 and f"results.csv:{len(rows) + 2}: layer=100000" in warnings[0], warnings
  assert "left out 2 row(s)" in warnings[0]
  (run / "config.json").unlink()  # a pretrained model's folder: sized by the rows, at most tables.MAX_GRID
  grids.clear()
  probe_heatmaps.main([str(run), "--out", str(tmp_path / "out")])
  assert grids and all(g.shape == (2, 3) for g in grids)


def test_induction_formation_grid_is_the_models(tmp_path, capsys, monkeypatch):
  from headspec.attention import induction_run

  rows = [
    dict(model="m", step=s, data="repeated_random", layer=l, head=h, role=role, score=0.1 * s, ci_low=0, ci_high=1)
    for s in (1, 5)
    for l in range(2)
    for h in range(3)
    for role in ("induction", "previous_token")
  ]
  rows.append(dict(rows[-1], layer=100000))  # 10^5 × 3 cells per step, and as many lines drawn
  tables.write(tables.path_of(tmp_path, tables.ROLES), rows, tables.ROLES)
  (tmp_path / "config.json").write_text(json.dumps({"model": {"num_layers": 2, "num_heads": 3, "pretrained": ""}}))
  drawn = []
  monkeypatch.setattr(induction_run, "_figure", lambda png, model, steps, score, *rest: drawn.append(score))
  md = induction_run.formation(tmp_path, "m", 0.4)
  assert [s["induction"].shape for s in drawn] == [(2, 2, 3)]
  warnings = capsys.readouterr().err.strip().splitlines()
  assert len(warnings) == 1 and f"roles.csv:{len(rows) + 1}: layer=100000" in warnings[0], warnings
  assert "between step 1 and step 5" in md.read_text()


# --- d: a config of another command is one line naming the file and the missing key ------------------------

REPO = pathlib.Path(__file__).resolve().parents[1]
OWN_CONFIGS = {
  "train": "base_decoder.py",
  "probe": "probe_ewt.py",
  "diversity": "diversity.py",
  "ablate": "ablate.py",
  "attention": "attention_ewt.py",
}


@pytest.mark.parametrize(
  "command, config, key",
  [
    ("probe", "attention_ewt.py", "probe"),
    ("attention", "probe_ewt.py", "batch_tokens"),
    ("train", "diversity.py", "data"),
  ],
)
def test_a_config_of_another_command_is_one_line(command, config, key, tmp_path, capsys):
  from headspec.cli import main as cli

  path = REPO / "configs" / config
  workdir = tmp_path / "run"
  assert cli.main(["headspec", command, f"--config={path}", f"--workdir={workdir}"]) == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1, err
  assert err.startswith(f"headspec: error: {path}: no config key {key}") and f"`headspec {command}` needs" in err
  assert not workdir.exists()


def test_every_commands_own_config_has_its_keys():
  from headspec.cli import main as cli

  for command, config in OWN_CONFIGS.items():
    module = importlib.util.spec_from_file_location("config", REPO / "configs" / config)
    loaded = importlib.util.module_from_spec(module)
    module.loader.exec_module(loaded)
    cli._check_keys(command, loaded.get_config(None), config)  # raises UserError if a key is missing


# --- e: study figures draw `$` as written; every metrics.jsonl reader skips damaged lines ------------------

DAMAGED_METRICS = (
  b'{"step": 1, "loss": 3.0}\n[1, 2]\n{"step": 1.5, "loss": 2.5}\n\xff{"step": 2}\n'
  b'{"step": 3, "loss": 2.0, "eval/loss": 2.5}\n{"step": true}\n{"st'
)


def test_every_metrics_jsonl_reader_skips_damaged_lines_with_one_warning(tmp_path, capsys):
  from headspec import study
  from headspec.atlas import data as atlas_data
  from headspec.attention import induction_run
  from headspec.io import metrics
  from headspec.launch import sweeps

  (tmp_path / "metrics.jsonl").write_bytes(DAMAGED_METRICS)  # not UTF-8, cut off, not a record, no integer step
  assert [r["step"] for r in metrics.read_metrics(tmp_path)] == [1, 3]
  warnings = capsys.readouterr().err.strip().splitlines()
  assert len(warnings) == 1 and "metrics.jsonl:2: 5 line(s) left out" in warnings[0], warnings
  assert sweeps._last(tmp_path) == {"step": 3, "loss": "2.000000", "eval_loss": "2.500000"}
  rows = study.training({"run": "r", "condition": "c", "seed": 0}, tmp_path)
  assert [(r["step"], r["loss"]) for r in rows] == [(1, 3.0), (3, 2.0)] and rows[1]["eval_loss"] == 2.5
  assert induction_run.training_loss(tmp_path)[0].tolist() == [1, 3]
  assert [p["step"] for p in atlas_data.training(tmp_path)] == [1, 3]
  assert [r["step"] for r in _analysis("_common").training_metrics(tmp_path)] == [1, 3]
  warnings = capsys.readouterr().err.strip().splitlines()
  assert len(warnings) == 5 and all("metrics.jsonl:2: 5 line(s) left out" in w for w in warnings), warnings


def test_study_figures_draw_condition_names_with_dollars(tmp_path):
  import pandas as pd

  from headspec import study

  run = lambda condition, run: dict(run=run, condition=condition, seed=0)
  emergence = [
    dict(
      run("me$$age", f"$5-{s}"), task="upos", step=step, selectivity=0.1, ci_low=0.0, ci_high=0.2, above_init_heads=1
    )
    for s in range(2)
    for step in (0, 10)
  ]
  training = [dict(run("a$b$c", "$$"), step=step, loss=3.0, eval_loss=2.5) for step in (1, 10)]
  frames = {
    "emergence": pd.DataFrame(emergence),
    "diversity": pd.DataFrame([dict(run("me$$age", "$$"), step=s, metric="me$$age", value=0.5) for s in (0, 10)]),
    "training": pd.DataFrame(training),
    "roles": pd.DataFrame(columns=["run", "condition", "seed", "step", "role", "score"]),
  }
  assert study._figures(frames, tmp_path) == ["emergence.png", "diversity.png", "loss.png"]  # no induction frame
  frames["induction"] = pd.DataFrame(
    [dict(run("L$2$", "$s0"), step=s, measure="repeat_drop", k=float("nan"), value=v) for s, v in ((0, 0.0), (10, 1.0))]
  )
  drawn = ["emergence.png", "diversity.png", "loss.png", "induction.png"]
  assert study._figures(frames, tmp_path) == drawn
  assert all((tmp_path / name).stat().st_size > 0 for name in drawn)


# --- f: the probe report reads its tables through tables.read (every row checked) --------------------------


@pytest.mark.parametrize("table", [tables.PROBES, tables.PROBE_SELECTIVITY])
def test_probe_report_refuses_a_bad_row_in_one_line(table, tmp_path):
  from headspec.errors import UserError
  from headspec.probing import report

  run = write_run(tmp_path / "run", layers=2, heads=2, steps=(0,), diversity=False, ablation=False, attention=False)
  path = tables.path_of(run, table)
  if not path.exists():  # selectivity.csv: one row is enough
    row = dict(model="run", step=0, task="upos", layer=0, head=0, split="synth/test", dev_rank=1, n=10)
    row |= {c: 0.1 for c in tables.PROBE_SELECTIVITY.float_columns}
    tables.write(path, [row], table)
  report.write_report(run / "probes", primary_split="synth/test", select_split="synth/dev")
  assert "upos" in (run / "probes" / "summary.md").read_text()
  lines = path.read_text().splitlines()
  path.write_text("\n".join([*lines, lines[1]]) + "\n")  # a row twice (a hand edit, a bad merge)
  with pytest.raises(UserError, match=rf"{path.name}:{len(lines) + 1}: duplicate row .* first on line 2"):
    report.write_report(run / "probes", primary_split="synth/test", select_split="synth/dev")


def test_probe_parts_are_written_beside_with_the_pid_and_killed_ones_removed(tmp_path):
  import numpy as np

  from headspec.probing import suite

  path = tmp_path / "run-step0.partial-0123"
  stale = _stale(tmp_path, path.name)  # was `<name>.tmp.npz`: no pid (two writers collided), never removed
  part = dict(per_word={("upos", 0): (np.zeros(3), np.ones(3))}, rows=[{"a": 1}], complexity=[], mdl=[], fits=[])
  suite._write_part(path, part)
  assert [p.name for p in tmp_path.iterdir()] == [path.name] and not stale.exists()
  got = suite._read_part(path)
  assert got["rows"] == [{"a": 1}] and got["per_word"][("upos", 0)][1].tolist() == [1.0, 1.0, 1.0]


def test_sweep_summary_refuses_a_non_utf8_table_in_one_line(tmp_path):
  from headspec.errors import UserError
  from headspec.launch import sweeps

  (tmp_path / sweeps.TABLE).write_bytes(b"name,workdir\n\xff\xfe,run\n")
  with pytest.raises(UserError, match="not a UTF-8 text file"):
    sweeps.summarize(tmp_path)
  assert not list(tmp_path.glob(".*.lock"))  # the lock file is gone with the writer


@pytest.mark.parametrize("digit", ["\u00b2", "\u0663", "\uff13"])
def test_counts_and_seeds_take_ascii_digits_only(digit):
  """A superscript, Arabic-Indic or fullwidth digit passes str.isdigit(); int() then raises or reads a
  number the user did not type. Each place that parses a count or seed refuses it in one line."""
  from headspec.configs.experiments import grammar, induction, specialization
  from headspec.data import synthetic
  from headspec.errors import UserError
  from headspec.launch import sweeps

  with pytest.raises(UserError, match="--seeds"):
    sweeps.parse_grid([], seeds=f"0,{digit}")
  with pytest.raises(UserError, match="--treebank-sentences"):
    synthetic.main_synthetic(["--out=/nonexistent", f"--treebank-sentences={digit},1,1"])
  for module in (grammar, induction, specialization):
    with pytest.raises(ValueError, match="seed"):
      module.experiment(f"seed={digit}")


def test_swap_folder_replaces_and_two_swappers_both_succeed(tmp_path):
  """remote.swap_folder (the attention pictures' folder): an earlier folder is replaced, nothing is left
  aside, and two processes swapping into one folder at once both succeed (rmtree then rename, before,
  failed with ENOTEMPTY when the other's rename came between)."""
  folder = tmp_path / "pictures"
  folder.mkdir()
  (folder / "old.png").write_text("old")
  tmp = tmp_path / f".pictures.tmp-{os.getpid()}"
  tmp.mkdir()
  (tmp / "new.png").write_text("new")
  remote.swap_folder(tmp, folder)
  assert [p.name for p in tmp_path.iterdir()] == ["pictures"] and [p.name for p in folder.iterdir()] == ["new.png"]
  script = (
    "import os, pathlib, sys\n"
    "from headspec.io import remote\n"
    "folder = pathlib.Path(sys.argv[1])\n"
    "for i in range(40):\n"
    "  tmp = folder.with_name(f'.{folder.name}.tmp-{os.getpid()}')\n"
    "  tmp.mkdir()\n"
    "  for n in range(5):\n"
    "    (tmp / f'{n}.png').write_text(str(os.getpid()))\n"
    "  remote.swap_folder(tmp, folder)\n"
  )
  procs = [subprocess.Popen([sys.executable, "-c", script, str(folder)], stderr=subprocess.PIPE) for _ in range(2)]
  errors = [p.communicate(timeout=120)[1].decode() for p in procs]
  assert [p.returncode for p in procs] == [0, 0], errors
  assert [p.name for p in tmp_path.iterdir()] == ["pictures"]
  assert sorted(p.name for p in folder.iterdir()) == [f"{n}.png" for n in range(5)]
  assert len({p.read_text() for p in folder.iterdir()}) == 1  # one drawing's files, whole
