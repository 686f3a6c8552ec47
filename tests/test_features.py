"""Word features equal a direct model call at the right positions, with windows, pooling and the cache."""

import dataclasses
import json

import jax
import numpy as np
import pytest

from headspec.data.tokenizer import train_sentencepiece
from headspec.data.treebank import load_split
from headspec.errors import UserError
from headspec.model.capture import bucket_length
from headspec.model.config import ModelConfig
from headspec.model.transformer import random_like
from headspec.probing import features as features_lib
from headspec.words.alignment import align, resolve_pooling


@dataclasses.dataclass
class WithSpecials:
  """A BERT-like view of a tokenizer: [CLS]-like prefix and [SEP]-like suffix ids."""

  inner: object
  prefix_ids: tuple = (3,)
  suffix_ids: tuple = (2,)

  def __getattr__(self, name):
    return getattr(self.inner, name)

  def word_pieces(self, words):
    return self.inner.word_pieces(words)


@pytest.fixture(scope="module")
def setup(data_dir, tmp_path_factory):
  dev = load_split(data_dir, "en_ewt", "dev")
  tokenizer = train_sentencepiece(
    [" ".join(s.words) for s in dev[:400]], tmp_path_factory.mktemp("spm"), vocab_size=700
  )
  # a few short sentences and the two longest of dev (split into windows at max_len=32)
  sentences = [s.words for s in dev[:6]] + [s.words for s in sorted(dev, key=lambda s: -len(s.words))[:2]]
  return tokenizer, sentences


def _model(kind, vocab_size):
  cfg = ModelConfig(
    kind=kind,
    vocab_size=vocab_size,
    num_layers=2,
    num_heads=3,
    d_model=24,
    d_head=5,
    d_ff=32,
    max_len=32,
    pre_layernorm=kind == "decoder",
  )
  return random_like(cfg, 0)


@pytest.mark.parametrize(
  "kind,pooling,specials", [("encoder", "mean", True), ("decoder", "last", False), ("encoder", "first", False)]
)
def test_features_equal_direct_model_call(setup, tmp_path, kind, pooling, specials):
  tokenizer, sentences = setup
  tok = WithSpecials(tokenizer) if specials else tokenizer
  model = _model(kind, tokenizer.vocab_size)
  feats = features_lib.extract_features(
    model,
    tok,
    sentences,
    cache_dir=tmp_path,
    identity={"test": kind},
    pooling=pooling,
    dtype="float32",
    batch_tokens=64,
    log=None,
  )
  assert feats.num_split_sentences >= 2 and not feats.from_cache
  al = align(sentences, tok, 32, causal=kind == "decoder")
  assert feats.num_words == al.num_words == sum(len(s) for s in sentences)
  np.testing.assert_array_equal(feats.word_sentence_N, al.word_sentence_N)
  z = [feats.z(l) for l in range(2)]
  residual = [feats.residual(l) for l in range(2)]
  embeddings = feats.residual(-1)  # layer -1: the embeddings
  # The reference: every window alone in a row of length max_len (one compile), its padding masked.
  tokens_BT = np.zeros((len(al.windows), 32), np.int32)
  for w, ids in enumerate(al.windows):
    tokens_BT[w, : len(ids)] = ids
  direct = jax.jit(lambda t, v: model(t, valid_BT=v, capture=("z", "resid_post", "embeddings"))[1])
  ref = jax.tree.map(
    np.asarray, direct(tokens_BT, np.arange(32)[None] < np.array([len(w) for w in al.windows])[:, None])
  )
  for n in range(al.num_words):
    w = int(al.word_window_N[n])
    inter = dataclasses.replace(
      ref,
      z_LBTHK=ref.z_LBTHK[:, w : w + 1],
      resid_post_LBTD=ref.resid_post_LBTD[:, w : w + 1],
      embeddings_BTD=ref.embeddings_BTD[w : w + 1],
    )
    s, e = al.word_start_N[n], al.word_end_N[n]
    pos = {"first": slice(s, s + 1), "last": slice(e - 1, e), "mean": slice(s, e)}[pooling]
    for l in range(2):
      np.testing.assert_allclose(z[l][n], np.asarray(inter.z_LBTHK[l, 0, pos]).mean(0), atol=2e-5, rtol=1e-4)
      np.testing.assert_allclose(
        residual[l][n], np.asarray(inter.resid_post_LBTD[l, 0, pos]).mean(0), atol=2e-4, rtol=1e-4
      )
    np.testing.assert_allclose(embeddings[n], np.asarray(inter.embeddings_BTD[0, pos]).mean(0), atol=1e-5)
  assert z[0].shape == (al.num_words, 3, 5) and residual[1].shape == (al.num_words, 24)


def test_features_do_not_depend_on_the_devices(setup, tmp_path):
  """Batches dealt over every local device (8 CPU devices in the tests) give the same bytes as one device."""
  tokenizer, sentences = setup
  assert len(jax.local_devices()) > 1
  model = _model("encoder", tokenizer.vocab_size)
  kw = dict(identity={"test": "devices"}, dtype="float32", batch_tokens=64, log=None)
  many = features_lib.extract_features(model, tokenizer, sentences, cache_dir=tmp_path / "many", **kw)
  one = features_lib.extract_features(
    model, tokenizer, sentences, cache_dir=tmp_path / "one", devices=jax.local_devices()[:1], **kw
  )
  for l in range(2):
    np.testing.assert_array_equal(many.z(l), one.z(l))
    np.testing.assert_array_equal(many.residual(l), one.residual(l))
  np.testing.assert_array_equal(many.residual(-1), one.residual(-1))
  assert json.loads((many.path / "meta.json").read_text())["devices"] == len(jax.local_devices())


def test_cache_is_reused_and_keyed(setup, tmp_path, monkeypatch):
  tokenizer, sentences = setup
  model = _model("encoder", tokenizer.vocab_size)
  kw = dict(cache_dir=tmp_path, identity={"run": "x", "step": 1}, name="en_ewt-dev", log=None)
  first = features_lib.extract_features(model, tokenizer, sentences, **kw)
  assert first.path.parent == tmp_path and first.path.name.startswith("en_ewt-dev-")
  z16 = np.load(first.path / "z_0.npy", mmap_mode="r")
  assert z16.dtype == np.float16  # the default on-disk dtype
  # A second call must not run the model: make any forward fail.
  monkeypatch.setattr(features_lib.words_lib, "pooled_forward", lambda *_: pytest.fail("recomputed"))
  second = features_lib.extract_features(model, tokenizer, sentences, **kw)
  assert second.from_cache and second.path == first.path
  np.testing.assert_array_equal(second.z(1), first.z(1))
  monkeypatch.undo()
  # another step, pooling or text is another cache entry
  others = [
    features_lib.extract_features(model, tokenizer, sentences, **dict(kw, identity={"run": "x", "step": 2})),
    features_lib.extract_features(model, tokenizer, sentences, **kw, pooling="mean"),
    features_lib.extract_features(model, tokenizer, sentences[:-1], **kw),
  ]
  assert len({first.path} | {o.path for o in others}) == 4 and not any(o.from_cache for o in others)
  assert not list(tmp_path.glob("*.tmp-*"))  # temporary folders are renamed or removed


def test_interventions_reach_the_features_and_their_cache_key(setup, tmp_path):
  """Features of a model with a head of layer 0 removed (an Edit of z, through the shared word forward): layer 0's
  z is read before the edit (unchanged), its residual stream and layer 1 change, and the edit keys the cache
  (an equal edit reads it back, another mask is another entry, no edit keeps the unedited key)."""
  from headspec.model.edits import head_mask

  tokenizer, sentences = setup
  model = _model("decoder", tokenizer.vocab_size)
  kw = dict(cache_dir=tmp_path, identity={"run": "x", "step": 1}, name="dev", log=None)
  plain = features_lib.extract_features(model, tokenizer, sentences, **kw)
  mask = np.ones((2, 3), np.float32)
  mask[0, 1] = 0.0
  edited = features_lib.extract_features(model, tokenizer, sentences, **kw, interventions={"z": head_mask(mask)})
  np.testing.assert_array_equal(edited.z(0), plain.z(0))
  assert np.abs(edited.residual(0) - plain.residual(0)).max() > 1e-3
  assert np.abs(edited.z(1) - plain.z(1)).max() > 1e-3
  again = features_lib.extract_features(model, tokenizer, sentences, **kw, interventions={"z": head_mask(mask.copy())})
  assert again.from_cache and again.path == edited.path != plain.path
  mask[0, 2] = 0.0
  other = features_lib.extract_features(model, tokenizer, sentences, **kw, interventions={"z": head_mask(mask)})
  assert not other.from_cache and other.path not in (edited.path, plain.path)
  assert features_lib.extract_features(model, tokenizer, sentences, **kw, interventions={}).path == plain.path


def test_bucket_lengths():
  assert [bucket_length(n, 128) for n in (1, 16, 17, 33, 100, 128)] == [16, 16, 32, 64, 128, 128]
  assert bucket_length(90, 100) == 100


def test_bad_inputs(setup, tmp_path):
  tokenizer, sentences = setup
  model = _model("encoder", tokenizer.vocab_size)
  with pytest.raises(UserError, match="cache_dtype"):
    features_lib.extract_features(model, tokenizer, sentences, cache_dir=tmp_path, identity={}, dtype="int8")
  with pytest.raises(UserError, match="pooling"):
    features_lib.extract_features(model, tokenizer, sentences, cache_dir=tmp_path, identity={}, pooling="max")
  with pytest.raises(UserError, match="no sentences"):
    features_lib.extract_features(model, tokenizer, [], cache_dir=tmp_path, identity={})
  assert not list(tmp_path.iterdir())


def test_auto_pooling_is_last_for_decoders_first_for_encoders():
  from headspec.probing import features as features_lib
  from headspec.probing.config import probe_config

  assert probe_config().probe.pooling == "auto"  # the suite's default: a decoder's word vector sees the whole word
  assert resolve_pooling("auto", "decoder") == "last"
  assert resolve_pooling("auto", "encoder") == "first"
  assert resolve_pooling("mean", "decoder") == "mean"
  features_lib.check_options("auto", "float16")
