"""Activation, attribution and path patching over the model's intervention sites (docs/patching.md)."""
