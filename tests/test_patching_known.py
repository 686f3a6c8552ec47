"""Known answers for patching: on the two-layer attention-only decoder that forms an induction head
(tests/induction_recipe.py: sinusoidal positions, untied unembedding, `varied_repeat_batch` rows),
activation patching of the repeated-sequence task picks out the induction head, and path patching into
its queries and keys picks out the layer-0 head it composes with (previous- or duplicate-token head)."""

import numpy as np
import pytest
from induction_recipe import INDUCTION_N as N
from induction_recipe import INDUCTION_SPECIALS as SPECIALS
from induction_recipe import INDUCTION_VOCAB as VOCAB

import headspec
from headspec.attention import induction as ind
from headspec.patching import tasks


@pytest.fixture(scope="module")
def induction_model(attention_only_decoder):
  return attention_only_decoder(2)


@pytest.mark.slow
def test_patching_picks_out_the_induction_circuit(induction_model):
  """Clean [BOS] r_1..r_6 r_1..r_5 (next r_6), corrupt [BOS] r'_1..r'_6 r_1..r_5; metric logit(r_6) − logit(r'_6).

  This model (seed 0) forms several layer-1 induction heads and one layer-0 duplicate-token head that
  they compose with (Q-composition: it tells their queries where the current token appeared before). So:
  - layer 1's attention output restores most of the behaviour (0.7 of it), layer 0's harms it (below);
  - Z_h matters only at the last position (no patch elsewhere moves the metric);
  - the largest single-head effect is the layer-0 partner's, and it is negative: its clean output in the
    corrupted run points the induction heads at the corrupted first half, which they copy (r'_6);
  - the layer-1 heads with a positive effect are induction heads (score > 0.3);
  - path patching into the induction heads' queries finds that partner and no other layer-0 head."""
  model = induction_model
  x = ind.repeated_random_tokens(VOCAB, SPECIALS, n=N, count=100, seed=1, bos=(2,))
  scores = ind.attention_scores(ind.run(model, x, np.ones(x.shape, bool), np.array(SPECIALS)), resamples=2, seed=0)
  induction = scores["induction"][0]
  partner = int(np.argmax(np.maximum(scores["previous_token"][0][0], scores["duplicate_token"][0][0])))
  clean, corrupt, answers = tasks.induction_pairs(VOCAB, SPECIALS, n=N, count=32, seed=2, bos=(2,))
  last_position = len(clean[0]) - 1

  def recovered(frame):
    base, source = frame.attrs["base"], frame.attrs["source"]
    assert source - base > 2.0, (base, source)  # the clean run predicts r_6, the corrupted one cannot
    return frame.assign(value=(frame["value"] - base) / (source - base))

  attn = recovered(headspec.patch(model, clean, corrupt, site="attn_out", answers=answers, by_position=False))
  assert attn["value"].iloc[1] > 0.5 and attn["value"].iloc[0] < 0.0, attn
  z = recovered(headspec.patch(model, clean, corrupt, site="z", answers=answers))
  assert z[z["position"] != last_position]["value"].abs().max() < 0.02
  last = z[z["position"] == last_position].set_index(["layer", "head"])["value"]
  assert last.abs().idxmax() == (0, partner) and last[(0, partner)] < -0.5, last
  helping = [h for (layer, h), v in last.items() if layer == 1 and v > 0.02]
  assert helping and all(induction[1][h] > 0.3 for h in helping), (last, induction)
  receivers = [(1, h) for h in range(4) if induction[1][h] > 0.5]
  path = recovered(headspec.path_patch(model, clean, corrupt, receivers=receivers, receiver_site="q",
                                       answers=answers, senders=[(0, h) for h in range(4)]))  # fmt: skip
  effect = path["value"].to_numpy()
  assert int(np.argmax(np.abs(effect))) == partner and np.sort(np.abs(effect))[-2] < 0.1 * np.abs(effect).max(), effect
