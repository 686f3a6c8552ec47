"""The study: when does head specialization emerge, and do the specialized heads matter? (docs/study.md)

One command runs all of it (headspec/launch/experiments.py; resumable: run it again after an interruption):

  headspec launch local --experiment=configs/experiments/specialization.py:small,corpus=english_mix --workdir=runs/natural
  headspec launch local --experiment=configs/experiments/specialization.py:small,corpus=english_mix,seed=1 --workdir=...
  headspec launch multi-gpu --experiment=configs/experiments/specialization.py --workdir=runs/spec

Every run is a 6-layer, 8-head causal decoder (dropout 0.1: the setting of the diversity seed notes) on
WikiText-103 from HEADSPEC_DATA_DIR (`headspec data download text wikitext_103`; `corpus=english_mix` for the
development corpus: `headspec data download text english_mix`), with checkpoints on a log-spaced schedule
from step 0. Conditions, 3 seeds each: `baseline`, `drophead` (DropHead p=0.1, Zhou et al. 2020) and
`disagreement` (Li et al. 2018's output disagreement, weight 0.01). At every kept step: the probe suite
on EWT (upos, xpos, deprel, arc, distance, depth; controls, bootstrap CIs), the diversity metrics, the
attention analyses (Clark table on the arcs a decoder sees, head roles, previous-token and induction
scores); at the last step the ablation suite with the causal test of specialization; at every kept step a
TopK sparse autoencoder on each layer's z (`headspec sae`, docs/sae.md: the heads' feature specialization),
then the run's head atlas (atlas.html);
all-MiniLM-L6-v2 through the same probe suite and Clark table; then `headspec study` writes ROOT/study/
(tables, figures, summary.md).

Arguments (comma-separated, any order):
  small            the CPU setting (the bridge to the GPU one): d_model 128, 800 steps of 16×64 tokens (0.8M
                   tokens), steps 0, 200, 800 kept, 3 seeds per condition, probes of the heads (not the
                   residual streams) on 4k EWT training words, the causal check of induction heads at
                   the last step only. The 9 runs and reports took 80 min on a 2-core CPU as two parts
                   side by side (docs/study.md); far too short to show induction heads.
  corpus=NAME      the training text: wikitext_103 (the default) | english_mix (the development corpus, 4.2M
                   words of NLTK corpora; the measurements in docs/study.md used it); both downloadable with
                   `headspec data download text NAME`
  condition=NAME   baseline | drophead | disagreement: a training config; for --experiment, a part (that
                   condition's runs; with seed=N, one run). Parts list the same runs with the same configs,
                   so the whole command afterwards skips what they did. MiniLM runs with the whole command
                   only, so parts may run side by side
  seed=N           the training seed; for --experiment, a part (that seed's run of each condition)
  probe | diversity | attention | ablate | sae     the analysis config of that stage instead of a training config
  minilm           with probe or attention: the same analysis of all-MiniLM-L6-v2

Full setting (GPU): d_model 256, d_ff 1024, 3,000 steps of 32×256 tokens (25M tokens per run), steps 0,
10, 30, 100, 300, 1000, 3000 kept, 9 runs. Learning rate 1e-3 (warmup, then cosine decay), tuned from the
seed notes' 1e-2 with batch 32: in the small setting (seed 0, 800 steps) 1e-2 ended at validation loss
6.14 nats/token and 1e-3 at 5.85 (docs/study.md). Expect more than one 45-minute GPU session (an ESTIMATE, not measured: no GPU
was lent to this project): run the same command again and it resumes at the first unfinished stage.
"""

from headspec.train.config import train_config

CONDITIONS = {  # condition -> train.regularizers overrides
  "baseline": {},
  "drophead": {"drophead": 0.1},
  "disagreement": {"output": 0.01},
}
KEEP = (0, 10, 30, 100, 300, 1000, 3000)
KEEP_SMALL = (0, 200, 800)  # step 30 could not be told from step 0 (docs/study.md)
SEEDS = (0, 1, 2)  # per condition, in both settings: claims that compare conditions need seed intervals
ANALYSES = ("probe", "diversity", "attention", "ablate")  # also the grammar setting's (configs/experiments/grammar.py)
STAGES = (*ANALYSES, "sae")  # this setting's: then SAEs on every layer's z at every kept step (after probe: beside it)
CORPORA = {"wikitext_103": "wikitext_103", "wikitext-103": "wikitext_103", "english_mix": "english_mix"}
CORPUS = "wikitext_103"  # downloadable: `headspec data download text wikitext_103`


def _args(arg):
  out = {"small": False, "condition": "baseline", "seed": 0, "stage": "", "minilm": False, "corpus": CORPUS}
  for a in [a.strip() for a in (arg or "").split(",") if a.strip()]:
    key, _, value = a.partition("=")
    if a == "small":
      out["small"] = True
    elif a == "minilm":
      out["minilm"] = True
    elif a in STAGES:
      out["stage"] = a
    elif key == "condition" and value in CONDITIONS:
      out["condition"] = value
    elif key == "seed" and value.lstrip("-").isascii() and value.lstrip("-").isdigit():
      out["seed"] = int(value)
    elif key == "corpus" and value in CORPORA:
      out["corpus"] = CORPORA[value]
    else:
      raise ValueError(
        f"configs/experiments/specialization.py: bad argument {a!r} (use small, condition={'|'.join(CONDITIONS)}, "
        f"seed=N, corpus=wikitext_103|english_mix, {', '.join(STAGES)}, minilm)"
      )
  return out


def experiment(arg: str | None = None):
  """The runs, analyses and references of the study (headspec/launch/experiments.py runs them in order)."""
  from headspec.launch.experiments import Experiment, Run

  a = _args(arg)
  small = a["small"]
  me = "configs/experiments/specialization.py"
  tag = "small," if small else ""
  corpus = f"corpus={a['corpus']}," if a["corpus"] != CORPUS else ""
  if a["stage"] or a["minilm"]:  # would be ignored: the runs' configs carry neither
    raise ValueError(f"{me}: the stage names and minilm are for single configs, not for the experiment ({arg!r})")
  conditions, seeds = tuple(CONDITIONS), SEEDS
  if arg and "condition=" in arg:  # one part of the setting (run the parts, then the whole command resumes)
    conditions = (a["condition"],)
  if arg and "seed=" in arg:  # a smaller part: that seed's run (of each condition, or of condition=NAME)
    seeds = (a["seed"],)
  runs = tuple(
    Run(f"{condition}_s{seed}", f"{me}:{tag}{corpus}condition={condition},seed={seed}", condition, seed)
    for condition in conditions
    for seed in seeds
  )
  part = len(runs) < len(CONDITIONS) * len(SEEDS)
  return Experiment(
    runs=runs,
    analyses=tuple((a, f"{me}:{tag}{a}") for a in STAGES) + (("atlas", ""),),
    # the whole command only: stages have no lock, and parts may run side by side
    references=() if part else tuple(("minilm", a, f"{me}:{tag}{a},minilm") for a in ("probe", "attention")),
  )


def get_config(arg: str | None = None):
  a = _args(arg)
  if a["stage"]:
    c = analysis_config(a["stage"], small=a["small"], minilm=a["minilm"])
    if a["small"]:
      _natural_text_cuts(c, a["stage"], minilm=a["minilm"])
    return c
  if a["minilm"]:
    raise ValueError("configs/experiments/specialization.py: 'minilm' goes with probe or attention")
  c = train_config()
  c.seed = a["seed"]
  c.data.corpus = a["corpus"]
  c.model.num_layers, c.model.num_heads = 6, 8
  c.model.dropout = c.model.attention_dropout = 0.1
  for key, value in CONDITIONS[a["condition"]].items():
    c.train.regularizers[key] = value
  c.train.learning_rate = 1e-3
  if a["small"]:
    c.data.vocab_size = 4000
    c.model.d_model, c.model.d_head, c.model.d_ff = 128, 16, 512
    c.train.steps, c.train.batch_size, c.train.seq_len = 800, 16, 64
    c.train.warmup_steps = 50
    c.train.log_every, c.train.eval_every, c.train.eval_batches = 20, 200, 10
    c.train.checkpoint_every, c.train.keep_steps = 800, KEEP_SMALL
  else:
    c.train.steps, c.train.batch_size, c.train.seq_len = 3000, 32, 256
    c.train.warmup_steps = 300
    c.train.log_every, c.train.eval_every = 50, 500
    c.train.checkpoint_every, c.train.keep_steps = 1000, KEEP
  return c


def _natural_text_cuts(c, stage: str, *, minilm: bool) -> None:
  """The natural-text setting's own cuts, sizing its 9 runs to within two hours on 2 CPU cores (docs/study.md).
  Not in `analysis_config`, from which the grammar and induction settings start."""
  if stage == "probe" and not minilm:
    # heads only: the residual streams were over half of a probe step; no head's rows change (probing/suite.py)
    c.probe.residuals = False
  if stage == "attention":
    # the causal check of induction heads was 79 s of a 129 s attention step, in a setting that forms none
    c.induction.causal.steps = "last"


def analysis_config(stage: str, *, small: bool = False, minilm: bool = False):
  """The study's analysis config of `stage` (also the grammar and induction settings' starting point)."""
  if stage == "probe":
    from headspec.probing.config import probe_config

    c = probe_config()
    c.probe.treebank = "en_ewt"
    if small:  # fewer words, penalties, iterations and resamples: about 2 minutes a step on 2 cores
      c.probe.max_train_words = c.probe.arc_max_train_words = 4000
      c.probe.l2_grid, c.probe.arc_l2_grid = (1e-4, 1e-3), (1e-3, 1e-2)
      c.probe.max_iter, c.probe.arc_epochs = 50, 4
      c.probe.bootstrap_resamples = 200
  elif stage == "diversity":
    from headspec.diversity.config import diversity_config

    c = diversity_config()
    c.num_tokens = 4096 if small else 10000
  elif stage == "attention":
    from headspec.attention.config import attention_config

    c = attention_config()
    c.steps = "all"
    c.clark.arcs = "reachable"  # what a decoder can see, for the trained runs and MiniLM alike (docs/attention.md)
    if small:
      c.max_sentences = 300
      c.clark.min_count = 50
      c.roles.bootstrap_resamples = 200
      c.pictures.sentences = (0,)
      c.induction.n = 25  # [BOS] + 50 tokens in the 64-token context
      c.induction.num_tokens = 4096
  elif stage == "sae":
    c = sae_stage_config(small)
  else:
    from headspec.ablation.config import ablate_config

    c = ablate_config()
    c.steps = "last"
    c.methods = "zero,mean,importance,pruning,causal"
    c.pruning.rankings = "importance,ablation,probe,random"
    if small:
      c.num_tokens = 4096
      c.bootstrap_resamples = 200
      c.pruning.random_seeds = 3
  if minilm:
    if stage not in ("probe", "attention"):
      raise ValueError(f"configs/experiments/specialization.py: 'minilm' goes with probe or attention, not {stage}")
    c.model.pretrained = "minilm"
  return c


def sae_stage_config(small: bool = False):
  """`headspec sae` at every kept step, one TopK SAE per layer's z, each head's z at unit RMS (docs/sae.md; the
  study's sae tables). Small: CPU-sized (2× the width of z in features, 400 steps of 256 tokens on 16k tokens,
  200 EWT dev sentences for the features' contexts); full: 4×, 2,000 steps of 1,024 on 100k tokens, every EWT
  dev sentence."""
  from headspec.sae.config import sae_config

  c = sae_config()
  c.steps, c.layers = "all", "all"
  c.sae.expansion, c.sae.train_steps, c.sae.batch_size = 4.0, 2000, 1024
  c.sae.normalize = "per_head"  # each head's z at unit RMS: S_h not driven by a head's output scale
  if small:
    c.train_tokens, c.eval_tokens = 16384, 4096
    c.sae.expansion, c.sae.train_steps, c.sae.batch_size, c.sae.warmup_steps = 2.0, 400, 256, 40
    c.sae.dead_after_tokens = 20000  # of the 102k tokens drawn: AuxK reaches latents dead for a fifth of them
    c.analysis.max_sentences = 200
  return c
