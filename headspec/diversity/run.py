"""`headspec diversity`: every head-diversity metric over a run's checkpoints, into a table and figures.

For each requested step (`config.steps` of a `headspec train` workdir, or step 0 of
`config.model.pretrained`), the model reads a fixed evaluation set (the first `config.num_tokens`
tokens of the run's own validation rows, as training packed them) in batches of `config.batch_size`
rows; headspec/diversity/metrics.py accumulates the metrics under one jit-compiled update per batch, so
memory is bounded by the batch and the O(L·H²·K²) accumulators, not by the evaluation set. Results go
to RUN/diversity/results.csv (docs/outputs.md contract `model,step,layer,head_i,head_j,metric,value`;
rows of a recomputed (model, step) are replaced, other models' and steps' kept) and the figures of headspec/diversity/plots.py.
"""

from __future__ import annotations

import functools
import pathlib
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging
from flax import nnx

from headspec.data.tokenizer import load_tokenizer
from headspec.diversity import metrics, plots
from headspec.diversity.config import SAMPLES
from headspec.errors import UserError
from headspec.io import provenance, remote, tables
from headspec.parallel import mesh as mesh_lib
from headspec.runs import targets
from headspec.runs.evaltext import evaluation_tokens
from headspec.words import jobloop


def _check_config(config: ml_collections.ConfigDict) -> None:
  if config.num_tokens <= 0:
    raise UserError(f"num_tokens={config.num_tokens}: must be a positive number of evaluation tokens")
  if config.batch_size <= 0:
    raise UserError(f"batch_size={config.batch_size}: must be a positive number of rows")
  if config.sample not in SAMPLES:
    raise UserError(f"sample={config.sample!r}: use one of {SAMPLES}")


def _batches(tokens_NT, valid_NT, batch_size: int):
  """Fixed-shape batches (the last one padded with invalid rows), so the update compiles once."""
  for start in range(0, len(tokens_NT), batch_size):
    tokens_BT, valid_BT = tokens_NT[start : start + batch_size], valid_NT[start : start + batch_size]
    pad = batch_size - len(tokens_BT)
    if pad:
      tokens_BT = np.concatenate([tokens_BT, np.zeros((pad, tokens_BT.shape[1]), np.int32)])
      valid_BT = np.concatenate([valid_BT, np.zeros((pad, valid_BT.shape[1]), bool)])
    yield tokens_BT, valid_BT


@functools.partial(mesh_lib.jit, static_argnames=("graphdef", "causal"), donate_argnames="state")
def _stream_update(params, state, tokens_BT, valid_BT, *, graphdef, causal: bool):
  """Forward pass capturing `metrics.CAPTURE`, then one `metrics.update`."""
  _, inter = nnx.merge(graphdef, params)(tokens_BT, valid_BT=valid_BT, capture=metrics.CAPTURE)
  return metrics.update_from(state, inter, valid_BT, causal=causal)


def model_metrics(model, tokens_NT, valid_NT, batch_size: int) -> dict[str, np.ndarray]:
  """All metrics of `model` over the evaluation set, streamed in batches: {name: [L,H,H] or [L,H]}."""
  cfg = model.cfg
  graphdef, params = nnx.split(model)
  state = metrics.init(cfg.num_layers, cfg.num_heads, cfg.d_head)
  for tokens_BT, valid_BT in _batches(tokens_NT, valid_NT, batch_size):  # compiled once per model shape
    state = _stream_update(
      params, state, jnp.asarray(tokens_BT), jnp.asarray(valid_BT), graphdef=graphdef, causal=cfg.kind == "decoder"
    )
  return {k: np.asarray(v) for k, v in jax.device_get(metrics.finalize(state)).items()}


def read_results(path, model: str | None = None) -> list[tuple[int, int, int, int, str, float]]:
  """Rows `(step, layer, head_i, head_j, metric, value)` of a diversity/results.csv ([] if absent), for the
  figures: those of `model` only when given (the table holds every model analysed into the workdir)."""
  return [
    (int(r["step"]), int(r["layer"]), int(r["head_i"]), int(r["head_j"]), r["metric"], float(r["value"]))
    for r in tables.read(path, tables.DIVERSITY)
    if model is None or r["model"] == model
  ]


class Diversity(jobloop.Analysis):
  """`headspec diversity` in the job loop's parts."""

  name = "diversity"

  def plan(self):
    _check_config(self.config)
    return targets.plan(self.config, self.workdir, steps=self.config.steps)

  def tables(self, jobs):
    return (tables.DIVERSITY, tables.DIVERSITY_METRICS)

  def prepare(self, jobs):
    config, workdir = self.config, self.workdir
    tokenizer = jobs[0].load()[1] if config.model.pretrained else load_tokenizer(workdir / "tokenizer")
    self.tokens_NT, self.valid_NT = evaluation_tokens(config, workdir, tokenizer)
    n_tokens = int(self.valid_NT.sum())
    logging.info(
      f"diversity: {len(jobs)} step(s), {n_tokens} tokens in {len(self.tokens_NT)} rows of {self.tokens_NT.shape[1]}"
    )

  def job(self, job):
    t0 = time.perf_counter()
    self.values = values = model_metrics(job.load()[0], self.tokens_NT, self.valid_NT, self.config.batch_size)
    rows = [dict(zip(tables.DIVERSITY.columns, (job.name, *r))) for r in metrics.rows(values, job.step)]
    self.model_name = job.name
    logging.info(f"  step {job.step}: {len(next(iter(values.values())))} layers in {time.perf_counter() - t0:.1f} s")
    return {tables.DIVERSITY: rows}

  def finish(self, jobs):
    workdir, values = self.workdir, self.values
    out_dir = workdir / "diversity"
    results = tables.path_of(workdir, tables.DIVERSITY)
    described = [
      dict(metric=m.name, kind=m.kind, basis_dependent=int(m.basis_dependent), doc=m.doc)
      for m in metrics.REGISTRY.values()
      if m.name in values
    ]  # which metrics compare heads' own coordinates (basis-dependent): beside the values, in a CSV
    tables.merge(tables.path_of(workdir, tables.DIVERSITY_METRICS), described, tables.DIVERSITY_METRICS)
    figures = remote.LocalMirror(out_dir, "diversity-figures")  # matplotlib needs local files; uploaded whole
    shape = next(iter(values.values())).shape[:2]  # the model's (L, H): rows of another shape are not drawn
    drawn = read_results(results, self.model_name)  # this model's rows: another model's are not its curves
    for path in plots.plot_all(drawn, figures.local, shape):
      logging.info(f"  wrote {out_dir / pathlib.Path(path).relative_to(figures.local) if figures.remote else path}")
    figures.sync()
    figures.cleanup()
    return results


@provenance.recorded("diversity")
def run(config: ml_collections.ConfigDict, workdir) -> pathlib.Path:
  """Computes every metric at every requested step; writes WORKDIR/diversity/results.csv and figures.

  Returns the path of results.csv. Bad input (not a run directory, no checkpoints, unknown step, bad
  config value) raises UserError before anything is written.
  """
  return jobloop.run(Diversity(config, workdir))
