"""The probing suite end to end: results.csv contract, merging, caching, bad input, and a trained model."""

import csv
import json
import logging
import pathlib

import numpy as np
import pytest
from flax import nnx

from headspec.data import treebank
from headspec.data.tokenizer import train_sentencepiece
from headspec.errors import UserError
from headspec.io import tables
from headspec.model.config import from_section
from headspec.model.transformer import random_like
from headspec.probing import report, suite, tasks
from headspec.probing import run as probe_run
from headspec.probing.config import probe_config
from headspec.runs import checkpoints
from headspec.runs import directory as runs
from headspec.train.config import train_config
from headspec.words import alignment as align

CONTRACT = "model,step,task,layer,head,split,accuracy,ci_low,ci_high,control_accuracy,selectivity,n"


def _blocks(path):
  return [b for b in pathlib.Path(path).read_text(encoding="utf-8").split("\n\n") if b.strip()]


@pytest.fixture(scope="module")
def ewt_part(data_dir, tmp_path_factory):
  """A data dir whose en_ewt train/dev/test are 300/80/80 sentences of EWT dev, and 40 of GUM dev."""
  out = tmp_path_factory.mktemp("data")
  blocks = _blocks(data_dir / "ud/en_ewt/en_ewt-ud-dev.conllu")
  (out / "ud/en_ewt").mkdir(parents=True)
  for split, part in (("train", blocks[:300]), ("dev", blocks[300:380]), ("test", blocks[380:460])):
    (out / f"ud/en_ewt/en_ewt-ud-{split}.conllu").write_text("\n\n".join(part) + "\n\n", encoding="utf-8")
  (out / "ud/en_gum").mkdir(parents=True)
  gum = _blocks(data_dir / "ud/en_gum/en_gum-ud-dev.conllu")[:40]
  (out / "ud/en_gum/en_gum-ud-dev.conllu").write_text("\n\n".join(gum) + "\n\n", encoding="utf-8")
  return out, [
    "\n".join(l.split("\t")[1] for l in b.splitlines() if l[:1].isdigit() and "\t" in l) for b in blocks[:300]
  ]


def _make_run(workdir, texts, steps=(5,)):
  """A run directory with a tiny random encoder saved at `steps` (no training) and a SentencePiece tokenizer."""
  config = train_config()
  config.model.update(
    kind="encoder",
    num_layers=2,
    num_heads=2,
    d_model=16,
    d_head=8,
    d_ff=32,
    dropout=0.0,
    attention_dropout=0.0,
    pre_layernorm=False,
  )
  config.train.seq_len = 32  # long EWT sentences are split into windows
  runs.write_config(workdir, config)
  tokenizer = train_sentencepiece([t.replace("\n", " ") for t in texts], workdir / "tokenizer", vocab_size=700)
  cfg = from_section(config.model, tokenizer.vocab_size, config.train.seq_len)
  mngr = checkpoints.manager(workdir)
  for seed, step in enumerate(steps):
    params = nnx.state(random_like(cfg, seed))
    checkpoints.save(mngr, step, {"params": params}, {})
  mngr.wait_until_finished()
  mngr.close()
  return workdir


def _config(data):
  c = probe_config()
  c.data_dir = str(data)
  c.probe.tasks = ("upos", "xpos", "deprel", "arc")  # the default adds distance, depth: tests/test_structural.py
  c.probe.extra_treebanks = ("en_gum",)
  c.probe.bootstrap_resamples = 100
  c.probe.refine_samples = 2048
  c.probe.l2_grid = (1e-4, 1e-2)
  c.probe.batch_tokens = 1024
  c.probe.arc_max_train_words = 2000
  c.probe.arc_epochs = 5
  return c


def _rows(path):
  with open(path, newline="") as f:
    assert f.readline().strip() == CONTRACT
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def test_default_tasks_are_every_task_structural_included():
  """`probe.tasks` defaults to every registered task, Hewitt & Manning's distance and depth probes too, so
  `headspec probe` and the quickstart write probes/structural.csv."""
  from headspec.probing.config import synthetic_probe_config

  for config in (probe_config(), synthetic_probe_config("data")):
    assert config.probe.tasks == ("upos", "xpos", "deprel", "arc", "distance", "depth") == tuple(tasks.REGISTRY)
    assert tables.PROBE_STRUCTURAL in suite.job_tables(config)


def test_quickstart_probes_are_the_synthetic_suite_with_three_keys_trimmed():
  """The quickstart's probes differ from configs/probe_synthetic.py only in the train subset, the λ grid and
  the random copy (which the quickstart asks for on the decoder alone): every task, split and protocol
  key stays the full suite's."""
  from headspec.probing.config import quickstart_probe_config, synthetic_probe_config

  full = synthetic_probe_config("data").to_dict()
  for random_baseline in (True, False):
    quick = quickstart_probe_config("data", random_baseline=random_baseline).to_dict()
    moved = {key for key in full["probe"] if quick["probe"][key] != full["probe"][key]}
    assert moved == {"max_train_words", "l2_grid"} | ({"random_baseline"} if not random_baseline else set())
    assert quick["probe"]["max_train_words"] == 12_000 and set(quick["probe"]["l2_grid"]) < set(
      full["probe"]["l2_grid"]
    )
    assert {k: v for k, v in quick.items() if k != "probe"} == {k: v for k, v in full.items() if k != "probe"}


def test_suite_on_ewt_part(ewt_part, tmp_path, caplog):
  caplog.set_level(logging.INFO)  # the progress lines are absl INFO logs
  data, texts = ewt_part
  workdir = _make_run(tmp_path / "run", texts, steps=(5, 9))
  config = _config(data)
  config.probe.steps = "9"
  config.probe.random_baseline = True
  results = probe_run.run(config, workdir)
  assert results == workdir / "probes/results.csv"
  # XLA compilations per model step: the second step (same shapes) compiles no forward
  # pass, start or Adam program again; only an L-BFGS narrowing to a shape the first step's fits never
  # reached (which probes still run depends on the data), at most 1 + log_{4/3}(G·T) per fit, and the
  # preconditioner's refresh at such a shape
  info = json.loads((workdir / "probes/run_info.json").read_text())
  compiles, by_function = info["xla_compilations"], info["xla_compilations_by_function"]
  assert compiles["run step 9"] > 0, by_function
  narrowing = {"jit(_lbfgs_step)", "jit(_take_groups)", "jit(_preconditioner)"}
  assert set(by_function["run-random step 0"]) <= narrowing, by_function
  # every source's softmax fit records its L-BFGS passes' arithmetic and full-pass shape (benchmarks)
  passes = info["lbfgs_passes"]
  assert {key.split(" step ")[0] for key in passes} == {"run", "run-random"}
  assert len(passes) == 2 * len([k for k in passes if k.startswith("run step 9")])
  num_p = len(config.probe.l2_grid)
  for rec in passes.values():  # controls have their task's classes: 2 · Σ classes · λ columns
    assert rec["words"] == info["train_words"] and rec["gflop"] > 0 and rec["columns"] % (2 * num_p) == 0, rec
  out = caplog.text
  assert "split into windows" in out and "en_ewt/train" in out
  rows = _rows(results)
  words = {"en_ewt/dev": 0, "en_ewt/test": 0, "en_gum/dev": 0}
  scored_arcs = {}  # arcs leave punctuation out (probe.arc_ignore_punct), task and control alike
  _, tokenizer = runs.load_run_model(workdir, 9)
  for split in words:
    tb, name = split.split("/")
    blocks = _blocks(data / f"ud/{tb}/{tb}-ud-{name}.conllu")
    sentences = [[l.split("\t") for l in b.splitlines() if l.split("\t")[0].isdigit()] for b in blocks]
    # the suite skips sentences the model cannot represent (a word of more pieces than its context)
    ok = align.align([[f[1] for f in s] for s in sentences], tokenizer, 32).representable_U
    fields = [f for s, good in zip(sentences, ok) if good for f in s]
    words[split] = len(fields)
    scored_arcs[split] = sum(f[3] != "PUNCT" for f in fields)
  groups = 2 * 2 + 2 + 1  # heads, residual streams, embeddings
  assert len(rows) == 2 * 4 * groups * 3  # (model, -random) x tasks x groups x splits
  assert {(r["model"], r["step"]) for r in rows} == {("run", "9"), ("run-random", "0")}
  for r in rows:
    assert r["task"] in ("upos", "xpos", "deprel", "arc") and r["split"] in words
    acc, low, high, control, sel = (
      float(r[k]) for k in ("accuracy", "ci_low", "ci_high", "control_accuracy", "selectivity")
    )
    assert 0 <= low <= acc <= high <= 1 and 0 <= control <= 1
    assert sel == pytest.approx(acc - control, abs=2e-6)
    assert int(r["n"]) == (scored_arcs if r["task"] == "arc" else words)[r["split"]]
    layer, head = int(r["layer"]), int(r["head"])
    assert -1 <= layer < 2 and -1 <= head < 2 and (layer >= 0 or head == -1)
  baselines = list(csv.DictReader(open(workdir / "probes/baselines.csv")))
  assert {b["task"] for b in baselines} == {"upos", "xpos", "deprel", "arc"}
  upos_dev = [r for r in rows if r["task"] == "upos" and r["split"] == "en_ewt/dev" and r["model"] == "run"]
  majority = next(float(b["accuracy"]) for b in baselines if b["task"] == "upos" and b["split"] == "en_ewt/dev")
  embedding = next(float(r["accuracy"]) for r in upos_dev if r["layer"] == "-1")
  assert embedding > majority + 0.05  # even random embeddings identify frequent word types
  fits = tables.read(workdir / "probes/fits.csv", tables.PROBE_FITS)
  assert len(fits) == 2 * 4 * groups * 2  # (model, -random) x tasks x groups x (task, control)
  dev = {
    (r["model"], r["task"], r["layer"], r["head"]): float(r["accuracy"]) for r in rows if r["split"] == "en_ewt/dev"
  }
  for f in fits:
    assert f["probe"] in ("task", "control") and float(f["l2"]) > 0
    if f["probe"] == "task":  # the probe results.csv scored (which also counts classes unseen in train, as wrong)
      scored = dev[(f["model"], f["task"], f["layer"], f["head"])]
      if f["task"] == "arc":
        assert float(f["dev_accuracy"]) == pytest.approx(scored, abs=1e-6)
      else:
        assert scored - 1e-6 <= float(f["dev_accuracy"]) <= scored + 0.02
    if f["task"] == "arc":
      assert 1 <= int(f["iterations"]) <= config.probe.arc_epochs and 0 <= float(f["train_accuracy"]) <= 1
      assert f["train_objective"] == "nan" and float(f["dev_loss"]) > 0
    else:
      assert float(f["train_objective"]) > 0 and int(f["iterations"]) >= 1 and f["start"] in ("lda", "prior")
      assert f["converged"] == "1", f  # the suite's L-BFGS converges on these small problems
  l2 = {(f["model"], f["task"], f["layer"], f["head"], f["probe"]): float(f["l2"]) for f in fits}
  assert all(l2[k[:4] + ("control",)] == v for k, v in l2.items() if k[4] == "task")  # one λ: control_lambda tied
  summary = (workdir / "probes/summary.md").read_text()
  assert "## run, step 9" in summary and "## run-random, step 0" in summary and "majority baseline" in summary
  for task in ("upos", "xpos", "deprel", "arc"):
    assert (workdir / f"probes/heatmap_{task}.png").stat().st_size > 1000

  # Probing another step adds its rows; re-probing a step replaces them (no duplicates) from the cache.
  caches = sorted(p.name for p in (workdir / "probes/cache").iterdir())
  config.probe.steps = "all"
  config.probe.random_baseline = False
  config.probe.tasks = ("upos",)
  config.probe.complexity = True  # also the complexity sweep: every λ of the grid, task and control
  config.probe.mdl, config.probe.mdl_fractions = True, (0.1, 0.5, 1.0)  # and MDL (a short schedule here)
  probe_run.run(config, workdir)
  rows2 = _rows(results)
  sweep = tables.read(workdir / "probes/complexity.csv", tables.COMPLEXITY)
  assert len(sweep) == 2 * groups * len(config.probe.l2_grid)  # steps 5 and 9
  assert {float(r["l2"]) for r in sweep} == set(config.probe.l2_grid) and {r["split"] for r in sweep} == {"en_ewt/dev"}
  chosen = {
    (r["step"], r["layer"], r["head"]): float(r["accuracy"])
    for r in rows2
    if r["split"] == "en_ewt/dev" and r["model"] == "run" and r["task"] == "upos"
  }
  assert len(chosen) == 2 * groups
  for key, acc in chosen.items():  # the reported dev accuracy is the sweep's best λ for that group
    best = max(float(r["accuracy"]) for r in sweep if (r["step"], r["layer"], r["head"]) == key)
    assert acc == pytest.approx(best, abs=1e-6)
  assert (workdir / "probes/complexity_upos.png").stat().st_size > 1000
  codes = tables.read(workdir / "probes/mdl.csv", tables.MDL)
  assert len(codes) == 2 * groups and {r["task"] for r in codes} == {"upos"}
  for r in codes:  # finite codes that compress, task and control (the features carry the labels)
    assert 0 < float(r["codelength_bits"]) and float(r["uniform_bits"]) > 0 and int(r["n"]) > 1000
    assert float(r["compression"]) > 1 and float(r["control_compression"]) > 1
  # (At steps 5 and 9 the features are close to word identity, which decides the control: with whole sentences
  # portioned, the control compresses 0.5-5 % better than UPOS in every group; no order is asserted.)
  assert "MDL" in (workdir / "probes/summary.md").read_text()
  assert {(r["model"], r["step"]) for r in rows2} == {("run", "5"), ("run", "9"), ("run-random", "0")}
  step9 = [r for r in rows2 if r["step"] == "9"]  # its upos rows replaced, the other tasks' kept (the key holds task)
  assert len(step9) == 4 * groups * 3 and len([r for r in step9 if r["task"] == "upos"]) == groups * 3
  assert len([r for r in rows2 if r["model"] == "run-random"]) == 4 * groups * 3  # untouched
  new = set(p.name for p in (workdir / "probes/cache").iterdir()) - set(caches)
  assert len(new) == 4 and all(n.startswith("run-step5-") for n in new)  # step 9 came from the cache

  # MDL alone (probe.mdl_only) on the probed run: the same codes, nothing fitted, the other tables untouched.
  kept = ("results.csv", "selectivity.csv", "fits.csv", "baselines.csv", "complexity.csv")
  before = {name: (workdir / "probes" / name).read_bytes() for name in kept}
  (workdir / "probes/mdl.csv").unlink()
  caplog.clear()
  config.probe.mdl_only = True
  assert probe_run.run(config, workdir) == workdir / "probes/mdl.csv"
  out = caplog.text
  assert "MDL: online codes" in out and "fitted" not in out
  assert tables.read(workdir / "probes/mdl.csv", tables.MDL) == codes
  assert {name: (workdir / "probes" / name).read_bytes() for name in kept} == before
  assert "MDL" in (workdir / "probes/summary.md").read_text()


def test_selectivity_rows_rank_on_dev_and_pair_with_the_next_head():
  """probes/selectivity.csv rows: heads ranked by DEV selectivity, each paired with the next-ranked head
  on the same split (the difference and its CI), residual streams unranked, paired CIs per head."""
  import types

  rng = np.random.default_rng(0)
  n = 3000
  sentence_N = np.repeat(np.arange(n // 10), 10)
  groups = [(0, 0), (0, 1), (0, 2), (0, -1)]
  rates = {"x/dev": (0.10, 0.30, 0.20, 0.50), "x/test": (0.12, 0.28, 0.21, 0.50)}  # correct − control rates
  per_word = {}
  for split, r in rates.items():
    d = np.stack([(rng.random(n) < p).astype(np.int8) for p in r], 1)
    per_word[("upos", split)] = (groups, d, np.ones(n), sentence_N)
  config = probe_config()
  config.probe.bootstrap_resamples = 200
  job = types.SimpleNamespace(name="m", step=0)
  rows = suite.selectivity_rows(job, per_word, "x/dev", config)
  test = {(r["layer"], r["head"]): r for r in rows if r["split"] == "x/test"}
  assert [test[(0, h)]["dev_rank"] for h in (0, 1, 2)] == [3, 1, 2] and test[(0, -1)]["dev_rank"] == -1
  first = test[(0, 1)]
  d = per_word[("upos", "x/test")][1]
  assert first["delta_next"] == pytest.approx(d[:, 1].mean() - d[:, 2].mean())  # head 1 minus head 2, on test
  assert first["delta_next_ci_low"] < first["delta_next"] < first["delta_next_ci_high"]
  assert first["delta_next_ci_low"] > 0  # 0.28 vs 0.21 over 3000 words: the dev order holds on test
  assert np.isnan(test[(0, 0)]["delta_next"]) and np.isnan(test[(0, -1)]["delta_next"])  # last head; residual
  for r in rows:
    assert r["selectivity_ci_low"] <= r["selectivity"] <= r["selectivity_ci_high"] and r["n"] == n


def _summary_row(model="m", layer=1, head=0, split="x/dev", acc=0.5, control=0.3) -> dict:
  """A results.csv row (as read back: strings) with a ±0.01 CI."""
  return dict(
    model=model,
    step="0",
    task="upos",
    layer=str(layer),
    head=str(head),
    split=split,
    accuracy=str(acc),
    ci_low=str(acc - 0.01),
    ci_high=str(acc + 0.01),
    control_accuracy=str(control),
    selectivity=str(acc - control),
    n="9",
  )


def test_summary_names_one_head_per_best_row():
  """The cross-model table reports the most selective head with its own accuracy, not another head's."""
  row = lambda model, head, acc, control: _summary_row(model, 1, head, "x/dev", acc, control)
  rows = [row("m", 0, 0.9, 0.8), row("m", 1, 0.6, 0.2), row("m-random", 0, 0.3, 0.3)]
  text = report.summary(rows, [], "x/dev", top_k=2)
  table = text[text.index("## Most selective head per task") :]
  assert "| m | 0 | upos | 1 | 1 | 0.600 | [0.590, 0.610] | 0.200 | +0.400 |" in table
  assert "0.900" not in table  # head 0 is the most accurate, not the most selective


def test_summary_overview_chooses_on_dev_and_reports_test():
  """The overview row of a task: the residual stream with the best DEV accuracy and the head with the
  best DEV selectivity, both reported with their TEST accuracy / control, and the head's paired CI."""

  row = lambda layer, head, split, acc, control: _summary_row("m", layer, head, split, acc, control)

  rows = [
    row(-1, -1, "t/dev", 0.70, 0.6),
    row(-1, -1, "t/test", 0.71, 0.6),
    row(0, -1, "t/dev", 0.90, 0.5),  # best residual on dev ...
    row(0, -1, "t/test", 0.80, 0.5),
    row(1, -1, "t/dev", 0.85, 0.5),
    row(1, -1, "t/test", 0.95, 0.5),  # ... though layer 1 is better on test
    row(0, 0, "t/dev", 0.60, 0.2),  # most selective head on dev
    row(0, 0, "t/test", 0.50, 0.3),
    row(0, 1, "t/dev", 0.65, 0.4),
    row(0, 1, "t/test", 0.70, 0.2),
  ]
  baselines = [dict(task="upos", split="t/test", baseline="majority", accuracy="0.3")]
  ci = dict(selectivity_ci_low="0.15", selectivity_ci_high="0.25", delta_next="nan")
  sel = {("m", "0", "upos", "0", "0", "t/test"): ci}
  text = report.summary(rows, baselines, "t/test", top_k=2, select_split="t/dev", selectivity=sel)
  line = "| upos | 0.300 (majority) | 0.710 / 0.600 | 0.800 / 0.500 (layer 0) | 0.500 / 0.300 (L0 H0) | +0.200 [+0.150, +0.250] |"
  assert line in text, text
  assert "best residual layer (chosen on dev) 0 0.800" in text  # the task header chooses on dev too


def test_residual_probes_match_sklearn(ewt_part, tmp_path):
  """benchmarks/check_residual_probes: the suite's residual-stream probes are within a point of
  scikit-learn's LogisticRegression on the same cached features, λ picked on dev by both."""
  from benchmarks import check_residual_probes

  data, texts = ewt_part
  workdir = _make_run(tmp_path / "run", texts[:50])
  config = _config(data)
  config.probe.update(tasks=("upos", "deprel"), eval_splits=("dev",), extra_treebanks=(), random_baseline=True)
  probe_run.run(config, workdir)  # with the random-weights copy, whose job comes last: the check skips it
  cache = sorted(p.name for p in (workdir / "probes/cache").iterdir())
  out = check_residual_probes.check(config, workdir, [1], ["upos", "deprel"], max_iter=3000)
  assert sorted(p.name for p in (workdir / "probes/cache").iterdir()) == cache  # read, not extracted again
  assert out["model"] == "run" and len(out["checks"]) == 2 and out["max_abs_difference_points"] <= 1.0, out
  majority = {r["task"]: float(r["accuracy"]) for r in csv.DictReader(open(workdir / "probes/baselines.csv"))}
  assert all(c["sklearn_converged"] and c["headspec_dev_accuracy"] > majority[c["task"]] for c in out["checks"]), out
  chosen = {
    r["task"]: float(r["l2"])
    for r in csv.DictReader(open(workdir / "probes/fits.csv"))
    if (r["model"], r["layer"], r["head"], r["probe"]) == ("run", "1", "-1", "task")
  }
  at_chosen = check_residual_probes.check(config, workdir, [1], ["upos", "deprel"], max_iter=3000, chosen_l2=True)
  assert {c["task"]: c["sklearn_l2"] for c in at_chosen["checks"]} == chosen, at_chosen
  assert at_chosen["max_abs_difference_points"] <= 1.0, at_chosen
  with pytest.raises(UserError, match="no probe results"):
    check_residual_probes.check(config, tmp_path / "nothing", [0], ["upos"], max_iter=10)


def test_a_new_task_is_one_registry_entry(ewt_part, tmp_path, monkeypatch):
  """A toy word-labelling task, registered as one entry, runs through the whole suite like the built-in ones,
  and reaches the causal test (refitted on its labels, ranked by its selectivity) and the study's task list."""
  data, texts = ewt_part
  toy = tasks.LabelTask("capitalised", lambda sentence, config: tuple(str(w[:1].isupper()) for w in sentence.words))
  monkeypatch.setitem(tasks.REGISTRY, toy.name, toy)
  workdir = _make_run(tmp_path / "run", texts[:50])
  config = _config(data)
  config.probe.update(tasks=("capitalised",), eval_splits=("dev",), extra_treebanks=(), arc_max_train_words=1)
  rows = _rows(probe_run.run(config, workdir))
  assert len(rows) == 2 * 2 + 2 + 1 and {r["task"] for r in rows} == {"capitalised"}
  assert all(0 <= float(r["control_accuracy"]) <= 1 for r in rows)
  baseline = next(csv.DictReader(open(workdir / "probes/baselines.csv")))
  assert baseline["task"] == "capitalised" and baseline["baseline"] == "majority" and float(baseline["accuracy"]) > 0.5
  embedding = next(float(r["accuracy"]) for r in rows if r["layer"] == "-1")
  assert embedding > float(baseline["accuracy"])  # word identity tells capitalisation

  from headspec import study
  from headspec.ablation import causal
  from headspec.ablation.config import ablate_config
  from headspec.words import selectivity

  assert "capitalised" in causal.label_tasks() and "capitalised" in study.tasks()
  model, tokenizer = runs.load_run_model(workdir, 5)
  ranked = selectivity.read_selectivity(workdir, "run", 5, 2, 2)
  c = ablate_config()
  c.bootstrap_resamples, c.causal.random_seeds, c.causal.refine_samples, c.causal.l2_grid = 50, 1, 0, (1e-3,)
  (toy_data,) = causal.load_task_data(data, "en_ewt", ["capitalised"], tokenizer, model.cfg, c, log=lambda _: None)
  capitals = [str(w[:1].isupper()) for s in toy_data.test.words for w in s]
  assert toy_data.num_classes == 2 and [("False", "True")[i] for i in toy_data.test.labels] == capitals
  causal_rows = causal.causal_rows(model, toy_data, ranked.by_task["capitalised"], None, None, c)
  assert {r["task"] for r in causal_rows} == {"capitalised"} and {r["k"] for r in causal_rows} == {0, 1, 2}


def test_causal_test_labels_deprels_as_the_probe_stage_did(ewt_part, tmp_path):
  """probe.deprel_subtypes reaches the causal test through RUN/probes/run_info.json: 'nmod:poss' stays whole
  when the probes kept subtypes, and is 'nmod' when they stripped them (the default, also with no probe stage)."""
  from headspec.ablation import causal
  from headspec.ablation.config import ablate_config

  data, texts = ewt_part
  workdir = _make_run(tmp_path / "run", texts[:50])
  model, tokenizer = runs.load_run_model(workdir, 5)
  assert causal.probe_settings(workdir).probe.deprel_subtypes is False  # no probe stage ran yet
  (workdir / "probes").mkdir()
  recorded = {"config": {"probe": {"deprel_subtypes": True, "tasks": ["deprel"]}}}
  (workdir / "probes/run_info.json").write_text(json.dumps(recorded))
  settings = causal.probe_settings(workdir)
  assert settings.probe.deprel_subtypes is True and settings.probe.tasks == ("deprel",)
  c = ablate_config()
  c.causal.max_train_words = c.causal.max_eval_words = 0  # every sentence
  load = lambda *probe: causal.load_task_data(
    data, "en_ewt", ["deprel"], tokenizer, model.cfg, c, *probe, log=lambda _: None
  )[0]
  kept, stripped = load(settings), load()
  gold = [d for s in treebank.load_split(data, "en_ewt", "train") for d in s.deprels]
  assert any(":" in d for d in gold)
  assert kept.num_classes > stripped.num_classes  # train has subtyped relations, kept apart only in `kept`


@pytest.mark.parametrize(
  "change,message",
  [
    (lambda c: setattr(c.probe, "tasks", ("upos", "ner")), "unknown task"),
    (lambda c: setattr(c.probe, "treebank", "en_nope"), "no treebank folder"),
    (lambda c: setattr(c.probe, "eval_splits", ("validation",)), "unknown split"),
    (lambda c: setattr(c.probe, "extra_treebanks", ("en_nope",)), "no treebank folder"),
    (lambda c: setattr(c.probe, "steps", "7"), r"step\(s\) \[7\] not saved"),
    (lambda c: setattr(c.probe, "pooling", "max"), "pooling"),
    (lambda c: setattr(c, "data_dir", "/nonexistent/data"), "does not exist"),
    (lambda c: c.probe.update(eval_splits=(), extra_treebanks=()), "nothing to score"),
    (lambda c: setattr(c.probe, "mdl_fractions", (0.5, 0.25, 1.0)), "mdl_fractions"),
    (lambda c: c.probe.update(mdl=False, mdl_only=True), "needs probe.mdl=True"),
  ],
)
def test_bad_input_is_one_line_and_writes_nothing(ewt_part, tmp_path_factory, change, message):
  data, texts = ewt_part
  workdir = _make_run(tmp_path_factory.mktemp("run"), texts[:50])
  config = _config(data)
  change(config)
  with pytest.raises(UserError, match=message) as e:
    probe_run.run(config, workdir)
  assert "\n" not in str(e.value)
  assert not (workdir / "probes").exists()


def test_empty_split_and_missing_run(ewt_part, tmp_path):
  data, texts = ewt_part
  empty = tmp_path / "data"
  (empty / "ud/en_ewt").mkdir(parents=True)
  for split in ("train", "dev", "test"):
    src = data / f"ud/en_ewt/en_ewt-ud-{split}.conllu"
    (empty / f"ud/en_ewt/en_ewt-ud-{split}.conllu").write_text("" if split == "dev" else src.read_text())
  workdir = _make_run(tmp_path / "run", texts[:50])
  with pytest.raises(UserError, match="no sentences"):
    probe_run.run(_config(empty), workdir)
  with pytest.raises(UserError, match="no config.json"):
    probe_run.run(_config(data), tmp_path / "not_a_run")
  bare = tmp_path / "bare"
  runs.write_config(bare, train_config())
  with pytest.raises(UserError, match="no checkpoint"):
    probe_run.run(_config(data), bare)
  assert not (workdir / "probes").exists() and not (bare / "probes").exists()


@pytest.mark.slow
def test_trained_model_has_selective_heads(tmp_path):
  """A briefly trained small model: heads far above the majority baseline, more selective than random weights.

  The quickstart *decoder* is used: in a couple hundred steps the causal LM already learns (loss ~3.7),
  while the masked-LM encoder is still near its unigram loss (~5.7) at that point.
  """
  from headspec.cli.quickstart import quickstart_config
  from headspec.data.synthetic import write_synthetic
  from headspec.probing.config import synthetic_probe_config
  from headspec.train.loop import train_and_evaluate

  data = write_synthetic(tmp_path / "data", num_train=1000, num_dev=200, num_test=200, num_text_sentences=8000)
  config = quickstart_config("decoder")
  config.data_dir = str(data)
  config.train.update(steps=200, eval_every=0, diversity_every=0, keep_steps=())
  train_and_evaluate(config, tmp_path / "decoder")
  config = synthetic_probe_config(str(data))
  config.probe.tasks = ("upos", "deprel")  # the two asserted on below (xpos and arcs: test_suite_on_ewt_part)
  config.probe.update(residuals=False, bootstrap_resamples=200)  # heads only: the asserts read heads
  results = probe_run.run(config, tmp_path / "decoder")
  summary = (results.parent / "summary.md").read_text()
  assert "## decoder, step 200" in summary and "## decoder-random, step 0" in summary
  rows = _rows(tmp_path / "decoder/probes/results.csv")
  baselines = {
    b["task"]: float(b["accuracy"])
    for b in csv.DictReader(open(tmp_path / "decoder/probes/baselines.csv"))
    if b["split"] == "synthetic/dev"
  }

  def heads(model, task):
    return [
      r
      for r in rows
      if r["model"] == model and r["task"] == task and r["split"] == "synthetic/dev" and int(r["head"]) >= 0
    ]

  for task in ("upos", "deprel"):
    best = max(heads("decoder", task), key=lambda r: float(r["accuracy"]))
    assert float(best["accuracy"]) > baselines[task] + 0.15
    assert float(best["ci_low"]) > baselines[task] + 0.1
    trained_sel = max(float(r["selectivity"]) for r in heads("decoder", task))
    random_sel = max(float(r["selectivity"]) for r in heads("decoder-random", task))
    assert trained_sel > 0.05 and trained_sel > random_sel + 0.05


def test_interrupted_suite_resumes_at_the_next_feature_source(ewt_part, tmp_path, monkeypatch):
  """A suite killed after two feature sources keeps them (probes/cache/*.partial-*/) and, run again,
  fits only the rest; its tables equal an uninterrupted run's. The folder is gone once the job is whole."""
  data, texts = ewt_part
  config = _config(data)
  config.probe.tasks = ("upos", "arc")
  whole = probe_run.run(config, _make_run(tmp_path / "whole" / "run", texts))
  workdir = _make_run(tmp_path / "resumed" / "run", texts)  # the same name: the model column
  real, calls, killed = suite._probe_source, [], []

  class Killed(Exception):
    pass

  def dies_on_the_third(*args, **kwargs):
    calls.append(args[1])  # (job context, layer, heads, read, what)
    if len(calls) == 3 and not killed:
      killed.append(True)
      raise Killed
    return real(*args, **kwargs)

  monkeypatch.setattr(suite, "_probe_source", dies_on_the_third)
  with pytest.raises(Killed):
    probe_run.run(config, workdir)
  (partial,) = (workdir / "probes/cache").glob("*.partial-*")
  assert len(list(partial.glob("*.npz"))) == 2 and not (workdir / "probes/results.csv").exists()
  # A heads-only run (probe.residuals=False) uses the same parts (the two layers' heads) and fits nothing;
  # its rows are the whole run's head rows, and it leaves the parts for the full run that follows.
  config.probe.residuals = False
  fitted_before = list(calls)
  only = _rows(probe_run.run(config, workdir))
  assert calls == fitted_before and len(list(partial.glob("*.npz"))) == 2
  key = lambda r: (r["task"], r["layer"], r["head"], r["split"])  # noqa: E731
  head_rows = sorted((r for r in _rows(whole) if int(r["head"]) >= 0), key=key)
  assert sorted(only, key=key) == head_rows and head_rows
  config.probe.residuals = True
  calls.clear()
  resumed = probe_run.run(config, workdir)
  assert calls == [-1, 0, 1]  # of 5 sources (2 layers' heads, the embeddings, 2 residual streams) 2 read back
  assert not list((workdir / "probes/cache").glob("*.partial-*"))
  assert _rows(resumed) == _rows(whole)
  for table in ("selectivity.csv", "baselines.csv", "fits.csv"):
    assert (workdir / "probes" / table).read_text() == (whole.parent / table).read_text()
