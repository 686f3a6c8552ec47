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
        "optax",
        "orbax-checkpoint>=0.11",
        "chex",
        "tensorflow-datasets>=4.9.7",
        "array_record",
        "grain>=0.2.10",
        "ml-collections",
        "absl-py",
        "sentencepiece",
        "tokenizers",
        "safetensors",
        "conllu>=4.5",
        "tensorboardX",
        "numpy",
        "matplotlib",
        "tqdm",
    ],
    extras_require={
        "tf": ["tensorflow"],
        "test": ["pytest", "pytest-xdist", "scikit-learn", "transformers", "torch"],
    },
    entry_points={"console_scripts": ["headspec=headspec.cli:run"]},
)
