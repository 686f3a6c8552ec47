"""The study in the grammar setting: decoders trained on text of headspec's synthetic grammar, probed on its
treebank, so every token's part of speech and head are known and nothing needs downloading (docs/study.md).

  headspec launch local --experiment=configs/experiments/grammar.py --workdir=runs/grammar
  headspec launch local --experiment=configs/experiments/grammar.py:condition=baseline --workdir=runs/grammar

The first stage writes ROOT/data (`headspec data synthetic`: the treebank, 4,000/500/500 sentences, and
200,000 sentences of text, seed 0, byte-identical on every rerun); every stage gets
--config.data_dir=ROOT/data. Runs: 4-layer, 4-head causal decoders (d_model 64, d_head 16, d_ff 256, no
dropout), vocabulary 1,000 pieces, 1,000 steps of 32×64 tokens (2M tokens, 0.7 of a pass over the 2.8M-token
text), steps 0, 10, 30, 100, 300, 1000 kept. Conditions (specialization.CONDITIONS): baseline, drophead,
disagreement, 5 seeds each: 15 runs. At every kept step: the probe suite (2k training words, 10 structural
epochs), the diversity metrics and the attention analyses of the specialization study's small setting on the
synthetic treebank; at the last step the ablation suite with the causal test; then the atlas and `headspec
study`. `condition=NAME` runs one condition's 5 seeds, `seed=N` one seed's run of each condition, both together one
run (parts: the same run configs, so the whole command later resumes past them). Two parts may run at
once in the same --workdir once its data stage is done (ROOT/stages/data.done): on the 2-core CPU two
small runs side by side go faster than one after the other.

Learning rate 1e-2, re-measured here (baseline, seed 0, 1,000 steps, warmup 100, cosine decay; validation
loss at step 1000 in nats/token): 1e-3 3.210, 3e-3 3.048, 1e-2 3.010.

On the 2-core development CPU all 15 runs take under two hours as seed parts two at a time, 12.5-15 min a
run (the times per stage: docs/study.md, "Time"). Results: docs/study.md, "What the grammar setting measured".

Arguments (comma-separated, any order): condition=NAME, seed=N (training configs; to experiment(): that
part); probe | diversity | attention | ablate (that stage's analysis config); lr=X
(training at another learning rate, for the sweep); tiny (test sizes: one run, a few steps, small analyses:
tests/test_study_settings.py).
"""

from headspec.configs.experiments import specialization
from headspec.train.config import train_config

CONDITIONS = specialization.CONDITIONS
ANALYSES = specialization.ANALYSES
SEEDS = (0, 1, 2, 3, 4)
STEPS = 1000
KEEP = (0, 10, 30, 100, 300, 1000)
KEEP_TINY = (0, 8)
LEARNING_RATE = 1e-2
DATA = ("synthetic", "--seed=0", "--text-sentences=200000")
DATA_TINY = ("synthetic", "--seed=0", "--text-sentences=2000", "--treebank-sentences=300,100,100")
ME = "configs/experiments/grammar.py"


def _args(arg):
  out = {"tiny": False, "condition": "baseline", "seed": 0, "stage": "", "lr": LEARNING_RATE}
  for a in [a.strip() for a in (arg or "").split(",") if a.strip()]:
    key, _, value = a.partition("=")
    if a == "tiny":
      out["tiny"] = True
    elif a in ANALYSES:
      out["stage"] = a
    elif key == "condition" and value in CONDITIONS:
      out["condition"] = value
    elif key == "seed" and value.lstrip("-").isascii() and value.lstrip("-").isdigit():
      out["seed"] = int(value)
    elif key == "lr" and positive(value):
      out["lr"] = float(value)
    else:
      raise ValueError(
        f"{ME}: bad argument {a!r} (use condition={'|'.join(CONDITIONS)}, seed=N, lr=X, {', '.join(ANALYSES)}, tiny)"
      )
  return out


def positive(text: str) -> bool:
  """Whether an argument value reads as a number above 0 (lr=X of this setting and the induction one)."""
  try:
    return float(text) > 0
  except ValueError:
    return False


def experiment(arg: str | None = None):
  """The grammar setting's data stage, runs and analyses (headspec/launch/experiments.py runs them in order)."""
  from headspec.launch.experiments import Experiment, Run

  a = _args(arg)
  if a["stage"] or "lr=" in (arg or ""):  # would be ignored: the runs' configs carry neither
    raise ValueError(f"{ME}: lr=X and the stage names are for single configs, not for the experiment ({arg!r})")
  tiny = a["tiny"]
  tag = "tiny," if tiny else ""
  conditions, seeds = (("baseline",), (0,)) if tiny else (tuple(CONDITIONS), SEEDS)
  if arg and "condition=" in arg:  # one part of the setting (run the parts, then the whole command resumes)
    conditions = (a["condition"],)
  if arg and "seed=" in arg:  # a smaller part: that seed's run (of each condition, or of condition=NAME)
    seeds = (a["seed"],)
  runs = tuple(
    Run(f"{condition}_s{seed}", f"{ME}:{tag}condition={condition},seed={seed}", condition, seed)
    for condition in conditions
    for seed in seeds
  )
  return Experiment(
    runs=runs,
    analyses=tuple((a, f"{ME}:{tag}{a}") for a in ANALYSES) + (("atlas", ""),),
    data=DATA_TINY if tiny else DATA,
  )


def get_config(arg: str | None = None):
  a = _args(arg)
  if a["stage"]:
    return analysis_config(a["stage"], a["tiny"])
  c = train_config()
  c.seed = a["seed"]
  c.data_dir = ""  # the experiment passes --config.data_dir=ROOT/data (its data stage writes it)
  c.data.corpus = "synthetic"
  c.data.vocab_size = 1000
  c.model.num_layers, c.model.num_heads = 4, 4
  c.model.d_model, c.model.d_head, c.model.d_ff = 64, 16, 256
  c.model.dropout = c.model.attention_dropout = 0.0
  for key, value in CONDITIONS[a["condition"]].items():
    c.train.regularizers[key] = value
  c.train.learning_rate = a["lr"]
  c.train.batch_size, c.train.seq_len = 32, 64
  if a["tiny"]:
    c.data.vocab_size = 400
    c.model.num_layers, c.model.num_heads, c.model.d_model, c.model.d_ff = 2, 2, 32, 64
    c.train.steps, c.train.batch_size, c.train.warmup_steps = 8, 8, 2
    c.train.log_every, c.train.eval_every, c.train.eval_batches = 4, 8, 2
    c.train.checkpoint_every, c.train.keep_steps = 8, KEEP_TINY
  else:
    c.train.steps, c.train.warmup_steps = STEPS, 100
    c.train.log_every, c.train.eval_every, c.train.eval_batches = 25, 250, 20
    c.train.checkpoint_every, c.train.keep_steps = STEPS, KEEP
  return c


def analysis_config(stage: str, tiny: bool = False):
  """The specialization study's small-setting analysis of `stage`, on the synthetic treebank of the run's
  data folder (data_dir '' = the run's own)."""
  c = specialization.analysis_config(stage, small=True)
  c.data_dir = ""
  if stage == "probe":  # small heads and a regular language: 2k training words, 10 structural epochs
    c.probe.treebank = "synthetic"
    c.probe.max_train_words = c.probe.arc_max_train_words = c.probe.structural_max_train_words = 2000
    c.probe.structural_epochs, c.probe.structural_patience = 10, 2
  elif stage == "attention":
    c.treebank = "synthetic"
    c.clark.min_count = 20
    c.max_sentences = 200
  elif stage == "ablate":
    c.treebank = "synthetic"
  if tiny:  # every stage and table once, as fast as it goes (the test of the setting's plumbing)
    if stage == "probe":
      c.probe.tasks = ("upos", "arc", "depth")
      c.probe.max_train_words = c.probe.arc_max_train_words = c.probe.structural_max_train_words = 500
      c.probe.l2_grid, c.probe.arc_l2_grid = (1e-3,), (1e-2,)
      c.probe.max_iter, c.probe.arc_epochs, c.probe.structural_epochs = 5, 1, 1
      c.probe.refine_samples, c.probe.bootstrap_resamples = 0, 20
    elif stage == "diversity":
      c.num_tokens = 512
    elif stage == "attention":
      c.max_sentences, c.clark.min_count, c.roles.bootstrap_resamples = 50, 5, 20
      c.pictures.sentences = ()
      c.induction.n, c.induction.num_sequences, c.induction.num_tokens = 10, 8, 512
      c.induction.causal.num_sequences, c.induction.causal.random_seeds = 8, 1
    else:
      c.methods, c.pruning.rankings = "zero,importance,pruning,causal", "importance,probe,random"
      c.num_tokens, c.bootstrap_resamples, c.pruning.random_seeds = 512, 20, 1
      c.causal.max_train_words, c.causal.max_eval_words, c.causal.refine_samples = 500, 300, 0
      c.causal.random_seeds, c.causal.l2_grid = 1, (1e-3,)
  return c
