"""Loading by Hub name (`hf:org/name[@revision]`, `headspec.load("org/name")`) from a local Hugging Face
cache, offline: the cache is built here in huggingface_hub's layout (refs/<revision> -> snapshots/<commit>)
around a tiny Llama saved in shards with their index; no network is used."""

import json
import os
import pathlib

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from headspec import pretrained  # noqa: E402
from headspec.errors import UserError  # noqa: E402
from headspec.runs import targets  # noqa: E402

huggingface_hub = pytest.importorskip("huggingface_hub")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

REPO = "tiny-org/tiny-llama"
COMMITS = {"main": "a" * 40, "step100": "b" * 40, "step300": "c" * 40}


def _save_snapshot(path: pathlib.Path, seed: int) -> None:
  bpe = tokenizers.ByteLevelBPETokenizer()
  bpe.train_from_iterator(["the cat sat on the mat"] * 3, vocab_size=120, special_tokens=["<pad>", "<s>", "</s>"])
  bpe.post_processor = tokenizers.processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
  path.mkdir(parents=True)
  bpe.save(str(path / "tokenizer.json"))
  (path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>"}))
  config = transformers.LlamaConfig(
    vocab_size=bpe.get_vocab_size(),
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    bos_token_id=1,
    eos_token_id=2,
  )
  torch.manual_seed(seed)
  transformers.LlamaForCausalLM(config).save_pretrained(path, max_shard_size="20KB")


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
  cache = tmp_path_factory.mktemp("hub")
  repo = cache / ("models--" + REPO.replace("/", "--"))
  for seed, (revision, commit) in enumerate(COMMITS.items()):
    _save_snapshot(repo / "snapshots" / commit, seed)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / revision).write_text(commit)
  return cache


@pytest.fixture(scope="module")
def bin_only(hub_cache):
  """A repository whose revision has PyTorch weights only (which the import never downloads)."""
  snapshot = hub_cache / "models--tiny-org--bin-only" / "snapshots" / ("d" * 40)
  snapshot.mkdir(parents=True)
  (snapshot / "config.json").write_text(json.dumps({"model_type": "llama"}))
  (hub_cache / "models--tiny-org--bin-only" / "refs").mkdir()
  (hub_cache / "models--tiny-org--bin-only" / "refs" / "main").write_text("d" * 40)
  return "hf:tiny-org/bin-only"


@pytest.fixture
def offline(hub_cache, monkeypatch):
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(hub_cache))
  monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
  return hub_cache


def test_load_by_name_and_revision_from_the_cache(offline):
  snapshot = offline / f"models--tiny-org--tiny-llama/snapshots/{COMMITS['main']}"
  assert len(list(snapshot.glob("model-*.safetensors"))) > 1  # sharded, with model.safetensors.index.json
  model, tokenizer = pretrained.load_pretrained(f"hf:{REPO}")
  assert model.cfg.num_kv_heads == 2 and tokenizer.prefix_ids == (1,)
  later, _ = pretrained.load_pretrained(f"hf:{REPO}@step100")
  w = lambda m: np.asarray(m.blocks[0].attention.w_q_DHK[...])
  assert np.abs(w(model) - w(later)).max() > 1e-3  # another revision, other weights
  reference = transformers.LlamaForCausalLM.from_pretrained(snapshot)
  np.testing.assert_allclose(
    w(model), reference.model.layers[0].self_attn.q_proj.weight.detach().numpy().T.reshape(32, 4, 8), atol=0
  )
  target = targets.pretrained_target(f"hf:{REPO}@step100")
  assert target.name == "tiny-llama" and target.kind == "decoder" and target.identity["pretrained"].endswith("@step100")
  assert target.identity["snapshot"].endswith(COMMITS["step100"])


@pytest.mark.parametrize(
  "spec, message",
  [
    (f"hf:{REPO}@step999", r"hf:tiny-org/tiny-llama@step999: not in the local Hugging Face cache .* HF_HUB_OFFLINE=1"),
    ("hf:other/model", "hf:other/model: not in the local Hugging Face cache"),
    ("hf:bad name!", "not a Hugging Face model name"),
    (f"hf:{REPO}@", "not a Hugging Face model name"),
    ("hf:tiny-org/bin-only", "hf:tiny-org/bin-only: no safetensors weights at this revision"),
  ],
)
def test_missing_or_malformed_names_are_one_line(offline, bin_only, spec, message):
  with pytest.raises(UserError, match=message) as error:
    targets.pretrained_target(spec)
  assert "\n" not in str(error.value)


def test_headspec_load_by_name(offline):
  import headspec

  loaded = headspec.load(REPO, revision="step100")
  assert loaded.target.name == "tiny-llama" and loaded.target.identity["snapshot"].endswith(COMMITS["step100"])
  assert headspec.load(f"hf:{REPO}").target.identity["snapshot"].endswith(COMMITS["main"])
  with pytest.raises(UserError, match="gpt2: not in the local Hugging Face cache"):
    headspec.load("gpt2")
  with pytest.raises(UserError, match="no such directory"):
    headspec.load("/nonexistent/model")


def test_published_revisions_are_the_steps_of_one_target(offline):
  import ml_collections

  config = ml_collections.ConfigDict({"seed": 0, "model": {"pretrained": f"hf:{REPO}@step300,step100"}})
  planned = targets.plan(config, None, steps="all", random_baseline=True)
  assert [(t.name, t.step) for t in planned] == [("tiny-llama", 100), ("tiny-llama", 300), ("tiny-llama-random", 0)]
  assert planned[1].identity["snapshot"].endswith(COMMITS["step300"])
  assert [t.step for t in targets.plan(config, None, steps="last")] == [300]
  assert [t.step for t in targets.plan(config, None, steps=(100,))] == [100]
  w = lambda t: np.asarray(t.load()[0].blocks[0].attention.w_q_DHK[...])
  assert np.abs(w(planned[0]) - w(planned[1])).max() > 1e-3
  with pytest.raises(UserError, match=r"step\(s\) \[200\] not among the revisions .*\(steps: \[100, 300\]\)"):
    targets.plan(config, None, steps="200")
  config.model.pretrained = f"hf:{REPO}@step100,main"
  with pytest.raises(UserError, match="revision 'main' names no training step"):
    targets.plan(config, None, steps="all")
  config.model.pretrained = f"hf:{REPO}@step100,step999"
  with pytest.raises(UserError, match="step999: not in the local Hugging Face cache"):
    targets.plan(config, None, steps="all")


def test_diversity_reads_revisions_as_steps(offline, synthetic_data_dir, tmp_path):
  """An analysis end to end over published revisions: the table's step column is the revisions' steps."""
  from headspec.configs import diversity as diversity_config
  from headspec.diversity.run import read_results
  from headspec.diversity.run import run as run_diversity

  config = diversity_config.get_config(None)
  config.num_tokens, config.batch_size = 100, 4
  config.data_dir, config.corpus, config.seq_len = str(synthetic_data_dir), "synthetic", 32
  config.model.pretrained = f"hf:{REPO}@step100,step300"
  table = read_results(run_diversity(config, tmp_path))
  assert {row[0] for row in table} == {100, 300}
