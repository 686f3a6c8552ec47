"""Sparse autoencoders on a layer's attention output (the concatenated z), attributed to heads (docs/sae.md).

  headspec sae --config=sae --workdir=RUN                        # a trained run's last step, its middle layer
  headspec sae --config=sae:minilm --workdir=runs/minilm          # all-MiniLM-L6-v2, EWT dev, wikitext-103 text
  headspec sae --config=sae:quickstart --workdir=runs/quickstart/decoder  # the quickstart's synthetic treebank

A TopK SAE (k = 16, 8 × the width of z) on the first 100,000 tokens of the evaluation text, measured on the
next 8,192 (a shorter text is cut in that proportion; L0, FVU, dead and dense latents, loss recovered by splicing the reconstruction in against zero-
and mean-ablating the layer's z), each feature's heads and its contexts and UPOS/deprel/head-distance
profile over the treebank split. Writes RUN/sae/{metrics,features,heads,contexts,labels}.csv
(docs/outputs.md), the figures RUN/sae/heads_<tag>.png and entropy_<tag>.png, and Orbax checkpoints under
RUN/sae/checkpoints/ (a rerun resumes or reuses them). `--config.layers=all`: one SAE per layer.
Time on the 2-core CPU at load average ~13 (other jobs running): the tests' tiny decoder (z of width 32,
256 features, 8k tokens) 2.5 min, 2 of them the 3,000 training steps; the quickstart decoder's z is twice as
wide (512 features). `:minilm` (1,536 features, 1,000 steps of 512 tokens): ~10 min at load ~15 with 50,000
training tokens, 800 steps and 300 EWT dev sentences (held-out FVU 0.53, train 0.22, 4% dead); the full
defaults there (3,072 features, 3,000 steps of 1,024) are for a GPU.
Every key, its default and meaning: headspec/sae/config.py.
"""

from headspec.sae.config import sae_config


def get_config(arg: str | None = None):
  c = sae_config()
  if arg == "minilm":  # sized for a CPU: 1,536 features, 1,000 steps of 512 tokens
    c.model.pretrained = "minilm"
    c.sae.expansion, c.sae.train_steps, c.sae.batch_size = 4.0, 1000, 512
  elif arg == "quickstart":
    c.analysis.treebank = "synthetic"
    c.data_dir = ""  # the run's own data directory (the quickstart's synthetic treebank), not HEADSPEC_DATA_DIR
  elif arg:
    raise ValueError(f"configs/sae.py: unknown argument {arg!r} (use 'minilm', 'quickstart' or none)")
  return c
