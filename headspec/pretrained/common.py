"""What the family modules share: the one-line check of a config value and the activations they map."""

from __future__ import annotations

import pathlib

from headspec.errors import UserError

ACTIVATIONS = {
  "gelu": "gelu_exact",
  "gelu_new": "gelu_tanh",
  "gelu_pytorch_tanh": "gelu_tanh",
  "relu": "relu",
}
GATED_ACTIVATIONS = {**ACTIVATIONS, "silu": "silu", "swish": "silu"}  # the decoders' gated MLPs add SiLU


def check(ok: bool, path: pathlib.Path, message: str) -> None:
  if not ok:
    raise UserError(f"{path}: {message}")


def activation(name: str, key: str, path: pathlib.Path, known: dict = ACTIVATIONS) -> str:
  check(name in known, path, f"{key}={name!r} is not supported (use one of {sorted(known)})")
  return known[name]
