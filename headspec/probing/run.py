"""`headspec probe`: linear probes on every head, every layer's residual stream and the embeddings.

For each requested checkpoint step of a run (or a pretrained model at step 0, and optionally the same
architecture with random weights; plan.py), suite.probe_job extracts the word features and fits and
scores every task's probes (its docstring). Through the job loop (headspec/words/jobloop.py) the rows go to
RUN/probes/results.csv, selectivity.csv, fits.csv (and complexity.csv, mdl.csv when asked) after each
job (docs/outputs.md contract), baselines to RUN/probes/baselines.csv, figures and summary.md via
report.py. RUN may be a URL (gs://bucket/run): tables and figures go there whole, the feature cache to
local scratch (features.run_cache_dir).
"""

from __future__ import annotations

import os
import pathlib
import time

import ml_collections
from absl import logging
from etils import epath

from headspec.io import provenance, remote, tables
from headspec.parallel.compilations import Compilations
from headspec.probing import complexity as complexity_lib
from headspec.probing import features as features_lib
from headspec.probing import plan, report, suite
from headspec.probing import tasks as tasks_lib
from headspec.words import jobloop


class Probe(jobloop.Analysis):
  """`headspec probe` in the job loop's parts."""

  name = "probe"

  def plan(self):
    plan.check_config(self.config)
    self.t0 = time.perf_counter()
    return plan.plan_jobs(self.config, self.workdir)  # checks steps / checkpoints before anything is written

  def tables(self, jobs):
    p = self.config.probe
    mdl_only = p.get("mdl_only", False)  # probes/mdl.csv alone; the probes' tables stay as they are
    return (*([] if mdl_only else [tables.PROBE_BASELINES]), *suite.job_tables(self.config))

  def prepare(self, jobs):
    p = self.config.probe
    self.data, self.skipped = suite.representable_data(self.config, jobs[0])
    provenance.note("train_words", self.data.train.num_words)  # run_info.json: after subsampling and skips
    data = self.data
    logging.info(
      f"probing {len(jobs)} model step(s) on {p.treebank}: train {data.train.num_words} words "
      f"({len(data.train.words)} sentences), tasks {', '.join(t.name for t in tasks_lib.from_config(self.config))}, "
      f"scored on {', '.join(s.key for s in data.evals)}"
    )
    self.cache_dir = features_lib.run_cache_dir(self.workdir)  # local: RUN/probes/cache; remote: local scratch
    self.cache_dir.mkdir(parents=True, exist_ok=True)

  def job(self, job):
    """One model step's features, fits and scores; its XLA compilations go to the log and to
    probes/run_info.json (xla_compilations["NAME step N"], and per function): in one process a later
    step of the same shapes compiles only L-BFGS narrowings to shapes no earlier fit reached, so nothing
    recompiles per step, per iteration or per probe still running (a resumed run's steps read from the
    feature cache skip their forward pass's compilations)."""
    with Compilations() as compiled:
      rows = suite.probe_job(job, self.data, self.config, self.cache_dir)
    where = f"{job.name} step {job.step}"
    provenance.note("xla_compilations", compiled.count, under=where)
    provenance.note("xla_compilations_by_function", compiled.counts, under=where)
    provenance.note("xla_compile_seconds", round(compiled.total_seconds, 1), under=where)
    logging.info(f"{where}: {compiled.count} XLA compilations ({compiled.total_seconds:.0f} s compiling)")
    return rows

  def finish(self, jobs):
    p = self.config.probe
    workdir, out_dir, data = self.workdir, self.workdir / "probes", self.data
    mdl_only = p.get("mdl_only", False)
    if not mdl_only:
      tables.merge(tables.path_of(workdir, tables.PROBE_BASELINES), data.baselines, tables.PROBE_BASELINES)
    report.write_report(
      out_dir,
      primary_split=suite.report_split(data),
      select_split=data.tune.key,
      top_k=p.top_k,
      skipped=self.skipped,
    )
    if tables.COMPLEXITY in suite.job_tables(self.config):
      complexity_lib.write_figures(out_dir)
    elapsed = time.perf_counter() - self.t0
    if mdl_only:
      codes = tables.path_of(workdir, tables.MDL)
      print(f"wrote {codes} and {out_dir / 'summary.md'} ({elapsed:.0f} s)", flush=True)
      return remote.native_path(codes)
    results = tables.path_of(workdir, tables.PROBES)
    print(f"wrote {results}, {out_dir / 'summary.md'} and heatmaps ({elapsed:.0f} s)", flush=True)
    return remote.native_path(results)


@provenance.recorded("probes")
def run(config: ml_collections.ConfigDict, workdir) -> pathlib.Path | epath.Path:
  """Probes per `config` (probing/config.py) for the run in `workdir`; returns RUN/probes/results.csv
  (RUN/probes/mdl.csv with `probe.mdl_only`, which adds MDL to a probed run without fitting again)."""
  return jobloop.run(Probe(config, workdir))


def quickstart(run_dir, data_dir, *, random_baseline: bool = True) -> str:
  """Probes a quickstart run (its last step, and random weights if `random_baseline`) on the synthetic
  treebank with `quickstart_probe_config`; returns summary.md."""
  from headspec.probing.config import quickstart_probe_config

  results = run(quickstart_probe_config(os.fspath(data_dir), random_baseline=random_baseline), run_dir)
  return (epath.Path(results).parent / "summary.md").read_text()
