"""The modern-decoder ModelConfig options as training config keys: declared in defaults.py with
ModelConfig's defaults (old configs train the same model), accepted on the command line, documented for
--help, checked on resume like the other shape keys, and each run's heads' K/V groups readable."""

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys

import jax
import pytest
from flax import nnx

from headspec.cli import config_help
from headspec.cli import main as cli
from headspec.configs import base_decoder
from headspec.errors import UserError
from headspec.model.config import ModelConfig, from_section
from headspec.model.transformer import Transformer
from headspec.runs import directory as runs
from headspec.train.config import train_config
from headspec.train.loop import check_config, train_and_evaluate

_FIELDS = dataclasses.fields(ModelConfig)
OPTIONS = _FIELDS[[f.name for f in _FIELDS].index("mlp") + 1 :]  # the options after `mlp` (runs._modern_options)
# A value other than the default for every option after `mlp` (a new option must be added here).
OTHER = dict(
  norm="rmsnorm",
  num_kv_heads=2,
  gated_mlp=True,
  parallel_residual=True,
  sublayer_norm=True,
  qk_norm="head",
  attention_bias=False,
  attention_out_bias=False,
  mlp_bias=False,
  rope_theta=500.0,
  rotary_fraction=0.5,
  rope_scaling="linear",
  rope_factor=2.0,
  rope_low_freq_factor=2.0,
  rope_high_freq_factor=8.0,
  rope_original_max_len=4,
  attention_scale=0.3,
  attention_softcap=3.0,
  final_softcap=3.0,
  scale_embeddings=True,
  attention_windows=(2, 0),
  clip_qkv=1.0,
)
SIZES = dict(kind="decoder", vocab_size=11, num_layers=2, num_heads=4, d_model=16, d_head=4, d_ff=8, max_len=8)


def _param_shapes(**options):
  cfg = ModelConfig(**SIZES, **options)
  model = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
  return jax.tree.map(lambda x: x.shape, nnx.to_pure_dict(nnx.state(model, nnx.Param)))


def test_every_option_that_changes_parameter_shapes_is_a_shape_key():
  assert sorted(OTHER) == sorted(f.name for f in OPTIONS)
  base = _param_shapes()
  changing = {name for name, value in OTHER.items() if _param_shapes(**{name: value}) != base}
  assert {"norm", "num_kv_heads", "gated_mlp", "qk_norm", "attention_bias", "mlp_bias"} <= changing
  assert not {f"model.{name}" for name in changing} - set(runs.SHAPE_KEYS)
  assert _param_shapes(qk_norm="head") != _param_shapes(qk_norm="full")  # 'head' vs 'full' differ too


def test_defaults_declare_every_option_with_modelconfigs_default_and_a_meaning():
  model = train_config().model
  meanings = config_help.meanings(train_config)
  # One source: the section is ModelConfig's fields (but the data's vocab_size and train's seq_len), meanings included.
  fields = {f.name for f in dataclasses.fields(ModelConfig)} - {"vocab_size", "max_len"}
  assert set(model) == fields | {"pretrained"}
  assert all(meanings.get(f"model.{name}") for name in fields)
  for f in OPTIONS:
    assert model[f.name] == f.default, f.name
    assert meanings.get(f"model.{f.name}"), f"model.{f.name} has no --help line"
  # The defaults describe the model configs built without the options did: GPT-2/BERT's.
  old = {k: model[k] for k in model if k not in {f.name for f in OPTIONS}}
  built = from_section(model, 50, 16)
  assert built == from_section(type(model)(old), 50, 16)
  assert built == dataclasses.replace(built, **{f.name: f.default for f in OPTIONS})


def _train_cli(data_dir, workdir, *overrides) -> int:
  sizes = "num_layers=1 num_heads=4 d_model=16 d_head=4 d_ff=16"
  argv = ["headspec", "train", "--config=base_decoder", f"--workdir={workdir}", f"--config.data_dir={data_dir}"]
  argv += ["--config.data.corpus=synthetic", "--config.data.vocab_size=512", "--config.train.steps=1"]
  argv += ["--config.train.batch_size=8", "--config.train.seq_len=16", "--config.train.eval_every=0"]
  argv += ["--config.train.checkpoint_every=1", "--config.train.keep_steps=()", "--config.train.warmup_steps=0"]
  argv += [f"--config.model.{kv}" for kv in sizes.split()] + [f"--config.{o}" for o in overrides]
  cli.FLAGS.unparse_flags()  # absl keeps flag values between in-process calls
  return cli.main(argv)


@pytest.fixture(scope="module")
def gqa_run(synthetic_data_dir, tmp_path_factory):
  """A 1-step base_decoder run with 2 K/V groups of 2 heads, trained through the command line."""
  workdir = tmp_path_factory.mktemp("model_keys") / "run"
  assert _train_cli(synthetic_data_dir, workdir, "model.num_kv_heads=2", "model.norm=rmsnorm") == 0
  return workdir


def test_train_accepts_the_model_options_on_the_command_line(gqa_run):
  written = json.loads((gqa_run / "config.json").read_text())["model"]
  assert (written["num_kv_heads"], written["norm"], written["qk_norm"]) == (2, "rmsnorm", "none")
  model, _ = runs.load_run_model(gqa_run, 1)
  assert model.cfg.num_kv_heads == 2 and model.blocks[0].attention.w_k_DHK.shape[1] == 2
  assert runs.kv_groups(gqa_run) == model.cfg.kv_group_of_head == (0, 0, 1, 1)


@pytest.mark.parametrize(
  "key,value,message",
  [
    ("num_kv_heads", 3, "model.num_kv_heads=3 must divide num_heads=8"),
    ("norm", "batchnorm", "model.norm must be one of"),
    ("qk_norm", "yes", "model.qk_norm must be one of"),
  ],
)
def test_a_bad_option_value_is_one_line_before_training(key, value, message):
  config = base_decoder.get_config()
  config.model[key] = value
  with pytest.raises(UserError, match=message) as e:
    check_config(config)
  assert "\n" not in str(e.value)


@pytest.mark.parametrize(
  "key,value",
  [
    ("num_kv_heads", 4),
    ("num_kv_heads", 0),  # no grouping: 4 K/V heads, not 2
    ("norm", "layernorm"),
    ("gated_mlp", True),
    ("qk_norm", "head"),
    ("attention_bias", False),
    ("mlp_bias", False),
    ("sublayer_norm", True),
  ],
)
def test_resume_with_another_model_option_is_one_line(gqa_run, key, value):
  config = runs.read_config(gqa_run)
  config.model[key] = value
  with pytest.raises(UserError, match=rf"model.{key} is .* there, .* in this config \(use a new --workdir\)") as e:
    runs.check_resume(gqa_run, config)
  assert "\n" not in str(e.value)


def test_resume_through_train_is_refused_before_the_restore(gqa_run, tmp_path):
  config = runs.read_config(gqa_run)
  config.model.gated_mlp = True
  config.train.steps = 2
  before = (gqa_run / "config.json").read_bytes()
  with pytest.raises(UserError, match=r"model.gated_mlp is False there, True in this config"):
    train_and_evaluate(config, gqa_run)
  assert (gqa_run / "config.json").read_bytes() == before


def test_a_config_written_before_the_options_resumes_as_the_default_model(gqa_run, tmp_path):
  """config.json files without the new keys mean ModelConfig's defaults: the default config resumes them."""
  old = tmp_path / "old"
  for folder in ("checkpoints", "tokenizer"):
    shutil.copytree(gqa_run / folder, old / folder)
  data = json.loads((gqa_run / "config.json").read_text())
  for f in OPTIONS:
    data["model"].pop(f.name)
  (old / "config.json").write_text(json.dumps(data))
  config = runs.read_config(gqa_run)
  for key in ("num_kv_heads", "norm"):
    config.model[key] = train_config().model[key]
  assert runs.check_resume(old, config) == [1]
  assert runs.kv_groups(old) == (0, 1, 2, 3)
  config.model.num_kv_heads = 4  # the same shapes as 0: one K/V head per head
  assert runs.check_resume(old, config) == [1]
  config.model.num_kv_heads = 2
  with pytest.raises(UserError, match="model.num_kv_heads is 4 there, 2 in this config"):
    runs.check_resume(old, config)


def test_pythia_revisions_experiment_plans_analyses_of_published_steps_without_training():
  """configs/experiments/pythia_revisions.py: a run without training (Run config ''), every analysis of the
  specialization study on the published revisions as steps; planned offline with `launch --dry-run`."""
  from headspec.ablation.run import check_config as check_ablate
  from headspec.attention.config import check_config as check_attention
  from headspec.configs.experiments import pythia_revisions as m
  from headspec.diversity.run import _check_config as check_diversity
  from headspec.probing.plan import check_config as check_probe

  spec = "configs/experiments/pythia_revisions.py"
  done = subprocess.run(
    [sys.executable, "-m", "headspec.launch", "local", "--dry-run", f"--experiment={spec}", "--workdir=root"],
    capture_output=True,
    text=True,
    env={**os.environ, "HEADSPEC_DATA_DIR": "/data"},
    timeout=60,
  )
  assert done.returncode == 0, done.stderr
  lines = [line for line in done.stdout.splitlines() if not line.startswith("#")]
  assert len(lines) == 6 and not any("headspec train" in line for line in lines)
  for line, stage in zip(lines, ("probe", "diversity", "attention", "ablate", "atlas")):
    assert f"root/stages/pythia-160m-{stage}.done -- {stage}" in line and line.endswith("--workdir=root/pythia-160m")
  assert lines[-1].endswith("headspec study --workdir=root")

  probe = m.get_config("probe")
  revisions = probe.model.pretrained.removeprefix("hf:EleutherAI/pythia-160m@").split(",")
  assert revisions[:4] == ["step0", "step1", "step2", "step4"] and revisions[-1] == "step143000"
  assert len(revisions) == len(m.STEPS) and probe.probe.steps == "all"
  for name, check in (("probe", check_probe), ("attention", check_attention), ("diversity", check_diversity)):
    check(m.get_config(f"model=pythia-410m,coarse,{name}"))
  ablate = m.get_config("coarse,ablate")
  check_ablate(ablate)
  assert ablate.steps == "last" and ablate.model.pretrained.endswith(
    "@step0,step64,step512,step4000,step32000,step143000"
  )
  for bad, message in (("modle=x", "bad argument 'modle=x'"), ("", "nothing to train")):
    with pytest.raises(ValueError, match=message):
      m.get_config(bad)


def _ablation_only_run(path, **model):
  """A run folder with config.json and one per-head table (what the atlas needs), no checkpoints."""
  from headspec.io import tables

  model = dict(kind="decoder", num_layers=1, num_heads=4, pretrained="", **model)
  path.mkdir(parents=True)
  (path / "config.json").write_text(json.dumps({"model": model, "train": {}}))
  rows = [dict(model="r", step=1, method="zero", layer=0, head=h, metric="loss_delta", value=0.1 * h) for h in range(4)]
  rows = [dict(r, ci_low="", ci_high="") for r in rows]
  tables.write(tables.path_of(path, tables.ABLATION_HEADS), rows, tables.ABLATION_HEADS)
  return path


def test_the_atlas_shows_each_heads_kv_group(tmp_path):
  from headspec.atlas import data, page

  grouped = data.run_data(_ablation_only_run(tmp_path / "gqa", num_kv_heads=2))
  assert grouped["kv_groups"] == [0, 0, 1, 1]
  assert data.run_data(_ablation_only_run(tmp_path / "mha", num_kv_heads=0))["kv_groups"] is None
  assert data.run_data(_ablation_only_run(tmp_path / "old"))["kv_groups"] is None  # config.json before the key
  html = page.render(data.atlas_data(tmp_path / "gqa"))
  assert re.search(r'"kv_groups":\s*\[0,\s*0,\s*1,\s*1\]', html) and "K/V group " in html
