"""setup.py beside pyproject.toml (which holds every other setting): the top-level configs/ folder ships in
the wheel as the package headspec.configs, so `--config=NAME` finds a config from any directory."""

from setuptools import find_packages, setup

setup(
  packages=find_packages(include=["headspec", "headspec.*"]) + ["headspec.configs", "headspec.configs.experiments"],
  package_dir={"headspec.configs": "configs", "headspec.configs.experiments": "configs/experiments"},
)
