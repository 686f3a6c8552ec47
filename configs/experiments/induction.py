"""The study in the induction setting: when do previous-token, duplicate-token and induction heads form, and
does the in-context loss drop with them (Olsson et al. 2022's phase change)? configs/induction.py as an
experiment, on data it writes itself (docs/study.md "Settings").

  headspec launch local --experiment=configs/experiments/induction.py --workdir=runs/induction
  headspec launch local --experiment=configs/experiments/induction.py:layers=2 --workdir=runs/induction
  headspec launch local --experiment=configs/experiments/induction.py:condition=L2_mlp,seed=1 --workdir=runs/induction

The first stage writes ROOT/data (`headspec data synthetic --repeats=1`): the synthetic grammar's text
with repeated random-word sequences mixed in (headspec/data/repeats.py: after every document, 8-24 words
drawn from the text's own words, written twice), corpus `synthetic_repeats` (4.0M tokens), and a
500/200/200-sentence treebank. Training replaces 75% of every batch's rows with repeated random sequences of
the text's own ids (`data.repeat_rows`, RepeatRows: `BOS p r r f`, r of 5-15 tokens); validation rows stay
text. Runs: causal decoders of 2 and 4 layers, attention-only and with MLPs (4 heads of 16, d_model 64, d_ff
256, rotary positions, no dropout), 5 seeds each: 20 runs; vocabulary 1,000 pieces, 6,000 steps of 64×32
tokens (12.3M tokens) at lr 1e-3, 12 kept steps. At every kept step `headspec attention` without treebank
analyses: previous-token, duplicate-token and induction scores on repeated random tokens ([BOS] + 2×15 of
the text's ids) with the loss on each copy, the in-context-learning score and loss by position on the run's
validation rows (text only), and the causal check (the top-k induction heads ablated vs layer-matched and vs
unlabelled random heads); the diversity metrics on 4,096 validation tokens. Then a cheap probe (upos, deprel
at steps 0, 2000, 6000 on the treebank sentences that fit the 32-token context: `headspec study` reads probe selectivity),
a TopK SAE on each layer's z at every kept step (`headspec sae`: the heads' feature specialization, set
beside the probe selectivity where a step was probed) and the report. Parts (`layers=N`, `condition=C`, `seed=N`) list the same run configs, so the whole command
resumes past them.

Why this data (docs/study.md, "Induction"; `python -m benchmarks.check_induction_data`): the
2-layer attention-only model formed no induction head within 1,778-6,000 steps on 128-token rows of the text
with word repeats, nor on 128-token rows each holding one repeated sequence, nor on 32-token rows half of
which were text; it formed one by step 316 on 32-token rows that were all repeated sequences, and between
steps 1,778 and 3,162 with 75% of them; with learned positions, none by step 3,200.

Why lr 1e-3 (docs/study.md, "Learning rate in the induction setting"; seed 0, 2 layers attention-only, the
config above): of 3e-4, 1e-3, 3e-3 and 1e-2, 1e-3 gave the lowest training loss on the mixed rows (4.38
nats over steps 5,500-6,000 against 5.08, 5.45, 5.58) and the only sharp induction head (L1H0, score 0.95
at step 6,000, previous-token head L0H1 0.98; the second copy's loss 6.24 nats below the first's). The text
validation loss fell with the rate instead (3.75, 3.49, 3.29, 3.20): the rate trades the text against the
repeats, and the setting asks about the repeats. Time (2-core CPU, two runs side by side): training about
8-9 min, attention at 12 steps about 1 min, probe about 1 min.

Arguments (comma-separated): layers=N (2-4), mlp (MLPs on; default attention-only), condition=L2_attn_only
(the same as layers=2; L4_mlp as layers=4,mlp), seed=N, lr=X (training configs); given to experiment(),
layers=N, mlp, condition=C and seed=N each pick a part (one depth's, the MLP runs, one condition's, one
seed's runs; they combine as filters, and parts that exclude each other are refused); attention |
diversity | probe | sae (the analysis configs); tiny (test sizes: one run, a few steps).
"""

from headspec.configs.experiments import grammar, specialization
from headspec.train.config import train_config

LAYERS = (2, 4)
SEEDS = (0, 1, 2, 3, 4)
STEPS = 6000
KEEP = (0, 100, 300, 600, 1000, 1500, 2000, 2500, 3000, 4000, 5000, 6000)
KEEP_TINY = (0, 8)
LEARNING_RATE = 1e-3
SEQ_LEN, BATCH = 32, 64
REPEAT_ROWS = 0.75  # of every batch's rows: repeated random sequences of the text's ids (data.repeat_rows)
PROBE_STEPS = (0, 2000, STEPS)  # `headspec study` reads probe selectivity: upos and deprel at three kept steps
DATA = ("synthetic", "--seed=0", "--text-sentences=200000", "--treebank-sentences=500,200,200", "--repeats=1")
DATA_TINY = ("synthetic", "--seed=0", "--text-sentences=2000", "--treebank-sentences=100,50,50", "--repeats=1")
ME = "configs/experiments/induction.py"
ANALYSES = ("attention", "diversity", "probe", "sae")  # in order: sae after probe, whose selectivity it sets beside


def _args(arg):
  out = {"tiny": False, "layers": 2, "mlp": False, "seed": 0, "stage": "", "lr": LEARNING_RATE}
  for a in [a.strip() for a in (arg or "").split(",") if a.strip()]:
    key, _, value = a.partition("=")
    if a in ("tiny", "mlp"):
      out[a] = True
    elif a in ANALYSES:
      out["stage"] = a
    elif key == "layers" and value in ("2", "3", "4"):
      out["layers"] = int(value)
    elif key == "condition" and value in CONDITIONS:
      out["layers"], out["mlp"] = CONDITIONS[value]
    elif key == "seed" and value.lstrip("-").isascii() and value.lstrip("-").isdigit():
      out["seed"] = int(value)
    elif key == "lr" and grammar.positive(value):
      out["lr"] = float(value)
    else:
      raise ValueError(
        f"{ME}: bad argument {a!r} (use layers=2|3|4, mlp, condition={'|'.join(CONDITIONS)}, seed=N, lr=X, "
        f"{', '.join(ANALYSES)}, tiny)"
      )
  return out


def condition(layers: int, mlp: bool) -> str:
  return f"L{layers}_{'mlp' if mlp else 'attn_only'}"


CONDITIONS = {condition(layers, mlp): (layers, mlp) for layers in (2, 3, 4) for mlp in (False, True)}


def experiment(arg: str | None = None):
  """The induction setting's data stage, runs and analyses (headspec/launch/experiments.py runs them in order)."""
  from headspec.launch.experiments import Experiment, Run

  a = _args(arg)
  tiny = a["tiny"]
  tag = "tiny," if tiny else ""
  given = dict(t.strip().partition("=")[::2] for t in (arg or "").split(",") if t.strip())
  if "lr" in given:
    raise ValueError(
      f"{ME}: lr= is not for the experiment (its runs train at LEARNING_RATE); give it to a training config"
    )
  # Parts, each a filter: layers=N one depth, mlp the MLP runs, condition=C one condition, seed=N one seed.
  depths = (int(given["layers"]),) if "layers" in given else LAYERS  # checked by _args; not the condition's
  shapes = [(layers, mlp) for layers in depths for mlp in (False, True)]
  if "mlp" in given:
    shapes = [s for s in shapes if s[1]]
  if "condition" in given:
    shapes = (
      [s for s in shapes if s == CONDITIONS[given["condition"]]]
      if "layers" in given or "mlp" in given
      else [CONDITIONS[given["condition"]]]
    )
  if not shapes:
    raise ValueError(f"{ME}: {arg!r} names parts that exclude each other (condition= against layers= or mlp)")
  seeds = (a["seed"],) if "seed" in given else SEEDS
  if tiny:  # the test sizes: one run, whatever the parts
    shapes, seeds = [(2, False)], (0,)
  runs = tuple(
    Run(
      f"{condition(layers, mlp)}_s{seed}",
      f"{ME}:{tag}layers={layers},{'mlp,' if mlp else ''}seed={seed}",
      condition(layers, mlp),
      seed,
    )
    for layers, mlp in shapes
    for seed in seeds
  )
  analyses = tuple((a, f"{ME}:{tag}{a}") for a in ANALYSES)
  return Experiment(runs=runs, analyses=analyses, data=DATA_TINY if tiny else DATA)


def get_config(arg: str | None = None):
  a = _args(arg)
  if a["stage"] == "probe":
    return probe_config(a["tiny"])
  if a["stage"] == "diversity":
    return diversity_config(a["tiny"])
  if a["stage"] == "sae":
    return sae_config(a["tiny"])
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
  c.model.positions = "rotary"  # with learned positions no induction head formed in 3,200 steps (docs/study.md)
  c.data.repeat_rows = REPEAT_ROWS
  c.train.learning_rate = a["lr"]
  c.train.batch_size, c.train.seq_len = BATCH, SEQ_LEN
  if a["tiny"]:
    c.data.vocab_size = 400
    c.model.d_model, c.model.d_ff = 32, 64
    c.train.steps, c.train.batch_size, c.train.warmup_steps = 8, 8, 2
    c.train.log_every, c.train.eval_every, c.train.eval_batches = 4, 8, 2
    c.train.checkpoint_every, c.train.keep_steps = 8, KEEP_TINY
  else:
    c.train.steps, c.train.warmup_steps = STEPS, 100
    c.train.log_every, c.train.eval_every, c.train.eval_batches = 20, 1000, 20  # log: the formation figure's loss
    c.train.checkpoint_every, c.train.keep_steps = STEPS, KEEP
  return c


def analysis_config(tiny: bool = False):
  """The attention analysis of every kept step, induction only (no treebank): scores, ICL, causal check."""
  c = specialization.analysis_config("attention", small=True)
  c.data_dir = ""
  c.treebank = ""
  c.induction.n = (SEQ_LEN - 1) // 2  # [BOS] + 2 × 15 tokens in the 32-token context
  c.induction.draw = "text"  # r from the ids the text uses: its 1,000 pieces hold 256 byte pieces it never uses
  c.induction.num_tokens = 8192
  if tiny:
    c.induction.n, c.induction.num_sequences, c.induction.num_tokens = 10, 8, 512
    c.induction.causal.num_sequences, c.induction.causal.random_seeds = 8, 1
    c.roles.bootstrap_resamples = 20
  return c


def diversity_config(tiny: bool = False):
  """The diversity metrics (docs/diversity.md) at every kept step on 4,096 of the run's validation tokens."""
  c = specialization.analysis_config("diversity", small=True)
  c.data_dir = ""
  if tiny:
    c.num_tokens = 512
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


def sae_config(tiny: bool = False):
  """A TopK SAE on each layer's z at every kept step (docs/sae.md), the natural-text setting's small sizes (z is
  64 wide here: 128 features), on the run's validation text; no treebank (the features' contexts are not this
  setting's question; `headspec study` sets S_h beside the probes' selectivity)."""
  c = specialization.sae_stage_config(small=True)
  c.data_dir = ""
  c.analysis.treebank = ""
  if tiny:
    c.train_tokens, c.eval_tokens = 1024, 512
    c.sae.features, c.sae.k, c.sae.train_steps, c.sae.batch_size, c.sae.warmup_steps = 32, 4, 20, 64, 2
  return c
