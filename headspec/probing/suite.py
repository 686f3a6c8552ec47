"""`headspec probe`: linear probes on every head, every layer's residual stream and the embeddings.

For each requested checkpoint step of a run (or a pretrained model at step 0, and optionally the same
architecture with random weights), word features are extracted (headspec/probing/features.py, cached),
probes are fitted on the treebank's train split with L2 chosen on its dev split
(headspec/probing/probe.py: softmax probes for upos/xpos/deprel; headspec/probing/arc.py: bilinear
head-selection probe for arcs), and scored on the evaluation splits with 95% bootstrap CIs over
sentences (stats.py) and Hewitt & Liang (2019) control tasks (controls.py):
selectivity = accuracy − control accuracy. Rows go to RUN/probes/results.csv (DESIGN.md contract),
majority/offset baselines to RUN/probes/baselines.csv, figures and summary.md via report.py.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import time

import ml_collections
import numpy as np

from headspec import tables, targets
from headspec.data import treebank as treebank_lib
from headspec.errors import UserError
from headspec.probing import arc as arc_lib
from headspec.probing import controls, probe, report, stats
from headspec.probing.align import POOLINGS
from headspec.probing.defaults import TASKS
from headspec.probing.features import CACHE_DTYPES, Features, extract_features

LABEL_TASKS = ("upos", "xpos", "deprel")
ARC_MAX_SENTENCE_WORDS = arc_lib.PACK_WIDTH  # arc probes train on sentences that fit one packed row;
# evaluation uses every sentence


@dataclasses.dataclass
class _Split:
  """One labelled treebank split. labels[task]: int ids (unseen-in-train labels get id C, never predicted)."""

  key: str
  words: list[tuple[str, ...]]
  labels: dict[str, np.ndarray]
  controls: dict[str, np.ndarray]
  heads: list[np.ndarray]
  control_heads: list[np.ndarray]
  sentence_N: np.ndarray

  @property
  def num_words(self) -> int:
    return len(self.sentence_N)


@dataclasses.dataclass
class _Data:
  train: _Split
  tune: _Split
  evals: list[_Split]
  classes: dict[str, list[str]]
  baselines: list[dict]


def _label(sentence, task: str, subtypes: bool) -> tuple[str, ...]:
  if task == "upos":
    return sentence.upos
  if task == "xpos":
    return sentence.xpos
  return sentence.deprels if subtypes else tuple(d.split(":")[0] for d in sentence.deprels)


def _subsample(sentences, max_words: int, seed: int):
  """A seeded random subset of whole sentences with about `max_words` words, in corpus order."""
  order = np.random.default_rng(seed).permutation(len(sentences))
  lengths = np.array([len(sentences[i].words) for i in order])
  keep = order[: max(1, int(np.searchsorted(np.cumsum(lengths), max_words, side="right")))]
  return [sentences[i] for i in sorted(keep)]


def _make_split(key, sentences, tasks, classes, train_counts, config) -> _Split:
  p = config.probe
  words = [s.words for s in sentences]
  flat_words = [w for ws in words for w in ws]
  labels, control = {}, {}
  for task in tasks:
    if task == "arc":
      continue
    index = {c: i for i, c in enumerate(classes[task])}
    labels[task] = np.array(
      [index.get(l, len(index)) for s in sentences for l in _label(s, task, p.deprel_subtypes)], np.int32
    )
    control[task] = controls.control_labels_N(flat_words, train_counts[task], config.seed)
  heads = [np.asarray(s.heads, np.int32) for s in sentences]
  sentence_N = np.repeat(np.arange(len(sentences)), [len(w) for w in words]).astype(np.int32)
  return _Split(
    key, words, labels, control, heads, controls.control_heads(words, config.seed) if "arc" in tasks else [], sentence_N
  )


def _check_config(config) -> None:
  p = config.probe
  tasks = tuple(p.tasks) if not isinstance(p.tasks, str) else tuple(t for t in p.tasks.split(",") if t)
  unknown = [t for t in tasks if t not in TASKS]
  if unknown or not tasks:
    raise UserError(f"probe.tasks: unknown task(s) {unknown or tasks!r}; choose from {', '.join(TASKS)}")
  if p.pooling not in POOLINGS:
    raise UserError(f"probe.pooling={p.pooling!r}: use one of {', '.join(POOLINGS)}")
  if p.cache_dtype not in CACHE_DTYPES:
    raise UserError(f"probe.cache_dtype={p.cache_dtype!r}: use one of {', '.join(CACHE_DTYPES)}")
  if (
    p.max_train_words < 0
    or min(p.batch_tokens, p.bootstrap_resamples, p.arc_max_train_words, p.arc_epochs) < 1
    or not len(p.l2_grid)
  ):
    raise UserError(
      "probe.max_train_words must be >= 0; probe.batch_tokens, bootstrap_resamples, arc_max_train_words "
      "and arc_epochs >= 1; probe.l2_grid non-empty"
    )


def _tasks(config) -> tuple[str, ...]:
  t = config.probe.tasks
  return tuple(x for x in t.split(",") if x) if isinstance(t, str) else tuple(t)


def _splits_of(data_root, treebank: str, wanted) -> list[str]:
  present = treebank_lib.available_splits(data_root, treebank)
  for split in wanted:
    if split not in treebank_lib.SPLITS:
      raise UserError(f"probe.eval_splits: unknown split {split!r} (use {', '.join(treebank_lib.SPLITS)})")
  return [s for s in wanted if s in present]


def load_data(config) -> _Data:
  """Reads and labels the train, dev and evaluation splits; every problem is a UserError before any work."""
  _check_config(config)
  data_root = targets.data_dir(config, purpose="the treebank to probe on")
  p, tasks = config.probe, _tasks(config)
  tb = p.treebank
  present = treebank_lib.available_splits(data_root, tb)
  for needed in ("train", "dev"):
    if needed not in present:
      raise UserError(
        f"treebank {tb} has no {needed} split under {data_root}/ud/{tb} "
        f"(present: {', '.join(present) or 'none'}); probes are fitted on train and tuned on dev"
      )
  missing = [s for s in p.eval_splits if s not in _splits_of(data_root, tb, p.eval_splits)]
  if missing:
    raise UserError(f"probe.eval_splits: {tb} has no split(s) {', '.join(missing)} (present: {', '.join(present)})")
  train = treebank_lib.load_split(data_root, tb, "train")
  if p.max_train_words:
    train = _subsample(train, p.max_train_words, config.seed)
  classes, counts = {}, {}
  for task in tasks:
    if task != "arc":
      values = [l for s in train for l in _label(s, task, p.deprel_subtypes)]
      classes[task] = sorted(set(values))
      index = {c: i for i, c in enumerate(classes[task])}
      counts[task] = np.bincount([index[v] for v in values], minlength=len(classes[task]))
  make = lambda key, sents: _make_split(key, sents, tasks, classes, counts, config)
  train_split = make(f"{tb}/train", train)
  loaded = {"dev": make(f"{tb}/dev", treebank_lib.load_split(data_root, tb, "dev"))}
  evals = []
  for split in p.eval_splits:
    if split not in loaded:
      loaded[split] = make(f"{tb}/{split}", treebank_lib.load_split(data_root, tb, split))
    evals.append(loaded[split])
  for extra in p.extra_treebanks:
    extra_splits = _splits_of(data_root, extra, ("dev", "test"))
    if not extra_splits:
      raise UserError(f"probe.extra_treebanks: {extra} has no dev or test split under {data_root}/ud/{extra}")
    for split in extra_splits:
      evals.append(make(f"{extra}/{split}", treebank_lib.load_split(data_root, extra, split)))
  if not evals:
    raise UserError("nothing to score: probe.eval_splits and probe.extra_treebanks are both empty")
  data = _Data(train_split, loaded["dev"], evals, classes, [])
  data.baselines = _baselines(data, tasks)
  return data


def _baselines(data: _Data, tasks) -> list[dict]:
  """Majority label (label tasks) and most frequent head offset (arc: head = word + o, or ROOT off the ends)."""
  rows = []
  offset = None
  if "arc" in tasks:
    offsets = np.concatenate([np.where(h > 0, h - np.arange(1, len(h) + 1), 0) for h in data.train.heads])
    values, freq = np.unique(offsets[offsets != 0], return_counts=True)
    offset = int(values[np.argmax(freq)])
  for split in data.evals:
    for task in tasks:
      if task == "arc":
        correct = [
          (
            np.where(
              (np.arange(1, len(h) + 1) + offset >= 1) & (np.arange(1, len(h) + 1) + offset <= len(h)),
              np.arange(1, len(h) + 1) + offset,
              0,
            )
            == h
          )
          for h in split.heads
        ]
        acc = float(np.concatenate(correct).mean())
        rows.append(dict(task=task, split=split.key, baseline=f"offset{offset:+d}", accuracy=acc, n=split.num_words))
      else:
        majority = int(np.bincount(data.train.labels[task], minlength=len(data.classes[task])).argmax())
        acc = float((split.labels[task] == majority).mean())
        rows.append(dict(task=task, split=split.key, baseline="majority", accuracy=acc, n=split.num_words))
  return rows


def plan_jobs(config, workdir) -> list[targets.Target]:
  """The (model, step)s to probe, checked (steps exist, pretrained name valid) before any work."""
  p = config.probe
  return targets.plan(config, workdir, steps=p.steps, model_name=p.model_name, random_baseline=p.random_baseline)


def _arc_correct(fitted, x_NGK, split: _Split, heads: list[np.ndarray]) -> np.ndarray:
  """correct_NG: whether each word's predicted head (per group) is its gold head in `heads`."""
  pred_NG = arc_lib.predict_heads(fitted, x_NGK, [len(w) for w in split.words])
  return pred_NG == np.concatenate(heads)[:, None]


def _feature_sources(cfg):
  """(layer, heads, reader(features) -> x_NGK) for every layer's heads, then every residual stream."""
  sources = [(l, list(range(cfg.num_heads)), lambda f, l=l: f.z(l)) for l in range(cfg.num_layers)]
  sources += [(l, [-1], lambda f, l=l: f.residual(l)[:, None, :]) for l in range(-1, cfg.num_layers)]
  return sources


def probe_job(job: targets.Target, data: _Data, config, cache_dir: pathlib.Path, log=print) -> list[dict]:
  """Extracts features and fits and scores every probe of one (model, step); returns results.csv rows."""
  p, tasks = config.probe, _tasks(config)
  t0 = time.perf_counter()
  model, tokenizer = job.load()
  feats: dict[str, Features] = {}
  for split in [data.train, data.tune] + data.evals:
    if split.key not in feats:
      feats[split.key] = extract_features(
        model,
        tokenizer,
        split.words,
        cache_dir=cache_dir,
        identity=job.identity,
        name=f"{job.name}-step{job.step}-{split.key.replace('/', '-')}",
        pooling=p.pooling,
        dtype=p.cache_dtype,
        batch_tokens=p.batch_tokens,
        log=log,
      )
  split_counts = {k: f.num_split_sentences for k, f in feats.items() if f.num_split_sentences}
  if split_counts:
    log(
      f"  sentences longer than the context ({model.cfg.max_len} tokens), split into windows: "
      + ", ".join(f"{k} {v}" for k, v in split_counts.items())
    )
  label_tasks = [t for t in tasks if t != "arc"]
  unseen_to_ignore = lambda y, c: np.where(y < c, y, -1)
  specs = []
  for t in label_tasks:
    c = len(data.classes[t])
    specs.append(probe.ProbeSpec(t, c, data.train.labels[t], unseen_to_ignore(data.tune.labels[t], c)))
    specs.append(probe.ProbeSpec(f"{t}/control", c, data.train.controls[t], data.tune.controls[t]))
  if "arc" in tasks:
    arc_train = _subsample_indices(data.train, p.arc_max_train_words, config.seed)
    arc_words = np.isin(data.train.sentence_N, arc_train)
  rows = []
  for layer, heads, read in _feature_sources(model.cfg):
    x_train, x_tune = read(feats[data.train.key]), read(feats[data.tune.key])
    if specs:
      fitted = probe.fit_softmax_probes(
        x_train, x_tune, specs, l2_grid=tuple(p.l2_grid), seed=config.seed, refine_samples=p.refine_samples
      )
    if "arc" in tasks:
      fitted_arc = {
        kind: arc_lib.fit_arc_probes(
          x_train[arc_words],
          [getattr(data.train, kind)[i] for i in arc_train],
          x_tune,
          getattr(data.tune, kind),
          l2_grid=arc_lib.DEFAULT_ARC_L2_GRID,
          seed=config.seed,
          epochs=p.arc_epochs,
        )
        for kind in ("heads", "control_heads")
      }
    for split in data.evals:
      x = x_tune if split.key == data.tune.key else read(feats[split.key])
      for t in tasks:
        if t == "arc":
          correct = _arc_correct(fitted_arc["heads"], x, split, split.heads)
          control = _arc_correct(fitted_arc["control_heads"], x, split, split.control_heads)
        else:
          correct = probe.predict(fitted, x, t) == split.labels[t][:, None]
          control = probe.predict(fitted, x, f"{t}/control") == split.controls[t][:, None]
        acc, low, high = stats.bootstrap_ci(
          correct, split.sentence_N, num_resamples=p.bootstrap_resamples, seed=config.seed
        )
        control_acc = control.mean(0)
        for g, head in enumerate(heads):
          rows.append(
            dict(
              model=job.name,
              step=job.step,
              task=t,
              layer=layer,
              head=head,
              split=split.key,
              accuracy=float(acc[g]),
              ci_low=float(low[g]),
              ci_high=float(high[g]),
              control_accuracy=float(control_acc[g]),
              selectivity=float(acc[g] - control_acc[g]),
              n=int(split.num_words),
            )
          )
    x_train = x_tune = x = None  # freed before the next layer is read: one layer's features at a time
    what = "embeddings" if layer == -1 else f"layer {layer} {'heads' if heads[0] >= 0 else 'residual'}"
    log(f"  {job.name} step {job.step}: probed {what} ({time.perf_counter() - t0:.0f} s)")
  return rows


def _subsample_indices(split: _Split, max_words: int, seed: int) -> np.ndarray:
  """Sentences (indices) for arc-probe training: each fits one packed row, about `max_words` words in all."""
  rng = np.random.default_rng(seed)
  order = [i for i in rng.permutation(len(split.words)) if len(split.words[i]) <= ARC_MAX_SENTENCE_WORDS]
  if not order:
    order = list(rng.permutation(len(split.words)))
  lengths = np.cumsum([len(split.words[i]) for i in order])
  return np.sort(np.asarray(order[: max(1, int(np.searchsorted(lengths, max_words, side="right")))]))


def run_probe_suite(config: ml_collections.ConfigDict, workdir) -> pathlib.Path:
  """Probes per `config` (see probing/defaults.py) for the run in `workdir`; returns RUN/probes/results.csv."""
  workdir = pathlib.Path(workdir)
  t0 = time.perf_counter()
  jobs = plan_jobs(config, workdir)  # checks steps / checkpoints before anything is written
  data = load_data(config)
  p = config.probe
  print(
    f"probing {len(jobs)} model step(s) on {p.treebank}: train {data.train.num_words} words "
    f"({len(data.train.words)} sentences), tasks {', '.join(_tasks(config))}, "
    f"scored on {', '.join(s.key for s in data.evals)}",
    flush=True,
  )
  out_dir = workdir / "probes"
  cache_dir = out_dir / "cache"
  cache_dir.mkdir(parents=True, exist_ok=True)
  results = tables.path_of(workdir, tables.PROBES)
  tables.check_writable(workdir, tables.PROBES, tables.PROBE_BASELINES)
  for job in jobs:
    print(f"{job.name} step {job.step}", flush=True)
    rows = probe_job(job, data, config, cache_dir, log=lambda s: print(s, flush=True))
    tables.merge(results, rows, tables.PROBES)  # after each step, so an interrupted study keeps what it finished
  tables.write(tables.path_of(workdir, tables.PROBE_BASELINES), data.baselines, tables.PROBE_BASELINES)
  report.write_report(out_dir, primary_split=data.tune.key, top_k=p.top_k)
  print(f"wrote {results}, {out_dir / 'summary.md'} and heatmaps ({time.perf_counter() - t0:.0f} s)", flush=True)
  return results


def main(config: ml_collections.ConfigDict, workdir) -> None:
  """The `headspec probe` command."""
  if not workdir:
    raise UserError("probe needs --workdir=DIR (a training run, or any folder with --config.model.pretrained)")
  results = run_probe_suite(config, workdir)
  print((pathlib.Path(results).parent / "summary.md").read_text())


def probe_quickstart(run_dir, data_dir) -> str:
  """Probes a quickstart run (its last step, plus random weights) on the synthetic treebank; returns summary.md."""
  from headspec.probing.defaults import probe_config

  config = probe_config()
  config.data_dir = os.fspath(data_dir)
  config.probe.treebank = "synthetic"
  config.probe.steps = "last"
  config.probe.random_baseline = True
  config.probe.bootstrap_resamples = 200
  results = run_probe_suite(config, run_dir)
  return (pathlib.Path(results).parent / "summary.md").read_text()
