"""The notebook API's smaller promises: patching takes text answers (" Mary", read as `headspec circuit`'s
pairs file reads them) and one prompt as well as a list; `headspec.load` of a run prints no library warnings;
`cache["hook_embed"]` is the token embedding alone (positions under `hook_pos_embed`), as in TransformerLens;
an unknown site's hint names valid sites."""

import subprocess
import sys

import numpy as np
import pytest

import headspec
from headspec.errors import UserError
from headspec.model.config import ModelConfig
from headspec.model.layers import sinusoidal_positions
from headspec.model.transformer import random_like
from headspec.patching import circuit as circuit_lib

CLEAN = "When Mary and John went to the store, John gave a drink to"
CORRUPT = "When Mary and John went to the store, Mary gave a drink to"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
  """A headspec SentencePiece tokenizer (' Mary', ' John' single tokens) and a random decoder of its vocabulary."""
  from headspec.data.tokenizer import train_sentencepiece

  lines = [CLEAN + " Mary.", CORRUPT + " John.", "the dog saw a cat. the cat saw the dog!"] * 40
  tok = train_sentencepiece(lines, tmp_path_factory.mktemp("spm"), vocab_size=300)
  cfg = ModelConfig(kind="decoder", vocab_size=tok.vocab_size, num_layers=1, num_heads=2, d_model=16,
                              d_head=8, d_ff=32, max_len=64)  # fmt: skip
  return random_like(cfg, 0), tok


def _reference_ids(tok, answer, wrong):
  """The (answer, wrong) ids `headspec circuit` reads from a pairs file row with these texts."""
  row = dict(clean=CLEAN, corrupt=CORRUPT, answer=answer, wrong=wrong, line=1)
  (_, _, (ids,)) = circuit_lib.pair_ids([row], tok, "pairs.jsonl", 300)
  return ids


def test_text_answers_are_the_pairs_files_token_ids(pair):
  model, tok = pair
  ids = _reference_ids(tok, " Mary", " John")
  assert ids[0] != ids[1]
  grid = dict(site="resid_pre", layers=[0], positions=[0])
  by_ids = headspec.patch(pair, [CLEAN], [CORRUPT], answers=[ids], **grid)
  by_text = headspec.patch(pair, [CLEAN], [CORRUPT], answers=[(" Mary", " John")], **grid)
  assert by_text.attrs == by_ids.attrs and by_text["value"].tolist() == by_ids["value"].tolist()
  mixed = headspec.patch(pair, [CLEAN], [CORRUPT], answers=[(" Mary", int(ids[1]))], **grid)
  assert mixed.attrs == by_ids.attrs
  attribution = headspec.attribution_patch(pair, [CLEAN], [CORRUPT], site="resid_pre", answers=[(" Mary", " John")])
  assert attribution.attrs == headspec.attribution_patch(pair, [CLEAN], [CORRUPT], site="resid_pre",
                                                         answers=[ids]).attrs  # fmt: skip
  clean_ids = list(tok.prefix_ids) + tok.encode(CLEAN)  # token-id prompts: the text's own one token
  corrupt_ids = list(tok.prefix_ids) + tok.encode(CORRUPT)
  by_own = headspec.patch(pair, [clean_ids], [corrupt_ids], answers=[(" Mary", " John")], **grid)
  assert by_own.attrs == by_ids.attrs


def test_a_text_answer_of_more_than_one_token_is_one_line(pair):
  model, tok = pair
  for answers, message in [
    ([(" Mary and", " John")], r"answers\[0\]\[0\]=' Mary and' is [2-9] tokens after its clean prompt, not one"),
    ([(" John", "")], r"answers\[0\]\[1\]='' is 0 tokens after its clean prompt, not one"),
  ]:
    with pytest.raises(UserError, match=message) as e:
      headspec.patch(pair, [CLEAN], [CORRUPT], site="z", answers=answers)
    assert "\n" not in str(e.value)
  with pytest.raises(UserError, match=r"answers\[0\]\[0\]=' Mary' is a text but no tokenizer was given"):
    headspec.patch(model, [[1, 2, 3]], [[1, 2, 4]], site="z", answers=[(" Mary", 3)])


def test_patch_takes_one_prompt(pair):
  model, tok = pair
  grid = dict(site="z", layers=[0], heads=[1])
  listed = headspec.patch(pair, [CLEAN], [CORRUPT], answers=[(" Mary", " John")], **grid)
  one = headspec.patch(pair, CLEAN, CORRUPT, answers=(" Mary", " John"), **grid)  # a bare pair for one prompt
  assert one.attrs == listed.attrs and one["value"].tolist() == listed["value"].tolist()
  ids = [list(tok.prefix_ids) + tok.encode(t) for t in (CLEAN, CORRUPT)]
  answers = _reference_ids(tok, " Mary", " John")
  one_ids = headspec.patch(model, ids[0], np.asarray(ids[1]), answers=answers, **grid)  # a bare Transformer
  assert one_ids.attrs == listed.attrs and one_ids["value"].tolist() == listed["value"].tolist()
  with pytest.raises(UserError, match="clean has 1 prompts and corrupt 2"):
    headspec.patch(pair, CLEAN, [CORRUPT, CORRUPT], answers=[(" Mary", " John")] * 2, site="z")


def test_load_of_a_run_prints_no_library_warnings(train_tiny_decoder, capfd):
  """In a fresh process, as a notebook runs it (pytest's own log capture would hide the lines in-process):
  nothing on stdout or stderr but what the script prints; a real error still comes through."""
  run = train_tiny_decoder(2, name="quiet_load")
  capfd.readouterr()
  code = f"import headspec; print(headspec.load({str(run)!r}).target.step)"
  subprocess.run([sys.executable, "-c", code], check=True)  # its stdout and stderr are this process's: capfd's
  out, err = capfd.readouterr()
  assert out == "2\n" and err == "", (out, err)
  with pytest.raises(UserError, match=r"step\(s\) \[5\] not saved"):
    headspec.load(run, step=5)


@pytest.mark.parametrize("positions", ["learned", "sinusoidal", "rotary"])
def test_hook_embed_is_the_token_embedding_alone(positions):
  cfg = ModelConfig(kind="decoder", vocab_size=50, num_layers=1, num_heads=2, d_model=16, d_head=8,
                              d_ff=32, max_len=16, positions=positions)  # fmt: skip
  net = random_like(cfg, 0)
  tokens = [[3, 14, 15, 9, 2], [6, 5, 3, 5, 8]]
  cache = headspec.capture(net, tokens, sites=["hook_embed", "hook_pos_embed", "z"] if positions != "rotary" else
                           ["hook_embed", "z"])  # fmt: skip
  W_E = np.asarray(net.token_embed_VD[...])
  scale = np.sqrt(16.0) if positions == "sinusoidal" else 1.0  # Vaswani et al.'s sqrt(D) on the token embedding
  np.testing.assert_allclose(cache["hook_embed"], W_E[np.asarray(tokens)] * scale, rtol=1e-6)
  np.testing.assert_array_equal(cache["embed"], cache["hook_embed"])
  full = headspec.capture(net, tokens, sites=["embeddings"])
  assert "embed" not in full.keys()
  np.testing.assert_array_equal(full["hook_embed"], cache["hook_embed"])  # computed when not captured
  if positions == "rotary":
    np.testing.assert_allclose(full["embeddings"], cache["hook_embed"], rtol=1e-6)
    with pytest.raises(UserError, match="rotary positions"):
      full["hook_pos_embed"]
    return
  table = np.asarray(net.position_embed_TD[...]) if positions == "learned" else sinusoidal_positions(5, 16)
  np.testing.assert_allclose(cache["hook_pos_embed"], np.broadcast_to(np.asarray(table)[:5], (2, 5, 16)), rtol=1e-6)
  np.testing.assert_allclose(full["embeddings"], cache["hook_embed"] + cache["hook_pos_embed"], rtol=1e-6, atol=1e-7)


def test_an_unknown_site_names_valid_ones():
  cfg = ModelConfig(kind="decoder", vocab_size=50, num_layers=2, num_heads=2, d_model=16, d_head=8,
                              d_ff=32, max_len=16)  # fmt: skip
  net = random_like(cfg, 0)
  with pytest.raises(UserError, match=r"unknown site 'resid_prе'.*did you mean 'resid_pre'") as e:
    headspec.capture(net, [[1, 2, 3]], sites=["resid_prе"])  # a Cyrillic е
  assert "e.g. 'z'" in str(e.value) and "\n" not in str(e.value)
  cache = headspec.capture(net, [[1, 2, 3]], sites=["z"])
  with pytest.raises(
    UserError, match=r"cache\['blocks.0.attn.hook_zz'\]: unknown site.*did you mean 'blocks.0.attn.hook_z'"
  ):
    cache["blocks.0.attn.hook_zz"]
  with pytest.raises(UserError, match=r"cache\['patern'\]: unknown site.*did you mean 'pattern'"):
    cache["patern"]
  with pytest.raises(UserError, match=r"cache\['q'\]: site 'q' was not captured"):  # a valid one: capture it
    cache["q"]
