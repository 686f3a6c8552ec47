"""When do induction heads form? A 2-layer attention-only decoder (Olsson et al. 2022's smallest
setting; 'mlp' for the standard decoder with MLPs) on WikiText-103, with a dense log-spaced
`train.keep_steps` from step 0, then `headspec attention` on every kept step.

  headspec train --config=configs/induction.py --workdir=runs/induction_s0
  headspec train --config=configs/induction.py:seed=1 --workdir=runs/induction_s1   # more seeds
  headspec attention --config=configs/induction.py:attention --workdir=runs/induction_s0

Arguments (comma-separated): 'mlp' (MLPs on), 'seed=N', 'attention' (the analysis config instead:
steps='all', no treebank analyses, only the induction step). The attention config writes roles.csv,
labels.csv, icl.csv, ablation/causal.csv (kind=induction), induction_formation.png and
induction_summary.md (the formation window) under RUN/attention (docs/attention.md). Context 256
tokens, 4,000 steps of 32 rows (33M tokens); a time on 2 CPU cores is NOT measured (estimate from
benchmarks/bench_train: a few hours; minutes on a GPU). 23 kept steps: about 23 × 2 MB of checkpoints.
"""

from headspec.train.config import train_config

KEEP_STEPS = (0, 10, 20, 30, 50, 70, 100, 150, 200, 300, 400, 500, 700, 1000, 1300, 1600, 2000, 2500, 3000, 3500, 4000)


def get_config(arg: str | None = None):
  args = [a for a in (arg or "").split(",") if a]
  if "attention" in args:
    from headspec.attention.config import attention_config

    c = attention_config()
    c.steps = "all"
    c.treebank = ""  # only the induction step
    c.induction.n = 100  # [BOS] + 200 tokens in the 256-token context
    c.induction.num_tokens = 32768
    return c
  c = train_config()
  c.data.corpus = "wikitext_103"
  c.model.num_layers, c.model.num_heads, c.model.d_model, c.model.d_head = 2, 8, 256, 32
  c.model.mlp = "mlp" in args
  c.model.dropout = c.model.attention_dropout = 0.0
  c.train.steps = 4000
  c.train.batch_size = 32
  c.train.seq_len = 256
  c.train.warmup_steps = 200
  c.train.learning_rate = 1e-3
  c.train.log_every = 10  # the training-loss curve of the formation figure
  c.train.eval_every = 500
  c.train.checkpoint_every = 1000
  c.train.keep_steps = KEEP_STEPS
  for a in args:
    if a.startswith("seed="):
      c.seed = int(a.split("=", 1)[1])
    elif a not in ("mlp", "attention"):
      raise ValueError(f"configs/induction.py: unknown argument {a!r} (use mlp, seed=N, attention)")
  return c
