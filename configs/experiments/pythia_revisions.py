"""The specialization study over a published training series: Pythia's checkpoints, nothing trained.

  headspec launch local --experiment=configs/experiments/pythia_revisions.py --workdir=runs/pythia
  headspec launch local --experiment=configs/experiments/pythia_revisions.py:model=pythia-410m,coarse \
    --workdir=runs/pythia410

EleutherAI publishes each Pythia model at 154 revisions (`step0`, `step1`, `step2`, `step4`, ..., `step512`,
then every 1,000 steps to `step143000`). This experiment reads the log-spaced ones below as the steps of one
"run", ROOT/<model>, through `model.pretrained=hf:EleutherAI/<model>@step0,step1,...` (docs/pretrained.md:
each revision's step is the number it names), and runs the analyses of configs/experiments/specialization.py
on them: the probe suite on EWT and the diversity metrics at every revision, the attention analyses at
every revision, the ablation suite with the causal test at the last, the atlas, then `headspec study`
(ROOT/study/: emergence over steps, diversity, roles, causal, rankings). Nothing is trained: the run has no
training stage (experiments.Run with config ''). Needs `pip install huggingface_hub` and network on first
use (each revision is about 0.3 GB for pythia-160m, cached in HF_HOME; later runs work with
HF_HUB_OFFLINE=1); a revision with PyTorch .bin weights only is one line when a stage plans. Resumable like every experiment: run the same command again.

Arguments (comma-separated, any order):
  model=NAME       an EleutherAI Pythia model (default pythia-160m: 12 layers × 12 heads); the deduped
                   series works too (model=pythia-160m-deduped)
  coarse           6 revisions instead of 19 (step0, step64, step512, step4000, step32000, step143000)
  probe | diversity | attention | ablate     the analysis config of that stage
"""

from headspec.configs.experiments import specialization

STEPS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1000, 2000, 4000, 8000, 16000, 32000, 64000, 143000)
STEPS_COARSE = (0, 64, 512, 4000, 32000, 143000)
ME = "configs/experiments/pythia_revisions.py"


def _args(arg):
  out = {"model": "pythia-160m", "coarse": False, "stage": ""}
  for a in [a.strip() for a in (arg or "").split(",") if a.strip()]:
    key, _, value = a.partition("=")
    if a == "coarse":
      out["coarse"] = True
    elif a in specialization.ANALYSES:
      out["stage"] = a
    elif key == "model" and value.startswith("pythia-"):
      out["model"] = value
    else:
      raise ValueError(
        f"{ME}: bad argument {a!r} (use model=pythia-NAME, coarse, {', '.join(specialization.ANALYSES)})"
      )
  return out


def pretrained(arg: str | None = None) -> str:
  """`hf:EleutherAI/<model>@step0,step1,...`: the revisions the analyses read as steps."""
  a = _args(arg)
  steps = STEPS_COARSE if a["coarse"] else STEPS
  return f"hf:EleutherAI/{a['model']}@" + ",".join(f"step{s}" for s in steps)


def experiment(arg: str | None = None):
  """One published series as a run without training, the specialization study's analyses on it."""
  from headspec.launch.experiments import Experiment, Run

  a = _args(arg)
  if a["stage"]:
    raise ValueError(f"{ME}: {a['stage']!r} names a stage's config, not an experiment")
  tag = ",".join([f"model={a['model']}", *(["coarse"] if a["coarse"] else [])])
  return Experiment(
    runs=(Run(a["model"], "", "published", 0),),  # config '': no training stage
    analyses=tuple((s, f"{ME}:{tag},{s}") for s in specialization.ANALYSES) + (("atlas", ""),),
  )


def get_config(arg: str | None = None):
  a = _args(arg)
  if not a["stage"]:
    raise ValueError(f"{ME}: nothing to train; give a stage ({', '.join(specialization.ANALYSES)})")
  c = specialization.analysis_config(a["stage"])
  c.model.pretrained = pretrained(arg)
  if a["stage"] == "probe":
    c.probe.steps = "all"
  elif a["stage"] != "ablate":  # ablation (and its causal test) at the last revision only
    c.steps = "all"
  return c
