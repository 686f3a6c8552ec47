"""The notebook face (docs/api.md): core (load, run, capture, probe, ablate, patch, circuit), tokens
(to_tokens and friends), views (attention figures and the offline HTML view), store (the activation store,
`headspec.activations`). `import headspec` reaches these lazily (headspec/__init__.py).
"""
