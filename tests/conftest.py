"""Test setup: 8 fake CPU devices (set before JAX starts) and the shared data directory."""

import os

os.environ.setdefault("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in os.environ["XLA_FLAGS"]:
  os.environ["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pathlib  # noqa: E402

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def data_dir() -> pathlib.Path:
  """HEADSPEC_DATA_DIR (default ../shared/data); a missing data directory fails the test, never skips it."""
  path = pathlib.Path(
    os.environ.get("HEADSPEC_DATA_DIR", pathlib.Path(__file__).resolve().parents[2] / "shared" / "data")
  )
  if not (path / "ud" / "en_ewt").is_dir():
    pytest.fail(f"HEADSPEC_DATA_DIR={path} has no ud/en_ewt: point HEADSPEC_DATA_DIR at the shared data")
  return path


@pytest.fixture(scope="session")
def synthetic_data_dir(tmp_path_factory) -> pathlib.Path:
  """A small synthetic treebank + text corpus (headspec/data/synthetic.py), shared by the session."""
  from headspec.data.synthetic import write_synthetic

  out = tmp_path_factory.mktemp("synthetic")
  write_synthetic(out, num_train=600, num_dev=150, num_test=150, num_text_sentences=6000)
  return out
