"""Faults in user input: each class of fault has one mechanism and one test over all
its users. 1: a config.json check refuses only what transformers refuses or what would compute wrong
numbers (special-token ids outside the vocabulary load, with one warning); 2: a user's config or
experiment file is user input (any exception: one line); 3: user text files read with or without a BOM;
4: the API's seeds, token ids, texts and metrics through one check each; 5-7: `data synthetic` outputs,
mesh sizes and non-UTF-8 workdirs checked first."""

import contextlib
import io
import json
import logging
import os
import pathlib
import re
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest  # noqa: E402

from headspec.errors import UserError  # noqa: E402

pytest.importorskip("transformers")

import test_pretrained  # noqa: E402

tiny_dirs = test_pretrained.tiny_dirs  # the fixture of tiny BERT (with and without MLM head) and GPT-2


def _one_line(call, match: str) -> str:
  with pytest.raises(UserError, match=match) as error:
    call()
  assert "\n" not in str(error.value)
  return str(error.value)


def _cli(args: list[str]) -> tuple[int, str]:
  """`headspec ARGS` in-process: (exit status, stderr)."""
  from headspec.cli import main as cli

  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    rc = cli.main(["headspec", *args])
  return rc, err.getvalue()


# ---------------------------------------------------------------- 1: config.json checks against transformers


@pytest.fixture(scope="module")
def root(tmp_path_factory):
  return str(tmp_path_factory.mktemp("families"))


def _transformers_outcome(path: pathlib.Path) -> str:
  """What transformers does with the directory's config.json: 'refuses' (loading the config or building
  the model raises), 'wrong numbers' (it builds, and computes non-finite or complex logits, logits that do
  not depend on the input, or NaN from a normalisation of a zero activation) or 'loads'."""
  import torch
  import transformers

  try:
    config = transformers.AutoConfig.from_pretrained(path)
    masked = config.model_type in ("bert", "roberta", "distilbert")
    model_cls = transformers.AutoModelForMaskedLM if masked else transformers.AutoModelForCausalLM
    model = model_cls.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
      logits = [model(torch.tensor([ids])).logits for ids in ([3, 4, 5, 6, 7, 8], [9, 8, 7, 6, 5, 4])]
  except Exception:  # noqa: BLE001  (any refusal)
    return "refuses"
  if logits[0].is_complex() or not all(bool(torch.isfinite(x).all()) for x in logits):
    return "wrong numbers"
  if torch.equal(logits[0][0, -1], logits[1][0, -1]):
    return "wrong numbers"  # the same next-token logits for every input (hidden_size=0)
  with torch.no_grad():
    for module in model.modules():
      if "norm" in type(module).__name__.lower() and hasattr(module, "weight") and module.weight is not None:
        if not bool(torch.isfinite(module(torch.zeros(1, 1, module.weight.shape[-1]))).all()):
          return "wrong numbers"  # NaN where an activation is zero (an epsilon <= 0)
  return "loads"


# Refused values transformers builds a model from: each computes nonsense headspec does not reproduce.
NONSENSE = {
  "sliding_window": "a window of -4 tokens holds no key: every query attends to nothing",
  "rope_parameters": "high_freq_factor <= low_freq_factor inverts Llama-3's frequency interpolation (a division "
  "by a negative gap); an odd rotary dimension (partial_rotary_factor) has no pairs to rotate",
  "clip_qkv": "clamp(min=0.4, max=-0.4) makes every query, key and value -0.4, whatever the input",
  "query_pre_attn_scalar": "(-24) ** -0.5 is imaginary: transformers keeps its real part (about 0), so every "
  "attention row is uniform, whatever the keys",
  "intermediate_size": "an MLP of width 0 (no model has one; headspec's MLP needs d_ff > 0)",
}


def _refused_cases():
  from test_pretrained_errors import CASES

  return [(f, c, m) for f, c, m in CASES if isinstance(c, dict)]


@pytest.mark.parametrize("family, change, message", _refused_cases(), ids=lambda v: str(v)[:40])
def test_every_refused_config_value_is_refused_by_transformers_or_computes_wrong_numbers(
  root, tiny_dirs, tmp_path, family, change, message
):
  """Every value headspec's checks (headspec/pretrained/config_checks.py, the families' translations) refuse:
  transformers refuses it too (its config validation or its model), or computes wrong numbers with it,
  or the value is one of NONSENSE's (named, with the reason)."""
  from test_pretrained_errors import _model

  path = _model(family, root, tiny_dirs, tmp_path)
  config = json.loads((path / "config.json").read_text())
  config.update(change)
  (path / "config.json").write_text(json.dumps(config))
  outcome = _transformers_outcome(path)
  assert outcome != "loads" or set(change) & set(NONSENSE), f"transformers loads {change} and computes right numbers"


# Values transformers loads and computes right numbers with: headspec loads them (ids: one warning, absent).
LOADS = [
  ("llama", dict(eos_token_id=99999), "eos_token_id=99999 is outside the vocabulary"),
  ("llama", dict(eos_token_id=[2, -1]), r"eos_token_id=\[2, -1\] is outside the vocabulary"),
  ("llama", dict(eos_token_id=-1), "eos_token_id=-1 is outside the vocabulary"),
  ("gpt2", dict(bos_token_id=50256, eos_token_id=50256), "bos_token_id=50256 is outside the vocabulary"),
  ("olmo2", dict(eos_token_id=50279), "eos_token_id=50279 is outside the vocabulary"),
  ("gemma2", dict(attn_logit_softcapping=-1.5), None),
]


@pytest.mark.parametrize("family, change, warning", LOADS, ids=lambda v: str(v)[:40])
def test_values_transformers_loads_load_with_at_most_one_warning(
  root, tiny_dirs, tmp_path, caplog, family, change, warning
):
  """Before: special-token ids outside the vocabulary (random tiny models keep GPT-2's 50256 with
  vocab_size=300) and a negative soft-cap (c·tanh(x/c) is the same for -c) stopped the load."""
  from test_pretrained_errors import _model

  from headspec import pretrained

  path = _model(family, root, tiny_dirs, tmp_path)
  config = json.loads((path / "config.json").read_text())
  config.update(change)
  (path / "config.json").write_text(json.dumps(config))
  assert _transformers_outcome(path) == "loads"
  with caplog.at_level(logging.WARNING):
    pretrained.model_family(path)  # a command plans, then loads: one warning for both
    model, _ = pretrained.load_pretrained(str(path))
  said = [r.getMessage() for r in caplog.records if "outside the vocabulary" in r.getMessage()]
  if warning is None:
    assert not said
  else:
    ids = [key for key in change if key.endswith("_token_id")]
    assert len(said) == len(ids) and any(re.search(warning, line) for line in said), said  # one per key
  if "attn_logit_softcapping" in change:
    assert model.cfg.attention_softcap == 1.5


@pytest.mark.parametrize("family", ["gpt2", "olmo2"])
def test_tiny_random_models_with_default_special_ids_load_and_generate(tmp_path, family):
  """transformers' GPT2Config and Olmo2Config keep GPT-2's and OLMo-2's special ids (50256, 50279) whatever
  the vocab_size: a tiny random model of 300 tokens. Before: "eos_token_id=50256 is outside the
  vocabulary" stopped headspec.load. Now it loads and generates what transformers generates."""
  import tokenizers
  import torch
  import transformers
  from test_pretrained import SENTENCES
  from test_pretrained_families import _save_tokenizer

  import headspec

  path = tmp_path / family
  if family == "gpt2":
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(SENTENCES * 3, vocab_size=300, min_frequency=1, special_tokens=["<|endoftext|>"])
    path.mkdir()
    bpe.save_model(str(path))  # vocab.json + merges.txt
    config = transformers.GPT2Config(vocab_size=bpe.get_vocab_size(), n_positions=64, n_embd=24, n_layer=2, n_head=3)
    assert config.eos_token_id == 50256
  else:
    _save_tokenizer(path, family)  # tokenizer.json of 200 tokens, padded to 300 rows as decoders do
    config = transformers.Olmo2Config(
      vocab_size=300, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=48
    )
    assert config.eos_token_id == 50279
  torch.manual_seed(0)
  hf = transformers.AutoModelForCausalLM.from_config(config).eval()
  hf.save_pretrained(path)
  loaded = headspec.load(path)
  prompt = [3, 4, 5, 6]
  expected = hf.generate(torch.tensor([prompt]), max_new_tokens=4, do_sample=False)[0, len(prompt) :].tolist()
  assert headspec.generate(loaded, prompt, 4) == expected
  assert headspec.generate(loaded, "the dog", 2)  # text prompts too: the tokenizer loaded


# ---------------------------------------------------------------- 2: a user's config or experiment file


FILE_FAULTS = {  # file text -> what the one line must say
  "syntax": (b"def get_config(:\n", r"cannot load the file \(SyntaxError: .*line 1"),
  "import": (b"import no_such_module_here\n", r"cannot load the file \(ModuleNotFoundError: No module named"),
  "zero": (b"def get_config(arg=None):\n  return 1/0\n\ndef experiment(arg):\n  return 1/0\n", "ZeroDivisionError"),
  "raise": (
    b"def get_config(arg=None):\n  raise RuntimeError('boom')\n\nexperiment = get_config\n",
    "RuntimeError: boom",
  ),
  "keyerror": (b"def get_config(arg=None):\n  return {}['x']\n\nexperiment = get_config\n", "KeyError: 'x'"),
  "not utf-8": (b"def get_config(arg=None):\n  return 'caf\xe9'\n", r"SyntaxError: .*utf-8.* line 2"),
  "not python": (b"root:x:0:0:root:/root:/bin/bash\n", r"not a Python config file"),
}

# Every flag that runs a user's python file: (flag, argv with FILE in it, runner).
LOADERS = {
  "headspec --config": ("--config", lambda f, w: ["probe", f"--config={f}", f"--workdir={w}"], "cli"),
  "launch --config": ("--config", lambda f, w: ["local", "--pipeline", f"--config={f}", f"--workdir={w}"], "launch"),
  "launch --experiment": ("--experiment", lambda f, w: ["local", f"--experiment={f}", f"--workdir={w}"], "launch"),
}


@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize("fault", FILE_FAULTS)
def test_any_fault_of_a_users_config_file_is_one_line_naming_it(tmp_path, loader, fault):
  """Before: a traceback for each (SyntaxError, ModuleNotFoundError, ZeroDivisionError, RuntimeError, a
  passwd file read as Python), and "bad config override among : 'x'" for a KeyError inside get_config."""
  from headspec import launch

  text, message = FILE_FAULTS[fault]
  file = tmp_path / ("config.txt" if fault == "not python" else "config.py")
  file.write_bytes(text)
  flag, argv, runner = LOADERS[loader]
  args = argv(str(file), str(tmp_path / "work"))
  if runner == "cli":
    rc, err = _cli(args)
  else:
    out = io.StringIO()
    with contextlib.redirect_stderr(out):
      rc = launch.main([*args, "--dry-run"])
    err = out.getvalue()
  lines = err.strip().splitlines()
  assert rc == 2 and len(lines) == 1, err
  assert f"{flag}={file}" in lines[0] and re.search(message, lines[0]), lines[0]
  assert not (tmp_path / "work").exists()


def test_an_experiments_broken_run_config_is_one_line(tmp_path):
  """The configs an experiment names go through the same loader."""
  from headspec import launch

  broken = tmp_path / "train.py"
  broken.write_text("def get_config(arg=None):\n  return 1/0\n")
  exp = tmp_path / "exp.py"
  exp.write_text(
    "from headspec.launch.experiments import Experiment, Run\n\n"
    f"def experiment(arg):\n  return Experiment(runs=(Run('a', {str(broken)!r}, 'c', 0),), analyses=())\n"
  )
  out = io.StringIO()
  with contextlib.redirect_stderr(out):
    rc = launch.main(["local", f"--experiment={exp}", f"--workdir={tmp_path / 'work'}", "--dry-run"])
  assert rc == 2 and out.getvalue().count("\n") == 1
  assert f"--config={broken}: get_config() failed (ZeroDivisionError" in out.getvalue()


# ---------------------------------------------------------------- 3: a user's text files


PAIR = b'{"clean": "a b", "corrupt": "a c", "answer": " b", "wrong": " c"}\n'
CONLLU = (
  b"# text = Dogs bark.\n1\tDogs\tdog\tNOUN\tNNS\t_\t2\tnsubj\t_\t_\n2\tbark\tbark\tVERB\tVBP\t_\t0\troot\t_\t_\n\n"
)


def _read_pairs(path):
  from headspec.patching.circuit import read_pairs

  return read_pairs(str(path))


def _read_conllu(path):
  from headspec.data.treebank import read_conllu

  return read_conllu(path)


# Every reader of a user's text file (headspec/io/textfiles.py): (reader, a valid file's bytes).
TEXT_READERS = {"circuit pairs=FILE.jsonl": (_read_pairs, PAIR), "treebank .conllu": (_read_conllu, CONLLU)}


@pytest.mark.parametrize("reader", TEXT_READERS)
def test_user_text_files_read_with_a_bom_and_refuse_other_bytes_naming_the_line(tmp_path, reader):
  """Before: a pairs file from Notepad (a UTF-8 byte-order mark) was "not JSON" at line 1, and a byte that
  is not UTF-8 a UnicodeDecodeError traceback (the treebank's message named no line)."""
  read, good = TEXT_READERS[reader]
  file = tmp_path / "user.txt"
  file.write_bytes(b"\xef\xbb\xbf" + good)
  assert read(file) and len(read(file)) == 1
  file.write_bytes(good + good.replace(b"b", b"caf\xe9", 1))
  line = len(good.splitlines()) + 1  # the first line of the second copy, where the byte is
  _one_line(lambda: read(file), rf"{file}:{line}: not UTF-8 \(invalid continuation byte")


# ---------------------------------------------------------------- 4: the API's seeds, token ids, texts, metrics

CLEAN = [[5, 9, 14, 20], [8, 2, 40, 41]]
CORRUPT = [[5, 9, 17, 20], [8, 2, 40, 44]]
ANSWERS = [(7, 11), (3, 4)]


@pytest.fixture(scope="module")
def run_dir(train_tiny_decoder):
  return train_tiny_decoder(2, name="faults_inputs")


@pytest.fixture(scope="module")
def loaded(run_dir):
  import headspec

  return headspec.load(run_dir)


def _patching(loaded, **changes):
  return dict(dict(model=loaded, clean=CLEAN, corrupt=CORRUPT, answers=ANSWERS), **changes)


def _seeded(loaded):
  """Every API function that takes a seed: (function, a valid call's keyword arguments)."""
  import headspec

  return {
    "generate": (headspec.generate, dict(model=loaded, prompt=[1, 2], max_new_tokens=1)),
    "probe": (headspec.probe, dict(model=loaded, task="upos", layer=0)),
    "ablate": (headspec.ablate, dict(model=loaded, heads=[(0, 0)])),
    "circuit": (headspec.circuit, _patching(loaded, methods=["eap"], sizes=[5], random_sets=1)),
  }


@pytest.mark.parametrize("seed", [-1, 2**63, 2**70, True, 1.5, "0"])
@pytest.mark.parametrize("function", ["generate", "probe", "ablate", "circuit"])
def test_every_seed_goes_through_one_check(loaded, function, seed):
  """Before: generate(seed=2**70) an OverflowError from jax.random.key, circuit(seed=-1) numpy's ValueError
  after the scores were computed; the others took them into their configs."""
  call, kwargs = _seeded(loaded)[function]
  _one_line(lambda: call(**kwargs, seed=seed), rf"{function}: seed=.* must be (a seed in 0\.\.2\*\*63-1|an int seed)")


def _with_ids(loaded, ids):
  """Every API function that takes token ids, given `ids` where a prompt's ids go."""
  import headspec

  pair = [ids, [5, 9, 17, 20][: len(ids)]]
  return {
    "generate prompt": lambda: headspec.generate(loaded, ids, 1),
    "capture": lambda: headspec.capture(loaded, ids),
    "to_str_tokens": lambda: headspec.to_str_tokens(loaded, ids),
    "patch": lambda: headspec.patch(**_patching(loaded, clean=pair, corrupt=pair), site="z"),
    "attribution_patch": lambda: headspec.attribution_patch(**_patching(loaded, clean=pair, corrupt=pair), site="z"),
    "path_patch": lambda: headspec.path_patch(**_patching(loaded, clean=pair, corrupt=pair), receivers=[(1, 0)]),
    "circuit": lambda: headspec.circuit(**_patching(loaded, clean=pair, corrupt=pair), methods=["eap"], sizes=[5]),
  }


@pytest.mark.parametrize(
  "function", ["generate prompt", "capture", "to_str_tokens", "patch", "attribution_patch", "path_patch", "circuit"]
)
def test_a_bool_is_no_token_id_anywhere(loaded, function):
  """Before: True was taken as token id 1 (numpy makes [True, 9, 14] the ids [1, 9, 14])."""
  _one_line(_with_ids(loaded, [True, 9, 14, 20])[function], r"\[0\]=True: a bool is not a token id")


def test_bool_answers_and_eos_are_no_token_ids(loaded):
  import headspec

  _one_line(lambda: headspec.generate(loaded, [1, 2], 1, eos_id=True), "eos_id=True must be None or a token id")
  _one_line(lambda: headspec.patch(**_patching(loaded, answers=[(True, 11), (3, 4)]), site="z"), r"answers\[0\]")


def test_a_text_goes_through_the_same_check_in_generate_as_in_to_tokens(loaded):
  """Before: generate(model, "the \\ud800 dog", 3) was a RuntimeError from sentencepiece."""
  import headspec

  text = "the \ud800 dog"
  reason = "a lone surrogate U+D800 at character 4; give valid Unicode text"
  assert reason in _one_line(lambda: headspec.to_tokens(loaded, text), "to_tokens: text=")
  assert reason in _one_line(lambda: headspec.generate(loaded, text, 3), "generate: prompt=")
  assert reason in _one_line(lambda: headspec.generate(loaded, ["the dog", text], 3), r"generate: prompt\[1\]=")


@pytest.mark.parametrize("function", ["patch", "attribution_patch", "path_patch", "circuit"])
def test_a_metric_returning_a_vector_is_one_line(loaded, function):
  """Before: a TypeError from inside JAX (reshape of a [B] vector to a scalar) for every function."""
  import headspec

  metric = lambda logits_BTV: logits_BTV[:, -1, 0]  # noqa: E731  (a value per prompt, not one number)
  extra = {"patch": dict(site="z"), "attribution_patch": dict(site="z"), "path_patch": dict(receivers=[(1, 0)]),
           "circuit": dict(methods=["eap"], sizes=[5])}[function]  # fmt: skip
  call = getattr(headspec, function)
  _one_line(lambda: call(**_patching(loaded, metric=metric), **extra), r"metric: returned shape \(2,\)")
  failing = lambda logits_BTV: logits_BTV["x"]  # noqa: E731
  _one_line(lambda: call(**_patching(loaded, metric=failing), **extra), "metric: calling it on logits")


# ---------------------------------------------------------------- 5-7: outputs, mesh sizes, workdirs


@pytest.mark.parametrize(
  "args, message",
  [
    (["--out={file}"], "--out={file}: is a file, not a folder"),
    (["--out={file}/data"], "--out={file}/data: is under {file}, a file, not a folder"),
    (["--out={folder}", "--repeats=-1"], r"--repeats=-1: a fraction in \(0, 1\]"),
    (["--out={folder}", "--repeats=nan"], r"--repeats=nan: a fraction in \(0, 1\]"),
  ],
)
def test_data_synthetic_checks_its_options_before_writing(tmp_path, args, message):
  """Before: NotADirectoryError tracebacks, and --repeats=-1 refused only after the whole treebank was written."""
  file, folder = tmp_path / "afile", tmp_path / "data"
  file.write_text("x")
  rc, err = _cli(["data", "synthetic", *(a.format(file=file, folder=folder) for a in args)])
  assert rc == 2 and err.count("\n") == 1 and re.search(message.format(file=file), err), err
  assert not folder.exists() and file.read_text() == "x"


def test_mesh_sizes_are_bounded_before_their_product():
  """Before: data=4294967296,fsdp=4294967296 multiplied to 0 in int64, then a ZeroDivisionError."""
  from headspec.parallel import mesh

  for spec in ("data=4294967296,fsdp=4294967296,tensor=-1", "tensor=" + "9" * 30):
    _one_line(lambda spec=spec: mesh.parse(spec, key="config.mesh"), r"config.mesh=.*exceeds the \d+ devices")


def test_a_workdir_that_is_not_utf8_is_named_as_such_by_every_user(tmp_path, run_dir):
  """Before: a run folder whose path holds a byte that is not UTF-8 loaded as "checkpoint ... does not match
  this model" (tensorstore cannot take the path). Every way to name a run folder says what is wrong."""
  import headspec
  from headspec import launch

  bad = os.fsdecode(os.fsencode(str(tmp_path)) + b"/run\xff")
  shutil.copytree(run_dir, bad)  # a trained run, moved to a folder whose name is not UTF-8
  said = r"--workdir=.*/run\\xff: the path has a byte that is not UTF-8"
  rc, err = _cli(["probe", "--config=probe_synthetic", f"--workdir={bad}"])
  assert rc == 2 and re.search(said, err), err
  out = io.StringIO()
  with contextlib.redirect_stderr(out):
    assert launch.main(["local", "--pipeline", "--config=quickstart_decoder", f"--workdir={bad}", "--dry-run"]) == 2
  assert re.search(said, out.getvalue()), out.getvalue()
  _one_line(lambda: headspec.load(bad), "the path has a byte that is not UTF-8")
