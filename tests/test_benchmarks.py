"""`python -m benchmarks`: reading each benchmark's JSON, the report it writes, and bad input."""

import json
import os
import pathlib
import subprocess
import sys

import pytest
import test_probe_suite

import benchmarks.__main__ as runner

REPO = pathlib.Path(__file__).resolve().parents[1]
ewt_part = test_probe_suite.ewt_part  # the fixture: 300/80/80 sentences of EWT dev, 40 of GUM dev


def test_last_json_and_flatten():
  out = 'compiling...\n{"a": 1}\nlog line\n{\n "results": [{"size": "tiny", "mfu": null}],\n "speedup": 2.5\n}\n'
  parsed = runner.last_json(out)
  assert parsed == {"results": [{"size": "tiny", "mfu": None}], "speedup": 2.5}
  assert runner.flatten(parsed) == [("results.0.size", "tiny"), ("results.0.mfu", None), ("speedup", 2.5)]


def test_markdown_names_the_machine_and_every_figure():
  info = {"date": "2026-11-23", "device": "2 × cpu (cpu)", "host": "x86_64", "python": "3.11", "versions": {"jax": "0"}}
  entries = {
    "probe": {"command": "python -m benchmarks.bench_probe", "wall_s": 3.0, "result": {"speedup": 7.0}},
    "attention": {"command": "python -m benchmarks.bench_attention", "wall_s": 0.0, "skipped": "needs data"},
    "train": {"command": "python -m benchmarks.bench_train", "wall_s": 1.0, "error": "boom"},
  }
  text = runner.markdown(info, entries, full=False)
  assert "2 × cpu (cpu)" in text and "| speedup | 7.0 |" in text
  assert "Skipped: needs data" in text and "Failed: boom" in text


def test_a_benchmark_may_run_another_modules_script():
  """structural_ewt is bench_structural at full size (all of EWT, layer 0's two shapes); probe_ewt is
  bench_probe at all of EWT's 200k training words."""
  assert runner.command("structural_ewt", runner.BENCHMARKS["structural_ewt"][0]) == (
    "python -m benchmarks.bench_structural --train_words=0 --dev_sentences=0 --layers=0"
  )
  assert runner.command("probe_ewt", runner.BENCHMARKS["probe_ewt"][0]) == (
    "python -m benchmarks.bench_probe --heads=12 --train=200000 --dev=25000 --sklearn_heads=1 --scaling_heads="
  )
  assert runner.command("probe", ["--heads=1"]) == "python -m benchmarks.bench_probe --heads=1"


def test_unknown_benchmark_is_refused(tmp_path):
  done = subprocess.run(
    [sys.executable, "-m", "benchmarks", "--only=nope", f"--out={tmp_path / 'B.md'}"],
    capture_output=True,
    text=True,
    cwd=runner.__file__.rsplit("/benchmarks/", 1)[0],
  )
  assert done.returncode == 2 and "unknown benchmark(s) nope" in done.stdout
  assert not (tmp_path / "B.md").exists()


def _run_benchmark(name: str, data_dir, *args) -> dict:
  """`python -m benchmarks.NAME ARGS` from the checkout on `data_dir`; its last JSON object (it must exit 0)."""
  done = subprocess.run(
    [sys.executable, "-m", f"benchmarks.{name}", *args],
    capture_output=True,
    text=True,
    cwd=runner.__file__.rsplit("/benchmarks/", 1)[0],
    env=dict(os.environ, HEADSPEC_DATA_DIR=str(data_dir)),
  )
  assert done.returncode == 0, done.stderr[-2000:]
  return runner.last_json(done.stdout)


@pytest.mark.e2e
def test_init_benchmark_draws_the_per_shape_weights(data_dir):
  """bench_init on a 1-layer, 8-wide model: the bucketed draw equals the per-shape draw bit for bit, in
  fresh processes, and the three ways' seconds and ratios are reported."""
  sizes = _run_benchmark("bench_init", data_dir, "--sizes=tiny")["sizes"]
  tiny = sizes["tiny"]
  assert list(sizes) == ["tiny"] and tiny["bucketed_equals_per_shape"], tiny
  assert all(s > 0 for s in tiny["seconds"].values())
  assert tiny["ratio_per_shape_over_bucketed"] == pytest.approx(
    tiny["seconds"]["per_shape"] / tiny["seconds"]["bucketed"], abs=0.01
  )


@pytest.mark.e2e
def test_extraction_benchmark_matches_transformers(data_dir):
  """bench_extract on 40 EWT sentences: packed headspec extraction and Hugging Face's PyTorch model give
  the same residual streams (float16 on both sides), and every figure is reported."""
  result = _run_benchmark("bench_extract", data_dir, "--max_sentences=40", "--lengths=16", "--repeats=1")
  assert result["max_abs_diff_residual"] < 0.02  # float16 storage of values up to ~10
  assert result["sentences"].startswith("en_ewt/dev: 40 sentences")
  assert result["headspec_words_per_s"] > 0 and result["torch_words_per_s"] > 0 and result["scaling"][0]["length"] == 16


@pytest.mark.slow
@pytest.mark.e2e
def test_structural_benchmark_times_both_families_on_the_same_sources(data_dir):
  """bench_structural on MiniLM's residual sources of the embeddings and layer 0 (--kind leaves layer 0's
  heads out) over ~200 EWT training words: the structural and the softmax fits of the same source are
  both timed, with their totals, ratios and load averages (about a minute)."""
  args = ("--layers=-1,0", "--kind=residual", "--train_words=200", "--dev_sentences=10")
  result = _run_benchmark("bench_structural", data_dir, *args)
  assert sorted(s["source"] for s in result["per_source"]) == ["layer -1 residual", "layer 0 residual"]
  source = result["per_source"][0]
  assert source["shape"][1:] == [1, 384]
  assert 150 <= result["train_words"] == source["shape"][0] <= 400 and result["dev_sentences"] == 10
  for family in ("softmax", "structural"):
    assert source[family]["fit_s"] > 0 and source[family]["score_s"] > 0
    assert len(source[family]["load_average_before"]) == 3
  assert all(1 <= e <= 40 for runs in source["structural"]["epochs_run"].values() for e in runs)
  total = result["total"]
  assert result["ratio_fit_structural_over_softmax"] == pytest.approx(  # the ratio is printed to 2 decimals
    total["structural"]["fit_s"] / total["softmax"]["fit_s"], rel=0.05, abs=0.005
  )
  assert "structural" in runner.BENCHMARKS and runner.BENCHMARKS["structural"][2]  # needs HEADSPEC_DATA_DIR


@pytest.mark.slow
@pytest.mark.e2e
def test_compile_cache_benchmark_loads_what_the_cold_command_compiled(data_dir):
  """bench_compile_cache at its smallest (a 2-step decoder, 300 probe words, UPOS, dev and test of 60
  sentences): the three commands
  run the same XLA programs; the warm command loads them from the cache the cold one wrote, in less time
  than compiling took."""
  result = _run_benchmark(
    "bench_compile_cache", data_dir, "--steps=2", "--train_words=300", "--tasks=upos", "--treebank_sentences=300,60,60"
  )
  off, cold, warm = (result["commands"][k] for k in ("off", "cold", "warm"))
  assert off["xla_programs"] == cold["xla_programs"] == warm["xla_programs"] > 10
  assert warm["xla_seconds"] < 0.5 * cold["xla_seconds"], result
  assert result["cache_entries"] >= cold["xla_programs"] // 2 and result["cache_mb"] > 0
  assert result["ratio_wall_warm_over_off"] == pytest.approx(warm["wall_s"] / off["wall_s"], abs=0.01)


def test_structural_rank_sweep_reads_the_cache_and_reports_every_fit(ewt_part, tmp_path):
  """benchmarks/check_structural_rank on a tiny probe run (width 16, with a random baseline): a row per
  (layer, rank, task, split, metric) with UUAS/root accuracy in [0, 1] and Spearman in [-1, 1]; rank 32 is
  capped at 16 and says so; the trained model's feature cache is read, not extracted again."""
  from benchmarks import check_structural_rank
  from headspec.errors import UserError
  from headspec.probing import run as probe_run

  data, texts = ewt_part
  workdir = test_probe_suite._make_run(tmp_path / "run", texts[:50])
  config = test_probe_suite._config(data)
  config.probe.update(tasks=("upos",), l2_grid=(1e-2,), eval_splits=("test",), extra_treebanks=(), random_baseline=True)
  config.probe.structural_epochs = 2
  probe_run.run(config, workdir)  # the cache; the softmax probe alone is the cheapest run that writes it
  cache = sorted(p.name for p in (workdir / "probes/cache").iterdir())
  out = check_structural_rank.sweep(config, workdir, [-1, 1], [2, 4, 32], ["distance", "depth"])
  assert sorted(p.name for p in (workdir / "probes/cache").iterdir()) == cache
  assert out["model"] == "run" and out["step"] == 5  # the trained model, not its random-weights copy
  assert out["splits"] == ["en_ewt/dev", "en_ewt/test"] and out["load_average_after"]
  keys = {(r["layer"], r["asked_rank"], r["task"], r["split"], r["metric"]) for r in out["rows"]}
  assert len(keys) == len(out["rows"]) == 2 * 3 * 2 * 2 * 2  # layers x ranks x tasks x splits x metrics
  for r in out["rows"]:
    assert r["rank"] == min(r["asked_rank"], 16) and r["capped"] == (r["asked_rank"] == 32)
    low = -1 if r["metric"] in ("dspr", "nspr") else 0
    assert low <= r["ci_low"] <= r["value"] <= r["ci_high"] <= 1, r
    assert 1 <= r["epochs_run"] <= 2 and r["fit_s"] >= 0
  assert "| 1 | 16 (capped) | distance | en_ewt/test | uuas " in check_structural_rank.markdown(out)
  with pytest.raises(UserError, match="not structural"):
    check_structural_rank.sweep(config, workdir, [0], [2], ["upos"])
  with pytest.raises(UserError, match="no feature cache"):
    check_structural_rank.sweep(config, tmp_path / "nothing", [0], [2], ["depth"])


def test_check_scripts_import_together():
  """check_residual_probes and check_structural_rank share flag names: one process imports both (the suite
  does), so only a script run defines check_structural_rank's flags."""
  import subprocess
  import sys

  code = "import benchmarks.check_residual_probes, benchmarks.check_structural_rank"
  done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
  assert done.returncode == 0, done.stderr[-2000:]


def test_quickstart_benchmark_knows_every_stage_the_quickstart_prints():
  """bench_quickstart times stages by the lines headspec/cli/quickstart.py prints: each must still be printed
  there (a renamed line would fold its stage's time into the stage before it)."""
  import inspect

  from benchmarks import bench_quickstart
  from headspec.cli import quickstart

  source = inspect.getsource(quickstart.run_quickstart)
  for start, _ in bench_quickstart.STAGES:
    template = start.replace("the decoder", "the {kind}").replace("the encoder", "the {kind}")
    assert template in source if start.startswith(("training", "probing")) else start in source, start
  assert bench_quickstart._stage("probing every head of the encoder on the synthetic treebank") == "probe encoder"
  assert bench_quickstart._stage("I1128 probing 2 model step(s)") is None


def test_quickstart_benchmark_reads_compilations_and_the_upos_row(tmp_path):
  import json

  from benchmarks import bench_quickstart

  for kind in ("decoder", "encoder"):
    probes = tmp_path / kind / "probes"
    probes.mkdir(parents=True)
    info = {"xla_compilations": {f"{kind} step 300": 7}, "xla_compile_seconds": {f"{kind} step 300": 1.5}}
    (probes / "run_info.json").write_text(json.dumps(info))
    (probes / "summary.md").write_text(
      "# x\n| task | baseline |\n|---|---|\n| upos | 0.202 (majority) |\n| xpos | 0.1 |\n"
    )
  facts = bench_quickstart._probe_facts(str(tmp_path))
  assert facts["encoder"]["xla_compilations"] == {"encoder step 300": 7}
  assert facts["decoder"]["summary_upos_row"] == "upos ; 0.202 (majority)"


def test_minilm_probe_benchmark_adds_up_the_suites_fit_lines_and_reads_the_run(tmp_path):
  """bench_probe_minilm sums the probe suite's 'fitted ... (N s)' lines by kind and by source (a line the
  suite logs, tested against headspec/probing/suite.py's format) and reads compilations and iterations."""
  import inspect
  import json

  from benchmarks import bench_probe_minilm
  from headspec.probing import suite

  assert "fitted {" in inspect.getsource(suite._probe_source)
  lines = [
    "probes:   0%|          | 0/13 [00:00<?, ?group/s][AI1128 09:28:33.2 suite.py:255]     layer 0 heads: fitted upos, "
    "xpos, deprel (36 s)\n",  # a progress bar before the log line, as stderr interleaves them
    "I1128 09:28:40.4 suite.py:255]     layer 0 heads: fitted arc (7 s)\n",
    "I1128 09:28:52.9 suite.py:255]     layer 0 heads: fitted distance, depth (13 s)\n",
    "I1128 09:29:08.1 suite.py:255]     embeddings: fitted upos, xpos, deprel (5 s)\n",
    "I1128 09:29:18.5 suite.py:267]     layer 1 heads upos: train objective 2.39, L-BFGS iterations 3-10\n",
  ]
  out = bench_probe_minilm.fit_seconds(lines)
  assert out["by_kind"] == {"softmax": 41, "arc": 7, "structural": 13}
  assert out["by_source"] == {"layer 0 heads": 56, "embeddings": 5}
  info = {
    "xla_compilations": {"m step 0": 7, "m-random step 0": 2},
    "xla_compile_seconds": {"m step 0": 1.5, "m-random step 0": 0.25},
    "xla_compilations_by_function": {
      "m step 0": {"jit(_lbfgs_step)": 3, "jit(stage)": 4},
      "m-random step 0": {"jit(stage)": 2},
    },
    "train_words": 40000,
    "lbfgs_passes": {
      "m step 0 layer 0 heads": dict(gflop=2.0, seconds=1.0, words=512, groups=2, width=8, columns=16),
      "m step 0 layer 1 heads": dict(gflop=1.0, seconds=0.5, words=512, groups=2, width=8, columns=16),
      "m step 0 embeddings": dict(gflop=4.0, seconds=1.0, words=512, groups=1, width=32, columns=16),
    },
  }
  (tmp_path / "run_info.json").write_text(json.dumps(info))
  (tmp_path / "fits.csv").write_text(
    "model,step,task,layer,head,probe,iterations\nm,0,upos,0,0,task,12\nm,0,upos,0,1,control,30\n"
    "m,0,xpos,0,0,task,40\nm,0,arc,0,0,task,\n"
  )
  (tmp_path / "summary.md").write_text("| task | baseline |\n|---|---|\n| upos | 0.2 (majority) |\n")
  facts = bench_probe_minilm.run_facts(str(tmp_path))
  assert (facts["xla_compilations"], facts["xla_compile_seconds"]) == (9, 1.8)
  assert facts["xla_compilations_top"] == {"jit(stage)": 6, "jit(_lbfgs_step)": 3}
  assert facts["lbfgs_iterations_max"] == {"upos": 30, "xpos": 40} and facts["lbfgs_iterations_total"] == 82
  assert facts["softmax_fits"] == 3 and facts["summary_upos_row"] == "upos ; 0.2 (majority)"
  floor = facts["lbfgs_floor"]  # per shape: the fits' arithmetic at a plain matmul's rate, measured now
  heads, wide = floor["by_shape"]["G 2 x K 8 x T 16 at N 512"], floor["by_shape"]["G 1 x K 32 x T 16 at N 512"]
  assert (heads["fits"], heads["gflop"], heads["seconds"], heads["gflop_per_s"]) == (2, 3.0, 1.5, 2.0)
  for shape in (heads, wide):
    assert shape["plain_matmul_gflop_per_s"] > 0
    floor_s, plain = shape["floor_s"], shape["plain_matmul_gflop_per_s"]  # each rounded to 0.1
    assert abs(floor_s * plain - shape["gflop"]) <= 0.05 * (floor_s + plain) + 0.01, shape
  assert floor["total"]["gflop"] == 7.0 and floor["total"]["seconds"] == 2.5


@pytest.mark.slow  # 77 s at load ~17 (a subprocess importing jax and torch, one compile)
def test_sae_benchmark_times_both_loops_on_the_same_batches(tmp_path):
  """bench_sae at a tiny size: headspec's fit_sae loop and the plain PyTorch loop of the same TopK SAE both train
  (the same planted activations and batches: their losses after 20 steps within 0.15 of each other), and the
  ratio is theirs."""
  args = ("--width=32", "--heads=4", "--features=64", "--k=4", "--batch=64", "--inputs=2048", "--steps=20")
  result = _run_benchmark("bench_sae", tmp_path, *args, "--chunk=10", "--skip_fit")
  jax_sps, torch_sps = result["headspec_steps_per_second"], result["torch_steps_per_second"]
  assert jax_sps > 0 and torch_sps > 0 and result["headspec_over_torch"] == pytest.approx(jax_sps / torch_sps, rel=0.01)
  loss = result["final_loss"]
  assert 0 < loss["headspec"] < 1 and abs(loss["headspec"] - loss["torch"]) < 0.15
  assert result["threads"]["torch"] == os.cpu_count() and result["shape"]["timed_steps"] == 20


@pytest.mark.slow  # three compiled programs (~25 s of CPU)
def test_circuit_benchmark_times_edge_scores_against_exact_edge_patching(tmp_path):
  """bench_circuit on a 2-layer model: every edge scored by EAP, EAP-IG and exact edge patching, each compiled
  once, the ratio the benchmark's own times', the agreement with exact patching reported."""
  result = _run_benchmark("bench_circuit", tmp_path, "--layers=2", "--prompts=2", "--n=3", "--steps=2")
  seconds = result["seconds"]
  assert "110 edges" in result["model"] and all(s > 0 for s in seconds.values())
  # relative: the reported seconds are rounded, and a tiny model's EAP takes a few milliseconds
  assert result["exact_over_eap"] == pytest.approx(seconds["exact"] / seconds["eap"], rel=0.1)
  assert result["compilations"] == {"eap": 1, "eap_ig": 1, "exact": 1}
  assert all(-1 <= r <= 1 for r in result["spearman_with_exact"].values())


def test_gpu_scale_script_runs_on_cpu_as_it_would_on_an_accelerator():
  """benchmarks/gpu_scale.py --smoke: both meshes of the training step, with the attention path each took."""
  env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
  done = subprocess.run(
    [sys.executable, "-m", "benchmarks.gpu_scale", "--smoke", "--skip_minilm"],
    cwd=REPO, env=env, capture_output=True, text=True, timeout=600,
  )  # fmt: skip
  assert done.returncode == 0, done.stderr[-2000:]
  out = json.loads(done.stdout)
  assert out["machine"]["devices"] == 2
  assert [r["mesh"] for r in out["training"]] == ["data=2,fsdp=1,tensor=1", "data=1,fsdp=2,tensor=1"]
  assert all(r["attention_path"] == "xla" and r["tokens_per_second"] > 0 for r in out["training"])


def test_depth_benchmark_reports_first_calls_and_ratios(tmp_path):
  """bench_depth at 1 and 2 layers (2 heads, 4 tokens): each depth's first-call and compile seconds of the forward
  and both sweeps, and the deeper over the shallower as the benchmark's own ratio."""
  result = _run_benchmark("bench_depth", tmp_path, "--layers=1,2", "--heads=2", "--tokens=4", "--prompts=2")
  names = ("forward", "ablation_sweep", "patching_sweep_z_by_position")
  assert list(result["depths"]) == ["1", "2"] and all(list(d) == list(names) for d in result["depths"].values())
  for name in names:
    shallow, deep = result["depths"]["1"][name], result["depths"]["2"][name]
    assert deep["seconds"] > 0 and deep["compile_seconds"] > 0
    assert result["ratio_deepest_over_shallowest"][name] == pytest.approx(
      deep["seconds"] / shallow["seconds"], abs=0.05
    )


def test_slowest_tests_reads_the_junit_record(tmp_path):
  """slowest_tests reads every test's time from the record pytest.ini has each run write; a rerun test
  keeps its last time."""
  from benchmarks import slowest_tests

  record = tmp_path / "record.xml"
  record.write_text(
    '<testsuites><testsuite name="pytest">'
    '<testcase classname="tests.test_a" name="test_x[1]" time="2.5"/>'
    '<testcase classname="tests.test_b" name="test_y" time="9.0"/>'
    '<testcase classname="tests.test_b" name="test_y" time="7.0"/>'
    "</testsuite></testsuites>"
  )
  assert slowest_tests.durations(str(record)) == {"tests/test_a.py::test_x[1]": 2.5, "tests/test_b.py::test_y": 7.0}
