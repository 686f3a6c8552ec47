"""Benchmark: Hewitt & Manning's structural probes against the softmax probes of the same sources (issue 36).

  HEADSPEC_DATA_DIR=... python -m benchmarks.bench_structural [--train_words=2000] [--dev_sentences=100]
                                                               [--layers=0]
  HEADSPEC_DATA_DIR=... python -m benchmarks.bench_structural --all   # the issue's size: hours on a 2-core CPU
  HEADSPEC_DATA_DIR=... python -m benchmarks.bench_structural --train_words=0 --dev_sentences=0
                    # layer 0's heads and residual on all of EWT: 42 min (`python -m benchmarks --only=structural_ewt`)

The issue's bar: the structural probes on all of EWT for all-MiniLM-L6-v2's 6 layers of 12 heads (Z_h, 32
wide), 6 residual streams and the embeddings (384 wide) within the time of the softmax probes of the same
sources on the same machine. Like for like, in one process: all-MiniLM-L6-v2's word features of EWT train
and dev, extracted once by the suite's own path (suite.job_features into a temporary cache; not timed);
then source by source (plan.feature_sources) the two fitters the suite calls, with the suite's default
settings (probing/config.py), one after the other as a command runs them (the first source of a shape pays
the compilations): tasks.fit_softmax (upos, xpos, deprel and their controls: L-BFGS at every λ of
probe.l2_grid, Adam refinement) and tasks.fit_structural (distance and depth and their control-tree probes:
Adam with early stopping on dev loss), then each family's scoring of dev as the suite scores a split
(softmax: predictions and the bootstrap CI; structural: the tree metrics with their bootstrap CIs).

Default size: layer 0's sources (its 12 heads and its residual stream: one source of each shape) on a
seeded subset of about --train_words EWT training words (the suite's probe.max_train_words) and the first
--dev_sentences dev sentences: about two minutes on an idle 2-core CPU. It checks the measurement; it does
not give the all-of-EWT ratio (epochs and L-BFGS iterations depend on the data size). --layers=all (or a
list; -1: the embeddings) picks sources, --kind=heads|residual one of their two shapes; --all: every
source on every sentence of EWT train and dev; --train_words=0 --dev_sentences=0: all of EWT for the
picked sources.
Prints one JSON object: per source each family's fit (wall and CPU) and score seconds, structural epochs
run and softmax L-BFGS iterations, the totals, the ratios structural / softmax (wall and CPU), and the load
average before and after each family's timing.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import tempfile
import time

os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={os.cpu_count()}")


SOFTMAX = ("upos", "xpos", "deprel")
STRUCTURAL = ("distance", "depth")


def _load(values) -> list[float]:
  return [round(v, 2) for v in values]


def _data(config, job, dev_sentences: int):
  """The suite's labelled splits (labels.load_data) of the sentences the model can represent, dev cut to its
  first `dev_sentences` (0: all)."""
  from headspec.probing import labels
  from headspec.words import alignment as align

  model, tokenizer = job.load()
  max_len = model.cfg.max_len

  def keep(key, sentences):
    if key.endswith("/dev") and dev_sentences:
      sentences = sentences[:dev_sentences]
    return align.representable([s.words for s in sentences], tokenizer, max_len, where=key).select(sentences)

  return labels.load_data(config, keep=keep)


def _score_softmax(members, fitted, x, split, config) -> None:
  """As suite._probe_source scores a split: per-word correctness, then the bootstrap CI over sentences."""
  from headspec.words import resampling

  for task in members:
    correct, _ = task.score(fitted[task.name], x, split)
    resampling.bootstrap_ci(correct, split.sentence_N, num_resamples=config.probe.bootstrap_resamples, seed=config.seed)


def _score_structural(members, fitted, x, split, config) -> None:
  for task in members:
    task.rows(fitted[task.name], x, split, num_resamples=config.probe.bootstrap_resamples, seed=config.seed)


def _timed(fit, score, members, x_train, x_dev, data, config) -> tuple[dict, dict]:
  """(fitted, timing): one family's cold fit and its scoring of dev, wall and CPU seconds, load averages."""
  out = {"load_average_before": _load(os.getloadavg())}
  wall, cpu = time.perf_counter(), time.process_time()
  fitted = fit(members, x_train, x_dev, data, config)
  out["fit_s"], out["fit_cpu_s"] = round(time.perf_counter() - wall, 2), round(time.process_time() - cpu, 2)
  wall = time.perf_counter()
  score(members, fitted, x_dev, data.tune, config)
  out["score_s"] = round(time.perf_counter() - wall, 2)
  out["load_average_after"] = _load(os.getloadavg())
  return fitted, out


def run(args) -> dict:
  from headspec.probing import plan, suite
  from headspec.probing import tasks as tasks_lib
  from headspec.probing.config import probe_config

  config = probe_config()
  config.model.pretrained = "minilm"
  config.probe.update(tasks=SOFTMAX + STRUCTURAL, eval_splits=("dev",), extra_treebanks=())
  config.probe.max_train_words = 0 if args.all else args.train_words
  (job,) = plan.plan_jobs(config, "")
  data = _data(config, job, 0 if args.all else args.dev_sentences)
  with tempfile.TemporaryDirectory() as cache:
    t0 = time.perf_counter()
    model, feats = suite.job_features(job, data, config, pathlib.Path(cache))
    extract_s = time.perf_counter() - t0
    softmax = [tasks_lib.REGISTRY[t] for t in SOFTMAX]
    structural = [tasks_lib.REGISTRY[t] for t in STRUCTURAL]
    sources = []
    every = args.all or args.layers == "all"
    layers = set() if every else {int(v) for v in args.layers.split(",") if v.strip()}
    for layer, heads, read in plan.feature_sources(model.cfg):
      if not every and layer not in layers:
        continue
      if args.kind != "both" and (heads[0] >= 0) != (args.kind == "heads"):
        continue
      x_train, x_dev = read(feats[data.train.key]), read(feats[data.tune.key])
      row = {"source": f"layer {layer} heads" if heads[0] >= 0 else f"layer {layer} residual", "shape": x_train.shape}
      fitted, row["softmax"] = _timed(tasks_lib.fit_softmax, _score_softmax, softmax, x_train, x_dev, data, config)
      row["softmax"]["lbfgs_iterations_max"] = int(max(fitted[t].iterations[t].max() for t in SOFTMAX))
      fitted, row["structural"] = _timed(
        tasks_lib.fit_structural, _score_structural, structural, x_train, x_dev, data, config
      )
      row["structural"]["epochs_run"] = {t: [f.epochs_run for f in fitted[t]] for t in STRUCTURAL}  # task, control
      row["shape"] = list(row["shape"])
      sources.append(row)
      print(json.dumps(row), flush=True)
  total = {
    family: {key: round(sum(r[family][key] for r in sources), 1) for key in ("fit_s", "fit_cpu_s", "score_s")}
    for family in ("softmax", "structural")
  }
  soft, tree = total["softmax"], total["structural"]
  return {
    "model": "all-MiniLM-L6-v2",
    "treebank": "en_ewt",
    "size": "all of EWT train and dev"
    if args.all or not (args.train_words or args.dev_sentences)
    else f"about {args.train_words or 'all'} train words, {args.dev_sentences or 'all'} dev sentences",
    "train_words": data.train.num_words,
    "train_sentences": len(data.train.words),
    "dev_words": data.tune.num_words,
    "dev_sentences": len(data.tune.words),
    "sources": len(sources),
    "extract_s": round(extract_s, 1),
    "softmax_tasks": "upos, xpos, deprel + controls, every λ of " + str(tuple(config.probe.l2_grid)),
    "structural_tasks": f"distance, depth + control trees, rank {config.probe.structural_rank}, "
    f"at most {config.probe.structural_epochs} epochs, patience {config.probe.structural_patience}",
    "total": total,
    "ratio_fit_structural_over_softmax": round(tree["fit_s"] / max(soft["fit_s"], 1e-9), 2),
    "ratio_fit_cpu_structural_over_softmax": round(tree["fit_cpu_s"] / max(soft["fit_cpu_s"], 1e-9), 2),
    "ratio_fit_and_score_structural_over_softmax": round(
      (tree["fit_s"] + tree["score_s"]) / max(soft["fit_s"] + soft["score_s"], 1e-9), 2
    ),
    "per_source": sources,
    "machine": {"cores": os.cpu_count(), "load_average_end": _load(os.getloadavg())},
  }


def main(argv=None):
  parser = argparse.ArgumentParser(prog="python -m benchmarks.bench_structural", description=__doc__.splitlines()[0])
  parser.add_argument("--train_words", type=int, default=2000, help="a seeded subset of EWT train of about this many")
  parser.add_argument("--dev_sentences", type=int, default=100, help="the first this many EWT dev sentences")
  parser.add_argument("--layers", default="0", help="these layers' sources, e.g. '0,-1' (-1: embeddings) or 'all'")
  parser.add_argument("--kind", default="both", choices=("both", "heads", "residual"), help="which sources of a layer")
  parser.add_argument("--all", action="store_true", help="every source on all of EWT train and dev (hours on 2 cores)")
  args = parser.parse_args(argv)
  print(json.dumps(run(args), indent=1))


if __name__ == "__main__":
  main()
