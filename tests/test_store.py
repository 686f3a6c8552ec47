"""The activation store (headspec/api/store.py): a corpus through the model at fixed shapes, one compiled program
per power-of-two bucket (and `headspec.capture` in a loop likewise); the stored activations at the real
tokens equal `capture`'s; padding is in no count or mean (ids padded by hand with a mask are the unpadded
ids); the disk round trip and lazy batches; TransformerLens's tokenize_and_concatenate for a file or an
iterator; bad input as one UserError line."""

import json

import numpy as np
import pytest

import headspec
from headspec.errors import UserError
from headspec.model.capture import bucket_length
from headspec.model.config import ModelConfig
from headspec.model.transformer import random_like
from headspec.parallel.compilations import Compilations

WORDS = "When Mary and John went to the store , John gave a drink to Mary . café naïve two spaces".split()


@pytest.fixture(scope="module")
def gpt2(tmp_path_factory):
  """The cheapest model with a tokenizer in tests/: a random 2-layer GPT-2 of context 64 (buckets 16, 32, 64)."""
  from test_api_tokens import _gpt2_dir

  return headspec.load(_gpt2_dir(tmp_path_factory.mktemp("gpt2")))


@pytest.fixture(scope="module")
def texts(gpt2):
  rng = np.random.default_rng(0)
  out = [" ".join(rng.choice(WORDS, n)) for n in rng.integers(1, 30, 40)]
  lengths = [len(headspec.to_tokens(gpt2, t)[0]) for t in out]
  assert max(lengths) <= 64 and len({bucket_length(n, 64) for n in lengths}) >= 2
  return out


@pytest.fixture(scope="module")
def encoder():
  """A random encoder: its attention looks both ways, so any padding counted would change every token."""
  cfg = ModelConfig(kind="encoder", vocab_size=50, num_layers=2, num_heads=2, d_model=16, d_head=8,
                              d_ff=32, max_len=32)  # fmt: skip
  return random_like(cfg, 0)


def test_one_program_per_bucket(gpt2, texts):
  """40 texts of varied lengths: the store compiles at most once per bucket; `capture` over batches of 5
  (eight batch lengths, fewer buckets) does too, where a program per batch length was compiled before."""
  lengths = [len(headspec.to_tokens(gpt2, t)[0]) for t in texts]
  buckets = {bucket_length(n, 64) for n in lengths}
  with Compilations() as compiled:
    store = headspec.activations(gpt2, texts, sites=["blocks.0.attn.hook_z"], batch_tokens=256, progress=False)
  assert compiled.count <= len(buckets) and store.manifest["buckets"].keys() == {str(T) for T in buckets}
  batches = [texts[i : i + 5] for i in range(0, 40, 5)]
  longest = [max(lengths[i : i + 5]) for i in range(0, 40, 5)]
  assert len(set(longest)) > len({bucket_length(n, 64) for n in longest})  # one program per length: too many
  with Compilations() as compiled:
    for batch in batches:
      headspec.capture(gpt2, batch, sites=["z"])
  assert compiled.count <= len({bucket_length(n, 64) for n in longest}), compiled.counts


def test_values_equal_capture_at_the_real_tokens(gpt2, texts, capfd):
  sites = ["blocks.1.attn.hook_z", "resid_post", "embeddings", "hook_embed", "blocks.0.ln1.hook_scale"]
  store = headspec.activations(gpt2, texts, sites=sites, batch_tokens=128)
  assert "activations" in capfd.readouterr().err  # the tqdm bar, on stderr
  cache = headspec.capture(gpt2, texts, sites=["z", "resid_post", "embeddings", "ln1_scale"])
  valid = np.asarray(cache.valid_BT)
  assert len(store) == store.num_tokens == valid.sum() and store.num_sequences == len(texts)
  s, p = store.sequence_N, store.position_N
  np.testing.assert_array_equal(store.tokens_N, cache.tokens_BT[s, p])
  assert sorted(zip(s, p)) == sorted(zip(*np.nonzero(valid)))  # every real token once, no padding
  near = lambda a, b: np.testing.assert_allclose(a, b, atol=2e-5, rtol=1e-5)
  near(store["blocks.1.attn.hook_z"], cache["z", 1][s, p])
  near(store["resid_post"], np.moveaxis(cache["resid_post"], 0, 2)[s, p])  # [N, L, D]
  near(store["embeddings"], cache["embeddings"][s, p])
  near(store["hook_embed"], cache["hook_embed"][s, p])  # TransformerLens's: the token embedding alone
  near(store["blocks.0.ln1.hook_scale"], cache["ln1_scale", 0][s, p])
  assert store.shape("blocks.1.attn.hook_z") == (4, 8) and store.shape("resid_post") == (2, 32)
  near(store.mean("resid_post"), np.moveaxis(cache["resid_post"], 0, 2)[valid].mean(0))  # padding in no mean


def test_padding_is_never_counted(encoder):
  """Ids padded by hand with the pad id and given with their mask are the unpadded ids: the same tokens,
  count and mean; without the mask the padding would be tokens (and change the encoder's every vector)."""
  rows = [[3, 7, 1, 9, 4], [2, 8], [5, 5, 6]]
  padded = np.zeros((3, 9), np.int32)
  mask = np.zeros((3, 9), bool)
  for b, row in enumerate(rows):
    padded[b, : len(row)], mask[b, : len(row)] = row, True
  plain = headspec.activations(encoder, rows, sites=["resid_post", "z"], progress=False)
  masked = headspec.activations(encoder, padded, mask=mask, sites=["resid_post", "z"], progress=False)
  unmasked = headspec.activations(encoder, padded, sites=["resid_post"], progress=False)
  assert plain.num_tokens == masked.num_tokens == 10 and unmasked.num_tokens == 27
  np.testing.assert_array_equal(masked.tokens_N, plain.tokens_N)
  for site in ("resid_post", "z"):
    np.testing.assert_allclose(masked.mean(site), plain.mean(site), atol=1e-6)
  assert np.abs(unmasked.mean("resid_post") - plain.mean("resid_post")).max() > 1e-3
  cache = headspec.capture(encoder, [rows[0]], sites=["resid_post"])  # one row, nothing padded by hand
  np.testing.assert_allclose(plain["resid_post"][plain.sequence_N == 0], np.moveaxis(cache["resid_post"][:, 0], 0, 1),
                             atol=1e-5)  # fmt: skip


def test_disk_round_trip_and_lazy_batches(gpt2, texts, tmp_path):
  sites = ["blocks.0.attn.hook_z", "resid_post"]
  memory = headspec.activations(gpt2, texts[:12], sites=sites, progress=False)
  folder = tmp_path / "acts"
  saved = headspec.activations(gpt2, texts[:12], sites=sites, to=folder, progress=False)
  manifest = json.loads((folder / "manifest.json").read_text())
  assert manifest["num_tokens"] == memory.num_tokens == sum(manifest["shards"])
  assert sorted(p.name for p in (folder / "blocks.0.z").iterdir())[0] == "000000.npy"
  again = headspec.ActivationStore.open(folder)
  assert again.sites == tuple(sites) and again.path is not None and "tokens of 12 sequences" in repr(again)
  for name in (*sites, "tokens", "sequence", "position"):
    np.testing.assert_array_equal(again[name], memory[name])
    np.testing.assert_array_equal(saved[name], memory[name])
  np.testing.assert_allclose(again.mean("resid_post"), memory.mean("resid_post"), rtol=1e-6)
  parts = list(again.batches("blocks.0.attn.hook_z", batch_tokens=7))
  assert {len(x) for x in parts[:-1]} == {7} and 1 <= len(parts[-1]) <= 7
  np.testing.assert_array_equal(np.concatenate(parts), memory["blocks.0.attn.hook_z"])
  both = next(again.batches(["resid_post", "tokens"], batch_tokens=5))
  assert both["resid_post"].shape == (5, 2, 32) and both["tokens"].shape == (5,)
  np.testing.assert_array_equal(again["blocks.0.z"], again["blocks.0.attn.hook_z"])  # any name of the same site
  sae = headspec.fit_sae(again["blocks.0.attn.hook_z"].reshape(len(again), -1), features=8, k=2, steps=2,
                         progress=False)  # fmt: skip
  assert sae is not None


def test_a_file_or_an_iterator_is_concatenated_and_cut(gpt2, tmp_path):
  """TransformerLens's tokenize_and_concatenate: each document's ids and EOS, cut into rows of `context`
  tokens (the last shorter, kept); a file's documents are separated by blank lines."""
  documents = ["When Mary and John went to the store,\nJohn gave a drink.", "café naïve", "two  spaces!?"] * 3
  path = tmp_path / "corpus.txt"
  path.write_text("\n\n".join(documents) + "\n")
  tok = gpt2.tokenizer
  stream = [i for d in documents for i in [*tok.encode(d), tok.eos_id]]
  from_file = headspec.activations(gpt2, path, sites=["resid_post"], context=16, progress=False)
  order = np.lexsort((from_file.position_N, from_file.sequence_N))
  np.testing.assert_array_equal(from_file.tokens_N[order], stream)
  assert from_file.position_N.max() == 15 and from_file.num_sequences == -(-len(stream) // 16)
  from_iterator = headspec.activations(gpt2, iter(documents), sites=["resid_post"], context=16, progress=False)
  np.testing.assert_allclose(from_iterator["resid_post"], from_file["resid_post"], atol=1e-6)
  words = [["John", "gave", "a", "drink"], ["Mary", "."]]  # word lists (a treebank's): pieces word by word
  by_words = headspec.activations(gpt2, words, sites=["z"], progress=False)
  pieces = [i for w in words for p in tok.word_pieces(w) for i in p]
  np.testing.assert_array_equal(by_words.tokens_N[np.lexsort((by_words.position_N, by_words.sequence_N))], pieces)


@pytest.mark.parametrize(
  "kwargs,message",
  [
    (dict(inputs=[]), r"activations: inputs=\[\] is empty"),
    (dict(sites=["hook_zz"]), "activations: unknown site 'hook_zz'"),
    (dict(sites=["pattern"]), "sites='pattern' is an attention map"),
    (dict(sites=["blocks.2.attn.hook_z"]), "layer 2 is out of range 0..1"),
    (dict(to="FILE/inside"), "activations: to=.*: cannot write there"),
    (dict(to="FILE"), "activations: to=.* is a file"),
    (dict(to="FULL"), "activations: to=.* is not empty"),
    (dict(mask=[[True]]), "mask= goes with token ids"),
    (dict(inputs=["Mary " * 80]), r"inputs\[0\]: \d+ tokens exceed the model's context of 64; give context=64"),
    (dict(inputs="MISSING"), "activations: inputs=.*missing.txt: no such file"),
    (dict(context=65), "context=65 must be in 1..64"),
    (dict(sites=None), "activations: sites=None must be"),
    (dict(sites=["blocks.0.hook_embed"]), "'embed' has no layer axis"),
    (dict(inputs=[[1, 2, 3]], context=8), "context= cuts text into rows"),
    (dict(inputs=[[1, 2, 3]], mask=[[True, False]]), r"mask\[0\] must be 3 bools"),
  ],
)
def test_bad_input_is_one_line(gpt2, tmp_path, kwargs, message):
  (tmp_path / "file.txt").write_text("x")
  (tmp_path / "full").mkdir()
  (tmp_path / "full" / "x").write_text("x")
  where = {"FILE": tmp_path / "file.txt", "FILE/inside": tmp_path / "file.txt" / "inside", "FULL": tmp_path / "full"}
  if "to" in kwargs:
    kwargs["to"] = where[kwargs["to"]]
  if kwargs.get("inputs") == "MISSING":
    kwargs["inputs"] = tmp_path / "missing.txt"
  kwargs = dict(inputs=["John gave a drink"], sites=["z"], progress=False) | kwargs
  with pytest.raises(UserError, match=message) as e:
    headspec.activations(gpt2, **kwargs)
  assert "\n" not in str(e.value)
  assert not (tmp_path / "full" / "z").exists()
