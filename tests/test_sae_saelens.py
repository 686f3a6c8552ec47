"""SAELens's folder layout both ways (headspec/sae/saelens.py, docs/sae.md "SAELens format").

SAELens pins transformer-lens < 4 and is not installed here: the reference folders are written by hand from
its layout (sae_lens/saes/sae.py `save_model`: cfg.json + sae_weights.safetensors) and `saelens_encode` below
re-implements its encode in numpy (sae_lens/saes/{standard,topk,jumprelu,gated}_sae.py `encode`,
sae.py `process_sae_in`), so headspec's encode of a loaded folder is checked against SAELens's arithmetic.
"""

from __future__ import annotations

import json

import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import save_file

import headspec
from headspec.errors import UserError
from headspec.sae import saelens
from headspec.sae.model import SAE

D_IN, D_SAE, K = 32, 48, 5


def saelens_encode(cfg: dict, w: dict, x):
  """SAELens 6's encode (float64): x' = x − b_dec·apply_b_dec_to_input, then the architecture's activation."""
  x = np.asarray(x, np.float64)
  w = {key: np.asarray(value, np.float64) for key, value in w.items()}
  sae_in = x - w["b_dec"] * cfg.get("apply_b_dec_to_input", True)
  arch = cfg["architecture"]
  if arch == "gated":
    active = (sae_in @ w["W_enc"] + w["b_gate"] > 0).astype(np.float64)
    return active * np.maximum(sae_in @ (w["W_enc"] * np.exp(w["r_mag"])) + w["b_mag"], 0.0)
  pre = sae_in @ w["W_enc"] + w["b_enc"]
  if arch == "standard":
    return np.maximum(pre, 0.0)
  if arch == "jumprelu":
    return np.maximum(pre, 0.0) * (pre > w["threshold"])
  if cfg.get("rescale_acts_by_decoder_norm"):
    pre = pre * np.linalg.norm(w["W_dec"], axis=-1)
  out = np.zeros_like(pre)
  top = np.argsort(-pre, axis=-1)[:, : cfg["k"]]
  rows = np.arange(len(pre))[:, None]
  out[rows, top] = np.maximum(pre[rows, top], 0.0)  # TopK, then ReLU of the kept values
  return out


def saelens_decode(cfg: dict, w: dict, f):
  f = np.asarray(f, np.float64)
  if cfg.get("rescale_acts_by_decoder_norm"):
    f = f / np.linalg.norm(np.asarray(w["W_dec"], np.float64), axis=-1)
  return f @ np.asarray(w["W_dec"], np.float64) + np.asarray(w["b_dec"], np.float64)


def weights(arch: str, seed: int = 0, d_in: int = D_IN) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  w = dict(W_enc=rng.normal(size=(d_in, D_SAE)) / np.sqrt(d_in), W_dec=rng.normal(size=(D_SAE, d_in)) * 0.3,
           b_dec=rng.normal(size=d_in) * 0.1)  # fmt: skip
  if arch == "gated":
    w |= dict(
      b_gate=rng.normal(size=D_SAE) * 0.3, b_mag=rng.normal(size=D_SAE) * 0.3, r_mag=rng.normal(size=D_SAE) * 0.2
    )
  else:
    w["b_enc"] = rng.normal(size=D_SAE) * 0.3
  if arch == "jumprelu":
    w["threshold"] = rng.uniform(-0.2, 0.6, size=D_SAE)  # negative ones too: SAELens's ReLU makes them 0
  return {key: value.astype(np.float32) for key, value in w.items()}


def reference_folder(path, arch: str, *, cfg_extra=None, tensors=None, hook="blocks.1.attn.hook_z", d_in=D_IN):
  """An SAELens 6 folder as `save_model` writes it: cfg.json (SAEConfig.to_dict) and sae_weights.safetensors."""
  cfg = dict(architecture=arch, d_in=d_in, d_sae=D_SAE, dtype="float32", device="cpu", apply_b_dec_to_input=True,
             normalize_activations="none", reshape_activations="hook_z",
             metadata=dict(sae_lens_version="6.18.0", sae_lens_training_version="6.18.0", model_name="gpt2-small",
                           hook_name=hook, hook_head_index=None, context_size=128, prepend_bos=True))  # fmt: skip
  if arch == "topk":
    cfg |= dict(k=K, rescale_acts_by_decoder_norm=False)
  cfg |= cfg_extra or {}
  w = tensors if tensors is not None else weights(arch, d_in=d_in)
  path.mkdir(parents=True, exist_ok=True)
  (path / "cfg.json").write_text(json.dumps(cfg))
  save_file(w, str(path / "sae_weights.safetensors"))
  return cfg, w


def inputs(n: int = 64, seed: int = 1):
  return np.random.default_rng(seed).normal(size=(n, D_IN)).astype(np.float32)


@pytest.mark.parametrize(
  "arch, extra",
  [
    ("standard", {}),
    ("topk", {}),
    ("topk", dict(rescale_acts_by_decoder_norm=True)),
    ("jumprelu", {}),
    ("standard", dict(apply_b_dec_to_input=False)),
    ("jumprelu", dict(apply_b_dec_to_input=False)),
    ("gated", {}),
  ],
)
def test_a_saelens_folder_encodes_as_saelens_does(tmp_path, arch, extra):
  cfg, w = reference_folder(tmp_path / "sae", arch, cfg_extra=extra)
  sae = headspec.load_sae(tmp_path / "sae")
  x = inputs()
  expected_f = saelens_encode(cfg, w, x)
  f = np.asarray(sae.encode(x))
  assert (f > 0).sum() > 0 and (expected_f > 0).any(axis=1).all()
  np.testing.assert_array_equal(f > 0, expected_f > 0)  # the same features fire
  np.testing.assert_allclose(f, expected_f, atol=2e-5)
  np.testing.assert_allclose(np.asarray(sae.decode(f)), saelens_decode(cfg, w, expected_f), atol=2e-5)
  assert sae.hook_name == "blocks.1.attn.hook_z" and sae.layer == 1 and sae.site == "z"
  assert sae.kind == {"standard": "relu", "topk": "topk", "jumprelu": "jumprelu", "gated": "jumprelu"}[arch]
  assert sae.k == (K if arch == "topk" else 0)


def test_a_pre_6_config_is_read_as_saelens_reads_it(tmp_path):
  """SAELens < 6: metadata at the top level, hook_point, activation_fn_str 'topk' with activation_fn_kwargs,
  a boolean normalize_activations (`handle_pre_6_0_config`)."""
  w = weights("topk")
  (tmp_path / "old").mkdir()
  old = dict(d_in=D_IN, d_sae=D_SAE, dtype="float32", hook_point="blocks.2.attn.hook_z", hook_point_layer=2,
             activation_fn_str="topk", activation_fn_kwargs=dict(k=K), normalize_activations=False,
             apply_b_dec_to_input=True, sae_lens_training_version="3.5.0", model_name="gpt2-small")  # fmt: skip
  (tmp_path / "old" / "cfg.json").write_text(json.dumps(old))
  save_file(w, str(tmp_path / "old" / "sae_weights.safetensors"))
  sae = headspec.load_sae(tmp_path / "old")
  assert sae.kind == "topk" and sae.k == K and sae.layer == 2
  x = inputs()
  np.testing.assert_allclose(np.asarray(sae.encode(x)), saelens_encode(dict(architecture="topk", k=K), w, x), atol=2e-5)


def test_expected_average_norm_is_folded_with_the_given_factor(tmp_path):
  """normalize_activations='expected_average_only_in': SAELens folds the release's norm_scaling_factor s
  (W_enc·s, W_dec/s, b_dec/s): encode(x) = SAE(x·s), decode = SAE's output / s."""
  cfg, w = reference_folder(
    tmp_path / "sae", "standard", cfg_extra=dict(normalize_activations="expected_average_only_in")
  )
  with pytest.raises(UserError, match=r"cfg.json: normalize_activations = 'expected_average_only_in' needs"):
    headspec.load_sae(tmp_path / "sae")
  sae = headspec.load_sae(tmp_path / "sae", norm_scaling_factor=2.5)
  x = inputs()
  f = saelens_encode(cfg, w, x * 2.5)
  np.testing.assert_allclose(np.asarray(sae.encode(x)), f, atol=2e-5)
  np.testing.assert_allclose(np.asarray(sae.decode(f)), saelens_decode(cfg, w, f) / 2.5, atol=2e-5)


def _headspec_sae(kind: str, seed: int = 0, per_head: bool = False) -> SAE:
  w = weights({"relu": "standard"}.get(kind, kind), seed)
  rng = np.random.default_rng(seed + 7)
  return SAE(
    W_enc_KF=jnp.asarray(w["W_enc"]), b_enc_F=jnp.asarray(w["b_enc"]), W_dec_FK=jnp.asarray(w["W_dec"]),
    b_dec_K=jnp.asarray(w["b_dec"]),
    threshold_F=jnp.asarray(np.abs(w["threshold"])) if kind == "jumprelu" else None,
    head_scale_K=jnp.asarray(np.repeat(rng.uniform(0.5, 2, 4), D_IN // 4), jnp.float32) if per_head else None,
    kind=kind, k=K if kind == "topk" else 0, info=dict(steps=3, history=[(1, 0.5)]),
  )  # fmt: skip


@pytest.mark.parametrize("kind", ["relu", "topk", "jumprelu"])
def test_save_then_load_is_the_same_sae_and_saelens_reads_it_alike(tmp_path, kind):
  sae = _headspec_sae(kind, per_head=kind == "topk")
  folder = sae.save(tmp_path / kind, layer=3, model_name="tiny")
  assert sorted(p.name for p in tmp_path.joinpath(kind).iterdir()) == ["cfg.json", "sae_weights.safetensors"]
  back = headspec.load_sae(folder)
  for name in ("W_enc_KF", "b_enc_F", "W_dec_FK", "b_dec_K", "threshold_F", "head_scale_K"):
    mine, theirs = getattr(sae, name), getattr(back, name)
    assert (mine is None) == (theirs is None), name
    if mine is not None:
      np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs), err_msg=name)
  assert (back.kind, back.k, back.hook_name, back.layer) == (kind, sae.k, "blocks.3.attn.hook_z", 3)
  x = inputs()
  np.testing.assert_array_equal(np.asarray(back.encode(x)), np.asarray(sae.encode(x)))
  np.testing.assert_allclose(headspec.sae_head_fractions(back, heads=4), headspec.sae_head_fractions(sae, heads=4))
  # the other direction: SAELens's arithmetic on the written folder gives headspec's features
  cfg = json.loads((folder / "cfg.json").read_text())
  from safetensors.numpy import load_file

  w = load_file(str(folder / "sae_weights.safetensors"))
  assert set(w) == set(saelens.TENSORS[cfg["architecture"]])  # SAELens loads its state dict strictly
  assert w["W_enc"].shape == (D_IN, D_SAE) and w["W_dec"].shape == (D_SAE, D_IN)
  assert cfg["architecture"] == {"relu": "standard", "topk": "topk", "jumprelu": "jumprelu"}[kind]
  assert cfg["normalize_activations"] == "none" and cfg["apply_b_dec_to_input"] is True
  assert (
    cfg["reshape_activations"] == "hook_z"
    and cfg["dtype"] == "float32"
    and (cfg["d_in"], cfg["d_sae"]) == (D_IN, D_SAE)
  )
  assert cfg["metadata"]["hook_name"] == "blocks.3.attn.hook_z" and cfg["metadata"]["sae_lens_version"] >= "6"
  np.testing.assert_allclose(np.asarray(sae.encode(x)), saelens_encode(cfg, w, x), atol=2e-5)


def test_a_fitted_sae_round_trips_with_its_per_head_scales(tmp_path):
  x = np.random.default_rng(0).normal(size=(512, 16)).astype(np.float32) * np.repeat([1.0, 0.2], 8)
  sae = headspec.fit_sae(x, features=24, k=3, steps=20, batch_size=64, normalize="per_head", heads=2, progress=False)
  back = headspec.load_sae(sae.save(tmp_path / "fit", hook_name="blocks.0.attn.hook_z"))
  np.testing.assert_array_equal(np.asarray(back.encode(x)), np.asarray(sae.encode(x)))
  np.testing.assert_array_equal(headspec.sae_head_fractions(back, heads=2), headspec.sae_head_fractions(sae, heads=2))
  assert back.info["steps"] == 20 and back.info["head_scales"] == pytest.approx(sae.info["head_scales"])


def test_kissane_attention_sae_folder_loads(tmp_path):
  """gpt2-small-hook-z-kk: <name>.pt (torch state dict W_enc, W_dec, b_enc, b_dec) beside <name>_cfg.json
  (act_size, dict_size, act_name), a standard ReLU SAE (SAELens's `connor_rob_hook_z` loader); read without torch."""
  torch = pytest.importorskip("torch")
  w = weights("standard")
  name = "gpt2-small_L3_Hcat_z_lr1.20e-03_l19.00e-01_ds48_bs4096_dc1.00e-06_rsanthropic_rie25000_nr4_v9"
  folder = tmp_path / "kk"
  folder.mkdir()
  state = {key: torch.from_numpy(value.copy()) for key, value in w.items()}
  state["W_dec"] = torch.from_numpy(w["W_dec"].T.copy()).t()  # a non-contiguous view: strides matter
  torch.save(state, folder / f"{name}.pt")
  cfg = dict(act_size=D_IN, dict_size=D_SAE, act_name="blocks.3.attn.hook_z", layer=3, site="z", concat_heads=True,
             head="cat", model_name="gpt2-small", enc_dtype="fp32", l1_coeff=0.9, seed=49)  # fmt: skip
  (folder / f"{name}_cfg.json").write_text(json.dumps(cfg))
  for path in (folder, folder / f"{name}.pt", folder / f"{name}_cfg.json"):
    sae = headspec.load_sae(path)
    assert sae.kind == "relu" and sae.layer == 3 and sae.width == D_IN and sae.num_features == D_SAE
    x = inputs()
    np.testing.assert_allclose(
      np.asarray(sae.encode(x)), saelens_encode(dict(architecture="standard"), w, x), atol=2e-5
    )
  mixed = dict(a=torch.arange(6, dtype=torch.bfloat16).reshape(2, 3).t(), b=torch.ones(2, dtype=torch.float16))
  torch.save(mixed, tmp_path / "mixed.pt")
  read = saelens.read_torch_state_dict(tmp_path / "mixed.pt")
  np.testing.assert_array_equal(read["a"].astype(np.float32), mixed["a"].float().numpy())
  assert read["b"].dtype == np.float16 and read["b"].tolist() == [1.0, 1.0]
  torch.save({"W": torch.ones(2), "f": print}, tmp_path / "code.pt")  # a pickled function is never run
  with pytest.raises(UserError, match=r"code.pt: holds \w+.print, not a plain state dict"):
    saelens.read_torch_state_dict(tmp_path / "code.pt")
  (folder / f"{name}2.pt").write_bytes((folder / f"{name}.pt").read_bytes())
  (folder / f"{name}2_cfg.json").write_text(json.dumps(cfg))
  with pytest.raises(UserError, match=r"holds no cfg.json \(SAELens\) and 2 .pt files with their _cfg.json; name one"):
    headspec.load_sae(folder)


def _biased_model():
  """A pre-LN decoder (LayerNorm, value biases, grouped K/V: 4 heads on 2 groups) with random biases and gains."""
  import jax
  from flax import nnx

  from headspec.model.config import ModelConfig
  from headspec.model.transformer import Transformer

  cfg = ModelConfig(kind="decoder", vocab_size=40, num_layers=2, num_heads=4, num_kv_heads=2, d_model=32, d_head=8,
                    d_ff=64, max_len=16, norm="layernorm", attention_bias=True)  # fmt: skip
  model = Transformer(cfg, rngs=nnx.Rngs(params=0))
  params = nnx.state(model, nnx.Param)
  keys = iter(jax.random.split(jax.random.key(3), 1000))
  nnx.update(model, jax.tree.map(lambda p: p + 0.3 * jax.random.normal(next(keys), p.shape) if p.ndim == 1 or
                                 p.shape[-1] == 8 and p.ndim == 2 else p, params))  # fmt: skip
  return model


def test_transformer_lens_value_bias_is_folded_for_headspec_z(tmp_path):
  """TransformerLens's from_pretrained folds ln1's bias into b_V (fold_ln) and b_V into b_O (fold_value_biases),
  so its hook_z is A·(x̂ (w ⊙ W_V)) with x̂ the plain normalised stream. Computed so from a real model's captured
  stream and pattern, it differs from headspec's z by value_bias_K; a TransformerLens-trained SAE loaded with the
  model reads headspec's z as SAELens reads TransformerLens's; headspec's own SAEs and folders saying
  fold_value_biases=False are left as they are."""
  model = _biased_model()
  tokens = jnp.asarray(np.random.default_rng(1).integers(0, 40, (2, 7)), jnp.int32)
  _, inter = model(tokens, capture=("z", "resid_pre", "pattern"))
  block, layer = model.blocks[1], 1
  x = np.asarray(inter.site("resid_pre"))[layer].astype(np.float64)
  x_hat = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + model.cfg.layer_norm_eps)
  w_DGK = np.asarray(block.ln_attention.scale[...])[:, None, None] * np.asarray(block.attention.w_v_DHK[...])
  v_BTGK = np.einsum("btd,dgk->btgk", x_hat, w_DGK)[:, :, [0, 0, 1, 1]]  # each query head's group
  z_tl = np.einsum("bhts,bshk->bthk", np.asarray(inter.site("pattern"))[layer], v_BTGK).reshape(14, 32)
  z_hs = np.asarray(inter.site("z"))[layer].reshape(14, 32)
  b_K = saelens.value_bias_K(model, layer)
  assert np.abs(b_K).max() > 0.1
  np.testing.assert_allclose(z_hs - z_tl, np.broadcast_to(b_K, z_hs.shape), atol=2e-5)
  cfg, w = reference_folder(tmp_path / "tl", "standard")
  sae = headspec.load_sae(tmp_path / "tl", model=model)
  f = saelens_encode(cfg, w, z_tl)
  np.testing.assert_allclose(np.asarray(sae.encode(z_hs)), f, atol=5e-5)
  np.testing.assert_allclose(np.asarray(sae.decode(f)), saelens_decode(cfg, w, f) + b_K, atol=5e-5)
  assert saelens.for_headspec_z(sae, model) is sae  # once only
  meta = dict(
    sae_lens_version="6.1.0",
    hook_name="blocks.1.attn.hook_z",
    model_from_pretrained_kwargs=dict(fold_value_biases=False),
  )
  reference_folder(tmp_path / "unfolded", "standard", cfg_extra=dict(metadata=meta))
  np.testing.assert_array_equal(np.asarray(headspec.load_sae(tmp_path / "unfolded", model=model).b_dec_K), w["b_dec"])
  own = _headspec_sae("relu").save(tmp_path / "own", layer=1)
  np.testing.assert_array_equal(np.asarray(headspec.load_sae(own, model=model).b_dec_K), w["b_dec"])
  meta = dict(
    sae_lens_version="6.1.0", hook_name="blocks.1.attn.hook_z", model_from_pretrained_kwargs=dict(fold_ln=False)
  )
  reference_folder(tmp_path / "no_fold_ln", "standard", cfg_extra=dict(metadata=meta))
  b_V = np.asarray(block.attention.b_v_HK[...])[[0, 0, 1, 1]].reshape(-1)
  np.testing.assert_allclose(
    np.asarray(headspec.load_sae(tmp_path / "no_fold_ln", model=model).b_dec_K), w["b_dec"] + b_V, atol=1e-6
  )


def _bad(tmp_path, arch="standard", extra=None, tensors=None, hook="blocks.1.attn.hook_z", d_in=D_IN):
  w = weights(arch, d_in=d_in)
  if tensors is not None:
    w = tensors(w)
  reference_folder(tmp_path / "bad", arch, cfg_extra=extra, tensors=w, hook=hook, d_in=d_in)
  return tmp_path / "bad"


@pytest.mark.parametrize(
  "make, message",
  [
    (lambda p: p / "nosuch", r"nosuch: no such folder"),
    (lambda p: _bad(p, extra=dict(architecture="batchtopk")), r"cfg.json: architecture = 'batchtopk'; headspec reads"),
    (lambda p: _bad(p, extra=dict(normalize_activations="layer_norm")), r"cfg.json: normalize_activations = 'layer_norm' scales"),
    (lambda p: _bad(p, extra=dict(normalize_activations="constant_norm_rescale")), r"cfg.json: normalize_activations"),
    (lambda p: _bad(p, extra=dict(d_in=16)), r"sae_weights.safetensors: W_enc has shape \[32, 48\], not \[16, 48\]"),
    (lambda p: _bad(p, extra=dict(d_sae="48")), r"cfg.json: d_sae = '48'; a positive integer"),
    (lambda p: _bad(p, "topk", extra=dict(k=0)), r"cfg.json: k = 0; a positive integer"),
    (lambda p: _bad(p, tensors=lambda w: w | dict(extra=np.ones(3, np.float32))), r"safetensors: extra is not a tensor of a standard SAE"),
    (lambda p: _bad(p, tensors=lambda w: {k: v for k, v in w.items() if k != "b_enc"}), r"safetensors: b_enc is missing"),
    (lambda p: _bad(p, tensors=lambda w: w | dict(b_dec=np.full(D_IN, np.nan, np.float32))), r"safetensors: b_dec holds NaN"),
    (lambda p: _bad(p, extra=dict(metadata=dict(sae_lens_version="6.1.0", hook_name="blocks.1.attn.hook_z", hook_head_index=2))), r"cfg.json: hook_head_index = 2: an SAE of one head"),
    (lambda p: _bad(p, hook="blocks.1.attn.hook_pattern"), r"cfg.json: metadata.hook_name='blocks.1.attn.hook_pattern': not the hook of a per-token site"),
    (lambda p: _bad(p, hook=None), r"metadata.hook_name=None"),
  ],
)  # fmt: skip
def test_a_folder_headspec_cannot_represent_is_one_line(tmp_path, make, message):
  with pytest.raises(UserError, match=message) as e:
    headspec.load_sae(make(tmp_path))
  assert "\n" not in str(e.value)


def test_damaged_files_are_one_line(tmp_path):
  folder = _bad(tmp_path)
  (folder / "sae_weights.safetensors").write_bytes(b"not a safetensors file at all")
  with pytest.raises(UserError, match=r"sae_weights.safetensors: not a safetensors file") as e:
    headspec.load_sae(folder)
  (folder / "cfg.json").write_text("{oops")
  with pytest.raises(UserError, match=r"cfg.json:1: not valid JSON"):
    headspec.load_sae(folder)
  (folder / "cfg.json").unlink()
  with pytest.raises(UserError, match=r"holds no cfg.json") as e:
    headspec.load_sae(folder)
  assert "\n" not in str(e.value)
  with pytest.raises(UserError, match=r"load_sae: path=None must be a path"):
    headspec.load_sae(None)
  with pytest.raises(UserError, match=r"hook_name is unknown"):
    _headspec_sae("relu").save(tmp_path / "nohook")
  negative = _headspec_sae("jumprelu").replace(threshold_F=jnp.full(D_SAE, -1.0))
  with pytest.raises(UserError, match=r"JumpReLU threshold is negative"):
    negative.save(tmp_path / "neg", layer=0)


# `headspec sae` in process (tests/test_sae.py's way: overrides go into a config file)
TINY = dict(
  train_tokens=3000, eval_tokens=1500, layer=0, sae__features=32, sae__k=4, sae__train_steps=60, sae__batch_size=256,
  sae__lr=3e-3, analysis__treebank="synthetic", analysis__max_sentences=20, analysis__batch_tokens=512, analysis__top=3,
)  # fmt: skip


def sae_cli(tmp_path, workdir, data_dir, **overrides) -> int:
  from headspec.cli import main as cli

  name = tmp_path / f"sae_cfg_{len(list(tmp_path.glob('sae_cfg_*.py')))}.py"
  lines = ["from headspec.configs.sae import get_config as base", "def get_config(a=None):", "  c = base(None)"]
  lines += [
    f"  c.{key.replace('__', '.')} = {value!r}" for key, value in {"data_dir": str(data_dir), **overrides}.items()
  ]
  name.write_text("\n".join(lines + ["  return c\n"]))
  cli.FLAGS.unparse_flags()
  return cli.main(["headspec", "sae", f"--config={name}", f"--workdir={workdir}"])


@pytest.fixture(scope="module")
def trained_sae_run(train_tiny_decoder, synthetic_data_dir, tmp_path_factory):
  run = train_tiny_decoder(2, (), name="sae_saelens")
  assert sae_cli(tmp_path_factory.mktemp("cfg"), run, synthetic_data_dir, **TINY) == 0
  return run


@pytest.mark.slow
def test_headspec_sae_writes_the_saelens_folder_and_loads_it_back(trained_sae_run, synthetic_data_dir, tmp_path):
  """The trained SAE is written in SAELens's layout beside its Orbax state; `--config.sae.load` on that folder
  analyses it without training: its metrics equal the trained SAE's (same SAE, same evaluation tokens) and
  every table gets its rows, under the sae 'loaded-topk-f32-k4'."""
  run = trained_sae_run
  folder = run / "sae" / "saelens" / "sae_saelens-step2-z0-topk-f32-k4"
  cfg = json.loads((folder / "cfg.json").read_text())
  assert cfg["metadata"]["hook_name"] == "blocks.0.attn.hook_z" and cfg["d_in"] == 32 and cfg["k"] == 4
  assert cfg["metadata"]["model_name"] == "sae_saelens" and cfg["metadata"]["headspec"]["step"] == 2
  (checkpoint,) = (run / "sae" / "checkpoints").iterdir()
  assert cfg["metadata"]["headspec"]["checkpoint"] == checkpoint.name
  sae = headspec.load_sae(folder)
  assert sae.layer == 0 and sae.num_features == 32

  assert sae_cli(tmp_path, run, synthetic_data_dir, **TINY, sae__load=str(folder)) == 0
  metrics = headspec.read_table(run, "sae_metrics")
  value = {(r.sae, r.metric): r.value for r in metrics.itertuples()}
  for name in ("l0", "fvu", "dead_fraction", "loss_splice", "loss_recovered_zero", "kl_splice"):
    assert value["loaded-topk-f32-k4", name] == pytest.approx(value["topk-f32-k4", name], rel=1e-5, abs=1e-7), name
  assert value["loaded-topk-f32-k4", "train_tokens"] == 0 and np.isnan(value["loaded-topk-f32-k4", "fvu_train"])
  assert value["loaded-topk-f32-k4", "features"] == 32 and value["loaded-topk-f32-k4", "k"] == 4
  for table in ("sae_features", "sae_heads", "sae_contexts", "sae_labels"):
    frame = headspec.read_table(run, table)
    assert {"topk-f32-k4", "loaded-topk-f32-k4"} <= set(frame["sae"]), table
    assert set(frame[frame["sae"] == "loaded-topk-f32-k4"]["layer"]) == {0}
  features = headspec.read_table(run, "sae_features").set_index(["sae", "feature"])
  np.testing.assert_allclose(
    features.loc["loaded-topk-f32-k4"]["firing_rate"], features.loc["topk-f32-k4"]["firing_rate"]
  )
  assert sorted((run / "sae" / "saelens").iterdir()) == [folder]  # a loaded SAE is not written again
  # the loaded SAE spliced into the model (headspec/model/edits.py) and attributed to heads
  from headspec.model import edits
  from headspec.model.sites import Edit

  model, _ = headspec.load(run)
  tokens = jnp.arange(1, 17).reshape(2, 8)
  logits, inter = model(tokens, capture=("z",))
  spliced, _ = model(tokens, interventions={"z": edits.splice(sae, layers=0)})
  z = np.asarray(inter.z_LBTHK[0]).reshape(16, 32)
  add = (np.asarray(sae(z)) - z).reshape(1, 2, 8, 4, 8)
  by_edit, _ = model(tokens, interventions={"z": Edit(add=np.concatenate([add, 0 * add]))})
  np.testing.assert_allclose(np.asarray(spliced), np.asarray(by_edit), atol=1e-4)
  assert headspec.sae_head_fractions(sae, heads=4).sum(1) == pytest.approx(np.ones(32))


@pytest.mark.slow
@pytest.mark.parametrize(
  "make, message",
  [
    (lambda p: p / "nosuch", "sae.load='{}': no such folder"),
    (lambda p: _bad(p, d_in=40), "has d_in=40, but this model's z is 32 wide (H·K = 4·8)"),
    (lambda p: _bad(p, hook="blocks.5.attn.hook_z"), "reads blocks.5.attn.hook_z, layer 5, but the model has 2 layers (0..1)"),
    (lambda p: _bad(p, extra=dict(architecture="batchtopk")), "architecture = 'batchtopk'"),
  ],
)  # fmt: skip
def test_a_bad_sae_load_is_one_line_and_writes_nothing(
  train_tiny_decoder, synthetic_data_dir, tmp_path, capsys, make, message
):
  run = train_tiny_decoder(2, (), name="sae_saelens_bad")
  folder = make(tmp_path)
  before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
  assert sae_cli(tmp_path, run, synthetic_data_dir, **TINY, sae__load=str(folder)) == 2
  err = capsys.readouterr().err.strip()
  lines = [line for line in err.splitlines() if "error" in line]
  assert len(lines) == 1 and "sae.load=" in lines[0] and message.format(folder) in lines[0], err
  assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
