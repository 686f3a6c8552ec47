"""Head ablations, importance, pruning, L0 gates, the causal probe test and interactions (docs/ablation.md).

  headspec ablate --config=configs/ablate.py --workdir=RUN [--config.steps=last]
  headspec ablate --config=configs/ablate.py:minilm --workdir=runs/minilm     # pretrained, step 0

Every key, with its default and meaning, is declared once in headspec/ablation/config.py:
  steps ('all'), model_name, random_baseline, methods (zero, mean, keep_only, importance, magnitude,
  entropy, pruning, gates, causal, interactions), seed, bootstrap_resamples, data_dir; the LM evaluation
  set num_tokens (8192), sample, batch_size, corpus, seq_len; the sentence evaluation set (models without
  LM head) treebank (en_ewt), split (dev), num_sentences (500), batch_tokens; pruning.{rankings,
  step_fraction (0.1), random_seeds (5), rerank}; gates.{penalties, steps (100), learning_rate,
  init_log_alpha}; causal.{random_seeds (3), max_train_words, max_eval_words, pooling, l2_grid,
  refine_samples, batch_tokens}; interactions.top (12).
Argument 'minilm': model.pretrained=minilm, metric embedding_shift on the first 500 EWT dev sentences,
and no L0 gates (MiniLM has no trained LM head, so gates would be refused).
Writes RUN/ablation/{heads,pruning,gates,causal,interactions}.csv and <figure>_<model>_step<step>.png.
Time on a 2-core CPU: the quickstart decoder (2 layers × 4 heads, 8k tokens) takes well under a minute
per step with every stage but the causal test (about a minute more with probes/results.csv); MiniLM's
zero + mean sweeps + importance over 500 EWT dev sentences take a few minutes (benchmarks/bench_ablation.py).
"""

from headspec.ablation.config import ablate_config


def get_config(arg: str | None = None):
  c = ablate_config()
  if arg == "minilm":
    c.model.pretrained = "minilm"
    c.methods = "zero,mean,keep_only,importance,magnitude,entropy,pruning,causal,interactions"
  elif arg:
    raise ValueError(f"configs/ablate.py: unknown argument {arg!r} (use 'minilm' or none)")
  return c
