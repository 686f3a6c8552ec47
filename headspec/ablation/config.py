"""Every `headspec ablate` config key with its default (configs/ablate.py starts from `ablate_config()`,
so each key is declared and documented once, as probing/config.py does for `headspec probe`);
`quickstart_ablate_config` is what the quickstart ablates with."""

from __future__ import annotations

import ml_collections

from headspec.runs.target_config import add_target_keys


def ablate_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  add_target_keys(c, steps="all")  # mesh, multihost, steps, model_name, model.pretrained, model.dtype
  c.random_baseline = False  # also ablate the first target with random weights (no LM head: embedding_shift)
  c.methods = "zero,mean,keep_only,importance,magnitude,entropy,pruning,gates,causal,interactions"
  #            ^ stages to run: heads.csv methods, then pruning, L0 gates, the causal probe test, interactions
  c.seed = 0  # MLM mask, bootstrap resamples, random pruning orders, gate noise, random heads of the causal test
  c.bootstrap_resamples = 1000  # resamples of evaluation sequences (test sentences) for the 95% CIs
  c.data_dir = ""  # '' = the run's own data_dir (config.json), then HEADSPEC_DATA_DIR

  # Evaluation set of a model with a trained LM head (the diversity command's evaluation_tokens).
  c.num_tokens = 8192  # the first num_tokens validation tokens of the run (or of `corpus` for a pretrained LM)
  c.sample = "first"  # 'first' rows, or 'random' rows drawn with `seed`
  c.batch_size = 8  # rows per compiled call
  c.corpus = "wikitext_103"  # pretrained LMs only: data_dir/text/<corpus>, valid split
  c.seq_len = 128  # pretrained LMs only: tokens per row, special tokens included
  # Evaluation set of a pretrained model without LM head (metric embedding_shift).
  c.treebank = "en_ewt"  # its sentences: data_dir/ud/<treebank>
  c.split = "dev"  # its split read: 'train' | 'dev' | 'test'
  c.num_sentences = 500  # the first num_sentences sentences of the split
  c.batch_tokens = 2048  # padded tokens per compiled call (sentences in power-of-two length buckets)

  c.pruning = ml_collections.ConfigDict()
  c.pruning.rankings = "importance,ablation,magnitude,entropy,probe,random"  # 'probe' needs probes/results.csv
  c.pruning.step_fraction = 0.1  # heads removed per step, as a fraction of all L·H heads
  c.pruning.random_seeds = 5  # random pruning orders (the spread of chance)
  c.pruning.rerank = True  # recompute importance under the current mask after every step (Michel et al. 2019)

  c.gates = ml_collections.ConfigDict()
  c.gates.penalties = (0.003, 0.01, 0.03, 0.1)  # λ (nats per open head) of LM loss + λ·E[L0]
  c.gates.steps = 100  # Adam steps per λ (weights frozen; only log α is trained)
  c.gates.learning_rate = 0.1  # Adam learning rate of log α
  c.gates.init_log_alpha = 3.0  # initial log α: P(gate open) ≈ 0.97

  c.causal = ml_collections.ConfigDict()
  c.causal.random_seeds = 3  # layer-matched random head sets per k
  c.causal.max_train_words = 4000  # probe training words (whole sentences, seeded subsample of train)
  c.causal.max_eval_words = 2000  # dev (l2 choice) and test (measurement) words
  # A word's vector from its 'first' | 'last' | 'mean' piece(s); 'auto' is probe.pooling's default ('last' for a
  # decoder, 'first' for an encoder), so heads are tested at the pieces they were ranked at.
  c.causal.pooling = "auto"
  c.causal.l2_grid = (1e-4, 1e-3)  # probe L2 penalties tried, best on dev
  c.causal.refine_samples = 20000  # Adam samples after the probes' closed-form start (headspec/probing/probe.py)
  c.causal.batch_tokens = 2048  # padded tokens per feature-extraction call

  c.interactions = ml_collections.ConfigDict()
  c.interactions.top = 12  # the most important heads whose pairs are ablated jointly
  return c


def quickstart_ablate_config(data_dir: str) -> ml_collections.ConfigDict:
  """The quickstart's ablation: the last step, single-head zero/mean, importance, pruning by importance,
  magnitude and 5 random orders on 2,048 validation tokens (seconds)."""
  c = ablate_config()
  c.data_dir = data_dir
  c.steps = "last"
  c.methods = "zero,mean,importance,pruning"
  c.pruning.rankings = "importance,magnitude,random"
  c.num_tokens = 2048
  c.bootstrap_resamples = 200
  return c
