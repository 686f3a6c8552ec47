"""Per-head probing suite on UD English EWT (upos, xpos, deprel, arc, distance, depth), cross-domain on GUM.

  headspec probe --config=configs/probe_ewt.py --workdir=RUN_DIR
  headspec probe --config=configs/probe_ewt.py --workdir=runs/minilm --config.model.pretrained=minilm

Needs HEADSPEC_DATA_DIR with ud/en_ewt/ (and ud/en_gum/ for the cross-domain rows; drop them with
--config.probe.extra_treebanks='()'). Probes every saved step of RUN_DIR (--config.probe.steps=last for one):
every head's Z_h, every layer's residual stream and the embeddings; fitted on EWT train, L2 tuned on dev,
scored on EWT dev/test and GUM dev/test with control tasks and 95% bootstrap CIs. Writes
RUN_DIR/probes/{results.csv, baselines.csv, summary.md, heatmap_<task>.png} and a feature cache in
RUN_DIR/probes/cache/ (about 2 GB per step for a 6-layer, 384-wide model; a second run reuses it).
Argument 'fast' probes on 40k training words (minutes instead of tens of minutes on a 2-core CPU).
Expect UPOS accuracy well above the majority baseline (~0.17) in the middle layers of a trained model and
positive selectivity, and a random-weights model (--config.probe.random_baseline=True) to be less selective.
"""

from headspec.probing.config import probe_config


def get_config(arg: str | None = None):
  c = probe_config()
  c.probe.treebank = "en_ewt"
  c.probe.extra_treebanks = ("en_gum",)
  if arg == "fast":
    c.probe.max_train_words = 40000
  return c
