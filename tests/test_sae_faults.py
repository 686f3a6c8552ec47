"""`headspec sae` and fit_sae under faults: reruns, a loss gone non-finite, two processes on one
checkpoint folder, a damaged checkpoint."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from test_sae import SMALL, sae_cli, short_run, snapshot  # noqa: F401  (short_run: a fixture)

import headspec
from headspec.errors import UserError
from headspec.runs import checkpoints

REPO = pathlib.Path(__file__).resolve().parents[1]
TINY = dict(SMALL, sae__features=32, sae__k=4, sae__train_steps=60)


@pytest.mark.slow  # three `headspec sae` runs on the tiny decoder
def test_a_failed_run_writes_nothing_and_a_rerun_replaces_the_sae_whole(
  short_run,  # noqa: F811  (test_sae's fixture)
  synthetic_data_dir,
  tmp_path,
  capsys,
  monkeypatch,
):
  """Run 1 writes an SAE with a treebank's labels. Run 2, its loss going NaN, exits 2 in one line and leaves
  every file as it was. Run 3, the same SAE name with another seed and no treebank, leaves none of run 1's
  labels or contexts: every profile left is one SAE's."""
  from headspec.sae import train as sae_train

  run = tmp_path / "run"
  shutil.copytree(short_run, run)
  assert sae_cli(tmp_path, run, synthetic_data_dir, **TINY) == 0
  assert len(headspec.read_table(run, "sae_labels"))
  before = snapshot(run)

  real = sae_train._chunk_program

  def diverging(o, aux_k):
    program = real(o, aux_k)
    return lambda *a: (lambda state, m: (state, m * np.nan))(*program(*a))

  monkeypatch.setattr(sae_train, "_chunk_program", diverging)
  capsys.readouterr()
  assert sae_cli(tmp_path, run, synthetic_data_dir, **{**TINY, "sae__lr": 0.5}) == 2
  lines = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
  assert len(lines) == 1 and "the loss went nan by step" in lines[0], lines
  assert snapshot(run) == before
  monkeypatch.setattr(sae_train, "_chunk_program", real)

  assert sae_cli(tmp_path, run, synthetic_data_dir, **{**TINY, "seed": 1, "analysis__treebank": ""}) == 0
  for name in ("sae_labels", "sae_contexts"):
    assert not len(headspec.read_table(run, name)), name
  features = headspec.read_table(run, "sae_features")
  assert len(features) == 32 and (features["treebank_fires"] == -1).all()
  assert len(headspec.read_table(run, "sae_metrics").groupby("metric")) == len(headspec.read_table(run, "sae_metrics"))


SCRIPT = textwrap.dedent("""
  import sys, numpy as np, headspec
  x = np.random.default_rng(0).normal(size=(512, 8)).astype(np.float32)
  sae = headspec.fit_sae(x, features=8, k=2, steps=300, batch_size=32, chunk=10, progress=False,
                         checkpoint_dir=sys.argv[1], checkpoint_every=10)
  np.save(sys.argv[2], np.asarray(sae.W_dec_FK))
""")


@pytest.mark.slow  # two processes importing JAX and training 300 steps: about 20 s
def test_two_processes_on_one_sae_checkpoint_folder(tmp_path):
  """Two fit_sae at once on one checkpoint folder (two `headspec sae` on one run): the second waits for the
  first (one line saying so), then finds the SAE done; both finish with the same SAE, no orbax error, and
  the folder holds one step (max_to_keep=1), no temporary."""
  folder = tmp_path / "ck"
  cmd = lambda i: [sys.executable, "-c", SCRIPT, str(folder), str(tmp_path / f"{i}.npy")]
  procs = [subprocess.Popen(cmd(i), cwd=REPO, stderr=subprocess.PIPE, text=True) for i in range(2)]
  errs = [p.communicate(timeout=300)[1] for p in procs]
  assert [p.returncode for p in procs] == [0, 0], errs
  assert not any("Traceback" in e or "orbax" in e.lower() for e in errs), errs
  waited = [line for e in errs for line in e.splitlines() if "waiting for SAE training" in line]
  assert len(waited) <= 1, waited
  assert checkpoints.saved_steps_of(folder) == [300]
  assert sorted(p.name for p in folder.iterdir()) == ["300"]
  np.testing.assert_array_equal(np.load(tmp_path / "0.npy"), np.load(tmp_path / "1.npy"))


def _damage_data(step: pathlib.Path):
  for f in (step / "state").rglob("*"):
    if f.is_file() and f.parent.name == "d":
      f.write_bytes(f.read_bytes()[:20])


def _damage_meta(step: pathlib.Path):
  (step / "meta" / "metadata").write_text("{garbage")


@pytest.mark.parametrize("damage, reason", [(_damage_data, "OUT_OF_RANGE"), (_damage_meta, "JSONDecodeError")])
def test_a_damaged_sae_checkpoint_says_why_and_what_to_do(tmp_path, capfd, damage, reason):
  x = np.random.default_rng(0).normal(size=(256, 8)).astype(np.float32)
  kw = dict(features=8, k=2, steps=20, batch_size=32, chunk=10, progress=False, checkpoint_every=10)
  folder = tmp_path / "ck"
  headspec.fit_sae(x, checkpoint_dir=folder, **kw)
  damage(folder / "20")
  with pytest.raises(UserError) as e:
    headspec.fit_sae(x, checkpoint_dir=folder, **kw)
  line = str(e.value)
  assert "\n" not in line and "SAE checkpoint of step 20 is damaged (" + reason in line, line
  assert f"`mv {folder / '20'} " in line and "run the same command again" in line, line
  assert "Traceback" not in capfd.readouterr().err
  shutil.rmtree(folder)  # as the message says: then the same call trains again
  assert headspec.fit_sae(x, checkpoint_dir=folder, **kw).info["resumed_at"] == 0
