"""Ablation core: known answers of the interventions, the from-layer fast path, importance, compile once."""

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from headspec.ablation import core, metrics
from headspec.errors import UserError
from headspec.model.config import ModelConfig
from headspec.model.edits import head_mask
from headspec.model.transformer import Transformer
from headspec.words import evalset

L, H, K, D = 3, 4, 8, 32


def tiny(kind="decoder", pre_layernorm=True, seed=0):
  cfg = ModelConfig(
    kind=kind, vocab_size=50, num_layers=L, num_heads=H, d_model=D, d_head=K, d_ff=64, max_len=16,
    pre_layernorm=pre_layernorm,
  )  # fmt: skip
  model = Transformer(cfg, rngs=nnx.Rngs(params=seed))
  for block in model.blocks:  # larger weights than the 0.02 init, so that heads matter
    for name in ("w_q_DHK", "w_k_DHK", "w_v_DHK", "w_o_HKD"):
      p = getattr(block.attention, name)
      p[...] = p[...] * 15
  return model


def lm_set(model, n=6, T=12, batch_size=4, seed=0):
  tokens = np.random.default_rng(seed).integers(1, 50, (n, T)).astype(np.int32)
  valid = np.ones((n, T), bool)
  valid[-1, T // 2 :] = False

  class Tok:
    mask_id, unk_id, vocab_size = 1, 0, 50

  return evalset.lm_eval_set(tokens, valid, model_kind=model.cfg.kind, tokenizer=Tok(), batch_size=batch_size, seed=0)


@pytest.mark.parametrize("pre_layernorm", [True, False])
def test_mask_equals_zeroed_w_o_rows_and_mean_of_constant_head_is_noop(pre_layernorm):
  model = tiny(pre_layernorm=pre_layernorm)
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 50, (2, 10)))
  mask = np.ones((L, H), np.float32)
  mask[1, 2] = 0
  masked, _ = model(tokens, interventions={"z": head_mask(mask)})
  edited = nnx.clone(model)
  edited.blocks[1].attention.w_o_HKD[...] = edited.blocks[1].attention.w_o_HKD[...].at[2].set(0.0)
  zeroed, _ = edited(tokens)
  np.testing.assert_allclose(masked, zeroed, atol=1e-5)
  assert not np.allclose(masked, model(tokens)[0], atol=1e-3)

  # Head (1, 2) with W_V = 0: V is its bias c everywhere, so Z_h = A_h V_h = c; mean ablation is a no-op.
  attention = edited.blocks[1].attention
  attention.w_v_DHK[...] = attention.w_v_DHK[...].at[:, 2].set(0.0)
  attention.b_v_HK[...] = attention.b_v_HK[...].at[2].set(jnp.linspace(-1, 1, K))
  replacement = np.zeros((L, H, K), np.float32)
  replacement[1, 2] = np.linspace(-1, 1, K)
  np.testing.assert_allclose(
    edited(tokens, interventions={"z": head_mask(mask, replacement)})[0], edited(tokens)[0], atol=1e-5
  )
  # and mean ablation through the evaluation set's own means gives the same answer
  es = lm_set(edited)
  mean_z, _ = core.head_statistics(edited, es)
  np.testing.assert_allclose(mean_z[1, 2], np.linspace(-1, 1, K), atol=1e-5)


@pytest.mark.parametrize("kind", ["decoder", "encoder"])
def test_from_layer_equals_full_forward(kind):
  model = tiny(kind, pre_layernorm=kind == "decoder")
  tokens = jnp.asarray(np.random.default_rng(2).integers(0, 50, (2, 9)))
  valid = jnp.asarray(np.arange(9)[None] < np.array([[9], [6]]))
  mask = np.ones((L, H), np.float32)
  mask[2, 1] = 0.0
  repl = np.random.default_rng(3).normal(size=(L, H, K)).astype(np.float32)
  full, inter = model(
    tokens, valid_BT=valid, interventions={"z": head_mask(mask, repl)}, capture=("resid_post", "embeddings")
  )
  for layer, x in enumerate([inter.embeddings_BTD, inter.resid_post_LBTD[0], inter.resid_post_LBTD[1]]):
    out, _ = model.from_layer(x, layer, valid_BT=valid, interventions={"z": head_mask(mask, repl)})
    np.testing.assert_allclose(out, full, atol=1e-4)
  hidden, _ = model(tokens, valid_BT=valid, output="hidden")
  assert hidden.shape == (2, 9, D)


def test_bad_mask_shapes_are_user_errors():
  """A mask of the wrong rank or size, or a replacement of the wrong rank, is one UserError line; the model's
  signature has no head_mask= (the head mask is an Edit of z)."""
  model = tiny()
  tokens = jnp.zeros((2, 5), jnp.int32)
  with pytest.raises(UserError, match=r"head_mask of shape \(4,\)"):
    head_mask(np.ones(4))
  with pytest.raises(UserError, match=r"interventions\['z'\].keep of shape \(4, 1, 1, 3, 1\) does not broadcast"):
    model(tokens, interventions={"z": head_mask(np.ones((H, L)))})
  with pytest.raises(UserError, match=r"replacement of shape \(3, 4\)"):
    head_mask(np.ones((L, H)), np.ones((L, H)))
  with pytest.raises(TypeError, match="head_mask"):
    model(tokens, head_mask=np.ones((L, H)))


def test_sweep_compiles_once_and_matches_single_forwards():
  model = tiny()
  es = lm_set(model, n=10, batch_size=4)  # 3 batches, the last padded
  zero = core.zero_replacement(model)
  mean_z, _ = core.head_statistics(model, es)
  before = core.TRACES["sweep"]
  eye = np.eye(H, dtype=np.float32)
  drop, keep = np.broadcast_to(1 - eye, (L, H, H)), np.broadcast_to(eye, (L, H, H))
  full, swept = core.run_sweep(model, es, drop, zero)
  _, swept_mean = core.run_sweep(model, es, drop, mean_z)
  _, swept_keep = core.run_sweep(model, es, keep, zero)
  assert core.TRACES["sweep"] - before == 1  # three sweeps, three batches, one trace

  np.testing.assert_allclose(full, core.run_one(model, es, np.ones((L, H)), zero), atol=1e-4)
  for l, h in [(0, 0), (1, 3), (2, 2)]:
    mask = np.ones((L, H), np.float32)
    mask[l, h] = 0
    np.testing.assert_allclose(swept[l, h], core.run_one(model, es, mask, zero), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(swept_mean[l, h], core.run_one(model, es, mask, mean_z), rtol=1e-4, atol=1e-4)
    keep_mask = np.ones((L, H), np.float32)
    keep_mask[l] = eye[h]
    np.testing.assert_allclose(swept_keep[l, h], core.run_one(model, es, keep_mask, zero), rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(
    core.run_masks(model, es, [np.ones((L, H))] * 3, zero)[1], full, atol=1e-4
  )  # pruning 0% reproduces the unablated loss
  d = metrics.deltas("lm", full, swept.reshape(L * H, *full.shape), resamples=50, seed=0)
  assert d["loss_delta"][0].shape == (L * H,) and np.all(d["loss_delta"][1] <= d["loss_delta"][2])


def test_importance_equals_finite_differences():
  model = tiny()
  es = lm_set(model, n=4, batch_size=4)
  zero = core.zero_replacement(model)
  raw = metrics.raw_importance(model, es)
  # E_x |∂ℓ(x)/∂m_h| by central differences of each sequence's mean NLL
  eps = 1e-2

  def per_seq_loss(mask):
    v = core.run_one(model, es, mask, zero).astype(np.float64)
    return v[:, 0] / v[:, 2]

  for l, h in [(0, 1), (2, 3)]:
    up, down = np.ones((L, H), np.float32), np.ones((L, H), np.float32)
    up[l, h], down[l, h] = 1 + eps, 1 - eps
    fd = np.abs((per_seq_loss(up) - per_seq_loss(down)) / (2 * eps)).mean()
    np.testing.assert_allclose(raw[l, h], fd, rtol=2e-2, atol=1e-4)
  norm = metrics.normalise_per_layer(raw)
  np.testing.assert_allclose(np.linalg.norm(norm, axis=1), 1.0, rtol=1e-6)


def test_embedding_shift_and_jacobian():
  model = tiny("encoder", pre_layernorm=False)
  rng = np.random.default_rng(4)
  windows = [rng.integers(1, 50, n).astype(np.int32) for n in (5, 9, 14, 3, 7)]
  es = evalset.sentence_embedding_set(windows, pad_id=0, max_len=16, batch_tokens=32)
  zero = core.zero_replacement(model)
  full, swept = core.run_sweep(model, es, np.ones((L, 1, H), np.float32), zero)  # "ablate" nothing
  assert metrics.values("embedding", full, full)["embedding_shift"] == pytest.approx(0.0, abs=1e-6)
  assert metrics.deltas("embedding", full, swept[0], resamples=20, seed=0)["embedding_shift"][0] == pytest.approx(
    0.0, abs=1e-6
  )
  # pooled embedding of one sentence equals the unpadded forward's mean
  h, _ = model(jnp.asarray(windows[1])[None], output="hidden")
  e = np.asarray(h[0].mean(0))
  np.testing.assert_allclose(full[1], e / np.linalg.norm(e), atol=1e-5)
  # ½‖∂e/∂m_h‖² against finite differences, sentence by sentence
  raw = metrics.raw_importance(model, es)
  eps = 1e-3
  for l, h in [(0, 2), (2, 0)]:
    up, down = np.ones((L, H), np.float32), np.ones((L, H), np.float32)
    up[l, h], down[l, h] = 1 + eps, 1 - eps
    jac = (core.run_one(model, es, up, zero) - core.run_one(model, es, down, zero)).astype(np.float64) / (2 * eps)
    np.testing.assert_allclose(raw[l, h], (0.5 * (jac**2).sum(-1)).mean(), rtol=3e-2)


def test_layer_matched_random_heads_avoid_the_selective_ones():
  """Random sets match the selective set's per-layer counts and draw from the non-selected heads first, so
  selective − random is not pulled toward 0 by shared heads; the overlap is minimal where a layer runs short."""
  from headspec.ablation import causal

  selectivity = np.array([[0.9, 0.8, 0.1, 0.0], [0.7, 0.6, 0.5, 0.4], [0.0, 0.0, 0.0, 0.0]])
  for k in (1, 2, 4, 6):
    sel = causal.selective_mask(selectivity, k)
    for seed in range(20):
      rand = causal.layer_matched_masks(sel, 1, seed)[0][0]
      np.testing.assert_array_equal((rand == 0).sum(1), (sel == 0).sum(1))
      short = np.maximum((sel == 0).sum(1) - (sel != 0).sum(1), 0).sum()  # selective heads that must be reused
      assert ((rand == 0) & (sel == 0)).sum() == short
      assert causal.overlap(sel, rand) == pytest.approx(short / k)
  # Layer 1 holds 3 of the 5 most selective heads and 1 other: the random set takes that one and 2 selective.
  sel = causal.selective_mask(selectivity, 5)
  assert causal.overlap(sel, causal.layer_matched_masks(sel, 1, 0)[0][0]) == pytest.approx(2 / 5)


def test_unlabelled_control_draws_k_heads_no_role_label_names():
  """A layer full of induction heads (layer 1 here): the layer-matched draw for the top head can only pick
  another of them; the unlabelled draw takes k heads from any layer that no role label names (not the
  previous-token head L0H3 either), never a top head, and is None when fewer than k such heads remain."""
  from headspec.ablation import causal

  induction = np.array([[0.1, 0.9, 0.0, 0.3], [0.95, 0.8, 0.7, 0.6]])
  unlabelled = (induction < 0.4) & ~np.array([[0, 0, 0, 1], [0, 0, 0, 0]], bool)  # L0H3: a previous-token head
  top = causal.selective_mask(induction, 1)
  assert (
    (causal.layer_matched_masks(top, 1, 0)[0][0][1] == 0) & (induction[1] >= 0.4)
  ).sum() == 1  # another induction head
  drawn = set()
  for seed in range(40):
    removed = {tuple(x) for x in np.argwhere(causal.unlabelled_mask(unlabelled, top, 1, seed) == 0)}
    assert len(removed) == 1 and all(unlabelled[x] for x in removed)
    drawn |= removed
  assert drawn == {(0, 0), (0, 2)}  # uniform over the pool: each is drawn
  again = [causal.unlabelled_mask(unlabelled, top, 2, 3) for _ in range(2)]
  np.testing.assert_array_equal(*again)
  assert (again[0] == 0).sum() == 2 and causal.unlabelled_mask(unlabelled, top, 3, 0) is None  # 2 unlabelled heads
  low = np.ones((2, 4), bool)  # at step 0 no head is named: the top heads themselves are never drawn
  mask = causal.unlabelled_mask(low, causal.selective_mask(induction, 4), 4, 0)
  assert (mask == 0).sum() == 4 and not ((mask == 0) & (causal.selective_mask(induction, 4) == 0)).any()


def test_sweeps_split_over_a_data_mesh_give_the_one_device_values():
  """Under a mesh of the suite's 2 devices on `data`, each device evaluates its share of the masks
  (headspec/parallel/mesh.py split_over_data): the sweep's and the mask evaluation's values equal one device's."""
  import jax

  from headspec.parallel import mesh

  model = tiny()
  es = lm_set(model)
  L, H = model.cfg.num_layers, model.cfg.num_heads
  rows_EH = 1.0 - np.eye(H, dtype=np.float32)[:3]  # 3 masks a layer: padded to 4 over 2 devices
  layer_masks = np.broadcast_to(rows_EH, (L, 3, H))
  masks_ELH = np.random.default_rng(0).integers(0, 2, (5, L, H)).astype(np.float32)
  zero = core.zero_replacement(model)
  alone = core.run_sweep(model, es, layer_masks, zero), core.run_masks(model, es, masks_ELH, zero)
  with mesh.using(mesh.parse(f"data={jax.device_count()}")):
    split = core.run_sweep(model, es, layer_masks, zero), core.run_masks(model, es, masks_ELH, zero)
  np.testing.assert_array_equal(split[0][0], alone[0][0])
  np.testing.assert_array_equal(split[0][1], alone[0][1])
  np.testing.assert_array_equal(split[1], alone[1])
