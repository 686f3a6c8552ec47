"""Every `headspec probe` config key with its default. configs/probe_*.py start from `probe_config()` and
override what they change, so each key is declared (and documented) once; `synthetic_probe_config` is
configs/probe_synthetic.py, and `quickstart_probe_config` its trimmed copy that `headspec quickstart` probes with."""

from __future__ import annotations

import ml_collections

from headspec.data import data_dir_default
from headspec.probing.tasks import REGISTRY
from headspec.runs.target_config import add_target_keys


def probe_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  add_target_keys(c, steps=None)  # mesh, multihost, model.pretrained, model.dtype
  c.seed = 0  # control-task labels, probe minibatch order, bootstrap resamples, random-baseline weights
  c.data_dir = data_dir_default()  # holds ud/<treebank>/<treebank>-ud-<split>.conllu

  c.probe = ml_collections.ConfigDict()
  c.probe.tasks = tuple(REGISTRY)  # all of probing/tasks.py's: 'upos', 'xpos', 'deprel', 'arc', 'distance', 'depth'
  c.probe.treebank = "en_ewt"  # probes are fitted on its train split and tuned on its dev split
  c.probe.eval_splits = ("dev", "test")  # splits of probe.treebank the probes are scored on
  c.probe.extra_treebanks = ()  # cross-domain: scored on their dev/test splits that exist (e.g. 'en_gum')
  c.probe.steps = "all"  # 'all' | 'last' | comma-separated steps ('100,1000'); pretrained models: step 0
  c.probe.model_name = ""  # the `model` column; '' = the pretrained name or the workdir's folder name
  c.probe.deprel_subtypes = False  # keep 'nmod:poss' as is (True) or strip to 'nmod' (False)
  c.probe.pooling = (
    "auto"  # a word's vector from its 'first' | 'last' | 'mean' piece(s); 'auto': last for decoders, first for encoders
  )
  c.probe.max_train_words = 0  # 0: all; else a seeded random subset of whole train sentences of about this many words
  c.probe.train_sample_seed = -1  # seed of the train subsets (max_train_words, arc_max_train_words); -1: `seed`
  c.probe.residuals = True  # also probe the embeddings and every layer's residual stream (False: the heads only)
  c.probe.random_baseline = False  # also probe the same architecture with random weights (model name + '-random')
  c.probe.l2_grid = (1e-5, 1e-4, 1e-3)  # L2 penalties λ tried per probe; the best on dev is kept
  # 'tied': λ chosen on the task's dev accuracy, its control fitted at that λ (Hewitt & Liang 2019);
  # 'separate': the control chooses its own λ on its own dev accuracy (softmax and arc probes)
  c.probe.control_lambda = "tied"
  c.probe.refine_samples = (
    200_000  # training words Adam visits after the closed-form LDA start (several passes if N is smaller; 0: LDA only)
  )
  c.probe.tol = 1e-5  # L-BFGS stops a softmax probe when its objective changes by less (relative; probe.py)
  c.probe.max_iter = 500  # L-BFGS iterations at most per softmax probe (each one pass over train; XPOS needs ~400)
  c.probe.arc_max_train_words = (
    0  # 0: arc probes train on every train sentence; else a seeded subset of about this many words
  )
  c.probe.arc_epochs = 10  # at most this many passes of the arc probes over train (early stopping on dev loss)
  c.probe.arc_patience = 2  # stop after this many epochs in which no arc probe's dev loss improved
  c.probe.arc_learning_rate = 1e-3  # Adam's step for the arc probes (1e-2 stopped after 1-2 epochs, underfitting)
  c.probe.arc_rank = 32  # rank of the bilinear arc probe, the same for every group (capped at the group's width)
  c.probe.arc_l2_grid = (1e-4, 1e-3, 1e-2)  # L2 penalties tried per arc probe; the best dev UAS is kept
  c.probe.arc_control = "hewitt_liang"  # 'hewitt_liang' (self / first / last word per type) | 'four_behaviours'
  c.probe.arc_ignore_punct = True  # leave punctuation (UPOS PUNCT) out of arc training and scoring, task and control
  c.probe.structural_rank = (
    64  # rank of B in Hewitt & Manning's distance and depth probes (capped at the group's width)
  )
  c.probe.structural_epochs = 40  # at most this many passes of the structural probes over train (H&M: 40)
  c.probe.structural_patience = 5  # stop after this many epochs in which no structural probe's dev loss improved
  c.probe.structural_learning_rate = 1e-3  # Adam's; divided by 10 after an epoch without dev improvement (H&M)
  c.probe.structural_batch_sentences = 20  # sentences per minibatch, reshuffled every epoch (H&M's batch_size)
  c.probe.structural_scale = "raw"  # 'raw' features as H&M | 'std': divided by their train std (docs/probing.md)
  # words left out of UUAS and root accuracy: 'upos' (UPOS PUNCT) | 'ptb' (H&M's 7 PTB XPOS tags, docs/probing.md)
  c.probe.structural_punctuation = "upos"
  c.probe.structural_max_train_words = 0  # 0: every train sentence; else a seeded subset of about this many words
  c.probe.complexity = False  # also write probes/complexity.csv: every λ's dev accuracy (Hewitt & Liang 2019)
  c.probe.mdl = False  # also write probes/mdl.csv: Voita & Titov (2020) online codelength per group, task and control
  c.probe.mdl_only = False  # True (with mdl): write only probes/mdl.csv, fit no probe, leave the other tables
  # MDL's portions of the training sentences, cut at sentence boundaries (the paper's 0.1% ... 100%; probing_core.md, MDL)
  c.probe.mdl_fractions = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.0625, 0.125, 0.25, 0.5, 1.0)
  c.probe.bootstrap_resamples = 1000  # resamples of sentences for the 95% confidence intervals
  c.probe.batch_tokens = 4096  # padded tokens per forward batch when extracting features
  c.probe.cache_dtype = "float16"  # features on disk in probes/cache/: 'float16' | 'float32'
  c.probe.top_k = 5  # heads listed per task in summary.md
  return c


def synthetic_probe_config(data_dir: str) -> ml_collections.ConfigDict:
  """The quickstart's probe study: the synthetic treebank in `data_dir`, the last step and random weights."""
  c = probe_config()
  c.data_dir = data_dir
  c.probe.treebank = "synthetic"
  c.probe.steps = "last"
  c.probe.random_baseline = True
  c.probe.bootstrap_resamples = 200
  # The structural probes fit on all 47.6k training words (structural_max_train_words 0): they add 11-19% to
  # the probe stage, and a 10k-word subset costs UUAS (docs/probing_core.md, "Measurements behind the constants").
  return c


QUICKSTART_TRAIN_WORDS = 12_000
"""Training words of the quickstart's probes (about 1,000 of the synthetic treebank's 4,000 train sentences)."""


def quickstart_probe_config(data_dir: str, *, random_baseline: bool = True) -> ml_collections.ConfigDict:
  """`headspec quickstart`'s probes: `synthetic_probe_config` trimmed so that README command 1 fits in about
  4 minutes on a 2-core CPU. Trained on a seeded subset of QUICKSTART_TRAIN_WORDS words and with two L2
  penalties (1e-4, 1e-3; the weakest, 1e-5, is the one whose L-BFGS runs to its iteration cap on the
  embeddings). Measured on the quickstart decoder (docs/results.md): every head's selectivity within 0.01
  of the full suite's, the same best heads; the embeddings' and residual streams' arc accuracy lower (the
  bilinear arc probe underfits 12k words). `random_baseline`: also probe a random-weights copy. The full
  suite on the same run: `headspec probe --config=configs/probe_synthetic.py`."""
  c = synthetic_probe_config(data_dir)
  c.probe.max_train_words = QUICKSTART_TRAIN_WORDS
  c.probe.l2_grid = (1e-4, 1e-3)
  c.probe.random_baseline = random_baseline
  return c
