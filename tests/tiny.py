"""The tests' way to call a model: one compiled program per (model graph, capture, output, argument shapes).

Calling an nnx model outside `jit` dispatches every operation on its own, and XLA compiles each distinct
(operation, shape) once per process: a forward pass of a 3-layer model with a few captures compiled 30-150
small programs, most of tests/test_model.py's time. `call(model, tokens, **kwargs)` is `model(tokens,
**kwargs)` as one jitted program, cached by the model's graph and the static keys (capture, output), so a
test that calls the same model again with new arrays compiles nothing. The model's own code is what runs:
only the dispatch differs.
"""

import functools

import jax
from flax import nnx


@functools.partial(jax.jit, static_argnums=0, static_argnames=("capture", "output"))
def _forward(graphdef, state, tokens_BT, kwargs, *, capture, output):
  return nnx.merge(graphdef, state)(tokens_BT, capture=capture, output=output, **kwargs)


def call(model, tokens_BT, *, capture=(), output="logits", **kwargs):
  """`model(tokens_BT, capture=capture, output=output, **kwargs)` under one cached `jit`: kwargs are the
  model's array arguments (valid_BT, positions_BT, segment_BT, token_types_BT, interventions)."""
  graphdef, state = nnx.split(model)
  return _forward(graphdef, state, tokens_BT, kwargs, capture=tuple(capture), output=output)
