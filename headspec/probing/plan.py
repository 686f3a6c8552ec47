"""What a probe study will do, checked before any work: its config, its (model, step)s, its feature groups."""

from __future__ import annotations

from headspec.errors import UserError
from headspec.probing import controls, features
from headspec.probing import tasks as tasks_lib
from headspec.runs import targets


def check_config(config) -> None:
  """Every `probe.*` value a study reads (tasks, pooling, cache dtype, sizes); UserError on the first bad one."""
  p = config.probe
  tasks_lib.from_config(config)
  features.check_options(p.pooling, p.cache_dtype)
  if (
    min(p.max_train_words, p.arc_max_train_words, p.get("max_iter", 0)) < 0
    or min(p.batch_tokens, p.bootstrap_resamples, p.arc_epochs, p.get("arc_rank", 1), p.get("arc_patience", 1)) < 1
    or not len(p.l2_grid)
    or not len(p.get("arc_l2_grid", (1,)))
    or not p.get("tol", 1.0) > 0
  ):
    raise UserError(
      "probe.max_train_words, arc_max_train_words and max_iter must be >= 0; probe.batch_tokens, "
      "bootstrap_resamples, arc_epochs, arc_rank and arc_patience >= 1; probe.tol > 0; probe.l2_grid and "
      "probe.arc_l2_grid non-empty"
    )
  rank = p.get("structural_rank", 1)
  if (
    min(p.get("structural_epochs", 1), p.get("structural_patience", 1), 1 if rank is None else rank) < 1
    or p.get("structural_max_train_words", 0) < 0
    or not p.get("structural_learning_rate", 1.0) > 0
    or p.get("structural_batch_sentences", 1) < 1
  ):
    raise UserError(
      "probe.structural_rank, structural_epochs, structural_patience and structural_batch_sentences must be "
      ">= 1, structural_max_train_words >= 0 and structural_learning_rate > 0"
    )
  from headspec.probing import structural

  if p.get("structural_punctuation", "upos") not in structural.PUNCTUATION:
    raise UserError(
      f"probe.structural_punctuation={p.structural_punctuation!r}: use one of {', '.join(structural.PUNCTUATION)}"
    )
  if p.get("structural_scale", "raw") not in structural.SCALES:
    raise UserError(f"probe.structural_scale={p.structural_scale!r}: use one of {', '.join(structural.SCALES)}")
  tasks_lib.control_lambda(config)  # 'tied' | 'separate'
  fractions = [float(f) for f in p.get("mdl_fractions", (1.0,))]
  if not fractions or fractions[-1] != 1.0 or any(not 0 <= a < b for a, b in zip([0.0] + fractions, fractions)):
    raise UserError(f"probe.mdl_fractions={tuple(fractions)}: increasing fractions in (0, 1] ending at 1.0")
  if p.get("mdl_only", False) and not p.get("mdl", False):
    raise UserError("probe.mdl_only=True computes only probes/mdl.csv: it needs probe.mdl=True")
  if p.get("arc_control", "hewitt_liang") not in controls.ARC_CONTROLS:
    raise UserError(f"probe.arc_control={p.arc_control!r}: use one of {', '.join(controls.ARC_CONTROLS)}")


def plan_jobs(config, workdir) -> list[targets.Target]:
  """The (model, step)s to probe, checked (steps exist, pretrained name valid) before any work."""
  p = config.probe
  return targets.plan(config, workdir, steps=p.steps, model_name=p.model_name, random_baseline=p.random_baseline)


def feature_sources(cfg):
  """(layer, heads, reader(features) -> x_NGK) for every layer's heads (G = H groups of K), then every
  residual stream (G = 1 group of D; layer -1 is the embeddings): the rows of results.csv."""
  sources = [(l, list(range(cfg.num_heads)), lambda f, l=l: f.z(l)) for l in range(cfg.num_layers)]
  sources += [(l, [-1], lambda f, l=l: f.residual(l)[:, None, :]) for l in range(-1, cfg.num_layers)]
  return sources
