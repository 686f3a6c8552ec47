"""The study in the induction setting: when do previous-token, duplicate-token and induction heads form, and
does the in-context loss drop with them (Olsson et al. 2022's phase change)? configs/induction.py as an
experiment, on data it writes itself (docs/study.md "Settings").

  headspec launch local --experiment=configs/experiments/induction.py --workdir=runs/induction
  headspec launch local --experiment=configs/experiments/induction.py:layers=2 --workdir=runs/induction

The first stage writes ROOT/data (`headspec data synthetic --repeats=1`): the synthetic grammar's text
with repeated random-word sequences mixed in (headspec/data/repeats.py: after every document, 8-24 words
drawn from the text's own words, written twice; about a fifth of the words), corpus `synthetic_repeats`
(4.0M tokens), and a 500/200/200-sentence treebank. Runs: causal decoders of 2 and 4 layers, attention-only
and with MLPs (4 heads of 16, d_model 64, d_ff 256, no dropout), 5 seeds each: 20 runs; vocabulary 1,000
pieces, 800 steps of 16×128 tokens (1.6M tokens), 11 kept steps, dense through the first 200. At every kept
step `headspec attention` without treebank analyses: previous-token, duplicate-token and induction scores on
repeated random tokens ([BOS] + 2×50), the in-context-learning score and loss by position on the run's
validation rows, and the causal check (the top-k induction heads ablated vs layer-matched random heads).
Then a cheap probe (upos, deprel at steps 0, 150, 800: `headspec study` reads probe selectivity) and the
report. `layers=N` runs one depth's 10 runs (a part: the same run configs; the whole command resumes past it).

Learning rate 1e-2, re-measured here (2 layers with MLPs, seed 0, 800 steps; validation loss at step 800,
nats/token): 1e-3 3.563, 3e-3 3.298, 1e-2 3.227. The 4-layer models were not swept.

Measured on the 2-core development CPU, `nice`, while other jobs ran (2026-11-25; 1-minute load average in
brackets): data stage 38 s [15]; training 800 steps, 2 layers with MLPs 241-265 s [14-19]; from 200-step
runs' throughput [11-14], 2 layers attention-only about 170 s, 4 layers with MLPs about 380 s (4 layers
attention-only not measured: taken as 280 s); attention at 11 kept steps 488 s [14-15] (38-58 s a step);
probe 35 s [4]. About 4.4 hours for all 20 runs at those loads; `layers=2` (10 runs) about 2 hours, the part
that fits the two-hour budget. In the measured run (2 layers with MLPs,
3e-3) NO induction head formed by step 800: the best induction score on repeated random tokens stayed at
0.015 (label threshold 0.4) and the best previous-token score reached 0.099, while the in-context-learning
score rose from -0.005 at step 0 to 0.85 [0.27, 1.54] at step 200 (0.58 at step 800). A 3,000-step check
(2 layers attention-only, 1e-2, 6.1M tokens, 226 s at load 3-5) formed none either: best induction score
0.007, and on the corpus' own repeated word sequences the second copy's loss was 3.31 nats against 3.47 for
the first (an induction head takes it towards 0). Olsson et al. saw the phase change after 2.5-5B tokens, far
beyond two hours of this CPU (about 30k tokens/s for the smallest model when idle); so at these sizes the
setting measures the absence of the phase change. The repeated random tokens are drawn from the ids that occur in
the run's validation rows (induction.draw='text'): the whole vocabulary includes the 256 byte pieces that this
text never uses.

Arguments (comma-separated): layers=N (2-4), mlp (MLPs on; default attention-only), seed=N, lr=X (training
configs; layers=N alone to experiment(): that part); attention | probe (the analysis configs); tiny (test
sizes: one run, a few steps).
"""

from headspec.configs.experiments import grammar, specialization
from headspec.defaults import train_config

LAYERS = (2, 4)
SEEDS = (0, 1, 2, 3, 4)
STEPS = 800
KEEP = (0, 25, 50, 75, 100, 150, 200, 300, 400, 600, 800)
KEEP_TINY = (0, 8)
LEARNING_RATE = 1e-2
PROBE_STEPS = (0, 150, STEPS)  # `headspec study` reads probe selectivity: upos and deprel at three kept steps
DATA = ("synthetic", "--seed=0", "--text-sentences=200000", "--treebank-sentences=500,200,200", "--repeats=1")
DATA_TINY = ("synthetic", "--seed=0", "--text-sentences=2000", "--treebank-sentences=100,50,50", "--repeats=1")
ME = "configs/experiments/induction.py"


def _args(arg):
  out = {"tiny": False, "layers": 2, "mlp": False, "seed": 0, "stage": "", "lr": LEARNING_RATE}
  for a in [a.strip() for a in (arg or "").split(",") if a.strip()]:
    key, _, value = a.partition("=")
    if a in ("tiny", "mlp"):
      out[a] = True
    elif a in ("attention", "probe"):
      out["stage"] = a
    elif key == "layers" and value in ("2", "3", "4"):
      out["layers"] = int(value)
    elif key == "seed" and value.lstrip("-").isdigit():
      out["seed"] = int(value)
    elif key == "lr" and grammar.positive(value):
      out["lr"] = float(value)
    else:
      raise ValueError(f"{ME}: bad argument {a!r} (use layers=2|3|4, mlp, seed=N, lr=X, attention, probe, tiny)")
  return out


def condition(layers: int, mlp: bool) -> str:
  return f"L{layers}_{'mlp' if mlp else 'attn_only'}"


def experiment(arg: str | None = None):
  """The induction setting's data stage, runs and analyses (headspec/experiments.py runs them in order)."""
  from headspec.experiments import Experiment, Run

  a = _args(arg)
  tiny = a["tiny"]
  tag = "tiny," if tiny else ""
  depths = (a["layers"],) if arg and "layers=" in arg else LAYERS  # layers=N: one part of the setting
  shapes = ((2, False),) if tiny else tuple((layers, mlp) for layers in depths for mlp in (False, True))
  runs = tuple(
    Run(
      f"{condition(layers, mlp)}_s{seed}",
      f"{ME}:{tag}layers={layers},{'mlp,' if mlp else ''}seed={seed}",
      condition(layers, mlp),
      seed,
    )
    for layers, mlp in shapes
    for seed in ((0,) if tiny else SEEDS)
  )
  analyses = tuple((a, f"{ME}:{tag}{a}") for a in ("attention", "probe"))
  return Experiment(runs=runs, analyses=analyses, data=DATA_TINY if tiny else DATA)


def get_config(arg: str | None = None):
  a = _args(arg)
  if a["stage"] == "probe":
    return probe_config(a["tiny"])
  if a["stage"]:
    return analysis_config(a["tiny"])
  c = train_config()
  c.seed = a["seed"]
  c.data_dir = ""  # the experiment passes --config.data_dir=ROOT/data (its data stage writes it)
  c.data.corpus = "synthetic_repeats"
  c.data.vocab_size = 1000
  c.model.num_layers, c.model.num_heads, c.model.mlp = a["layers"], 4, a["mlp"]
  c.model.d_model, c.model.d_head, c.model.d_ff = 64, 16, 256
  c.model.dropout = c.model.attention_dropout = 0.0
  c.train.learning_rate = a["lr"]
  c.train.batch_size, c.train.seq_len = 16, 128
  if a["tiny"]:
    c.data.vocab_size = 400
    c.model.d_model, c.model.d_ff = 32, 64
    c.train.steps, c.train.batch_size, c.train.warmup_steps = 8, 8, 2
    c.train.log_every, c.train.eval_every, c.train.eval_batches = 4, 8, 2
    c.train.checkpoint_every, c.train.keep_steps = 8, KEEP_TINY
  else:
    c.train.steps, c.train.warmup_steps = STEPS, 100
    c.train.log_every, c.train.eval_every, c.train.eval_batches = 10, 200, 20  # log: the formation figure's loss
    c.train.checkpoint_every, c.train.keep_steps = STEPS, KEEP
  return c


def analysis_config(tiny: bool = False):
  """The attention analysis of every kept step, induction only (no treebank): scores, ICL, causal check."""
  c = specialization.analysis_config("attention", small=True)
  c.data_dir = ""
  c.treebank = ""
  c.induction.n = 50  # [BOS] + 100 tokens in the 128-token context
  c.induction.draw = "text"  # r from the ids the text uses: its 1,000 pieces hold 256 byte pieces it never uses
  c.induction.num_tokens = 8192
  if tiny:
    c.induction.n, c.induction.num_sequences, c.induction.num_tokens = 10, 8, 512
    c.induction.causal.num_sequences, c.induction.causal.random_seeds = 8, 1
    c.roles.bootstrap_resamples = 20
  return c


def probe_config(tiny: bool = False):
  """UPOS and deprel selectivity on the synthetic treebank at PROBE_STEPS: what `headspec study` needs to
  write its tables, kept cheap (the setting's question is the attention analyses')."""
  c = specialization.analysis_config("probe", small=True)
  c.data_dir = ""
  c.probe.treebank = "synthetic"
  c.probe.tasks = ("upos", "deprel")
  c.probe.steps = ",".join(str(s) for s in (KEEP_TINY if tiny else PROBE_STEPS))
  c.probe.max_train_words = 2000
  if tiny:
    c.probe.max_train_words, c.probe.max_iter, c.probe.refine_samples, c.probe.bootstrap_resamples = 300, 5, 0, 20
  return c
