"""headspec: attention-head specialization in JAX transformers."""

from setuptools import find_packages, setup

setup(
  name="headspec",
  version="0.1.0",
  description="Attention-head specialization in JAX transformers: capture, probing, diversity, ablation.",
  python_requires=">=3.10",
  packages=find_packages(include=["headspec", "headspec.*"]),
  install_requires=[
    "jax>=0.6",
    "flax>=0.12",
    "optax>=0.2.8",  # optax.tree.norm (tested with 0.2.8)
    "orbax-checkpoint>=0.11",
    "chex",
    "tensorflow-datasets>=4.9.10",
    "array_record",
    "grain>=0.2.18,<0.3",
    "ml-collections",
    "absl-py",
    "sentencepiece",
    "tokenizers",
    "safetensors",
    "conllu>=6",
    "tensorboardX",
    "etils[epath]",  # run and data directories (gs:// too)
    "pyarrow",  # WikiText's parquet files (headspec data download text)
    "numpy",
    "networkx",  # attention flow (max-flow, Abnar & Zuidema 2020)
    "pandas",  # results tables as DataFrames (headspec.read_table, the API)
    "scipy",
    "matplotlib",
    "tqdm",
  ],
  extras_require={
    "tf": ["tensorflow"],
    # torch pinned: the CPU build (an unpinned torch pulls a multi-GB CUDA build).
    # analysis/ scripts and the atlas without JAX: `pip install --no-deps -e . && pip install -e ".[analysis]"`
    # needs only these (etils[epath] is headspec.tables' path layer).
    "analysis": ["pandas", "matplotlib", "etils[epath]"],
    # selenium: the atlas browser test (it also needs `apt-get install chromium chromium-driver`).
    # nbclient, ipykernel, nbformat: tests/test_notebooks.py re-executes docs/notebooks on a Jupyter kernel.
    "test": [
      "pytest",
      "pytest-xdist",
      "ruff",
      "scikit-learn",
      "transformers>=4.45",
      "torch==2.13.0",
      "selenium",
      "nbclient",
      "ipykernel",
      "nbformat",
    ],
  },
  entry_points={"console_scripts": ["headspec=headspec.cli:run"]},
)
