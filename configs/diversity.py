"""Head-diversity metrics over a run's checkpoints (headspec/diversity/run.py).

  headspec diversity --config=configs/diversity.py --workdir=RUN [--config.steps=all]
  headspec diversity --config=configs/diversity.py:minilm --workdir=runs/minilm   # pretrained, step 0

For every saved step of RUN ('last' or '100,1000' for some), every metric of headspec/diversity/metrics.py
over the first 10,000 tokens of the run's own validation rows (a pretrained model reads the valid split
of data_dir/text/<corpus> instead). Writes RUN/diversity/results.csv (`model,step,layer,head_i,head_j,
metric,value`; rerunning replaces the rows of the (model, step)s recomputed), curves.png, matrix_<metric>.png,
heads.png and output_dissimilarity.gif. Time on a 2-core CPU (10k tokens): ~10 s to compile and draw
the figures, then under 1 s per checkpoint for the quickstart model (2 layers, 4 heads, d_model 64),
~7 s per checkpoint for base_decoder (6 layers, 8 heads, d_model 256, rows of 128), about half a minute
for MiniLM (6 layers, 12 heads, d_model 384). Memory: one batch of activations plus ~1.5 MiB of sums.
Every key and its default: headspec/diversity/config.py.
"""

from headspec.diversity.config import diversity_config


def get_config(arg: str | None = None):
  c = diversity_config()
  if arg == "minilm":
    c.model.pretrained = "minilm"
  elif arg:
    raise ValueError(f"configs/diversity.py: unknown argument {arg!r} (use 'minilm' or none)")
  return c
