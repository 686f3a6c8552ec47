"""The analysis commands' outputs: a work directory that cannot be written is refused before any
computation; temporary folders of killed writers are removed and never shown; the atlas survives bad
table rows and a damaged metrics.jsonl; words and names with `$` are drawn as written, not as mathtext."""

import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest
from test_atlas_fixtures import tiny_png, write_run

from headspec.atlas import run_data
from headspec.io import remote, tables

DOLLARS = ["$$", "me$$age", "$5", "a$b$c"]  # the first two are EWT train forms


# --- `$` in drawn text (item 10) ----------------------------------------------------------------------


def test_attention_pictures_draw_words_with_dollars(tmp_path):
  from headspec.attention import pictures

  n = len(DOLLARS)
  attn_LHNN = np.random.default_rng(0).random((1, 2, n, n))
  assert len(pictures.head_pictures([(attn_LHNN, None)], [DOLLARS], tmp_path)) == 2
  pictures.line_view(attn_LHNN[0], DOLLARS, tmp_path / "lines.png", title="me$$age")
  pictures.rollout_flow_picture(attn_LHNN[0, 0], attn_LHNN[0, 1], DOLLARS, tmp_path / "flow.png", title="$$")
  assert all((tmp_path / f).stat().st_size > 0 for f in ("L0H1.png", "lines.png", "flow.png"))


def test_analysis_figures_draw_names_with_dollars(tmp_path):
  from headspec.ablation import plots as ablation_plots
  from headspec.attention import induction_run
  from headspec.diversity import plots as diversity_plots
  from headspec.probing import complexity, report

  rows = [dict(method="me$$age", metric="$$", layer=l, head=h, value=0.1 * h) for l in range(2) for h in range(2)]
  ablation_plots.heads(rows, 2, 2, tmp_path / "heads.png")
  pruning = [dict(metric="$$", ranking="me$$age", fraction_pruned=f, value=f) for f in (0.0, 0.5)]
  ablation_plots.pruning(pruning, tmp_path / "pruning.png")
  diversity = diversity_plots.tables([(s, 0, 0, -1, "me$$age", 0.5 + s) for s in (0, 10)])
  diversity_plots.plot_curves(diversity, tmp_path / "curves.png")
  probe_rows = [
    dict(layer=l, head=h, accuracy=0.5, selectivity=0.1) for l in range(-1, 2) for h in ([-1] if l < 0 else (-1, 0))
  ]
  report.heatmap(probe_rows, "me$$age step 0: upos probes on $$/test", tmp_path / "heatmap.png")
  sweep = [
    dict(model="me$$age", step=0, task="upos", split="$$/dev", layer=0, head=h, l2=l2, accuracy=0.5)
    | dict(control_accuracy=0.3, selectivity=0.2)
    for h in (-1, 0)
    for l2 in (0.1, 1.0)
  ]
  complexity.figure(sweep, tmp_path / "complexity.png")
  score = {k: np.full((2, 1, 2), 0.5) for k in ("induction", "previous_token")}
  curve = (np.array([1, 10]), np.array([3.0, 2.0]))
  induction_run._figure(tmp_path / "induction.png", "me$$age", [1, 10], score, [], curve, 0.4, None, None)
  for name in ("heads", "pruning", "curves", "heatmap", "complexity", "induction"):
    assert (tmp_path / f"{name}.png").stat().st_size > 0, name


# --- the atlas: bad rows, metrics.jsonl, temporary folders (items 8, 9, 11) ----------------------------


def _add_row(run, table, **changes):
  rows = tables.read(tables.path_of(run, table), table)
  tables.write(tables.path_of(run, table), rows + [dict(rows[0], **changes)], table)
  return len(rows) + 2  # the new row's line (line 1 is the header)


def test_atlas_grid_comes_from_the_config_and_skips_rows_outside(tmp_path, capsys):
  run = write_run(tmp_path / "run", layers=3, heads=4)
  line = _add_row(run, tables.ROLES, layer="100000")  # a 10^10-cell grid if the grid followed the rows
  data = run_data(run)
  assert (data["layers"], data["heads"]) == (3, 4)
  warnings = [line for line in capsys.readouterr().err.splitlines() if "roles.csv" in line]
  assert len(warnings) == 1 and f"roles.csv:{line}: layer=100000" in warnings[0]
  # With config.json the grid is the model's, whatever the tables say.
  (run / "config.json").write_text(json.dumps({"model": {"num_layers": 2, "num_heads": 4, "pretrained": ""}}))
  data = run_data(run)
  assert (data["layers"], data["heads"]) == (2, 4)
  assert all(len(grid) == 2 for m in data["metrics"] for grid in m["grids"].values())
  assert "probes/results.csv" in capsys.readouterr().err  # layer 2's rows, left out with a warning


def test_atlas_per_lambda_gate_rows_are_not_a_head(tmp_path):
  run = write_run(tmp_path / "run", layers=2, heads=2)
  rows = [
    dict(model="run", step=0, penalty=0.1, layer=l, head=h, gate_open_probability=0.9, heads_kept=4)
    | dict(metric="gate", value=1.0)
    for l in range(2)
    for h in range(2)
  ]
  rows.append(
    dict(model="run", step=0, penalty=0.1, layer=-1, head=-1, gate_open_probability="", heads_kept=4)
    | dict(metric="loss", value=3.0)
  )
  tables.write(tables.path_of(run, tables.ABLATION_GATES), rows, tables.ABLATION_GATES)
  gates = next(m for m in run_data(run)["metrics"] if m["id"].startswith("gates/"))
  assert gates["grids"]["0"][1][1]["v"] == 0.9  # not overwritten by the per-λ row (grid[-1][-1])


def test_atlas_reads_a_damaged_metrics_jsonl(tmp_path, capsys):
  run = write_run(tmp_path / "run", layers=2, heads=2)
  good = len(run_data(run)["training"])
  with open(run / "metrics.jsonl", "ab") as f:
    f.write(b'{"step": 1.5, "loss": 1.0}\n')  # a non-integer step
    f.write(b'{"step": 5000, "loss": 2.0}\n')
    f.write(b'\xff\xfe{"step": 6000}\n')  # not UTF-8
    f.write(b'{"step": 7000, "lo')  # cut off by a killed run
  capsys.readouterr()
  training = run_data(run)["training"]
  assert len(training) == good + 1 and training[-1] == {"step": 5000, "loss": 2.0}
  warnings = [line for line in capsys.readouterr().err.splitlines() if "metrics.jsonl" in line]
  assert len(warnings) == 1 and f"metrics.jsonl:{good + 1}: 3 line(s)" in warnings[0]


def test_atlas_ignores_temporary_picture_folders(tmp_path):
  run = write_run(tmp_path / "run", layers=2, heads=2)
  stale = run / "attention" / "pictures" / ".run-step0.tmp-999999"
  stale.mkdir(parents=True)
  (stale / "L0H1.png").write_bytes(tiny_png())
  (stale / "summary.png").write_bytes(tiny_png())
  data = run_data(run)
  names = [im["name"] for im in data["images"]] + [
    im["name"] for extra in data["heads_extra"].values() for im in extra.get("images", [])
  ]
  assert names and not any(".tmp-" in n for n in names)


# --- temporary folders of killed writers (item 8) ------------------------------------------------------


def _dead_pid() -> int:
  """The pid of a process that has exited."""
  out = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
  return int(out.stdout)


def test_stale_temporaries_are_removed_and_live_ones_kept(tmp_path):
  # A writer that is killed with SIGKILL mid-write leaves its temporary folder.
  code = "import os, sys, time; os.mkdir(sys.argv[1] + f'/x.tmp-{os.getpid()}'); print(flush=True); time.sleep(60)"
  writer = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
  writer.stdout.readline()
  theirs = tmp_path / f"x.tmp-{writer.pid}"
  assert theirs.is_dir() and remote.remove_stale_temps(tmp_path) == []  # alive: a concurrent writer, kept
  writer.kill()
  writer.wait()
  ours_old = tmp_path / f".y.png.tmp-{os.getpid()}"  # our pid, from before we started: the pid was reused
  ours_old.write_bytes(b"half")
  os.utime(ours_old, (1e9, 1e9))
  ours_now = tmp_path / f"z.tmp-{os.getpid()}"
  ours_now.mkdir()
  (tmp_path / "results.csv").write_text("a\n")
  removed = remote.remove_stale_temps(tmp_path)
  assert sorted(removed) == sorted([theirs, ours_old])
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["results.csv", ours_now.name])


@pytest.fixture(scope="module")
def tiny_encoder(data_dir, tmp_path_factory):
  from headspec.data.tokenizer import train_sentencepiece
  from headspec.data.treebank import load_split
  from headspec.model.config import ModelConfig
  from headspec.model.transformer import random_like

  dev = load_split(data_dir, "en_ewt", "dev")
  tokenizer = train_sentencepiece(
    [" ".join(s.words) for s in dev[:300]], tmp_path_factory.mktemp("spm"), vocab_size=600
  )
  cfg = ModelConfig(
    "encoder", tokenizer.vocab_size, num_layers=2, num_heads=2, d_model=16, d_head=8, d_ff=16, max_len=32
  )
  return random_like(cfg, 0), tokenizer, [s.words for s in dev[:3]]


def test_feature_cache_removes_a_killed_extractions_folder(tiny_encoder, tmp_path):
  from headspec.probing import features

  model, tokenizer, sentences = tiny_encoder
  stale = tmp_path / f"minilm-step0-en_ewt-train-0123.tmp-{_dead_pid()}"
  stale.mkdir()
  (stale / "z_0.npy").write_bytes(b"\0" * 4096)
  kw = dict(cache_dir=tmp_path, identity={"run": "x"}, name="dev", log=None)
  got = features.extract_features(model, tokenizer, sentences, **kw)
  assert not stale.exists() and [p.name for p in tmp_path.iterdir()] == [got.path.name]


def test_attention_pictures_remove_a_killed_drawings_folder_and_draw_dollars(tiny_encoder, tmp_path):
  from headspec.attention.config import attention_config
  from headspec.attention.run import draw_pictures

  model, tokenizer, sentences = tiny_encoder
  folder = tmp_path / "pictures" / "run-step4"
  stale = folder.with_name(f".run-step2.tmp-{_dead_pid()}")
  stale.mkdir(parents=True)
  (stale / "L0H0.png").write_bytes(tiny_png())
  examples = [list(sentences[0][:5]) + ["$$", "me$$age"]]  # EWT train forms
  draw_pictures(model, tokenizer, examples, folder, attention_config())
  assert not stale.exists() and [p.name for p in folder.parent.iterdir()] == ["run-step4"]
  assert (folder / "L1H1.png").is_file()


# --- a work directory that cannot be written (item 6) ---------------------------------------------------

CONFIGS = pathlib.Path(__file__).resolve().parents[1] / "configs"
COMMANDS = {  # each on all-MiniLM-L6-v2 (atlas and study read tables only)
  "probe": "probe_minilm_ewt.py",
  "diversity": "diversity.py",
  "ablate": "ablate.py",
  "attention": "attention_ewt.py",
  "atlas": None,
  "study": None,
}


def _minilm_config(tmp_path, name: str) -> str:
  """--config=FILE: configs/NAME with model.pretrained='minilm' (in-process cli.main cannot take the same
  --config.key override twice: absl defines the flag once per process)."""
  path = tmp_path / f"minilm_{name}"
  base = name.removesuffix(".py")
  lines = [f"import sys\nsys.path.insert(0, {str(CONFIGS)!r})\nimport {base}\n", "def get_config(arg=None):"]
  path.write_text(
    "\n".join(lines + [f"  c = {base}.get_config(None)", "  c.model.pretrained = 'minilm'", "  return c\n"])
  )
  return f"--config={path}"


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("where", ["a file", "under a file", "read-only"])
def test_a_workdir_that_cannot_be_written_is_one_line_before_any_computation(
  command, where, tmp_path, capsys, monkeypatch
):
  from headspec import pretrained
  from headspec.cli import main as cli

  monkeypatch.setattr(pretrained, "load_pretrained", lambda *a: pytest.fail(f"{command} loaded a model first"))
  afile = tmp_path / "afile"
  afile.write_text("not a folder\n")
  workdir = {"a file": afile, "under a file": afile / "run", "read-only": tmp_path / "run"}[where]
  if where == "read-only":  # as root, chmod would not stop us: the check asks os.access
    workdir.mkdir()
    write_run(workdir, layers=2, heads=2)  # tables for the atlas to read
    access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: access(p, mode) and os.fspath(p) != os.fspath(workdir))
  cli.FLAGS.unparse_flags()
  config = [_minilm_config(tmp_path, COMMANDS[command])] if COMMANDS[command] else []
  assert cli.main(["headspec", command, *config, f"--workdir={workdir}"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("headspec: error:") and "\n" not in err, err
  expected = {"a file": "is a file, not a folder", "under a file": "is a file, not a folder"}
  assert expected.get(where, "cannot write in") in err, err
  assert afile.read_text() == "not a folder\n"


def test_diversity_figures_take_the_models_shape_not_the_tables(tmp_path, capsys):
  from headspec.diversity import plots

  rows = [(0, l, i, j, "js_distance", 0.5) for l in range(2) for i in range(3) for j in range(3)]
  rows += [(0, 100000, 0, 1, "js_distance", 0.5), (0, 0, 100000, -1, "attention_entropy", 1.0)]  # 10^15 cells
  data = plots.tables(rows, (2, 3))
  assert data["js_distance"][0].shape == (2, 3, 3) and "attention_entropy" not in data
  err = capsys.readouterr().err.strip()
  assert "\n" not in err and "2 row(s) outside the model's 2 layers × 3 heads" in err
  assert [p.name for p in plots.plot_all(rows, tmp_path, (2, 3))] == ["curves.png", "matrix_js_distance.png"]


def test_other_metrics_jsonl_readers_skip_damaged_lines(tmp_path):
  """Siblings of the atlas reader: the induction formation figure and the analysis/ scripts."""
  from headspec.attention import induction_run

  sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "analysis"))
  import _common

  (tmp_path / "metrics.jsonl").write_bytes(
    b'{"step": 1, "loss": 3.0}\n[1, 2]\n{"step": 1.5, "loss": 2.5}\n\xff{"step": 2}\n{"step": 3, "loss": 2.0}\n{"st'
  )
  steps, loss = induction_run.training_loss(tmp_path)
  assert steps.tolist() == [1, 3] and loss.tolist() == [3.0, 2.0]
  assert [r["step"] for r in _common.training_metrics(tmp_path)] == [1, 3]
