"""Capture: the cache helpers against TransformerLens 4's ActivationCache (TransformerBridge over
the same GPT-2 directory): accumulated_resid, decompose_resid (TL's 'embed' + 'pos_embed' are headspec's one
'embed'), stack_head_results and apply_ln_to_stack. The random checkpoint's final LayerNorm has weight 1 and
bias 0, where TransformerLens's unfolded apply_ln_to_stack and headspec's (which applies the weight) agree."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

import headspec  # noqa: E402

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("transformer_lens")
from transformer_lens.model_bridge import TransformerBridge  # noqa: E402

TOKENS = [[5, 9, 14, 20, 33, 7, 61], [8, 2, 40, 41, 12, 3, 90]]


@pytest.mark.slow
def test_cache_helpers_equal_transformer_lens(tmp_path):
  from test_api_tokens import _gpt2_dir

  path = _gpt2_dir(tmp_path)
  bridge = TransformerBridge.boot_transformers(str(path), device="cpu")
  _, tl = bridge.run_with_cache(torch.tensor(TOKENS))
  cache = headspec.capture(headspec.load(path), TOKENS)
  near = lambda ours, ref: np.testing.assert_allclose(np.asarray(ours), ref.detach().numpy(), atol=2e-5, rtol=1e-4)

  ref, ref_labels = tl.accumulated_resid(incl_mid=True, return_labels=True)
  ours, labels = cache.accumulated_resid(incl_mid=True, return_labels=True)
  assert labels == ref_labels
  near(ours, ref)
  near(cache.accumulated_resid(1), tl.accumulated_resid(1))
  ref, ref_labels = tl.decompose_resid(return_labels=True)
  assert ref_labels[:2] == ["embed", "pos_embed"] and ref_labels[2:] == cache.decompose_resid(return_labels=True)[1][1:]
  merged = torch.cat([ref[:1] + ref[1:2], ref[2:]])
  near(cache.decompose_resid(), merged)
  near(cache.decompose_resid(apply_ln=True), tl.apply_ln_to_stack(merged, layer=-1))
  near(cache.stack_head_results(), tl.stack_head_results(layer=-1))
  assert np.abs(np.asarray(cache.stack_head_results())).max() > 1e-3  # not all zeros
