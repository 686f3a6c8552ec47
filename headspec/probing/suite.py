"""One probe job of `headspec probe` (probing/run.py): linear probes on every head, every layer's
residual stream and the embeddings of one (model, step).

Word features are extracted (features.py, cached), and every task's probes (tasks.py: softmax probes
for upos/xpos/deprel, probe.py; a bilinear head-selection probe for arcs, arc.py) are fitted on the
treebank's train split with L2 chosen on its dev split (labels.py reads and labels the splits), and
scored on the evaluation splits with 95% bootstrap CIs over sentences (headspec/words/resampling.py) and
Hewitt & Liang (2019) control tasks (controls.py): selectivity = accuracy − control accuracy.
`probe_job` returns {table: rows} (docs/outputs.md contracts); each finished feature source is kept
in the feature cache until the job's rows are written, so an interrupted job resumes at the next one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import time

import ml_collections
import numpy as np
from absl import logging

from headspec.io import filenames, locks, provenance, remote, tables
from headspec.probing import complexity as complexity_lib
from headspec.probing import labels, mdl, plan
from headspec.probing import tasks as tasks_lib
from headspec.probing.features import Features, extract_features
from headspec.runs import targets
from headspec.words import alignment as align
from headspec.words import batches as words_lib
from headspec.words import jobloop, resampling


def _scored(task, fitted, x, split):
  """(correct_NG, control_NG, weight_N) of a task's score (weight 1 = scored; tasks may leave it out)."""
  out = task.score(fitted, x, split)
  correct, control = out[0], out[1]
  weight = np.asarray(out[2], np.float64) if len(out) > 2 else np.ones(correct.shape[0])
  return correct, control, weight


def selectivity_rows(job, per_word: dict, tune_key: str, config) -> list[dict]:
  """probes/selectivity.csv rows: per (task, split, head group) the selectivity with its paired
  bootstrap CI (task and control scored on the same resampled sentences), each head's rank by
  selectivity on the tune (dev) split among the heads (layer, head >= 0), and the paired difference to
  the head ranked next on dev, on the same split: a CI that excludes 0 says the dev ranking of the
  two holds on that split beyond sentence sampling."""
  p, rows = config.probe, []
  for (task, split_key), (groups, d_NG, weight_N, sentence_N) in per_word.items():
    sel, low, high = resampling.bootstrap_selectivity(
      d_NG, np.zeros_like(d_NG), sentence_N, num_resamples=p.bootstrap_resamples, seed=config.seed, weight_N=weight_N
    )
    heads = [i for i, (layer, head) in enumerate(groups) if head >= 0]
    tune = per_word.get((task, tune_key))
    rank = {}
    if tune is not None and heads:
      tw = tune[2]
      tune_sel = (tune[1][:, heads] * tw[:, None]).sum(0) / max(tw.sum(), 1e-300)
      order = [heads[i] for i in np.argsort(-tune_sel, kind="stable")]
      rank = {g: r + 1 for r, g in enumerate(order)}
      nxt = {order[r]: order[r + 1] for r in range(len(order) - 1)}
    delta = {}
    if rank and len(rank) > 1:
      a = [g for g in rank if g in nxt]
      dd, dl, dh = resampling.paired_difference_ci(
        d_NG[:, a],
        d_NG[:, [nxt[g] for g in a]],
        sentence_N,
        num_resamples=p.bootstrap_resamples,
        seed=config.seed,
        weight_N=weight_N,
      )
      delta = {g: (dd[i], dl[i], dh[i]) for i, g in enumerate(a)}
    nan = float("nan")
    for g, (layer, head) in enumerate(groups):
      dn = delta.get(g, (nan, nan, nan))
      rows.append(
        dict(
          model=job.name,
          step=job.step,
          task=task,
          layer=layer,
          head=head,
          split=split_key,
          selectivity=float(sel[g]),
          selectivity_ci_low=float(low[g]),
          selectivity_ci_high=float(high[g]),
          dev_rank=rank.get(g, -1),
          delta_next=float(dn[0]),
          delta_next_ci_low=float(dn[1]),
          delta_next_ci_high=float(dn[2]),
          n=int(weight_N.sum()),
        )
      )
  return rows


def job_features(job: targets.Target, data: labels.Data, config, cache_dir: pathlib.Path):
  """(model, {split key: Features}): the word features of every split of `data` for one (model, step),
  extracted once and then read from `cache_dir` (features.py)."""
  p = config.probe
  model, tokenizer = job.load()
  pooling = align.resolve_pooling(p.pooling, model.cfg.kind)
  feats: dict[str, Features] = {}
  splits = list({s.key: s for s in [data.train, data.tune] + data.evals}.values())
  with jobloop.progress(len(splits), f"{job.name} step {job.step}: features", unit="split") as bar:
    for split in splits:
      feats[split.key] = extract_features(
        model,
        tokenizer,
        split.words,
        cache_dir=cache_dir,
        identity=job.identity,
        name=f"{job.name}-step{job.step}-{split.key.replace('/', '-')}",
        pooling=pooling,
        dtype=p.cache_dtype,
        batch_tokens=p.batch_tokens,
        log=logging.info,
      )
      bar.update(1)
  return model, feats


# A feature source's rows by family: the key in its part (and in the part files, _write_part) -> its table.
# Another family of rows (a new probe) is one entry here, its rows under that key in `_probe_source`'s
# part, and its table in `job_tables`.
PART_TABLES = {
  "rows": tables.PROBES,
  "complexity": tables.COMPLEXITY,
  "mdl": tables.MDL,
  "fits": tables.PROBE_FITS,
  "structural": tables.PROBE_STRUCTURAL,
}


def job_tables(config) -> tuple[tables.Table, ...]:
  """The tables a probe job writes rows of: the probes' (not with `probe.mdl_only`), complexity.csv
  (`probe.complexity`), mdl.csv (`probe.mdl`)."""
  p = config.probe
  mdl_only = p.get("mdl_only", False)
  out = [] if mdl_only else [tables.PROBES, tables.PROBE_SELECTIVITY, tables.PROBE_FITS]
  out += (
    [tables.PROBE_STRUCTURAL] if not mdl_only and any(_structural(t) for t in tasks_lib.from_config(config)) else []
  )
  out += [tables.COMPLEXITY] if p.get("complexity", False) and not mdl_only else []
  out += [tables.MDL] if p.get("mdl", False) else []
  return tuple(out)


@dataclasses.dataclass
class _Job:
  """What every feature source of one (model, step) is fitted and scored with."""

  job: targets.Target
  data: labels.Data
  config: ml_collections.ConfigDict
  feats: dict
  tasks: list
  fitters: dict  # fit function -> the tasks it fits together, in one pass over the features
  score_splits: dict  # split key -> split: the evaluation splits, and dev (always scored, for the rankings)
  wants: dict  # {'complexity': bool, 'mdl': bool}: the optional tables asked for


def probe_job(
  job: targets.Target,
  data: labels.Data,
  config,
  cache_dir: pathlib.Path,
  *,
  want: tuple[tables.Table, ...] | None = None,
  keep_source=None,
) -> dict[tables.Table, list[dict]]:
  """Extracts features and fits and scores every probe of one (model, step): {table: rows} of the
  tables in `want` (default `job_tables(config)`; of PART_TABLES' and probes/selectivity.csv).
  keep_source(layer, heads) -> bool: only those feature sources (plan.feature_sources); default all,
  or the heads only when `probe.residuals` is False."""
  want = job_tables(config) if want is None else tuple(want)
  tasks = tasks_lib.from_config(config)
  t0 = time.perf_counter()
  model, feats = job_features(job, data, config, cache_dir)
  split_counts = {k: f.num_split_sentences for k, f in feats.items() if f.num_split_sentences}
  if split_counts:
    logging.info(
      f"  sentences longer than the context ({model.cfg.max_len} tokens), split into windows: "
      + ", ".join(f"{k} {v}" for k, v in split_counts.items())
    )
  fitters: dict = {}
  for task in tasks:
    fitters.setdefault(task.fit, []).append(task)
  score_splits = {s.key: s for s in data.evals}
  score_splits.setdefault(data.tune.key, data.tune)
  wants = dict(complexity=tables.COMPLEXITY in want, mdl=tables.MDL in want)
  ctx = _Job(job, data, config, feats, tasks, fitters, score_splits, wants)
  partial = _partial_dir(cache_dir, job, data, feats, config, wants)
  parts = locks.SharedFolder(partial)  # another live process probing the same job may share it: never removed under it
  heads_first = keep_source is None and not config.probe.get("residuals", True)  # the full run may follow
  if heads_first:
    keep_source = _heads_only
  sources = [s for s in plan.feature_sources(model.cfg) if keep_source is None or keep_source(s[0], s[1])]
  out = {table: [] for table in PART_TABLES.values()}
  per_word: dict = {}  # (task, split) -> (groups, correct − control per word and group (int8), weight_N, sentence_N)
  with jobloop.progress(len(sources), f"{job.name} step {job.step}: probes", unit="group") as bar:
    for layer, heads, read in sources:
      what = "embeddings" if layer == -1 else f"layer {layer} {'heads' if heads[0] >= 0 else 'residual'}"
      done = partial / f"{what.replace(' ', '-')}.npz"
      if done.is_file():  # finished before an interruption: the same rows, read back
        part = _read_part(done)
        logging.info(f"  {job.name} step {job.step}: {what} read back from {done}")
      else:
        part = _probe_source(ctx, layer, heads, read, what)
        _write_part(done, part)
        logging.info(f"  {job.name} step {job.step}: probed {what} ({time.perf_counter() - t0:.0f} s)")
      for key, table in PART_TABLES.items():
        out[table] += part[key]
      for key, (d, weight) in part["per_word"].items():
        groups, d_old, _, _ = per_word.get(key, ([], np.zeros((len(weight), 0), np.int8), None, None))
        sentence_N = score_splits[key[1]].sentence_N
        per_word[key] = (groups + [(layer, h) for h in heads], np.concatenate([d_old, d], 1), weight, sentence_N)
      bar.update(1)
  parts.done(remove=not heads_first)  # the job is whole: its rows go to the tables next (the last user removes it)
  # else the heads' parts stay, so the full run that may follow fits only the residual streams
  if tables.PROBE_SELECTIVITY in want:
    eval_keys = {s.key for s in data.evals}
    out[tables.PROBE_SELECTIVITY] = [
      r for r in selectivity_rows(job, per_word, data.tune.key, config) if r["split"] in eval_keys
    ]
  return {table: out[table] for table in want}


def _structural(task) -> bool:
  return getattr(task, "structural", False)


def _heads_only(layer: int, heads: list[int]) -> bool:
  return heads[0] >= 0


def _probe_source(ctx: _Job, layer: int, heads: list[int], read, what: str) -> dict:
  """Fits and scores every task on one feature source (a layer's heads, a residual stream or the
  embeddings): {'per_word': {(task, split): (correct − control per word and group (int8), weight_N)}}
  and the rows of each PART_TABLES key ('complexity', 'mdl': when `ctx.wants` them). With
  `probe.mdl_only` only the MDL rows, from the train features alone."""
  data, config, job, feats = ctx.data, ctx.config, ctx.job, ctx.feats
  p = config.probe
  part = {"per_word": {}} | {key: [] for key in PART_TABLES}
  if p.get("mdl_only", False):  # the MDL table alone: no probe is fitted or scored
    part["mdl"] = _mdl_rows(ctx, layer, heads, read(feats[data.train.key]), what)
    return part
  x_train, x_tune = read(feats[data.train.key]), read(feats[data.tune.key])
  fitted = {}
  for fit, members in ctx.fitters.items():
    t0 = time.perf_counter()
    fitted.update(fit(members, x_train, x_tune, data, config))
    logging.info(f"    {what}: fitted {', '.join(t.name for t in members)} ({time.perf_counter() - t0:.0f} s)")
  for f in {id(f): f for f in fitted.values() if hasattr(f, "lbfgs_arithmetic")}.values():  # the softmax fit
    # probes/run_info.json: what benchmarks set beside a plain matmul of the same shapes (issue 33)
    provenance.note("lbfgs_passes", f.lbfgs_arithmetic(), under=f"{job.name} step {job.step} {what}")
  if ctx.wants["complexity"]:
    for task in ctx.tasks:
      if task.fit is tasks_lib.fit_softmax:
        y, c = np.asarray(data.tune.labels[task.name]), len(data.vocab[task.name].classes)
        n = int(((y >= 0) & (y < c)).sum())  # as fit_softmax scores dev: classes unseen in train ignored
        part["complexity"] += complexity_lib.complexity_rows(
          job.name, job.step, task.name, layer, heads, fitted[task.name], data.tune.key, n
        )
  for task in ctx.tasks:
    line = tasks_lib.fit_report(task.name, fitted[task.name])
    if line:
      logging.info(f"    {what} {line}")
    for r in tasks_lib.fit_rows(task.name, fitted[task.name]):
      where = dict(model=job.name, step=job.step, task=task.name, layer=layer, head=heads[r.pop("group")])
      part["fits"].append({**where, **r})
  eval_keys = {s.key for s in data.evals}
  for split in ctx.score_splits.values():
    x = x_tune if split.key == data.tune.key else read(feats[split.key])
    for task in ctx.tasks:
      if _structural(task):  # probes/structural.csv: tree metrics, not per-word accuracy
        if split.key in eval_keys or split.key == data.tune.key:  # dev too: heads are ranked on it
          for r in task.rows(fitted[task.name], x, split, num_resamples=p.bootstrap_resamples, seed=config.seed):
            group = r.pop("group")
            part["structural"].append(dict(model=job.name, step=job.step, layer=layer, head=heads[group], **r))
        continue
      correct, control, weight = _scored(task, fitted[task.name], x, split)
      part["per_word"][(task.name, split.key)] = (
        np.asarray(correct, np.int8) - np.asarray(control, np.int8),
        weight,
      )
      if split.key not in eval_keys:
        continue
      acc, low, high = resampling.bootstrap_ci(
        correct, split.sentence_N, num_resamples=p.bootstrap_resamples, seed=config.seed, weight_N=weight
      )
      control_acc = (np.asarray(control, np.float64) * weight[:, None]).sum(0) / max(weight.sum(), 1e-300)
      for g, head in enumerate(heads):
        part["rows"].append(
          dict(
            model=job.name,
            step=job.step,
            task=task.name,
            layer=layer,
            head=head,
            split=split.key,
            accuracy=float(acc[g]),
            ci_low=float(low[g]),
            ci_high=float(high[g]),
            control_accuracy=float(control_acc[g]),
            selectivity=float(acc[g] - control_acc[g]),
            n=int(weight.sum()),
          )
        )
  if ctx.wants["mdl"]:
    part["mdl"] = _mdl_rows(ctx, layer, heads, x_train, what)
  return part


def _mdl_rows(ctx: _Job, layer: int, heads: list[int], x_train, what: str) -> list[dict]:
  """probes/mdl.csv rows of one feature source: the online codes of every label task and its control."""
  data = ctx.data
  label_tasks = {
    t.name: (data.train.labels[t.name], data.train.controls[t.name], len(data.vocab[t.name].classes))
    for t in ctx.tasks
    if isinstance(t, tasks_lib.LabelTask)
  }
  if not label_tasks:
    return []
  t0 = time.perf_counter()
  fractions = tuple(ctx.config.probe.get("mdl_fractions", mdl.DEFAULT_FRACTIONS))
  rows = mdl.mdl_rows(
    ctx.job.name, ctx.job.step, layer, heads, x_train, label_tasks, fractions=fractions, seed=ctx.config.seed,
    sentence_N=data.train.sentence_N,  # portions of sentences, as Voita & Titov
  )  # fmt: skip
  logging.info(
    f"    {what} MDL: online codes of {', '.join(label_tasks)} and their controls ({time.perf_counter() - t0:.0f} s)"
  )
  return rows


def _partial_dir(cache_dir: pathlib.Path, job, data: labels.Data, feats: dict, config, wants: dict) -> pathlib.Path:
  """Where a job keeps each finished feature source until the job's rows are written, so an
  interrupted suite (hours for the MiniLM reference on a CPU) resumes at the next source. Keyed by
  everything the rows depend on: the features (their cache keys hash model and words), every label
  and control array, and the config; anything else is a new folder."""
  digest = hashlib.sha256()
  settings = config.to_dict()
  settings["probe"].pop("residuals", None)  # which sources run changes no source's rows: heads-only runs share parts
  digest.update(json.dumps([settings, wants], sort_keys=True, default=str).encode())
  for key in sorted(feats):
    digest.update(feats[key].path.name.encode())
  for split in [data.train, data.tune] + data.evals:
    for table in (split.labels, split.controls):
      for name in sorted(table):
        value = table[name]  # an array per word, or one per sentence (arcs), or a structural.Tree per sentence
        for a in value if isinstance(value, (list, tuple)) else [value]:
          for b in dataclasses.astuple(a) if dataclasses.is_dataclass(a) else (a,):  # a Tree's arrays, not its address
            digest.update(np.ascontiguousarray(b).tobytes())
  return cache_dir / f"{filenames.component(job.name)}-step{job.step}.partial-{digest.hexdigest()[:16]}"


def _write_part(path: pathlib.Path, part: dict) -> None:
  """One source's results, written whole (a temporary file renamed), so a kill leaves none or all."""
  path.parent.mkdir(parents=True, exist_ok=True)
  keys = list(part["per_word"])
  arrays = {f"{kind}_{i}": a for i, k in enumerate(keys) for kind, a in zip(("d", "w"), part["per_word"][k])}
  meta = {k: part.get(k, []) for k in PART_TABLES} | {"keys": keys}
  tmp = remote.temp_beside(path)  # .<name>.tmp-<pid>; a killed writer's is removed here first
  with remote.replacing(tmp, path), tmp.open("wb") as f:  # a file, not a name: np.savez would add .npz to it
    np.savez(f, meta=np.array(json.dumps(meta, default=float)), **arrays)


def _read_part(path: pathlib.Path) -> dict:
  with np.load(path) as f:
    meta = json.loads(str(f["meta"]))
    per_word = {tuple(k): (f[f"d_{i}"], f[f"w_{i}"]) for i, k in enumerate(meta["keys"])}
  # (a part saved before a family existed, e.g. probes/fits.csv, has no rows of it: its source gets none)
  return {k: meta.get(k, []) for k in PART_TABLES} | {"per_word": per_word}


def report_split(data: labels.Data) -> str:
  """The split summaries, heatmaps and rankings report: the treebank's test split when it is
  evaluated (probes are chosen on dev, so dev numbers are optimistic), else the dev split."""
  test = data.tune.key.rsplit("/", 1)[0] + "/test"
  return test if any(s.key == test for s in data.evals) else data.tune.key


def representable_data(config, job: targets.Target) -> tuple[labels.Data, list[str]]:
  """The labelled splits (labels.load_data) of only the sentences `job`'s model can represent
  (align.representable: a split that keeps none is a UserError), and a line per split that lost some.
  Every job of a suite shares the first one's tokenizer and context (one run's steps, or a model and its
  random-weights copy), so one check serves them all."""
  model, tokenizer = job.load()
  max_len, skipped = model.cfg.max_len, []
  del model

  def keep(key, sentences):
    sentences, kept = words_lib.representable_sentences(sentences, tokenizer, max_len, where=key)
    skipped.extend([kept.summary()] if kept.num_skipped else [])
    return sentences

  return labels.load_data(config, keep=keep), skipped
