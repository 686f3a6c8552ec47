"""The analysis scripts in an environment without JAX: a fresh virtualenv with headspec installed
`--no-deps` plus only the `analysis` extra, running one script on fixture tables. Slow (a venv and a
pip install, from pip's cache when it has them); skipped when pip cannot reach a package index."""

import os
import pathlib
import subprocess
import sys

import pytest
from test_atlas_fixtures import write_run

REPO = pathlib.Path(__file__).resolve().parents[1]


def _analysis_extra() -> list[str]:
  """The `analysis` extra as pyproject.toml declares it (so this test checks the extra is enough)."""
  tomllib = pytest.importorskip("tomllib")  # Python 3.11+
  extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
  assert "analysis" in extras, "pyproject.toml has no analysis extra"
  return extras["analysis"]


@pytest.mark.slow
@pytest.mark.e2e
def test_analysis_script_runs_without_jax(tmp_path):
  venv = tmp_path / "venv"
  # No pip inside the venv: this environment's pip installs into it (--python), without compiling .pyc
  # files; ensurepip and byte-compiling pandas and matplotlib were half of this test's time.
  subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
  python = str(venv / "bin" / "python")
  pip = [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-compile"]
  deps = subprocess.run([*pip, *_analysis_extra()], capture_output=True, text=True)
  if deps.returncode != 0:
    why = f"pip could not install the analysis extra (no package index?): {deps.stderr.strip()[-300:]}"
    pytest.fail(why, pytrace=False) if os.environ.get("CI") else pytest.skip(why)  # CI has the index
  subprocess.run([*pip, "--no-deps", "-e", str(REPO)], check=True, capture_output=True, text=True)
  no_jax = subprocess.run([python, "-c", "import jax"], capture_output=True, text=True)
  assert no_jax.returncode != 0 and "No module named 'jax'" in no_jax.stderr  # an honest no-JAX environment

  run = write_run(tmp_path / "run", layers=2, heads=3, steps=(0, 10, 100))
  out = tmp_path / "out"
  result = subprocess.run(
    [python, str(REPO / "analysis" / "specialization.py"), str(run), "--out", str(out)],
    capture_output=True,
    text=True,
    cwd=tmp_path,
  )
  assert result.returncode == 0, result.stderr
  assert (out / "specialization.png").stat().st_size > 0 and (out / "specialization.svg").stat().st_size > 0
  # The atlas is JAX-free too.
  code = "import sys, headspec; print(headspec.build_atlas(sys.argv[1])); assert 'jax' not in sys.modules"
  subprocess.run([python, "-c", code, str(run)], check=True, capture_output=True, text=True)
  assert (run / "atlas.html").is_file()
