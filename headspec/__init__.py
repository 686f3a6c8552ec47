"""headspec: attention-head specialization in JAX transformers."""

__version__ = "0.1.0"
