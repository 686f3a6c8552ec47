"""`headspec probe`: linear probes on every head, every layer's residual stream and the embeddings.

For each requested checkpoint step of a run (or a pretrained model at step 0, and optionally the same
architecture with random weights; plan.py), word features are extracted (features.py, cached), and
every task's probes (tasks.py: softmax probes for upos/xpos/deprel, probe.py; a bilinear
head-selection probe for arcs, arc.py) are fitted on the treebank's train split with L2 chosen on its
dev split (labels.py reads and labels the splits), and scored on the evaluation splits with 95%
bootstrap CIs over sentences (stats.py) and Hewitt & Liang (2019) control tasks (controls.py):
selectivity = accuracy − control accuracy. Rows go to RUN/probes/results.csv (docs/outputs.md
contract), baselines to RUN/probes/baselines.csv, figures and summary.md via report.py.
"""

from __future__ import annotations

import os
import pathlib
import time

import ml_collections

from headspec import tables, targets
from headspec.errors import UserError
from headspec.probing import labels, plan, report, stats
from headspec.probing import tasks as tasks_lib
from headspec.probing.features import Features, extract_features


def probe_job(job: targets.Target, data: labels.Data, config, cache_dir: pathlib.Path, log=print) -> list[dict]:
  """Extracts features and fits and scores every probe of one (model, step); returns results.csv rows."""
  p, tasks = config.probe, tasks_lib.from_config(config)
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
  fitters: dict = {}  # tasks sharing a fitter are fitted together, in one pass over the features
  for task in tasks:
    fitters.setdefault(task.fit, []).append(task)
  rows = []
  for layer, heads, read in plan.feature_sources(model.cfg):
    x_train, x_tune = read(feats[data.train.key]), read(feats[data.tune.key])
    fitted = {}
    for fit, members in fitters.items():
      fitted.update(fit(members, x_train, x_tune, data, config))
    for split in data.evals:
      x = x_tune if split.key == data.tune.key else read(feats[split.key])
      for task in tasks:
        correct, control = task.score(fitted[task.name], x, split)
        acc, low, high = stats.bootstrap_ci(
          correct, split.sentence_N, num_resamples=p.bootstrap_resamples, seed=config.seed
        )
        control_acc = control.mean(0)
        for g, head in enumerate(heads):
          rows.append(
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
              n=int(split.num_words),
            )
          )
    x_train = x_tune = x = fitted = None  # freed before the next layer is read: one layer's features at a time
    what = "embeddings" if layer == -1 else f"layer {layer} {'heads' if heads[0] >= 0 else 'residual'}"
    log(f"  {job.name} step {job.step}: probed {what} ({time.perf_counter() - t0:.0f} s)")
  return rows


def run_probe_suite(config: ml_collections.ConfigDict, workdir) -> pathlib.Path:
  """Probes per `config` (see probing/defaults.py) for the run in `workdir`; returns RUN/probes/results.csv."""
  workdir = pathlib.Path(workdir)
  t0 = time.perf_counter()
  plan.check_config(config)
  jobs = plan.plan_jobs(config, workdir)  # checks steps / checkpoints before anything is written
  data = labels.load_data(config)
  p = config.probe
  print(
    f"probing {len(jobs)} model step(s) on {p.treebank}: train {data.train.num_words} words "
    f"({len(data.train.words)} sentences), tasks {', '.join(t.name for t in tasks_lib.from_config(config))}, "
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
  from headspec.probing.defaults import synthetic_probe_config

  results = run_probe_suite(synthetic_probe_config(os.fspath(data_dir)), run_dir)
  return (pathlib.Path(results).parent / "summary.md").read_text()
