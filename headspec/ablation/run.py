"""`headspec ablate`: head ablations, importance, pruning, L0 gates, the causal probe test, interactions.

For each (model, step) of `targets.plan` (a run's saved steps, or a pretrained model at step 0) the
stages named in `config.methods` run on one fixed evaluation set (headspec/words/evalset.py) and
their rows go through `tables.merge` into RUN/ablation/{heads,pruning,gates,causal,interactions}.csv
(docs/outputs.md), figures beside them (plots.py). Everything a user can get wrong (unknown method or
ranking, a run without checkpoints, probe results of another architecture, L0 gates on a model without
a trained LM head, a foreign table file) is a UserError raised before any computation or write.
Formulas and sources: docs/ablation.md and each module's docstring. RUN may be a URL (gs://bucket/run):
tables and figures are written there whole.
"""

from __future__ import annotations

import dataclasses
import pathlib
import time

import ml_collections
import numpy as np
from absl import logging
from etils import epath

from headspec.ablation import causal, core, gates, interactions, metrics, plots, pruning
from headspec.errors import UserError
from headspec.io import filenames, provenance, remote, tables
from headspec.runs import directory as runs
from headspec.runs import targets
from headspec.words import evalset as evalset_lib
from headspec.words import jobloop
from headspec.words.alignment import POOLINGS
from headspec.words.selectivity import read_selectivity

HEAD_METHODS = ("zero", "mean", "keep_only", "importance", "magnitude", "entropy")
METHODS = HEAD_METHODS + ("pruning", "gates", "causal", "interactions")
TABLES = (
  tables.ABLATION_HEADS,
  tables.ABLATION_PRUNING,
  tables.ABLATION_GATES,
  tables.ABLATION_CAUSAL,
  tables.ABLATION_INTERACTIONS,
)


def _names(value) -> tuple[str, ...]:
  """A tuple, list or comma-separated string of names."""
  if isinstance(value, str):
    return tuple(x.strip() for x in value.split(",") if x.strip())
  return tuple(value)


def check_config(config) -> tuple[tuple[str, ...], tuple[str, ...]]:
  """(methods, pruning rankings), every value checked; one UserError line otherwise."""
  methods, rankings = _names(config.methods), _names(config.pruning.rankings)
  unknown = [m for m in methods if m not in METHODS]
  if unknown or not methods:
    raise UserError(f"methods: unknown method(s) {unknown or list(methods)}; choose from {', '.join(METHODS)}")
  unknown = [r for r in rankings if r not in pruning.RANKINGS]
  if unknown:
    raise UserError(f"pruning.rankings: unknown ranking(s) {unknown}; choose from {', '.join(pruning.RANKINGS)}")
  checks = [
    (config.num_tokens > 0, f"num_tokens={config.num_tokens}: must be positive"),
    (config.batch_size > 0 and config.batch_tokens > 0, "batch_size and batch_tokens must be positive"),
    (config.num_sentences > 0, f"num_sentences={config.num_sentences}: must be positive"),
    (config.bootstrap_resamples > 0, "bootstrap_resamples must be positive"),
    (0 < config.pruning.step_fraction <= 1, f"pruning.step_fraction={config.pruning.step_fraction}: in (0, 1]"),
    (config.pruning.random_seeds >= 1, "pruning.random_seeds must be >= 1"),
    (config.gates.steps >= 1 and len(config.gates.penalties) > 0, "gates.steps >= 1 and gates.penalties non-empty"),
    (all(p >= 0 for p in config.gates.penalties), "gates.penalties must be >= 0"),
    (config.causal.random_seeds >= 1, "causal.random_seeds must be >= 1"),
    (config.causal.pooling in ("auto", *POOLINGS), f"causal.pooling={config.causal.pooling!r}: use auto or {POOLINGS}"),
    (config.interactions.top >= 2, "interactions.top must be >= 2"),
  ]
  for ok, message in checks:
    if not ok:
      raise UserError(message)
  return methods, rankings


def _sentence_windows(config, tokenizer, max_len: int, kind: str) -> list[np.ndarray]:
  """The first `num_sentences` sentences of `treebank`/`split`, as token windows with their specials."""
  from headspec.data import treebank as treebank_lib
  from headspec.words import alignment as align
  from headspec.words import batches as words_lib

  data_root = targets.data_dir(config, purpose=f"the {config.treebank} {config.split} sentences")
  sentences = treebank_lib.load_split(data_root, config.treebank, config.split)[: config.num_sentences]
  kept, _ = words_lib.representable_sentences(sentences, tokenizer, max_len, where=f"{config.treebank}/{config.split}")
  return align.align([s.words for s in kept], tokenizer, max_len, causal=kind == "decoder").windows


def evaluation_set(config, workdir, job: targets.Target, tokenizer, model_cfg) -> evalset_lib.EvalSet:
  """The evaluation set of `job`: LM rows (trained LM head) or sentences / rows for embedding_shift.

  A run's rows are its own validation tokens and a pretrained LM's the valid split of `corpus`, both as
  the diversity command's `evaluation_tokens` reads them; a pretrained model without LM head (MiniLM) reads
  the first `num_sentences` sentences of `treebank`/`split` (EWT dev).
  """
  from headspec.runs.evaltext import evaluation_tokens  # the evaluation text every analysis reads

  if config.model.pretrained and not job.lm_head:
    windows = _sentence_windows(config, tokenizer, model_cfg.max_len, model_cfg.kind)
    return evalset_lib.sentence_embedding_set(
      windows, pad_id=tokenizer.pad_id, max_len=model_cfg.max_len, batch_tokens=config.batch_tokens
    )
  tokens_NT, valid_NT = evaluation_tokens(config, workdir, tokenizer)
  if not job.lm_head:
    return evalset_lib.token_rows_embedding_set(tokens_NT, valid_NT, batch_size=config.batch_size)
  return evalset_lib.lm_eval_set(
    tokens_NT, valid_NT, model_kind=model_cfg.kind, tokenizer=tokenizer, batch_size=config.batch_size, seed=config.seed
  )


@dataclasses.dataclass
class _Plan:
  """Everything checked before the first computation."""

  jobs: list
  methods: tuple
  rankings: tuple
  selectivity: dict  # (name, step) -> headspec.words.selectivity.Selectivity | None
  data_root: pathlib.Path | None
  probe_config: ml_collections.ConfigDict | None = None  # the probe stage's settings (causal.probe_settings)


class Ablation(jobloop.Analysis):
  """`headspec ablate` in the job loop's parts."""

  name = "ablate"

  def plan(self):
    config = self.config
    self.t0 = time.perf_counter()
    self.methods, self.rankings = check_config(config)
    return targets.plan(
      config, self.workdir, steps=config.steps, model_name=config.model_name, random_baseline=config.random_baseline
    )

  def tables(self, jobs):
    return TABLES

  def prepare(self, jobs):
    """The checks that need a model: gates vs LM head, probe results vs the model's shape."""
    config, methods, rankings = self.config, self.methods, self.rankings
    if "gates" in methods and not jobs[0].lm_head:
      raise UserError(
        f"L0 gates need a trained LM head; {jobs[0].name} has none (its LM loss means nothing): drop 'gates' from methods"
      )
    model, _ = jobs[0].load()
    L, H = model.cfg.num_layers, model.cfg.num_heads
    selectivity = {}
    if "causal" in methods or "probe" in rankings:
      for job in jobs:
        selectivity[(job.name, job.step)] = read_selectivity(self.workdir, job.name, job.step, L, H)
    data_root = None
    if "causal" in methods and any(selectivity.values()):
      run_config = None if config.model.pretrained else runs.read_config(self.workdir)
      data_root = targets.data_dir(config, run_config, purpose="the treebank of the causal probe test")
    probe_config = causal.probe_settings(self.workdir) if data_root is not None else None
    self.plan_ = _Plan(jobs, methods, rankings, selectivity, data_root, probe_config)
    self.sets, self.task_cache = {}, {}
    logging.info(f"ablate: {len(jobs)} model step(s), methods {', '.join(methods)}")

  def job(self, job):
    model, tokenizer = job.load()
    if job.lm_head not in self.sets:
      self.sets[job.lm_head] = evaluation_set(self.config, self.workdir, job, tokenizer, model.cfg)
    rows = ablate_job(job, model, self.sets[job.lm_head], self.config, self.plan_, self.task_cache, tokenizer)
    self.drawn = (rows, model.cfg.num_layers, model.cfg.num_heads)  # drawn once the tables hold them
    kept = lambda r: r["kind"] != "probe_selective"  # ablation/causal.csv's induction rows: attention's
    return {
      table: jobloop.Rows(rows[table], others=kept) if table is tables.ABLATION_CAUSAL else rows[table]
      for table in TABLES
      if rows[table]
    }

  def merged(self, job):
    for path in _figures(self.workdir / "ablation", job, *self.drawn):
      logging.info(f"  wrote {path}")

  def finish(self, jobs):
    out_dir = self.workdir / "ablation"
    print(f"ablate: tables in {out_dir} ({time.perf_counter() - self.t0:.0f} s)", flush=True)
    return remote.native_path(out_dir)


def _bar(total: int, desc: str):
  return jobloop.progress(total, desc, unit="call")


def _head_rows(method, metric, value_LH, low_LH=None, high_LH=None) -> list[dict]:
  L, H = np.shape(value_LH)
  nan = np.full((L, H), np.nan)
  low_LH, high_LH = nan if low_LH is None else low_LH, nan if high_LH is None else high_LH
  return [
    dict(
      method=method, layer=l, head=h, metric=metric, value=value_LH[l, h], ci_low=low_LH[l, h], ci_high=high_LH[l, h]
    )
    for l in range(L)
    for h in range(H)
  ]


@dataclasses.dataclass(frozen=True)
class _Stage:
  """What every stage of one (model, step) reads."""

  model: object
  es: evalset_lib.EvalSet
  config: ml_collections.ConfigDict
  plan: _Plan
  tag: str  # '<model> step <step>', for the log lines and progress bars


def ablate_job(job, model, es, config, plan: _Plan, task_data_cache: dict, tokenizer) -> dict:
  """Every requested stage for one (model, step): {table: rows} (a list per table of TABLES)."""
  cfg = model.cfg
  L, H = cfg.num_layers, cfg.num_heads
  methods, kind = plan.methods, es.kind
  R, seed = config.bootstrap_resamples, config.seed
  tag = f"{job.name} step {job.step}"
  out = {t: [] for t in TABLES}
  zero = core.zero_replacement(model)
  mean_z, entropy = core.head_statistics(model, es)
  full = core.run_one(model, es, np.ones((L, H)), zero)
  base = metrics.values(kind, full, full)
  logging.info(f"{tag}: {es.description}; unablated " + ", ".join(f"{k} {v:.4f}" for k, v in base.items()))

  eye = np.eye(H, dtype=np.float32)
  sweeps = {"zero": (1 - eye, zero), "mean": (1 - eye, mean_z), "keep_only": (eye, zero)}
  wanted = [m for m in sweeps if m in methods]
  if "zero" not in wanted and "ablation" in plan.rankings and "pruning" in methods:
    wanted.insert(0, "zero")
  single = {}
  if wanted:
    with _bar(len(wanted) * len(es.batches), f"{tag}: single-head sweeps ({', '.join(wanted)})") as bar:
      for method in wanted:
        rows_EH, replacement = sweeps[method]
        _, swept = core.run_sweep(model, es, np.broadcast_to(rows_EH, (L, H, H)), replacement, progress=bar)
        d = metrics.deltas(kind, full, swept.reshape(L * H, *full.shape), resamples=R, seed=seed)
        single[method] = d
        if method in methods:
          for metric, (v, lo, hi) in d.items():
            out[tables.ABLATION_HEADS] += _head_rows(method, metric, *(x.reshape(L, H) for x in (v, lo, hi)))

  importance = None
  if {"importance", "interactions"} & set(methods) or ("pruning" in methods and "importance" in plan.rankings):
    with _bar(len(es.batches), f"{tag}: importance") as bar:
      raw_importance = metrics.raw_importance(model, es, progress=bar)
      importance = metrics.normalise_per_layer(raw_importance)
    if "importance" in methods:
      out[tables.ABLATION_HEADS] += _head_rows("importance", "score", importance)
      # Unnormalised too: the per-layer norm erases differences between layers (comparisons across layers).
      out[tables.ABLATION_HEADS] += _head_rows("importance", "raw_score", raw_importance)
  if "magnitude" in methods:
    out[tables.ABLATION_HEADS] += _head_rows("magnitude", "score", metrics.magnitude(model))
  if "entropy" in methods:
    out[tables.ABLATION_HEADS] += _head_rows("entropy", "score", entropy)

  selectivity = plan.selectivity.get((job.name, job.step))
  stage = _Stage(model, es, config, plan, tag)
  if "pruning" in methods:
    out[tables.ABLATION_PRUNING] = _pruning(stage, full, single, importance, entropy, selectivity)
  if "gates" in methods:
    if job.lm_head:
      out[tables.ABLATION_GATES] = _gates(stage)
    else:
      logging.info(f"{tag}: gates skipped (no trained LM head)")
  if "causal" in methods:
    if selectivity is None:
      logging.info(f"{tag}: causal test skipped (no probe results for it in probes/results.csv)")
    else:
      lm_set = es if job.lm_head else None
      out[tables.ABLATION_CAUSAL] = _causal(stage, lm_set, mean_z, selectivity, task_data_cache, tokenizer)
  if "interactions" in methods:
    heads = interactions.top_heads(importance, min(config.interactions.top, L * H))
    n = len(heads) * (len(heads) + 1) // 2 + 1
    with _bar(-(-n // core.MASKS_PER_CALL), f"{tag}: interactions of the top {len(heads)} heads") as bar:
      out[tables.ABLATION_INTERACTIONS] = interactions.interactions(model, es, heads, progress=bar)
  for rows in out.values():
    for r in rows:
      r.update(model=job.name, step=job.step)
  for r in out[tables.ABLATION_CAUSAL]:
    r["kind"] = "probe_selective"
  return out


def _pruning(stage: _Stage, full, single: dict, importance, entropy, selectivity) -> list[dict]:
  """ablation/pruning.csv rows: every ranking's pruning curve (`full`: the unablated outputs)."""
  model, es, config, plan, tag = stage.model, stage.es, stage.config, stage.plan, stage.tag
  L, H = model.cfg.num_layers, model.cfg.num_heads
  p = config.pruning
  counts = pruning.schedule(L * H, p.step_fraction)
  fixed = {}
  main_metric = "loss_delta" if es.kind == "lm" else "embedding_shift"
  for ranking in plan.rankings:
    if ranking == "ablation":
      # The single-head zero-ablation effect (loss increase, or embedding shift): smallest first.
      fixed[(ranking, -1)] = single["zero"][main_metric][0].reshape(L, H)
    elif ranking == "magnitude":
      fixed[(ranking, -1)] = metrics.magnitude(model)
    elif ranking == "entropy":
      fixed[(ranking, -1)] = -entropy
    elif ranking == "probe":
      if selectivity is None:
        logging.info(f"{tag}: pruning by probe selectivity skipped (no probe results for it)")
      else:
        fixed[(ranking, -1)] = np.max(np.stack(list(selectivity.by_task.values())), axis=0)
    elif ranking == "random":
      for s in range(p.random_seeds):
        fixed[(ranking, s)] = pruning.random_scores((L, H), config.seed + s)
  masks = {key: pruning.fixed_masks(scores, counts) for key, scores in fixed.items()}
  if "importance" in plan.rankings:
    if p.rerank:
      score_fn = lambda mask: metrics.normalise_per_layer(metrics.raw_importance(model, es, mask))
      with _bar(len(counts) - 1, f"{tag}: pruning by importance (re-ranked each step)") as bar:
        masks[("importance", -1)] = pruning.iterative_masks(score_fn, (L, H), counts, progress=bar)
    else:
      masks[("importance", -1)] = pruning.fixed_masks(importance, counts)
  keys = list(masks)
  flat = [m for key in keys for m in masks[key]]
  with _bar(-(-len(flat) // core.MASKS_PER_CALL), f"{tag}: pruning curves ({len(flat)} masks)") as bar:
    values = core.run_masks(model, es, flat, core.zero_replacement(model), progress=bar)
  rows, i = [], 0
  for ranking, s in keys:
    for n in counts:
      for metric, value in metrics.values(es.kind, values[i], full).items():
        rows.append(
          dict(ranking=ranking, seed=s, heads_pruned=n, fraction_pruned=n / (L * H), metric=metric, value=value)
        )
      i += 1
  return rows


def _gates(stage: _Stage) -> list[dict]:
  """ablation/gates.csv rows: L0 gates fitted per penalty, scored on the held-out half."""
  model, es, config, tag = stage.model, stage.es, stage.config, stage.tag
  g = config.gates
  L, H = model.cfg.num_layers, model.cfg.num_heads
  fit_set, held_out = es.halves()
  zero = core.zero_replacement(model)
  full = metrics.values("lm", core.run_one(model, held_out, np.ones((L, H)), zero))
  rows = []
  with _bar(len(g.penalties), f"{tag}: L0 gates ({g.steps} steps per λ)") as bar:
    for penalty in g.penalties:
      log_alpha = gates.fit_gates(
        model, fit_set, penalty, steps=g.steps, learning_rate=g.learning_rate, init_log_alpha=g.init_log_alpha,
        seed=config.seed,
      )  # fmt: skip
      z = np.asarray(gates.deterministic_gates(log_alpha))
      p_open = np.asarray(gates.open_probability(log_alpha))
      scored = metrics.values("lm", core.run_one(model, held_out, z, zero))
      kept = int((z > 0).sum())
      summary = dict(
        expected_l0=float(p_open.sum()),
        loss=scored["loss"],
        accuracy=scored["accuracy"],
        loss_delta=scored["loss"] - full["loss"],
      )
      common = dict(penalty=penalty, heads_kept=kept)
      rows += [
        dict(common, layer=-1, head=-1, gate_open_probability=float("nan"), metric=k, value=float(v))
        for k, v in summary.items()
      ]
      rows += [
        dict(common, layer=l, head=h, gate_open_probability=float(p_open[l, h]), metric="gate", value=float(z[l, h]))
        for l in range(L)
        for h in range(H)
      ]
      bar.update(1)
  return rows


def _causal(stage: _Stage, lm_set, mean_z, selectivity, cache: dict, tokenizer) -> list[dict]:
  """ablation/causal.csv rows of the causal probe test (`cache`: the task data of each treebank)."""
  model, config, plan, tag = stage.model, stage.config, stage.plan, stage.tag
  tasks = [t for t in causal.label_tasks() if t in selectivity.by_task]
  skipped = sorted(set(selectivity.by_task) - set(tasks))
  if skipped:
    logging.info(
      f"{tag}: causal test skips {', '.join(skipped)} (only label tasks {', '.join(causal.label_tasks())} are refitted)"
    )
  key = (selectivity.treebank, tuple(tasks))
  if key not in cache:
    cache[key] = causal.load_task_data(
      plan.data_root, selectivity.treebank, tasks, tokenizer, model.cfg, config, plan.probe_config, log=logging.info
    )
  rows = []
  L, H = model.cfg.num_layers, model.cfg.num_heads
  n = len(causal.ks(L * H)) * (1 + config.causal.random_seeds) * len(tasks)
  with _bar(n, f"{tag}: causal test ({', '.join(tasks)}, re-extract + refit per ablation)") as bar:
    for data in cache[key]:
      rows += causal.causal_rows(model, data, selectivity.by_task[data.task], lm_set, mean_z, config, progress=bar)
  for line in causal.verdicts(rows):
    logging.info(f"  {line}")
  return rows


def _figures(out_dir, job, rows: dict, L: int, H: int) -> list[epath.Path]:
  tag = f"{filenames.component(job.name)}_step{job.step}"  # a name with `/` or `..` stays one file here
  made = []
  draw = [
    (tables.ABLATION_HEADS, lambda r, p: plots.heads(r, L, H, p), "heads"),
    (tables.ABLATION_PRUNING, plots.pruning, "pruning"),
    (tables.ABLATION_GATES, plots.gates, "gates"),
    (tables.ABLATION_CAUSAL, plots.causal, "causal"),
    (tables.ABLATION_INTERACTIONS, plots.interactions, "interactions"),
  ]
  for table, fn, name in draw:
    if rows[table]:
      made.append(fn(rows[table], out_dir / f"{name}_{tag}.png"))
  return made


@provenance.recorded("ablation")
def run(config: ml_collections.ConfigDict, workdir) -> pathlib.Path | epath.Path:
  """Every requested stage at every requested step; returns RUN/ablation/ (tables and figures)."""
  return jobloop.run(Ablation(config, workdir))


def quickstart(run_dir, data_dir) -> str:
  """A small ablation of a quickstart decoder's last step (single-head zero/mean, importance, pruning by
  importance, magnitude and 5 random orders) on 2,048 validation tokens: seconds. Returns a summary."""
  import os

  from headspec.ablation.config import quickstart_ablate_config

  out_dir = run(quickstart_ablate_config(os.fspath(data_dir)), run_dir)
  rows = [r for r in tables.read(out_dir / "heads.csv", tables.ABLATION_HEADS) if r["metric"] == "loss_delta"]
  rows.sort(key=lambda r: -float(r["value"]))
  lines = [f"ablation of {run_dir}: the heads whose removal costs most LM loss (zero or mean ablation)"]
  lines += [
    f"  step {r['step']} {r['method']:>4} layer {r['layer']} head {r['head']}: +{float(r['value']):.4f} "
    f"[{float(r['ci_low']):.4f}, {float(r['ci_high']):.4f}]"
    for r in rows[:5]
  ]
  return "\n".join(lines)
