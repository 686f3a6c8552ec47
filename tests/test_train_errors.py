"""Faults in training and the run directory: bad config values, refused resumes, damaged run
files and cut-off metrics lines each stop with one line naming the key or file, and change nothing."""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

from headspec.cli.quickstart import quickstart_config
from headspec.errors import UserError
from headspec.io import metrics
from headspec.launch import sweeps
from headspec.runs import checkpoints
from headspec.runs import directory as runs
from headspec.train.loop import train_and_evaluate

REPO = pathlib.Path(__file__).resolve().parents[1]


def tiny_config(data_dir, steps=2):
  c = quickstart_config("decoder")
  c.data_dir = str(data_dir)
  c.data.vocab_size = 512
  c.model.num_layers, c.model.num_heads, c.model.d_model, c.model.d_head, c.model.d_ff = 1, 2, 16, 8, 32
  c.train.steps, c.train.batch_size, c.train.seq_len = steps, 8, 16
  c.train.log_every, c.train.eval_every, c.train.diversity_every = 1, 0, 0
  c.train.checkpoint_every, c.train.keep_steps = 1, ()
  return c


@pytest.fixture(scope="module")
def trained(synthetic_data_dir, tmp_path_factory):
  """A 2-step run with checkpoints at steps 1 and 2 (never modified: tests work on copies)."""
  workdir = tmp_path_factory.mktemp("faults") / "run"
  train_and_evaluate(tiny_config(synthetic_data_dir), workdir)
  assert checkpoints.saved_steps(workdir) == [1, 2]
  return workdir


@pytest.fixture
def run_copy(trained, tmp_path):
  copy = tmp_path / "run"
  shutil.copytree(trained, copy)
  return copy


def snapshot(workdir: pathlib.Path) -> dict:
  return {p: p.read_bytes() for p in workdir.rglob("*") if p.is_file()}


def one_line(e: pytest.ExceptionInfo) -> str:
  message = str(e.value)
  assert "\n" not in message and len(message.replace(str(e.value).split(":")[0], "FILE")) < 300, message
  return message


BAD_VALUES = [
  ("train.keep_last", 0),
  ("train.log_every", 0),
  ("train.checkpoint_every", 0),
  ("train.seq_len", 0),
  ("train.seq_len", 1),  # a decoder row of one token has nothing to predict
  ("train.steps", -5),
  ("train.steps", 0),
  ("train.batch_size", 0),
  ("train.learning_rate", -1e-3),
  ("train.learning_rate", float("nan")),
  ("train.warmup_steps", -1),
  ("train.weight_decay", -0.1),
  ("train.grad_clip", 0.0),
  ("train.eval_every", -1),
  ("train.eval_batches", 0),
  ("train.diversity_every", -1),
  ("train.mlm_probability", 0.0),
  ("train.keep_steps", (0, -100)),
  ("train.regularizers.drophead", 1.0),
  ("train.regularizers.drophead_turn", 0.0),
  ("train.regularizers.drophead_schedule", "w"),
  ("train.regularizers.subspace", -1.0),
  ("model.num_heads", 0),
  ("model.num_layers", 0),
  ("model.d_model", -16),
  ("model.d_head", 0),
  ("model.d_ff", 0),
  ("model.dropout", 1.0),
  ("model.attention_dropout", -0.1),
  ("model.kind", "encdec"),
  ("model.pretrained", "minilm"),
  ("data.vocab_size", 0),
]


@pytest.mark.parametrize("key,value", BAD_VALUES, ids=[f"{k}={v}" for k, v in BAD_VALUES])
def test_bad_config_values_are_refused_before_anything_is_written(synthetic_data_dir, tmp_path, key, value):
  config = tiny_config(synthetic_data_dir)
  section, _, name = key.rpartition(".")
  node = config
  for part in section.split("."):
    node = node[part]
  with node.ignore_type():
    node[name] = value
  with pytest.raises(UserError) as e:
    train_and_evaluate(config, tmp_path / "w")
  assert key in one_line(e)
  assert not (tmp_path / "w").exists()


def test_bad_values_on_a_resume_leave_the_run_as_it_was(run_copy):
  before = snapshot(run_copy)
  for key, value in (("keep_last", 0), ("steps", -1), ("log_every", 0)):
    config = tiny_config("/nowhere", steps=4)
    config.train[key] = value
    with pytest.raises(UserError, match=f"train.{key}="):
      train_and_evaluate(config, run_copy)
  assert snapshot(run_copy) == before


def test_a_manager_never_keeps_zero_checkpoints(tmp_path):
  with pytest.raises(UserError, match="train.keep_last=0"):
    checkpoints.manager(tmp_path, keep_last=0)


@pytest.mark.parametrize(
  "key,value",
  [("train.seq_len", 32), ("data.vocab_size", 600), ("data.corpus", "other"), ("model.num_heads", 4)],
)
def test_resume_with_another_shape_or_corpus_is_refused_and_changes_nothing(run_copy, synthetic_data_dir, key, value):
  config = tiny_config(synthetic_data_dir, steps=4)
  section, name = key.split(".")
  config[section][name] = value
  before = snapshot(run_copy)
  with pytest.raises(UserError, match=f"{key} is .* there, .* in this config") as e:
    train_and_evaluate(config, run_copy)
  one_line(e)
  assert snapshot(run_copy) == before
  runs.load_run_model(run_copy, 2)  # still usable by every analysis


def test_a_failed_restore_rewrites_no_config(run_copy, synthetic_data_dir):
  """config.json used to be written before the restore: a refused resume left it describing the new run."""
  for path in (run_copy / "checkpoints" / "2" / "state").rglob("d/*"):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
  config = tiny_config(synthetic_data_dir, steps=4)
  config.train.learning_rate = 1e-4  # not a shape key: the resume passes every check before the restore
  before = snapshot(run_copy)
  with pytest.raises(UserError, match=r"checkpoints/2/state/d/\w+: checkpoint file unreadable") as e:
    train_and_evaluate(config, run_copy)
  assert "does not match" not in one_line(e)
  assert snapshot(run_copy) == before


def test_checkpoints_without_their_tokenizer_are_refused(run_copy, synthetic_data_dir):
  shutil.rmtree(run_copy / "tokenizer")
  before = snapshot(run_copy)
  with pytest.raises(UserError, match=r"tokenizer/headspec_tokenizer.json: missing, but .* holds steps \[1, 2\]"):
    train_and_evaluate(tiny_config(synthetic_data_dir, steps=4), run_copy)
  assert snapshot(run_copy) == before


def test_a_tokenizer_of_another_vocab_size_is_refused(run_copy, synthetic_data_dir):
  shutil.rmtree(run_copy / "checkpoints")
  (run_copy / "config.json").unlink()
  config = tiny_config(synthetic_data_dir)
  config.data.vocab_size = 600
  with pytest.raises(UserError, match="tokenizer of 512 pieces, this config has data.vocab_size=600"):
    train_and_evaluate(config, run_copy)
  assert not (run_copy / "config.json").exists()


def _truncate(path: pathlib.Path) -> None:
  path.write_bytes(path.read_bytes()[: max(1, path.stat().st_size // 2)])


DAMAGE = {
  "truncated data file": (
    lambda run: [_truncate(p) for p in (run / "checkpoints/2/state").rglob("d/*")],
    r"state/.*d/",
  ),
  "truncated ocdbt manifest": (lambda run: _truncate(run / "checkpoints/2/state/manifest.ocdbt"), "manifest.ocdbt"),
  "garbage state metadata": (lambda run: (run / "checkpoints/2/state/_METADATA").write_text("garbage{"), "_METADATA"),
  "garbage data metadata": (lambda run: (run / "checkpoints/2/data/metadata").write_text("}"), "data/metadata"),
  "truncated config.json": (lambda run: _truncate(run / "config.json"), r"config.json:\d+: not valid JSON"),
  "corrupt tokenizer model": (lambda run: (run / "tokenizer/spm.model").write_bytes(b"\x00garbage"), "spm.model"),
  "truncated tokenizer model": (lambda run: _truncate(run / "tokenizer/spm.model"), "spm.model"),
  "truncated tokenizer json": (lambda run: _truncate(run / "tokenizer/headspec_tokenizer.json"), "tokenizer.json:"),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_damaged_run_files_are_one_line_naming_the_file(run_copy, synthetic_data_dir, damage):
  corrupt, names = DAMAGE[damage]
  corrupt(run_copy)
  with pytest.raises(UserError, match=names) as e:  # what every analysis calls
    runs.load_run_model(run_copy, 2)
  assert str(run_copy) in one_line(e)
  before = snapshot(run_copy)
  with pytest.raises(UserError, match=names) as e:  # a resume
    train_and_evaluate(tiny_config(synthetic_data_dir, steps=4), run_copy)
  one_line(e)
  assert snapshot(run_copy) == before


def test_a_step_folder_without_its_commit_marker_is_not_a_step(run_copy, synthetic_data_dir):
  (run_copy / "checkpoints" / "3").mkdir()  # empty
  (run_copy / "checkpoints" / "4" / "state").mkdir(parents=True)  # half-copied
  (run_copy / "checkpoints" / "4" / "state" / "_METADATA").write_text("{}")
  assert checkpoints.saved_steps(run_copy) == [1, 2]
  assert runs.resolve_steps(run_copy, "last") == [2]
  with pytest.raises(UserError, match="step"):
    runs.resolve_steps(run_copy, "3")
  # A resume continues from step 2 and saves steps 3 and 4 over the stray folders.
  train_and_evaluate(tiny_config(synthetic_data_dir, steps=4), run_copy)
  assert checkpoints.saved_steps(run_copy)[-2:] == [3, 4]
  runs.load_run_model(run_copy, 4)


def test_damaged_checkpoint_on_the_command_line_is_one_line(run_copy, synthetic_data_dir):
  """No orbax or tensorstore traceback (nor the dozens their late reads print) around the error line."""
  for path in (run_copy / "checkpoints/2/state").rglob("d/*"):
    _truncate(path)
  shape = "data.vocab_size=512 model.num_layers=1 model.num_heads=2 model.d_model=16 model.d_head=8 model.d_ff=32"
  cmd = [sys.executable, "-m", "headspec", "train", f"--config={REPO}/configs/quickstart.py:decoder"]
  cmd += [f"--workdir={run_copy}", f"--config.data_dir={synthetic_data_dir}", "--config.train.steps=4"]
  cmd += [f"--config.{flag}" for flag in f"{shape} train.seq_len=16 train.batch_size=8".split()]
  done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, env=dict(os.environ))
  lines = [line for line in done.stderr.splitlines() if line.strip() and "WARNING" not in line]
  assert done.returncode == 2, done.stderr[-3000:]
  assert len(lines) == 1 and "checkpoint file unreadable" in lines[0], done.stderr[-3000:]


def test_a_cut_off_metrics_line_is_dropped_on_resume_and_skipped_by_readers(tmp_path, capsys):
  path = tmp_path / "metrics.jsonl"
  path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo')  # killed while writing step 2
  writer = metrics.MetricsWriter(tmp_path)
  writer.write({"step": 2, "loss": 1.5})
  writer.close()
  assert [json.loads(line) for line in path.read_text().splitlines()] == [
    {"step": 1, "loss": 2.0},
    {"step": 2, "loss": 1.5},
  ]
  assert f"{path}:2: dropped a cut-off last line" in capsys.readouterr().err

  path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "loss": 1.0}')  # whole, only its newline missing
  writer = metrics.MetricsWriter(tmp_path)
  writer.write({"step": 3, "loss": 0.5})
  writer.close()
  assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]

  path.write_text('{"step": 1, "loss": 2.0}\n{"step": 2, "lo\n{"step": 3, "loss": 0.5}\n[1]\n{"step": 4, "lo')
  assert [r["step"] for r in metrics.read_metrics(tmp_path)] == [1, 3]
  err = capsys.readouterr().err
  assert err.count("metrics.jsonl") == 1 and f"{path}:2: 3 line(s) left out" in err, err  # one warning


def test_sweep_summary_survives_a_cut_off_metrics_line(tmp_path, capsys):
  grid = sweeps.parse_grid(["train.learning_rate=1e-3,2e-3"])
  plan = sweeps.expand(None, grid, tmp_path)
  sweeps.write_plan(tmp_path, plan)
  for i, run in enumerate(plan):
    pathlib.Path(run.workdir).mkdir()
    (pathlib.Path(run.workdir) / "metrics.jsonl").write_text(
      f'{{"step": 10, "loss": {i + 1}.0}}\n{{"step": 20, "eval/loss": 0.5}}\n{{"step": 30, "lo'
    )
  rows = (sweeps.summarize(tmp_path)).read_text().splitlines()
  assert rows[1].endswith(",20,1.000000,0.500000") and rows[2].endswith(",20,2.000000,0.500000"), rows
  assert "metrics.jsonl:3: 1 line(s) left out" in capsys.readouterr().err


def test_a_resume_drops_records_logged_after_its_checkpoint(tmp_path, capsys):
  """Killed after logging steps 3 and 4 but before their checkpoint: the resumed run logs them again."""
  path = tmp_path / "metrics.jsonl"
  path.write_text("".join(f'{{"step": {s}, "loss": 1.0}}\n' for s in (1, 2, 3, 4)))
  writer = metrics.MetricsWriter(tmp_path, resume_step=2)
  writer.write({"step": 3, "loss": 0.5})
  writer.close()
  assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [1, 2, 3]
  assert f"{path}:3: dropped 2 lines logged after step 2" in capsys.readouterr().err


def test_a_sweep_table_without_its_columns_is_one_line(tmp_path):
  (tmp_path / "sweep.csv").write_text("nme,wrkdir\nx,y\n")
  with pytest.raises(UserError, match=r"sweep.csv: no 'name' column"):
    sweeps.summarize(tmp_path)


def test_a_token_cache_of_another_corpus_is_refused(run_copy, synthetic_data_dir):
  """No checkpoint yet (killed before the first), but cache/ holds the first corpus' tokens."""
  shutil.rmtree(run_copy / "checkpoints")
  config = tiny_config(synthetic_data_dir)
  config.data.corpus = "other"
  before = snapshot(run_copy)
  with pytest.raises(UserError, match="a token cache .* data.corpus is 'synthetic' there, 'other' in this config"):
    train_and_evaluate(config, run_copy)
  assert snapshot(run_copy) == before


def test_a_wrong_data_position_is_one_line_and_changes_nothing(run_copy, synthetic_data_dir):
  (run_copy / "checkpoints/2/data/metadata").write_text('{"next": 3}')  # JSON, not the iterator's state
  before = snapshot(run_copy)
  with pytest.raises(UserError, match=r"checkpoints/2/data/metadata: not a data-iterator position") as e:
    train_and_evaluate(tiny_config(synthetic_data_dir, steps=4), run_copy)
  one_line(e)
  assert snapshot(run_copy) == before
  runs.load_run_model(run_copy, 2)  # the parameters are fine


# --- a damaged data file inside orbax's database; a refusal known only once the corpus is read ---


def test_a_damaged_database_file_names_the_step_and_how_to_set_it_aside(run_copy, synthetic_data_dir):
  """Orbax wraps tensorstore's read error in an exception whose text is the repr of a pybind method: it was
  reported as "does not match this model". The step, the file and how to set the step aside (docs/scale.md)."""
  for path in (run_copy / "checkpoints/2/state/ocdbt.process_0/d").iterdir():
    path.write_bytes(b"\0" * path.stat().st_size)  # no zstd frame where every array's chunks begin
  for attempt in (lambda: runs.load_run_model(run_copy, 2), lambda: train_and_evaluate(tiny_config("/x", 4), run_copy)):
    with pytest.raises(UserError) as e:
      attempt()
    message = one_line(e)
    assert message.startswith(f"{run_copy}/checkpoints/2/state/") and "checkpoint file unreadable" in message
    assert "does not match" not in message and "pybind" not in message and "TensorStore" not in message, message
    assert "step 2 is damaged: set it aside with `mv checkpoints/2 damaged-step-2` in the run folder" in message
    assert "training then resumes from step 1" in message
  # The advice works: the step set aside, training resumes from step 1 and saves a new step 2.
  (run_copy / "checkpoints/2").rename(run_copy / "damaged-step-2")
  assert checkpoints.saved_steps(run_copy) == [1]
  train_and_evaluate(tiny_config(synthetic_data_dir, steps=3), run_copy)
  assert checkpoints.saved_steps(run_copy) == [1, 2, 3]
  runs.load_run_model(run_copy, 2)


def test_damaged_array_metadata_is_one_line_naming_the_file(run_copy):
  path = next((run_copy / "checkpoints/2/state/array_metadatas").iterdir())
  _truncate(path)
  with pytest.raises(UserError, match=f"{path}: corrupt checkpoint metadata .* step 2 is damaged: set it aside") as e:
    runs.load_run_model(run_copy, 2)
  assert "does not match" not in one_line(e)


def test_a_corpus_shorter_than_one_row_is_refused_and_leaves_nothing(synthetic_data_dir, tmp_path):
  """train.seq_len beyond the corpus' tokens is known only once it is tokenized: the tokenizer and token
  cache written by then are removed, and so is the workdir the run made."""
  config = tiny_config(synthetic_data_dir)
  config.train.seq_len = 1_000_000
  with pytest.raises(UserError, match=r"data.corpus='synthetic', split train: .*fewer than one row of seq_len=1000000"):
    train_and_evaluate(config, tmp_path / "w")
  assert not (tmp_path / "w").exists()
  (tmp_path / "mine").mkdir()  # a workdir the user made: kept, empty as it was
  with pytest.raises(UserError, match="fewer than one row"):
    train_and_evaluate(config, tmp_path / "mine")
  assert list((tmp_path / "mine").iterdir()) == []
