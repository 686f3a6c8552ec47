"""The study's settings (configs/experiments/grammar.py, induction.py, specialization.py): their runs, configs,
the data stage that writes a setting's own data, and a tiny grammar setting end to end."""

import os
import pathlib
import subprocess
import sys

import pytest

from headspec.cli import handlers
from headspec.configs.experiments import grammar, induction, specialization
from headspec.data.repeats import write_repeats
from headspec.data.synthetic import write_synthetic
from headspec.errors import UserError
from headspec.launch import args, plan

REPO = pathlib.Path(__file__).resolve().parents[1]


def _plan_lines(spec: str, root: str = "root") -> list[str]:
  opts = args.parser().parse_args(["local", f"--experiment={spec}", f"--workdir={root}"])
  return [" ".join(plan.headspec_argv(s)) for s in plan.experiment_plans(opts, [])[0]]


def test_grammar_setting_runs_every_condition_with_five_seeds():
  exp = plan.load_experiment("configs/experiments/grammar.py")  # every run's and analysis' config loads
  assert {r.condition for r in exp.runs} == set(specialization.CONDITIONS)
  for condition in specialization.CONDITIONS:
    assert sorted(r.seed for r in exp.runs if r.condition == condition) == [0, 1, 2, 3, 4]
  assert [a for a, _ in exp.analyses] == [*specialization.ANALYSES, "atlas"] and exp.data[0] == "synthetic"
  c = grammar.get_config("condition=drophead,seed=3")
  assert (c.seed, c.data.corpus, c.train.regularizers.drophead) == (3, "synthetic", 0.1)
  keep = c.train.keep_steps
  assert keep[0] == 0 and keep[-1] == c.train.steps and all(b / max(a, 1) >= 3 for a, b in zip(keep, keep[1:]))
  assert grammar.get_config("probe").probe.treebank == "synthetic"
  assert grammar.get_config("attention").treebank == grammar.get_config("ablate").treebank == "synthetic"
  assert grammar.get_config("lr=1e-2").train.learning_rate == 1e-2
  with pytest.raises(ValueError, match="bad argument 'lr=x'"):
    grammar.get_config("lr=x")
  assert len(grammar.experiment("tiny").runs) == 1
  part = grammar.experiment("condition=drophead")  # a part: the same runs' configs, so the whole one resumes
  assert set(part.runs) == {r for r in exp.runs if r.condition == "drophead"} and part.analyses == exp.analyses
  with pytest.raises(ValueError, match="not for the experiment"):
    grammar.experiment("lr=3e-3")
  assert grammar.experiment("seed=2").runs == tuple(r for r in exp.runs if r.seed == 2)  # seed-major parts
  assert grammar.experiment("condition=baseline,seed=4").runs == tuple(r for r in exp.runs if r.name == "baseline_s4")


def test_induction_setting_runs_two_depths_with_and_without_mlps():
  exp = plan.load_experiment("configs/experiments/induction.py")
  conditions = {r.condition for r in exp.runs}
  assert conditions == {"L2_attn_only", "L2_mlp", "L4_attn_only", "L4_mlp"}
  assert all(sorted(r.seed for r in exp.runs if r.condition == c) == [0, 1, 2, 3, 4] for c in conditions)
  for run in exp.runs:
    c = plan.load_config(run.config)
    assert (c.model.num_layers, c.model.mlp) == (int(run.condition[1]), run.condition.endswith("_mlp"))
    assert c.data.corpus == "synthetic_repeats" and c.seed == run.seed
    assert 0.5 < c.data.repeat_rows < 1 and c.model.positions == "rotary"  # where induction heads formed
  keep = c.train.keep_steps
  assert keep[0] == 0 and keep[-1] == c.train.steps and sum(s <= c.train.steps // 4 for s in keep) >= 6  # dense early
  a = induction.get_config("attention")
  assert (a.steps, a.treebank, a.induction.icl, a.induction.causal.enabled) == ("all", "", True, True)
  assert a.induction.draw == "text"  # not the byte pieces the text never uses
  assert 2 * a.induction.n + 1 <= c.train.seq_len
  # study needs probe selectivity; the SAEs after it, at every kept step on every layer, no treebank
  assert [name for name, _ in exp.analyses] == ["attention", "diversity", "probe", "sae"]
  s = induction.get_config("sae")
  assert (s.steps, s.layers, s.analysis.treebank, s.data_dir) == ("all", "all", "", "")
  assert induction.get_config("diversity").steps == "all"
  assert induction.experiment("condition=L4_mlp,seed=3").runs == tuple(r for r in exp.runs if r.name == "L4_mlp_s3")
  assert induction.experiment("seed=1").runs == tuple(r for r in exp.runs if r.seed == 1)
  assert induction.experiment("layers=4,mlp").runs == induction.experiment("condition=L4_mlp").runs
  for parts in ("condition=L2_mlp,layers=4", "layers=4,condition=L2_mlp", "condition=L2_attn_only,mlp"):
    with pytest.raises(ValueError, match="exclude each other"):  # in either order: refused, never one silently
      induction.experiment(parts)
  with pytest.raises(ValueError, match="lr= is not for the experiment"):
    induction.experiment("lr=3e-3")
  assert (
    induction.get_config("condition=L4_mlp").model.num_layers == 4
    and induction.get_config("condition=L4_mlp").model.mlp
  )
  p = induction.get_config("probe")
  assert p.probe.treebank == "synthetic" and {0, c.train.steps} <= {int(s) for s in p.probe.steps.split(",")}
  assert "--repeats=1" in exp.data
  part = induction.experiment("layers=2")
  assert set(part.runs) == {r for r in exp.runs if r.condition.startswith("L2_")} and part.data == exp.data


def test_settings_write_their_data_first_and_every_stage_reads_it(tmp_path):
  lines = _plan_lines("configs/experiments/induction.py", str(tmp_path))
  data = f"--config.data_dir={tmp_path}/data"
  assert "stages/data.done -- data synthetic" in lines[0] and lines[0].endswith(f"--out={tmp_path}/data")
  assert all(data in line for line in lines[1:-1]) and data not in lines[-1]  # not the report
  assert not any("data.done" in line for line in _plan_lines("configs/experiments/specialization.py:small"))


def test_natural_text_setting_defaults_to_the_downloadable_corpus():
  assert specialization.get_config("small").data.corpus == "wikitext_103"
  assert specialization.get_config("small,corpus=wikitext-103").data.corpus == "wikitext_103"
  assert specialization.get_config("corpus=english_mix,seed=1").data.corpus == "english_mix"
  exp = plan.load_experiment("configs/experiments/specialization.py:small,corpus=english_mix")
  assert all(plan.load_config(r.config).data.corpus == "english_mix" for r in exp.runs)
  assert all("corpus" not in r.config for r in specialization.experiment("small").runs)
  with pytest.raises(ValueError, match="bad argument 'corpus=wikitext'"):
    specialization.get_config("corpus=wikitext")


def test_natural_text_setting_cuts_stay_its_own():
  """The small natural-text setting probes heads only and checks induction causally at the last step; the
  grammar and induction settings, which start from the same analysis configs, keep residuals and every step."""
  assert specialization.get_config("small").train.keep_steps == (0, 200, 800)
  assert specialization.get_config("small,probe").probe.residuals is False
  assert specialization.get_config("small,probe,minilm").probe.residuals is True
  assert specialization.get_config("small,attention").induction.causal.steps == "last"
  assert specialization.get_config("probe").probe.residuals is True  # the GPU setting
  assert specialization.analysis_config("probe", small=True).probe.residuals is True
  assert induction.get_config("attention").induction.causal.steps == "all"


def test_natural_text_setting_without_its_corpus_says_how_to_get_it(tmp_path):
  done = subprocess.run(
    [sys.executable, "-m", "headspec", "train", "--config=configs/experiments/specialization.py:small"]
    + [f"--workdir={tmp_path / 'run'}", f"--config.data_dir={tmp_path}"],
    capture_output=True,
    text=True,
    cwd=REPO,
    env={k: v for k, v in os.environ.items() if k != "HEADSPEC_DATA_DIR"},
    timeout=120,
  )
  err = done.stderr.strip().splitlines()
  assert done.returncode == 2 and len(err) == 1, done.stderr
  assert "headspec data download text wikitext_103" in err[0] and "text/wikitext_103" in err[0]


def _files(folder: pathlib.Path) -> dict[str, bytes]:
  return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_data_stage_writes_treebank_and_text_byte_identically(tmp_path, capsys):
  argv = ["--text-sentences=400", "--treebank-sentences=30,10,10", "--repeats=0.5"]
  for out in ("a", "b"):
    handlers.data(None, "", ["synthetic", f"--out={tmp_path / out}", *argv])
  assert capsys.readouterr().out.split() == [str(tmp_path / "a"), str(tmp_path / "b")]
  a, b = _files(tmp_path / "a"), _files(tmp_path / "b")
  assert a == b and set(a) == {
    *(f"ud/synthetic/synthetic-ud-{s}.conllu" for s in ("train", "dev", "test")),
    *(f"text/{c}/{s}.txt" for c in ("synthetic", "synthetic_repeats") for s in ("train", "valid")),
  }
  assert a["ud/synthetic/synthetic-ud-dev.conllu"].count(b"# sent_id") == 10
  handlers.data(None, "", ["synthetic", f"--out={tmp_path / 'c'}", *argv, "--seed=1"])
  assert _files(tmp_path / "c")["text/synthetic/train.txt"] != a["text/synthetic/train.txt"]
  with pytest.raises(UserError, match="--treebank-sentences=30,10"):
    handlers.data(None, "", ["synthetic", f"--out={tmp_path / 'd'}", "--treebank-sentences=30,10"])


def test_repeats_keep_every_document_and_add_sequences_written_twice(tmp_path):
  write_synthetic(tmp_path, num_train=5, num_dev=5, num_test=5, num_text_sentences=3000)
  out = write_repeats(tmp_path, "synthetic", seed=0, fraction=0.5, min_words=4, max_words=6)
  for split in ("train", "valid"):
    source = (tmp_path / "text" / "synthetic" / f"{split}.txt").read_text().strip().split("\n\n")
    mixed = (out / f"{split}.txt").read_text().strip().split("\n\n")
    added = [d for d in mixed if d not in source]
    assert [d for d in mixed if d in source] == source  # every document, in order
    assert 0.35 * len(source) < len(added) < 0.65 * len(source) or split == "valid"  # valid: 12 documents
    for document in added:
      words = document.split()
      assert len(words) % 2 == 0 and 4 <= len(words) // 2 <= 6 and words[: len(words) // 2] == words[len(words) // 2 :]
  with pytest.raises(UserError, match="wikitext_103: no train.txt, valid.txt"):
    write_repeats(tmp_path, "wikitext_103")


def _launch_tiny(experiment: str, root) -> None:
  """`headspec launch local` on a setting's `tiny` sizes into ROOT, with nothing from the development data."""
  command = [sys.executable, "-m", "headspec.launch", "local", f"--experiment={experiment}:tiny", f"--workdir={root}"]
  env = {k: v for k, v in os.environ.items() if k != "HEADSPEC_DATA_DIR"}
  done = subprocess.run(command, capture_output=True, text=True, cwd=REPO, env=env)
  assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow
@pytest.mark.e2e
def test_tiny_grammar_setting_runs_end_to_end(tmp_path):
  """`headspec launch local` on the grammar setting's `tiny` sizes: data, one run, every analysis, the report."""
  _launch_tiny("configs/experiments/grammar.py", tmp_path)
  run = tmp_path / "baseline_s0"
  for table in ("probes/results.csv", "diversity/results.csv", "attention/roles.csv", "ablation/heads.csv"):
    assert (run / table).stat().st_size > 0, table
  assert (run / "atlas.html").is_file() and (tmp_path / "study" / "summary.md").is_file()
  assert sorted(p.name for p in (tmp_path / "stages").glob("*.done"))[-1] == "data.done"


@pytest.mark.slow
@pytest.mark.e2e
def test_tiny_induction_setting_runs_end_to_end(tmp_path):
  """`headspec launch local` on the induction setting's `tiny` sizes: data, one run trained through
  `data.repeat_rows` (most of each batch repeated random sequences of the text's own ids), every analysis,
  and the report's induction tables (the repeat drop and the causal check at every kept step)."""
  import pandas as pd

  c = induction.get_config("tiny,seed=0")
  assert c.data.repeat_rows == induction.REPEAT_ROWS and c.train.seq_len == induction.SEQ_LEN
  _launch_tiny("configs/experiments/induction.py", tmp_path)
  run = tmp_path / "L2_attn_only_s0"
  for table in ("probes/selectivity.csv", "diversity/results.csv", "attention/icl.csv", "ablation/causal.csv",
                "sae/heads.csv"):  # fmt: skip
    assert (run / table).stat().st_size > 0, table
  sae = pd.read_csv(tmp_path / "study" / "sae.csv").fillna({"task": ""})
  kept = set(induction.KEEP_TINY)  # both layers' heads at every kept step, each probed step's ρ
  assert set(sae[sae["measure"] == "specialization_mean"]["step"]) == kept
  assert set(sae[sae["measure"] == "spearman_selectivity"]["step"]) == kept
  assert (pd.read_csv(tmp_path / "study" / "sae_heads.csv").groupby("step").size() == 8).all()
  ind = pd.read_csv(tmp_path / "study" / "induction.csv")
  kept = set(induction.KEEP_TINY)
  for measure in ("repeat_drop", "icl_score", "loss_delta_second_vs_random (zero)"):
    assert set(ind[ind["measure"] == measure]["step"]) == kept, measure
  assert "## Induction by step" in (tmp_path / "study" / "summary.md").read_text()
