"""Sparse autoencoders on one layer's activations, attributed to heads (docs/sae.md, issue 66).

  model.py     the SAE (TopK, ReLU + L1) and its encode/decode
  train.py     `fit_sae`: optax training, AuxK, unit-norm decoder, Orbax checkpoints, resume
  metrics.py   L0, FVU, dead/dense latents, loss recovered, head attribution and specialization
  splice.py    the SAE's reconstruction spliced into a forward pass (an `Edit` of one layer's site)
  labels.py    features against a treebank: top contexts, UPOS/deprel/head-distance profiles, selectivity
  saelens.py   SAELens's folder layout both ways (`SAE.save`, `headspec.load_sae`), Kissane et al.'s .pt files
  run.py       `headspec sae`

Shapes: in an SAE, K is the input width (H·K of the concatenated z) and F the number of features.
"""
