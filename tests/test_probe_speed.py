"""The softmax probe fit's cost structure: bounded compilations, one read per L-BFGS iteration, and
results unchanged against the reference fit (benchmarks/probe_reference.json)."""

import json
import math

import numpy as np
from jax import monitoring

from benchmarks import check_probe_reference as reference
from headspec.probing import probe, probe_objective


def _compiles(names):
  """A list that collects the backend compilations of jitted functions whose name contains one of
  `names`, and the listener to unregister."""
  seen = []

  def listener(event, duration, **kwargs):
    if event == "/jax/core/compile/backend_compile_duration" and any(n in str(kwargs.get("fun_name")) for n in names):
      seen.append(kwargs.get("fun_name"))

  monitoring.register_event_duration_secs_listener(listener)
  return seen, listener


def test_results_agree_with_the_fit_before_the_rewrite():
  """Every probe's penalised objective within 1e-3 relative of the old fit's or lower, every dev
  accuracy within 0.1 point (20,000 dev words)."""
  gaps = reference.compare(reference.fit_all(), json.loads(reference.REFERENCE.read_text()))
  assert gaps["objective_worst_relative_excess"] <= 1e-3, gaps
  assert gaps["dev_accuracy_max_abs_points"] <= 0.1, gaps


def test_compilations_are_bounded_and_each_iteration_reads_once(monkeypatch):
  """With narrowing at every chance (NARROWING_COST = 0) the L-BFGS step compiles at most 1 + log_{4/3} of
  the pass's groups × columns times however many iterations run; every iteration reads the device
  once (plus the host copies taken when the pass narrows)."""
  x, specs = reference.problem()
  n = reference.N_TRAIN
  reads, real_lbfgs = [], probe._lbfgs
  iterations = []

  def counting(*args, fetch, **kwargs):
    out = real_lbfgs(*args, fetch=lambda a: reads.append(1) or fetch(a), **kwargs)
    iterations.append(int(out.iterations.max()))
    return out

  monkeypatch.setattr(probe, "_lbfgs", counting)
  monkeypatch.setattr(probe, "NARROWING_COST", 0.0)
  steps, listener = _compiles(["_lbfgs_step"])
  narrowings = []
  real_narrowed = probe_objective.ProbeProblem.restrict
  monkeypatch.setattr(
    probe_objective.ProbeProblem, "restrict", lambda self, *a: narrowings.append(1) or real_narrowed(self, *a)
  )
  try:
    fitted = probe.fit_softmax_probes(x[:n], x[n:], specs, refine_samples=2048, batch_size=512)
  finally:
    monitoring.unregister_event_duration_listener(listener)
  width = reference.G * 3 * (8 + 20)
  assert narrowings, "the pass never narrowed"
  assert 1 <= len(steps) <= 1 + len(narrowings) <= 1 + math.log(width, 4 / 3), (steps, narrowings)
  assert max(iterations) > len(steps) + 5  # many iterations, few compilations
  assert len(reads) <= sum(iterations) + len(iterations) * 2 + 2 * len(narrowings), (len(reads), iterations)
  assert all(np.isfinite(fitted.train_objective[s.name]).all() for s in specs)


def test_a_second_fit_of_the_same_shapes_compiles_nothing():
  """Fits of the same shapes (a suite's layers, MDL's repeated blocks) reuse every compiled program."""
  x, specs = reference.problem()
  n = reference.N_TRAIN
  kw = dict(refine_samples=2048, batch_size=512, l2_grid=(1e-3,))
  probe.fit_softmax_probes(x[:n], x[n:], specs, **kw)
  seen, listener = _compiles([""])
  try:
    probe.fit_softmax_probes(x[:n] * 2.0 + 1.0, x[n:], specs, **kw)
  finally:
    monitoring.unregister_event_duration_listener(listener)
  assert seen == [], seen


def test_arc_epochs_read_the_device_once_for_early_stopping(monkeypatch):
  """The dev loss that early stopping reads is one compiled loop per packed-row width, however many
  chunks the dev split takes, and gives the loss chunk by chunk summed on the host."""
  from headspec.probing import arc

  rng = np.random.default_rng(0)
  lengths = rng.integers(3, 12, 300)
  x = rng.standard_normal((lengths.sum(), 2, 8)).astype(np.float32)
  heads = [rng.integers(0, n + 1, n) for n in lengths]
  w = lengths[:200].sum()
  calls, real = [], arc._nll_sum_PG
  monkeypatch.setattr(arc, "_nll_sum_PG", lambda *a: calls.append(a[1].shape[0]) or real(*a))
  fitted = arc.fit_arc_probes(x[:w], heads[:200], x[w:], heads[200:], epochs=3, patience=5, chunk_words=128)
  assert len(calls) == fitted.epochs_run and calls[0] > 1  # one call per epoch (one width), several chunks in it
  chunks, words = arc._dev_chunks(arc._buckets(lengths[200:], np.concatenate(heads[200:])), x[w:], 128)
  params = (fitted.a_GKI[None], fitted.b_GKI[None], fitted.root_GI[None])  # one l2 value: the chosen
  one = arc._dev_nll(params, chunks, words, fitted.mean_GK, fitted.std_GK)
  per_chunk = sum(
    np.asarray(arc._nll_PG(params, c[0][i], c[1][i], c[2][i], fitted.mean_GK, fitted.std_GK), np.float64)
    for c in chunks
    for i in range(c[0].shape[0])
  )
  np.testing.assert_allclose(one, per_chunk / words, rtol=1e-5)


def test_benchmark_report_keeps_the_sections_it_does_not_rerun(tmp_path):
  """`python -m benchmarks --only=probe` rewrites the probe section and keeps the others as they were."""
  import benchmarks.__main__ as runner

  old = tmp_path / "B.md"
  old.write_text(
    "# Benchmarks\n\nold header\n\n## train\n\n`cmd` — 1 s wall\n\n| figure | value |\n|---|---|\n| x | 1 |\n\n## probe\n\nold probe\n"
  )
  info = {"date": "2026-11-25", "device": "cpu", "host": "x86_64", "python": "3.11", "versions": {}}
  entries = {"probe": {"command": "python -m benchmarks.bench_probe", "wall_s": 3.0, "result": {"speedup_cpu": 3.1}}}
  text = runner.markdown(info, entries, False, runner.kept_sections(str(old), entries))
  assert "| x | 1 |" in text and "| speedup_cpu | 3.1 |" in text and "old probe" not in text
  assert text.index("## train") < text.index("## probe")


def test_pass_chunks_cover_the_words_evenly_within_the_cache_bound():
  """pass_chunk_words: chunks of whole multiples of 64 words (or all the words, when fewer than the
  smallest chunk), at least 256 words, at most `most`, at most CHUNK_LOGITS logits, and padding under 64
  words a chunk."""
  for n, groups, columns in [(5708, 1, 416), (47600, 1, 594), (20000, 12, 624), (200, 2, 100), (200000, 72, 624)]:
    c = probe.pass_chunk_words(n, groups, columns)
    chunks = -(-n // c)
    assert c == n if n < 256 else (c % 64 == 0 and 256 <= c <= 2048), (n, c)
    assert chunks * c - n < 64 * chunks, (n, c)
    assert c * groups * columns <= probe.CHUNK_LOGITS or c <= 256, (n, c)
  assert probe.pass_chunk_words(5708, 1, 416) == 1920  # 3 chunks of 1,920 (the old rule: 2 chunks of 4,096)
  # the measured best chunks (probe.py): all-MiniLM-L6-v2's head layers at 40k words, the quickstart's
  assert probe.pass_chunk_words(39998, 12, 600) == 256 and probe.pass_chunk_words(47600, 4, 354) == 1024
  assert probe.pass_chunk_words(100_000, 1, 16, most=1024) == 1024
