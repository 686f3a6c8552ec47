"""Names become paths: one rule, headspec/io/filenames.py `component`, turns every user-given name
into a file-name component, and every writer uses it. An absolute path, `..` or `/` in `model_name` wrote
the probe's parts outside the run directory, and failed in `patch` and `ablate` only when the figures were
saved, after the computing."""

import os
import pathlib
import re
import shutil

import pytest

from headspec.io import filenames, tables

HOSTILE = ("/abs/x", "../../../x", "a/b", "a\\b", "..", ".", "", "x\x00y", "a b", "\ud800", ".hidden", "é" * 100)


def test_component_is_one_safe_file_name_and_distinct_names_stay_distinct(tmp_path):
  names = (*HOSTILE, "a_b", "minilm", "pythia-70m", "run-random")
  made = [filenames.component(n) for n in names]
  for name, part in zip(names, made):
    assert part and "/" not in part and "\\" not in part and "\x00" not in part and not part.startswith("."), name
    assert len(part.encode("utf-8")) <= filenames.MAX_BYTES + 9, name
    (tmp_path / part).write_text("x")  # a valid file name, in this folder
  assert len(set(made)) == len(made)  # two names never share a file
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted(made)
  assert [filenames.component(n) for n in ("minilm", "pythia-70m", "run-random")] == [
    "minilm",
    "pythia-70m",
    "run-random",
  ]


def test_every_sanitizer_is_the_one_function():
  """No writer keeps a sanitizer of its own (the attention pictures' `_safe`, the feature cache's)."""
  root = pathlib.Path(filenames.__file__).parents[1]  # the package: every module of headspec
  rule = re.compile(r"isalnum\(\) or \w+ in [\"']|re\.sub\(r?[\"']\[\^A-Za-z0-9")  # a name's character filter
  own = [
    p.relative_to(root).as_posix()
    for p in root.rglob("*.py")
    if p.name != "filenames.py" and rule.search(p.read_text())
  ]
  assert own == ["launch/sweeps.py"]  # a sweep's run names, "<key>=<value>,...": always one component (key= first)


def _escape(tmp_path) -> str:
  """A model name with every hazard at once: absolute, `..` and `/` (it names tmp_path/outside/...)."""
  return f"{tmp_path}/outside/../outside/x"


@pytest.fixture(scope="module")
def trained(train_tiny_decoder):
  return train_tiny_decoder(1, name="names")


@pytest.fixture()
def workdir(trained, tmp_path):
  out = tmp_path / "in" / "run"
  shutil.copytree(trained, out, ignore=shutil.ignore_patterns("probes", "patching", "ablation", "attention"))
  return out


@pytest.fixture()
def outside(tmp_path, workdir):
  """The hostile name; after the test, nothing new under tmp_path but inside the run directory."""
  before = {os.fspath(p) for p in tmp_path.rglob("*")}
  yield _escape(tmp_path)
  now = {os.fspath(p) for p in tmp_path.rglob("*")}
  assert sorted(p for p in now - before if not p.startswith(os.fspath(workdir) + os.sep)) == []
  assert not (tmp_path / "outside").exists()


@pytest.mark.slow  # a probe of the tiny decoder's heads: 37 s on 2 CPU cores at load average ~10 (an upper bound)
def test_probe_parts_of_a_hostile_model_name_stay_in_the_cache(workdir, outside, synthetic_data_dir, monkeypatch):
  from headspec.probing import suite
  from headspec.probing.config import probe_config
  from headspec.probing.run import run as run_probe

  parts = []
  write_part = suite._write_part
  monkeypatch.setattr(suite, "_write_part", lambda path, part: (parts.append(path), write_part(path, part))[1])
  p = probe_config()
  p.data_dir, p.probe.treebank, p.probe.model_name, p.probe.steps = str(synthetic_data_dir), "synthetic", outside, "1"
  p.probe.tasks, p.probe.residuals, p.probe.eval_splits = ("upos",), False, ("dev",)
  p.probe.l2_grid, p.probe.max_iter, p.probe.bootstrap_resamples = (1e-3,), 30, 10
  run_probe(p, workdir)
  assert parts and all(os.fspath(x).startswith(os.fspath(workdir / "probes" / "cache") + os.sep) for x in parts)
  assert {r["model"] for r in tables.read(workdir / tables.PROBES.path, tables.PROBES)} == {outside}  # as given


def test_patch_figures_of_a_hostile_model_name_are_written(workdir, outside):
  from headspec.patching import run as patch_run
  from headspec.patching.config import patch_config

  c = patch_config()
  c.model_name, c.count, c.induction_n, c.sites, c.attribution, c.path = outside, 2, 3, "resid_pre", False, False
  patch_run.run(c, workdir)
  assert (workdir / "patching" / f"induction_resid_pre_denoising_{filenames.component(outside)}_step1.png").is_file()
  assert {r["model"] for r in tables.read(workdir / tables.PATCHING.path, tables.PATCHING)} == {outside}


def test_ablate_figures_of_a_hostile_model_name_are_written(workdir, outside, synthetic_data_dir):
  from headspec.ablation.config import quickstart_ablate_config
  from headspec.ablation.run import run as run_ablation

  a = quickstart_ablate_config(str(synthetic_data_dir))
  a.model_name, a.methods, a.num_tokens, a.bootstrap_resamples = outside, "zero", 256, 10
  run_ablation(a, workdir)
  assert (workdir / "ablation" / f"heads_{filenames.component(outside)}_step1.png").is_file()
  assert {r["model"] for r in tables.read(workdir / tables.ABLATION_HEADS.path, tables.ABLATION_HEADS)} == {outside}


@pytest.mark.slow  # two probes of the tiny decoder's heads (the second reads the feature cache): 88 s at load ~13
def test_a_probe_of_another_task_keeps_the_earlier_tasks_rows_and_baselines(workdir, synthetic_data_dir):
  """A sibling of the patching rows: probes/baselines.csv was
  rewritten whole by each probe run, so probing xpos after upos dropped upos's baselines (its results
  rows stayed)."""
  from headspec.probing.config import probe_config
  from headspec.probing.run import run as run_probe

  p = probe_config()
  p.data_dir, p.probe.treebank, p.probe.steps = str(synthetic_data_dir), "synthetic", "1"
  p.probe.residuals, p.probe.eval_splits = False, ("dev",)
  p.probe.l2_grid, p.probe.max_iter, p.probe.bootstrap_resamples = (1e-3,), 30, 10
  for task in ("upos", "xpos"):
    p.probe.tasks = (task,)
    run_probe(p, workdir)
  assert {r["task"] for r in tables.read(workdir / tables.PROBES.path, tables.PROBES)} == {"upos", "xpos"}
  baselines = tables.read(workdir / tables.PROBE_BASELINES.path, tables.PROBE_BASELINES)
  assert sorted((r["task"], r["split"]) for r in baselines) == [("upos", "synthetic/dev"), ("xpos", "synthetic/dev")]
