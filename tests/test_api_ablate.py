"""Ablation on your own text: `headspec.ablate(model, heads, texts=...)` needs no data directory
and takes a (model, tokenizer) pair; its loss change is the model's own next-token loss with and without the
heads. Without texts a pretrained LM's default evaluation text is the first corpus the data directory holds
(it failed offline unless corpus='english_mix'), read without writing a TFDS copy into the data directory,
and its rows are the command's."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import headspec  # noqa: E402
from headspec.errors import UserError  # noqa: E402
from headspec.model.edits import head_mask  # noqa: E402

pytest.importorskip("transformers")
TEXTS = ["When Mary and John went to the store, John gave a drink to Mary.", "café naïve — 東京  two  spaces!?"]


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
  from test_api_tokens import _gpt2_dir

  return _gpt2_dir(tmp_path_factory.mktemp("gpt2"))


def _loss(net, tokens_BT, valid_BT, mask_LH):
  """Mean next-token cross-entropy over the valid pairs, from the model's forward."""
  edit = {"z": head_mask(jnp.asarray(mask_LH))}
  logits, _ = net(jnp.asarray(tokens_BT), valid_BT=jnp.asarray(valid_BT), interventions=edit)
  logp = jax.nn.log_softmax(np.asarray(logits, np.float64)[:, :-1], -1)
  target = tokens_BT[:, 1:]
  nll = -np.take_along_axis(logp, target[..., None], -1)[..., 0]
  pairs = valid_BT[:, 1:] & valid_BT[:, :-1]
  return float(nll[pairs].sum() / pairs.sum())


def test_ablate_your_own_texts_without_a_data_directory(gpt2_dir, monkeypatch):
  monkeypatch.delenv("HEADSPEC_DATA_DIR", raising=False)
  loaded = headspec.load(gpt2_dir)
  heads = [(0, 1), (1, 2)]
  result = headspec.ablate(loaded, heads, texts=TEXTS, bootstrap_resamples=50)
  tokens_BT = headspec.to_tokens(loaded, TEXTS)
  valid_BT = np.zeros(tokens_BT.shape, bool)
  for b, text in enumerate(TEXTS):
    valid_BT[b, : len(headspec.to_tokens(loaded, text)[0])] = True
  mask = np.ones((2, 4), np.float32)
  mask[0, 1] = mask[1, 2] = 0
  assert result.metric == "loss_delta" and result.evaluation.startswith("your 2 text(s): ")
  assert result.before["loss"] == pytest.approx(_loss(loaded.model, tokens_BT, valid_BT, np.ones((2, 4))), abs=1e-4)
  assert result.after["loss"] == pytest.approx(_loss(loaded.model, tokens_BT, valid_BT, mask), abs=1e-4)
  assert result.value == pytest.approx(result.after["loss"] - result.before["loss"], abs=1e-9) and result.value != 0
  pair = headspec.ablate(tuple(loaded), heads, TEXTS, bootstrap_resamples=50)  # a (model, tokenizer) pair
  assert pair.value == pytest.approx(result.value, abs=1e-6)
  one = headspec.ablate(loaded, [(0, 1)], texts=TEXTS[0], method="mean")  # one text; mean over its tokens
  assert one.method == "mean" and one.evaluation.startswith("your 1 text(s)")


@pytest.mark.slow
def test_minilm_on_your_texts_is_an_embedding_shift(monkeypatch):
  monkeypatch.delenv("HEADSPEC_DATA_DIR", raising=False)
  result = headspec.ablate(headspec.load("minilm"), [(2, 9)], texts=TEXTS, bootstrap_resamples=50)
  assert result.metric == "embedding_shift" and result.value > 0 and "2 text(s)" in result.evaluation


def _corpus(data_dir, name):
  folder = data_dir / "text" / name
  folder.mkdir(parents=True)
  docs = [" ".join(TEXTS) + f" line {i}.\nA second line {i}." for i in range(40)]
  (folder / "train.txt").write_text("\n\n".join(docs[:20]) + "\n")
  (folder / "valid.txt").write_text("\n\n".join(docs[20:]) + "\n")


def test_a_pretrained_lm_reads_the_corpus_there_is_and_writes_nothing(gpt2_dir, tmp_path, monkeypatch):
  from headspec.ablation.config import ablate_config
  from headspec.ablation.run import evaluation_set

  data_dir = tmp_path / "data"
  _corpus(data_dir, "english_mix")  # no wikitext_103: the command's default is not there
  monkeypatch.setenv("HEADSPEC_DATA_DIR", str(data_dir))
  before = sorted(p.relative_to(data_dir) for p in data_dir.rglob("*"))
  loaded = headspec.load(gpt2_dir)
  result = headspec.ablate(loaded, [(0, 0)], num_tokens=200, seq_len=32, bootstrap_resamples=50)
  assert result.evaluation.startswith("english_mix valid split: ")
  assert sorted(p.relative_to(data_dir) for p in data_dir.rglob("*")) == before  # no TFDS copy written
  # The rows are the command's (evaltext.evaluation_tokens through TFDS, on a copy of the folder).
  copy = tmp_path / "copy"
  _corpus(copy, "english_mix")
  c = ablate_config()
  c.update(data_dir=str(copy), corpus="english_mix", num_tokens=200, seq_len=32)
  c.model.pretrained = loaded.target.identity["pretrained"]
  command = evaluation_set(c, "", loaded.target, loaded.tokenizer, loaded.cfg)
  ours = next(es for key, (es, _) in loaded._cache.items() if key[0] == "evalset")
  for a, b in zip(ours.batches, command.batches, strict=True):
    np.testing.assert_array_equal(a.inputs_BT, b.inputs_BT)
    np.testing.assert_array_equal(a.weights_BT, b.weights_BT)
  with pytest.raises(UserError, match=r"text/wikitext_103/valid.txt: no such file; give your own text"):
    headspec.ablate(loaded, [(0, 0)], corpus="wikitext_103")


@pytest.mark.parametrize(
  "kwargs,message",
  [
    (dict(texts=[]), r"ablate: texts=\[\] is empty"),
    (dict(texts=["hi " * 80]), r"ablate: texts\[0\]: \d+ tokens exceed the model's context of 64"),
    (dict(texts=["ok", ""]), r"ablate: texts\[1\]='' has no tokens"),
    (dict(texts=["a"]), "give no token to score"),
    (dict(texts=3), "ablate: texts=3 must be a list of texts"),
  ],
)
def test_bad_texts_are_one_line(gpt2_dir, kwargs, message):
  with pytest.raises(UserError, match=message) as e:
    headspec.ablate(headspec.load(gpt2_dir), [(0, 0)], **kwargs)
  assert "\n" not in str(e.value)


def test_a_pair_without_texts_is_told_to_give_them(gpt2_dir, monkeypatch):
  monkeypatch.delenv("HEADSPEC_DATA_DIR", raising=False)
  loaded = headspec.load(gpt2_dir)
  with pytest.raises(UserError, match="give your own text as texts="):
    headspec.ablate(tuple(loaded), [(0, 0)])
  with pytest.raises(UserError, match=r"no data directory \(the evaluation text of a pretrained LM; or give"):
    headspec.ablate(loaded, [(0, 0)])
