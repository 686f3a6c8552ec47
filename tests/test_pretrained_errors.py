"""The Hugging Face import under faults: shard index entries outside the model folder, malformed
config.json values (types, ranges, NaN-giving values) and indexes, a layer count above the checkpoint's
tensors, corrupt weights met while planning, bad `hf:` names and revisions, a revision given twice. Each
is one line naming the file and the key (or the name), raised when a command plans, before any computation.
The checkpoints are the tiny random ones of tests/test_pretrained*.py (transformers + save_pretrained)."""

import hashlib
import json
import os
import pathlib
import shutil
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import safetensors.numpy  # noqa: E402

pytest.importorskip("transformers")
huggingface_hub = pytest.importorskip("huggingface_hub")

import test_pretrained  # noqa: E402
from test_pretrained_families import LLAMA3, _tiny  # noqa: E402
from test_pretrained_hub import _save_snapshot  # noqa: E402

from headspec import pretrained  # noqa: E402
from headspec.errors import UserError  # noqa: E402
from headspec.runs import targets  # noqa: E402

tiny_dirs = test_pretrained.tiny_dirs  # the fixture of tiny BERT (with and without MLM head) and GPT-2


@pytest.fixture(scope="module")
def root(tmp_path_factory):
  return str(tmp_path_factory.mktemp("families"))


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
  """A tiny Llama saved in shards with model.safetensors.index.json (save_pretrained, max_shard_size)."""
  path = tmp_path_factory.mktemp("sharded") / "llama"
  _save_snapshot(path, seed=0)
  return path


def _copy(src: pathlib.Path, dst: pathlib.Path) -> pathlib.Path:
  shutil.copytree(src, dst, symlinks=True)
  return dst


def _one_line(call, match: str) -> str:
  with pytest.raises(UserError, match=match) as error:
    call()
  assert "\n" not in str(error.value)
  return str(error.value)


def _edit_index(path: pathlib.Path, edit) -> pathlib.Path:
  index = path / "model.safetensors.index.json"
  data = json.loads(index.read_text())
  edit(data)
  index.write_text(json.dumps(data))
  return index


# ---------------------------------------------------------------- item 4: shard entries outside the folder


@pytest.mark.parametrize("where", ["parent", "absolute", "linked folder", "etc_passwd"])
def test_shard_entries_outside_the_model_folder_are_refused(sharded, tmp_path, where):
  """Before: `../x.safetensors` (a valid shard) loaded silently from outside; `/etc/passwd` was opened."""
  path = _copy(sharded, tmp_path / "model")
  first = sorted(path.glob("model-*.safetensors"))[0]
  outside = tmp_path / "outside"
  outside.mkdir()
  shutil.copy(first, outside / first.name)
  entry = {
    "parent": f"../outside/{first.name}",
    "absolute": str(outside / first.name),
    "linked folder": f"elsewhere/{first.name}",
    "etc_passwd": "/etc/passwd",
  }[where]
  (path / "elsewhere").symlink_to(outside, target_is_directory=True)  # a folder link leading outside
  index = _edit_index(
    path, lambda d: d["weight_map"].update({k: entry for k, v in d["weight_map"].items() if v == first.name})
  )
  first.unlink()
  message = rf"{index}: weight_map entry '{entry}' is outside the model folder {path}"
  _one_line(lambda: pretrained.load_pretrained(str(path)), message)
  _one_line(lambda: targets.pretrained_target(str(path)), message)  # when a command plans


def test_shards_linked_into_the_hub_blobs_load_and_another_snapshot_is_outside(sharded, tmp_path, monkeypatch):
  """huggingface_hub's layout: snapshots/<commit>/<file> links to ../../blobs/<sha256>; such links are inside."""
  repo = tmp_path / "hub" / "models--tiny-org--linked"
  snapshot, other = repo / "snapshots" / ("e" * 40), repo / "snapshots" / ("f" * 40)
  (repo / "blobs").mkdir(parents=True)
  for commit in (snapshot, other):
    commit.mkdir(parents=True)
    for file in sharded.iterdir():
      data = file.read_bytes()
      blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
      blob.write_bytes(data)
      (commit / file.name).symlink_to(os.path.relpath(blob, commit))
  (repo / "refs").mkdir()
  (repo / "refs" / "main").write_text("e" * 40)
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
  model, _ = pretrained.load_pretrained("hf:tiny-org/linked")
  assert model.cfg.num_layers == 2
  (snapshot / "model.safetensors.index.json").unlink()  # rewritten as a plain file pointing at the other commit
  data = json.loads((other / "model.safetensors.index.json").read_text())
  name = sorted(set(data["weight_map"].values()))[0]
  data["weight_map"] = {k: (f"../{'f' * 40}/{v}" if v == name else v) for k, v in data["weight_map"].items()}
  (snapshot / "model.safetensors.index.json").write_text(json.dumps(data))
  _one_line(
    lambda: pretrained.load_pretrained("hf:tiny-org/linked"), f"weight_map entry '../{'f' * 40}/{name}' is outside"
  )


@pytest.mark.parametrize(
  "edit, message",
  [
    (lambda d: d.update(weight_map=sorted(d["weight_map"])), r"weight_map=\[.* must be a non-empty object"),
    (lambda d: d.update(weight_map={}), r"weight_map=\{\} must be a non-empty object"),
    (lambda d: d.pop("weight_map"), "weight_map=null must be a non-empty object"),
    (lambda d: d["weight_map"].update({"model.norm.weight": 3}), "weight_map entry 'model.norm.weight': 3 is not a"),
    (
      lambda d: d["weight_map"].update({"model.norm.weight": None}),
      "weight_map entry 'model.norm.weight': null is not",
    ),
    (
      lambda d: d["weight_map"].update({"model.norm.weight": "gone.safetensors"}),
      "weight_map entry 'gone.safetensors': no such shard",
    ),
  ],
)
def test_malformed_shard_index_is_one_line(sharded, tmp_path, edit, message):
  path = _copy(sharded, tmp_path / "model")
  index = _edit_index(path, edit)
  _one_line(lambda: targets.pretrained_target(str(path)), f"{index}: {message}")


def test_shard_index_that_is_not_an_object(sharded, tmp_path):
  path = _copy(sharded, tmp_path / "model")
  (path / "model.safetensors.index.json").write_text("[1, 2]")
  _one_line(lambda: pretrained.load_pretrained(str(path)), "index.json: not a safetensors index .*top level is a list")


# ---------------------------------------------------------------- items 5, 6, 13: config.json values

LLAMA3_BAD_FREQ = dict(LLAMA3, low_freq_factor=4.0, high_freq_factor=1.0)
CASES = [
  # item 5: malformed values, each named by its key
  ("llama", b"[1, 2]", r"not a Hugging Face config \(a JSON object\) \(the top level is a list\)"),
  ("llama", b'"llama"', "not a Hugging Face config .*the top level is a string"),
  ("llama", b'{"model_type": "llama", "name": "caf\xe9"}', "cannot read JSON .*'utf-8' codec"),
  ("llama", dict(model_type=["llama"]), r'model_type=\["llama"\] must be a string'),
  ("llama", dict(num_attention_heads=0), "num_attention_heads=0 must be positive"),
  ("llama", dict(num_attention_heads="4"), 'num_attention_heads="4" must be an integer, not a string'),
  ("llama", dict(num_attention_heads=4.0), r"num_attention_heads=4.0 must be an integer, not a decimal number"),
  ("llama", dict(num_attention_heads=True), "num_attention_heads=true must be an integer, not a boolean"),
  ("llama", dict(num_key_value_heads=0), "num_key_value_heads=0 must be positive"),
  ("distilbert", dict(n_heads="4"), 'n_heads="4" must be an integer, not a string'),
  ("llama", dict(vocab_size=None), "vocab_size=null must be an integer, not null"),
  ("llama", dict(rope_parameters=None, rope_scaling="linear"), 'rope_scaling="linear" must be an object, not a string'),
  ("llama", dict(rope_parameters=None, rope_theta="big"), 'rope_theta="big" must be a number, not a string'),
  ("llama", dict(rope_parameters=dict(LLAMA3, factor="8")), 'rope_parameters.factor="8" must be a number'),
  ("llama", dict(rope_parameters={"rope_type": "llama3"}), "missing key 'rope_parameters.low_freq_factor'"),
  ("gpt2", dict(layer_norm_epsilon="1e-5"), 'layer_norm_epsilon="1e-5" must be a number, not a string'),
  ("llama", dict(hidden_act=["silu"]), r'hidden_act=\["silu"\] must be a string, not a list'),
  ("qwen2", dict(use_sliding_window="yes"), 'use_sliding_window="yes" must be true or false, not a string'),
  ("gemma2", dict(layer_types="full_attention"), 'layer_types="full_attention" must be a list of strings'),
  ("roberta", dict(pad_token_id=None), "pad_token_id=null must be an integer, not null"),
  ("bert_mlm", dict(hidden_dropout_prob=1.5), r"hidden_dropout_prob=1.5 must be a number in \[0, 1\)"),
  ("bert_mlm", dict(num_hidden_layers=None), "num_hidden_layers=null must be an integer"),
  # item 6: values that loaded and computed NaN or nonsense
  ("llama", dict(rope_parameters=None, rope_theta=-10000.0), "rope_theta=-10000.0 must be a positive number"),
  ("llama", dict(rope_parameters=dict(LLAMA3, rope_theta=-500.0)), "rope_parameters.rope_theta=-500.0 must be a pos"),
  ("llama", dict(rope_parameters=None, rope_theta=float("nan")), "rope_theta=NaN must be a positive number"),
  ("llama", dict(rms_norm_eps=-1e-5), "rms_norm_eps=-1e-05 must be a positive number"),
  ("gpt2", dict(layer_norm_epsilon=-1e-5), "layer_norm_epsilon=-1e-05 must be a positive number"),
  ("bert_mlm", dict(layer_norm_eps=0.0), "layer_norm_eps=0.0 must be a positive number"),
  ("mistral", dict(sliding_window=-4), "sliding_window=-4 must be at least 0"),
  (
    "llama",
    dict(rope_parameters=LLAMA3_BAD_FREQ),
    "rope_parameters.high_freq_factor=1.0 must exceed low_freq_factor=4",
  ),
  (
    "gpt_neox",
    dict(rope_parameters=dict(partial_rotary_factor=1.5)),
    r"rope_parameters.partial_rotary_factor=1.5 must be a number in \(0, 1\]",
  ),
  ("olmo", dict(clip_qkv=-0.4), "clip_qkv=-0.4 must be a number >= 0"),
  ("gemma2", dict(query_pre_attn_scalar=-24), "query_pre_attn_scalar=-24 must be a positive number"),
  # item 13: the HF key that is wrong, not the ModelConfig field it became
  ("llama", dict(head_dim=7), "head_dim=7 rotates 7 features per head; .* must be even"),
  (
    "gpt_neox",
    dict(rope_parameters=dict(rope_type="default", rope_theta=100.0, partial_rotary_factor=0.3125)),
    r"hidden_size=64 / num_attention_heads=4 = 16 with rope_parameters.partial_rotary_factor=0.3125 rotates 5",
  ),
  ("llama", dict(hidden_size=0), "hidden_size=0 must be positive"),
  ("llama", dict(intermediate_size=0), "intermediate_size=0 must be positive"),
  ("bert_mlm", dict(max_position_embeddings=0), "max_position_embeddings=0 must be positive"),
  ("gpt2", dict(n_inner=0), "n_inner=0 must be positive"),
  ("llama", dict(eos_token_id="</s>"), 'eos_token_id="</s>" must be a token id'),
  # (ids outside the vocabulary and negative soft-caps load, as in transformers: tests/test_faults_inputs.py)
]


def _model(family: str, root: str, tiny_dirs, tmp_path) -> pathlib.Path:
  source = tiny_dirs[family] if family in tiny_dirs else _tiny(family, root)
  return _copy(source, tmp_path / family)


@pytest.mark.parametrize("family, change, message", CASES, ids=[f"{c[0]}-{c[2][:40]}" for c in CASES])
def test_malformed_or_nonsense_config_values_are_one_line_naming_the_key(
  root, tiny_dirs, tmp_path, family, change, message
):
  path = _model(family, root, tiny_dirs, tmp_path)
  if isinstance(change, bytes):
    (path / "config.json").write_bytes(change)
  else:
    config = json.loads((path / "config.json").read_text())
    config.update(change)
    (path / "config.json").write_text(json.dumps(config))
  settings = path / "tokenizer_config.json"
  if family == "llama" and settings.is_file():  # the tokenizer then takes its EOS from eos_token_id
    (settings).write_text(json.dumps({k: v for k, v in json.loads(settings.read_text()).items() if k != "eos_token"}))
  config_path = path / "config.json"
  _one_line(lambda: pretrained.model_family(path), f"{config_path}: {message}")  # when a command plans
  _one_line(lambda: pretrained.load_pretrained(str(path)), f"{config_path}: {message}")


@pytest.mark.parametrize("family, key", [("llama", "num_hidden_layers"), ("gpt2", "n_layer"), ("bert_mlm", None)])
def test_layer_count_above_the_checkpoint_is_refused_before_building(root, tiny_dirs, tmp_path, family, key):
  """Before: the abstract model of 200 claimed layers took 45 s to build, only to miss layer 2's first tensor."""
  path = _model(family, root, tiny_dirs, tmp_path)
  key = key or "num_hidden_layers"
  config = json.loads((path / "config.json").read_text())
  config[key] = 200
  (path / "config.json").write_text(json.dumps(config))
  start = time.perf_counter()
  _one_line(
    lambda: targets.pretrained_target(str(path)),
    rf"config.json: {key}=200, but {path / 'model.safetensors'} holds the tensors of 2 layer\(s\) \(0-1\)",
  )
  _one_line(lambda: pretrained.load_pretrained(str(path)), rf"{key}=200, but .* holds the tensors of 2 layer")
  assert time.perf_counter() - start < 10  # both; before, one import alone took 45 s


def test_missing_middle_layer_is_named(tiny_dirs, tmp_path):
  path = _copy(tiny_dirs["gpt2"], tmp_path / "gpt2")
  tensors = safetensors.numpy.load_file(path / "model.safetensors")
  kept = {k: v for k, v in tensors.items() if ".h.0." not in k}
  safetensors.numpy.save_file(kept, path / "model.safetensors")
  _one_line(lambda: pretrained.load_pretrained(str(path)), r"n_layer=2, but .* holds the tensors of 1 layer\(s\) \(1\)")


# ---------------------------------------------------------------- item 7: corrupt files met while planning


@pytest.mark.parametrize("family", ["bert_mlm", "gpt2"])
def test_corrupt_weights_are_one_line_when_planning(tiny_dirs, tmp_path, family):
  """Before: an encoder's weights were opened unguarded (the LM-head check), a pybind traceback."""
  path = _copy(tiny_dirs[family], tmp_path / family)
  (path / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
  _one_line(lambda: targets.pretrained_target(str(path)), "model.safetensors: not a readable safetensors file")


def test_corrupt_shard_is_one_line_when_planning(sharded, tmp_path):
  path = _copy(sharded, tmp_path / "model")
  shard = sorted(path.glob("model-*.safetensors"))[-1]
  shard.write_bytes(shard.read_bytes()[:100])
  _one_line(lambda: targets.pretrained_target(str(path)), f"{shard}: not a readable safetensors file")


# ---------------------------------------------------------------- items 7 and 13: hf: names and revisions


@pytest.mark.parametrize(
  "spec",
  [
    "hf:org/a..b",
    "hf:org--x/name",
    "hf:org/name--x",
    "hf:org/-name",
    "hf:org/name.",
    "hf:org/name.git",
    "hf:a/b/c",
    "hf:org/" + "n" * 97,
  ],
)
def test_hub_names_breaking_the_hub_rules_are_one_line(spec, monkeypatch, tmp_path):
  """Before: huggingface_hub's HFValidationError (a traceback) for `..` and `--`."""
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
  _one_line(lambda: targets.pretrained_target(spec), f"'{spec}': not a Hugging Face model name")


@pytest.mark.parametrize("revision", ["../../../etc", "/abs", "a..b", "main lock", "x.lock", "step1,step2"])
def test_revisions_that_would_be_paths_in_the_cache_are_refused(revision):
  """A revision becomes refs/<revision> in the Hub cache (read, and written online): no '..' or absolute."""
  _one_line(lambda: pretrained.parse_hub_name(f"hf:org/name@{revision}"), f"revision '{revision}' is not a branch")


def test_valid_hub_names_still_parse():
  assert pretrained.parse_hub_name("hf:EleutherAI/pythia-70m@step1000") == ("EleutherAI/pythia-70m", "step1000")
  assert pretrained.parse_hub_name("gpt2") == ("gpt2", None)
  assert pretrained.parse_hub_name("hf:org/my_model.v2@refs/pr/1") == ("org/my_model.v2", "refs/pr/1")
  assert pretrained.parse_hub_name("hf:o/n@stage1-step5000-tokens21B")[1] == "stage1-step5000-tokens21B"


def test_load_refuses_a_revision_given_twice(sharded, tmp_path, monkeypatch):
  """Before: load("hf:…@step100", revision="step300") silently took step300."""
  import headspec

  cache = tmp_path / "hub"
  repo = cache / "models--tiny-org--twice"
  for revision, commit in (("step100", "1" * 40), ("step300", "3" * 40)):
    _copy(sharded, repo / "snapshots" / commit)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
  _one_line(
    lambda: headspec.load("hf:tiny-org/twice@step100", revision="step300"),
    r"load\('hf:tiny-org/twice@step100', revision='step300'\): two revisions",
  )
  loaded = headspec.load("hf:tiny-org/twice@step100", revision="step100")  # the same one twice is fine
  assert loaded.target.identity["snapshot"].endswith("1" * 40)
  assert np.asarray(loaded.model.blocks[0].attention.w_q_DHK[...]).shape == (32, 4, 8)


# ---------------------------------------------------------------- siblings: the tokenizer files the import reads


def _llama_with(root, tmp_path, edit) -> pathlib.Path:
  path = _copy(_tiny("llama", root), tmp_path / "llama")
  edit(path)
  return path


def _settings(path: pathlib.Path, **changes) -> None:
  file = path / "tokenizer_config.json"
  file.write_text(json.dumps({**json.loads(file.read_text()), **changes}))


def _eos_in_the_padding_rows(path: pathlib.Path) -> None:
  """A decoder's padded embedding rows (vocab_size above the tokenizer's) hold no token: an EOS id there."""
  config = json.loads((path / "config.json").read_text())
  tokenizer_size = config["vocab_size"]
  config.update(vocab_size=tokenizer_size + 8, eos_token_id=tokenizer_size + 2)
  (path / "config.json").write_text(json.dumps(config))
  settings = json.loads((path / "tokenizer_config.json").read_text())
  settings.pop("eos_token")
  (path / "tokenizer_config.json").write_text(json.dumps(settings))


@pytest.mark.parametrize(
  "edit, message",
  [
    (lambda p: (p / "tokenizer_config.json").write_text("[1]"), r"tokenizer_config.json: not a JSON object \(the top"),
    (lambda p: (p / "tokenizer_config.json").write_bytes(b'{"a": "\xff"}'), "tokenizer_config.json: cannot read JSON"),
    (lambda p: _settings(p, eos_token=["</s>"]), r'tokenizer_config.json: eos_token=\["</s>"\] must be a token'),
    (lambda p: _settings(p, bos_token=1), "tokenizer_config.json: bos_token=1 must be a token"),
    (lambda p: _settings(p, add_bos_token="yes"), 'tokenizer_config.json: add_bos_token="yes" must be true or false'),
    (_eos_in_the_padding_rows, r"config.json: eos_token_id=\d+ is outside the tokenizer's vocabulary \(\d+ tokens\)"),
  ],
)
def test_malformed_tokenizer_settings_are_one_line_naming_the_key(root, tmp_path, edit, message):
  """Before: tracebacks (TypeError, UnicodeDecodeError), an `add_bos_token="yes"` taken as true, and
  "the tokenizer has no eos_token None" for an id in the padding rows."""
  path = _llama_with(root, tmp_path, edit)
  _one_line(lambda: pretrained.load_pretrained(str(path)), message)


def test_valid_tokenizer_settings_with_nulls_still_load(root, tmp_path):
  path = _llama_with(root, tmp_path, lambda p: _settings(p, add_bos_token=None, add_prefix_space=None))
  assert pretrained.load_pretrained(str(path))[1].prefix_ids == (1,)


def test_a_weight_holding_nan_is_refused(tiny_dirs, tmp_path):
  """A sibling of item 6: a damaged tensor computed NaN everywhere, silently."""
  path = _copy(tiny_dirs["gpt2"], tmp_path / "gpt2")
  tensors = safetensors.numpy.load_file(path / "model.safetensors")
  key = next(k for k in tensors if k.endswith("h.1.mlp.c_fc.weight"))
  tensors[key][0, :3] = [np.nan, np.inf, -np.inf]
  safetensors.numpy.save_file(tensors, path / "model.safetensors")
  _one_line(
    lambda: pretrained.load_pretrained(str(path)), r"model.safetensors: tensor 'h.1.mlp.c_fc.weight' holds 3 NaN"
  )
