"""The Python API under wrong types. Every public function (headspec.__all__) and
`Captured.head_attention` refuse a wrong type (None, a list where a text goes, a text where a bool or a
count goes, a lone surrogate in text) with one headspec.errors.UserError naming the argument, before any
work: no TypeError or AttributeError escapes. Plus the API's smaller faults: answers as a numpy array,
empty prompts, `run(m, 42)`."""

import inspect
import re

import numpy as np
import pytest

import headspec
from headspec.errors import UserError

CLEAN = [[5, 9, 14, 20], [8, 2, 40, 41]]
CORRUPT = [[5, 9, 17, 20], [8, 2, 40, 44]]
ANSWERS = [(7, 11), (3, 4)]
SURROGATE = "the d\ud800og"  # a lone surrogate: no UTF-8 file or tokenizer holds one


@pytest.fixture(scope="module")
def run_dir(train_tiny_decoder):
  return train_tiny_decoder(2, name="faults_api")


@pytest.fixture(scope="module")
def calls(run_dir, synthetic_data_dir):
  """function name -> (the function, keyword arguments of a valid call)."""
  from headspec.probing.config import synthetic_probe_config

  loaded = headspec.load(run_dir)
  (captured,) = headspec.run(loaded, "the dog")
  config = synthetic_probe_config(str(synthetic_data_dir))
  patching = dict(model=loaded, clean=CLEAN, corrupt=CORRUPT, answers=ANSWERS)
  return {
    "load": (headspec.load, dict(source=run_dir)),
    "split_words": (headspec.split_words, dict(text="the dog")),
    "to_tokens": (headspec.to_tokens, dict(model=loaded, text="the dog")),
    "to_str_tokens": (headspec.to_str_tokens, dict(model=loaded, text="the dog")),
    "to_single_token": (headspec.to_single_token, dict(model=loaded, text="the")),
    "capture": (headspec.capture, dict(model=loaded, tokens_or_text="the dog")),
    "activations": (headspec.activations, dict(model=loaded, inputs="the dog", sites=["z"], progress=False)),
    "generate": (headspec.generate, dict(model=loaded, prompt="the dog", max_new_tokens=2)),
    "plot_attention": (headspec.plot_attention, dict(pattern=np.full((2, 3, 3), 1 / 3), tokens=["a", "b", "c"])),
    "attention_view": (headspec.attention_view, dict(pattern=np.full((2, 3, 3), 1 / 3), tokens=["a", "b", "c"])),
    "run": (headspec.run, dict(model=loaded, sentences="the dog")),
    "probe": (headspec.probe, dict(model=loaded, task="upos", layer=0, config=config)),
    "ablate": (headspec.ablate, dict(model=loaded, heads=[(0, 0)])),
    "patch": (headspec.patch, dict(patching, site="z")),
    "attribution_patch": (headspec.attribution_patch, dict(patching, site="z")),
    "path_patch": (headspec.path_patch, dict(patching, receivers=[(1, 0)])),
    "circuit": (headspec.circuit, dict(patching, methods=["eap"], sizes=[5], random_sets=1)),
    "read_table": (headspec.read_table, dict(workdir=run_dir, name="probes")),
    "read_tables": (headspec.read_tables, dict(runs=[run_dir], name="probes")),
    "Captured.head_attention": (captured.head_attention, dict(layer=0, head=0)),
    "build_atlas": (headspec.build_atlas, dict(workdir=run_dir)),
    "fit_sae": (headspec.fit_sae, dict(x_NK=np.ones((8, 4), np.float32), features=8, k=2, steps=1, progress=False)),
    "sae_head_fractions": (headspec.sae_head_fractions, dict(sae=_SAE(), heads=2)),
    "load_sae": (headspec.load_sae, dict(path=run_dir)),
  }


class _SAE:
  W_dec_FK = np.ones((8, 4))


# (function, argument, wrong value): each must be one UserError naming the argument.
WRONG = [
  ("load", "source", None),
  ("load", "source", ["minilm"]),
  ("load", "source", 3),
  ("load", "source", "mini\ud800lm"),
  ("load", "step", "2"),
  ("load", "step", True),
  ("load", "step", 2.0),
  ("load", "revision", ["main"]),
  ("split_words", "text", None),
  ("split_words", "text", ["the dog"]),
  ("split_words", "text", b"the dog"),
  ("to_tokens", "model", None),
  ("to_tokens", "text", 3),
  ("to_tokens", "text", [SURROGATE]),
  ("to_tokens", "prepend_bos", "yes"),
  ("to_str_tokens", "model", "gpt2"),
  ("to_str_tokens", "text", 3.5),
  ("to_str_tokens", "prepend_bos", 1),
  ("to_single_token", "model", None),
  ("to_single_token", "text", ["a"]),
  ("capture", "model", None),
  ("capture", "tokens_or_text", None),
  ("capture", "tokens_or_text", 3),
  ("capture", "tokens_or_text", [SURROGATE]),
  ("capture", "sites", 3),
  ("capture", "prepend_bos", "no"),
  ("capture", "head_mask", "all"),
  ("capture", "tokenizer", "gpt2"),
  ("activations", "model", None),
  ("activations", "inputs", None),
  ("activations", "inputs", 3),
  ("activations", "inputs", []),
  ("activations", "inputs", [SURROGATE]),
  ("activations", "sites", 3),
  ("activations", "sites", None),
  ("activations", "to", 3),
  ("activations", "context", "16"),
  ("activations", "batch_tokens", 0),
  ("activations", "prepend_bos", "no"),
  ("activations", "progress", 1),
  ("run", "model", None),
  ("run", "model", "minilm"),
  ("run", "sentences", None),
  ("run", "sentences", 42),
  ("run", "sentences", [3]),
  ("run", "sentences", [["the", 3]]),
  ("run", "sentences", SURROGATE),
  ("run", "sentences", [["the", "d\ud800og"]]),
  ("run", "head_mask", "all"),
  ("run", "head_mask", [("0", "1")]),
  ("run", "pooling", ["first"]),
  ("probe", "model", None),
  ("probe", "task", ["upos"]),
  ("probe", "task", None),
  ("probe", "heads", [(0, "1")]),
  ("probe", "heads", (0, 1)),
  ("probe", "layer", "0"),
  ("probe", "layer", True),
  ("probe", "treebank", ["synthetic"]),
  ("probe", "treebank", "synth\ud800etic"),
  ("probe", "eval_splits", "dev"),
  ("probe", "eval_splits", [1]),
  ("probe", "max_train_words", "2000"),
  ("probe", "max_train_words", 2000.0),
  ("probe", "data_dir", 3),
  ("probe", "seed", "0"),
  ("probe", "config", {"probe": {}}),
  ("probe", "cache_dir", 3),
  ("probe", "bootstrap_resamples", "100"),  # a probe.* key given as a keyword
  ("probe", "l2_grid", "1e-3"),
  ("probe", "pooling", 3),
  ("ablate", "model", None),
  ("ablate", "heads", None),
  ("ablate", "heads", "0,1"),
  ("ablate", "heads", [(0, 0.5)]),
  ("ablate", "method", ["zero"]),
  ("ablate", "num_tokens", "2048"),
  ("ablate", "seed", 0.5),
  ("ablate", "data_dir", ["data"]),
  ("ablate", "config", "configs/ablate_quickstart.py"),
  ("ablate", "num_sentences", "3"),  # an ablate config key given as a keyword
  ("patch", "model", None),
  ("patch", "clean", None),
  ("patch", "clean", 3),
  ("patch", "corrupt", "the cat"),
  ("patch", "clean", [SURROGATE, "a cat"]),
  ("patch", "site", ["z"]),
  ("patch", "site", None),
  ("patch", "metric", 3),
  ("patch", "by_position", "no"),
  ("patch", "by_position", 1),
  ("patch", "direction", ["noising"]),
  ("patch", "layers", "0"),
  ("patch", "heads", [0.5]),
  ("patch", "positions", ["1"]),
  ("patch", "answers", "ab"),
  ("patch", "answers", 3),
  ("patch", "tokenizer", "gpt2"),
  ("attribution_patch", "model", 3),
  ("attribution_patch", "clean", None),
  ("attribution_patch", "site", ["z"]),
  ("attribution_patch", "by_position", "no"),
  ("attribution_patch", "direction", 1),
  ("attribution_patch", "answers", 3),
  ("path_patch", "receivers", 3),
  ("path_patch", "receivers", [("1", 0)]),
  ("path_patch", "senders", 3),
  ("path_patch", "senders", [(0,)]),
  ("path_patch", "receiver_site", ["q"]),
  ("path_patch", "corrupt", None),
  ("path_patch", "direction", None),
  ("generate", "model", None),
  ("generate", "prompt", 3.5),
  ("generate", "max_new_tokens", "2"),
  ("generate", "max_new_tokens", -1),
  ("generate", "temperature", "0"),
  ("generate", "top_k", 0),
  ("generate", "use_cache", "yes"),
  ("generate", "eos_id", 1.5),
  ("plot_attention", "pattern", None),
  ("plot_attention", "pattern", np.ones((2, 3, 4))),
  ("plot_attention", "tokens", ["a"]),
  ("plot_attention", "layer", "0"),
  ("plot_attention", "heads", [5]),
  ("plot_attention", "max_tokens", 0),
  ("attention_view", "pattern", np.full((3, 3), np.nan)),
  ("attention_view", "tokens", ["a", "b"]),
  ("attention_view", "batch", 1.5),
  ("attention_view", "decimals", -1),
  ("circuit", "model", None),
  ("circuit", "clean", 3),
  ("circuit", "methods", "eap"),
  ("circuit", "methods", ["acdc"]),
  ("circuit", "steps", 0),
  ("circuit", "steps", "5"),
  ("circuit", "sizes", [0]),
  ("circuit", "sizes", "5"),
  ("circuit", "random_sets", -1),
  ("circuit", "batch_size", 0),
  ("read_table", "workdir", None),
  ("read_table", "name", ["probes"]),
  ("read_table", "name", None),
  ("read_tables", "runs", None),
  ("read_tables", "runs", 3),
  ("read_tables", "runs", [None]),
  ("read_tables", "runs", {"a": 3}),
  ("read_tables", "name", ["probes"]),
  ("Captured.head_attention", "layer", "0"),
  ("Captured.head_attention", "head", 1.5),
  ("build_atlas", "workdir", None),
  ("build_atlas", "compare", 3),
  ("build_atlas", "compare", [None]),
  ("fit_sae", "features", "8"),
  ("fit_sae", "features", 0),
  ("fit_sae", "k", 2.5),
  ("fit_sae", "steps", None),
  ("fit_sae", "kind", ["topk"]),
  ("fit_sae", "seed", "0"),
  ("sae_head_fractions", "sae", None),
  ("sae_head_fractions", "sae", np.ones((8, 4))),
  ("sae_head_fractions", "heads", "2"),
  ("load_sae", "path", None),
  ("load_sae", "path", 3),
  ("load_sae", "norm_scaling_factor", "2"),
  ("load_sae", "norm_scaling_factor", -1.0),
]


@pytest.mark.parametrize("function,argument,value", WRONG, ids=[f"{f}-{a}-{v!r}" for f, a, v in WRONG])
def test_a_wrong_type_is_one_user_error_naming_the_argument(calls, function, argument, value):
  call, kwargs = calls[function]
  with pytest.raises(UserError) as e:  # a TypeError or AttributeError fails the test
    call(**(kwargs | {argument: value}))
  message = str(e.value)
  assert "\n" not in message and re.search(rf"\b{argument}\b", message), message


@pytest.mark.parametrize("function", ["load", "run", "patch", "read_table"])
def test_a_missing_argument_is_a_user_error(calls, function):
  call, kwargs = calls[function]
  first = next(iter(kwargs))
  with pytest.raises(UserError, match=f"{function}: missing a required argument: '{first}'"):
    call(**{k: v for k, v in kwargs.items() if k != first})


def test_every_public_function_is_checked():
  """Every function headspec exports (from headspec/api/, the atlas, the SAEs, or itself) has rows in WRONG (a new one
  gets its rows), and goes through headspec/arguments.py's one check."""

  public = {name for name in headspec.__all__ if inspect.isfunction(getattr(headspec, name))}
  assert {"load", "run", "probe", "ablate", "patch", "read_table"} <= public
  assert public | {"Captured.head_attention"} <= {f for f, _, _ in WRONG}, public - {f for f, _, _ in WRONG}
  assert all(hasattr(getattr(headspec, name), "__wrapped__") for name in public)  # functools.wraps of the check


def test_wrong_types_are_refused_in_words(calls):
  """The messages say what the argument must be (item 13: `run(m, 42)` once said '(none given)')."""
  run, kwargs = calls["run"]
  with pytest.raises(UserError, match=r"run: sentences=42 must be a text \(str\), a list of texts or a list of word"):
    run(**(kwargs | {"sentences": 42}))
  with pytest.raises(UserError, match=r"sentences\[0\]: a lone surrogate U\+D800 at character 5"):
    run(**(kwargs | {"sentences": [SURROGATE]}))
  patch, kwargs = calls["patch"]
  with pytest.raises(UserError, match=r"patch: by_position='no' must be True or False, not str"):
    patch(**(kwargs | {"by_position": "no"}))
  probe, kwargs = calls["probe"]
  with pytest.raises(UserError, match=r"probe: max_train_words='2000' must be an int >= 0, not str"):
    probe(**(kwargs | {"max_train_words": "2000"}))
  with pytest.raises(UserError, match=r"probe: bootstrap_resamples='100' must be of type int \(it is 200 now\)"):
    probe(**(kwargs | {"bootstrap_resamples": "100"}))
  with pytest.raises(UserError, match=r"probe: give heads=\[\(layer, head\), ...\] and/or layer=L"):
    probe(**(kwargs | {"heads": [], "layer": None}))  # once an empty frame, nothing fitted


def test_no_senders_is_refused(calls):
  path_patch, kwargs = calls["path_patch"]
  with pytest.raises(UserError, match=r"senders=\[\]: no sender heads given"):  # once an IndexError
    path_patch(**(kwargs | {"senders": []}))


def test_answers_may_be_a_numpy_array_like_the_prompts(calls):
  patch, kwargs = calls["patch"]
  as_lists = patch(**(kwargs | {"layers": [0], "heads": [1]}))
  as_arrays = patch(
    **(kwargs | {"clean": np.asarray(CLEAN), "answers": np.asarray(ANSWERS), "layers": [0], "heads": [1]})
  )
  assert len(as_lists) == 4 and as_lists["value"].tolist() == as_arrays["value"].tolist()
  with pytest.raises(UserError, match=r"answers\[0\] = \[7, 11, 1\]: give a \(correct_id, wrong_id\) pair"):
    patch(**(kwargs | {"answers": np.asarray([(7, 11, 1), (3, 4, 1)])}))


@pytest.mark.parametrize(
  "clean,corrupt,message",
  [
    ([[], []], [[], []], "prompt pair 0: clean is empty"),
    ([CLEAN[0], []], [CORRUPT[0], [1, 2, 3, 4]], "prompt pair 1: clean is empty"),
    (CLEAN, [CORRUPT[0], []], "prompt pair 1: corrupt is empty"),
  ],
)
def test_empty_prompts_are_called_empty(calls, clean, corrupt, message):
  patch, kwargs = calls["patch"]
  with pytest.raises(UserError, match=message) as e:
    patch(**(kwargs | {"clean": clean, "corrupt": corrupt}))
  assert "equal" not in str(e.value)


# --------------------------------------------------------------------- CoNLL-U digits (item 13)


@pytest.mark.parametrize("head", ["\u0663", "\uff13", "\u00b3", "+3", "3_0", "0x3"])
def test_head_must_be_ascii_digits(tmp_path, head):
  """int() reads '٣' (Arabic-Indic), '３' (fullwidth), '+3' and '3_0' (= 30); CoNLL-U's HEAD is ASCII digits."""
  from test_treebank import GOOD

  from headspec.data import treebank

  path = tmp_path / "digits.conllu"
  path.write_text(GOOD.replace("1\tThey\tthey\tPRON\tPRP\t_\t4", f"1\tThey\tthey\tPRON\tPRP\t_\t{head}"))
  with pytest.raises(UserError, match=re.escape(f"{path}:3: HEAD {head!r} is not an integer (ASCII digits")):
    treebank.read_conllu(path)


@pytest.mark.parametrize("word_id", ["\u0661", "\uff11", "+1"])
def test_word_ids_must_be_ascii_digits(tmp_path, word_id):
  from test_treebank import GOOD

  from headspec.data import treebank

  path = tmp_path / "ids.conllu"
  path.write_text(GOOD.replace("1\tThey\t", f"{word_id}\tThey\t"))
  with pytest.raises(UserError, match=re.escape(f"{path}:3: ") + ".*" + re.escape(f"'{word_id}' is not a valid ID")):
    treebank.read_conllu(path)


# ------------------------------------------------ splits with nothing to fit, tune or score (item 10)

ONE_WORD = "# sent_id = one\n1\tGo\tgo\tVERB\tVB\t_\t0\troot\t_\t_\n\n"
PUNCT_ONLY = "# sent_id = p\n1\t.\t.\tPUNCT\t.\t_\t0\tpunct\t_\t_\n2\t!\t!\tPUNCT\t.\t_\t1\tpunct\t_\t_\n\n"


@pytest.fixture(scope="module")
def small_treebank(tmp_path_factory):
  from headspec.data.synthetic import write_synthetic

  return write_synthetic(tmp_path_factory.mktemp("small"), num_train=30, num_dev=8, num_test=8, num_text_sentences=20)


def _config(root, tasks):
  from headspec.probing.config import synthetic_probe_config

  c = synthetic_probe_config(str(root))
  c.probe.tasks, c.probe.eval_splits = tasks, ("dev", "test")
  return c


def _with_split(small_treebank, tmp_path, split, text):
  import shutil

  root = tmp_path / "data"
  shutil.copytree(small_treebank, root)
  path = root / "ud" / "synthetic" / f"synthetic-ud-{split}.conllu"
  path.write_text(text)
  return root, path


@pytest.mark.parametrize(
  "task,split,text,message",
  [
    ("arc", "train", ONE_WORD, "nothing to fit on this split: no scorable arc, no word has another word as its head"),
    ("arc", "train", PUNCT_ONLY, r"nothing to fit .* \(punctuation is left out: probe.arc_ignore_punct\)"),
    ("arc", "dev", PUNCT_ONLY, "nothing to tune on this split: no scorable word, every word is punctuation"),
    ("arc", "test", PUNCT_ONLY, "nothing to score on this split: no scorable word, every word is punctuation"),
    ("distance", "train", ONE_WORD, "nothing to fit on this split: no pair of words in one sentence"),
    ("distance", "dev", ONE_WORD, "nothing to tune on this split: no pair of non-punctuation words"),
    ("depth", "test", PUNCT_ONLY, "nothing to score on this split: no non-punctuation word"),
    ("upos", "dev", PUNCT_ONLY.replace("PUNCT", "SYM"), "nothing to tune on this split: no word has a upos label seen"),
  ],
)
def test_a_split_with_nothing_to_fit_or_score_is_one_line_before_fitting(
  small_treebank, tmp_path, task, split, text, message
):
  from headspec.probing import labels

  if task == "upos":  # a dev split whose labels train never has: λ would be picked on no word
    text = text.replace("SYM\t.", "SYM\tSYM")
  root, path = _with_split(small_treebank, tmp_path, split, text)
  with pytest.raises(UserError, match=re.escape(f"{path}: task '{task}' has nothing") + ".*") as e:
    labels.load_data(_config(root, (task,)))
  assert re.search(message, str(e.value)) and "\n" not in str(e.value), e.value


def test_one_word_and_punctuation_splits_that_can_be_scored_still_load(small_treebank, tmp_path):
  from headspec.probing import labels

  root, _ = _with_split(small_treebank, tmp_path, "dev", ONE_WORD)  # its root is a scorable arc; upos scores it
  data = labels.load_data(_config(root, ("upos", "arc", "depth")))
  assert data.tune.num_words == 1
  c = _config(root, ("upos",))
  (root / "ud" / "synthetic" / "synthetic-ud-test.conllu").write_text(PUNCT_ONLY)  # upos scores punctuation
  assert labels.load_data(c).evals[-1].num_words == 2


def test_probe_refuses_such_a_split_before_extracting_features(calls, small_treebank, tmp_path):
  probe, kwargs = calls["probe"]
  root, path = _with_split(small_treebank, tmp_path, "train", ONE_WORD)
  cache = tmp_path / "cache"
  with pytest.raises(UserError, match=re.escape(f"{path}: task 'arc' has nothing to fit")):
    probe(**(kwargs | {"task": "arc", "config": _config(root, ("arc",)), "cache_dir": cache}))
  assert not cache.exists()
