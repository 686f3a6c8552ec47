"""The atlas's SAE feature pages (headspec/atlas/features.py) and the per-feature tables `headspec sae` writes
for them (headspec/sae/feature_data.py): histograms, head shares, the direct-path logit effect. The pages in a
real browser: tests/test_atlas_browser.py."""

from __future__ import annotations

import re

import numpy as np
import pytest
from test_atlas_fixtures import SAE_EVAL_TOKENS, SAE_FEATURES, SAE_TOKEN_MARKUP, write_run

from headspec.atlas import build_atlas, run_data
from headspec.atlas.features import NO_LOGITS, features_data
from headspec.io import tables


@pytest.fixture(scope="module")
def sae_run(tmp_path_factory):
  """The SAE tables only (known answers: tests/test_atlas_fixtures.py write_sae, feature_tables), atlas built."""
  run = write_run(tmp_path_factory.mktemp("runs") / "features", probes=False, diversity=False, ablation=False,
                  attention=False, sae=True)  # fmt: skip
  build_atlas(run)
  return run


def test_every_live_feature_has_a_page_and_the_cards_link_to_them(sae_run):
  folder = sae_run / "atlas_features" / "features_step1000_z1_topk-f8-k2"
  live = sorted(f for f, (_, _, _, rate) in SAE_FEATURES.items() if rate)
  assert sorted(p.name for p in folder.iterdir()) == sorted(f"f{f}.html" for f in live)  # f4 is dead: no page
  assert list((sae_run / "atlas_features").iterdir()) == [folder]  # the latest step's SAE only, not minilm's
  (card,) = run_data(sae_run)["heads_extra"]["1,2"]["sae"]
  links = [f["page"] for f in card["features"]]
  assert links == [f"atlas_features/features_step1000_z1_topk-f8-k2/f{f}.html" for f in (3, 1, 5, 6, 7)]
  assert card["more"] == [[0, "atlas_features/features_step1000_z1_topk-f8-k2/f0.html"]]  # the 6th carried
  assert all((sae_run / link).is_file() for link in links)
  # and each page links back to the cards of the heads carrying it (atlas.html#L<layer>H<head> opens one)
  page = (folder / "f0.html").read_text()
  hrefs = re.findall(r'class="head-link" href="([^"]+)"', page)
  assert hrefs == ["../../atlas.html#L1H3", "../../atlas.html#L1H0", "../../atlas.html#L1H2"]  # f0's heads 3;0;2
  assert 'href="f1.html"' in page and "previous feature" not in page  # the next live feature; f0 is the first
  assert 'href="f5.html"' in (folder / "f3.html").read_text()  # f4, dead, is skipped
  atlas = (sae_run / "atlas.html").read_text()
  assert "wanted = /^#L(\\d+)H(\\d+)$/" in atlas  # the atlas opens the card a feature page's link names


def test_a_compared_run_has_no_page_links(sae_run, tmp_path):
  other = write_run(tmp_path / "other", probes=False, diversity=False, ablation=False, attention=False, sae=True)
  from headspec.atlas import atlas_data

  first, second = atlas_data(sae_run, compare=[other])["runs"]
  assert first["heads_extra"]["1,2"]["sae"][0]["features"][0]["page"]
  assert second["heads_extra"]["1,2"]["sae"][0]["features"][0]["page"] is None  # its pages are not written here
  assert not (other / "atlas_features").exists()


def test_a_page_shows_the_histogram_shares_labels_and_logit_effect(sae_run):
  pages = {p["feature"]: p for p in features_data(sae_run)}
  for f, (top, share, carried, rate) in SAE_FEATURES.items():
    if not rate:
      assert f not in pages
      continue
    p = pages[f]
    # the histogram's counts add up to the tokens where the feature fires
    assert p["active"] == sum(c for _, _, c in p["histogram"]) == round(rate * SAE_EVAL_TOKENS)
    assert p["shares"][0] == [top, share] and sum(s for _, s in p["shares"]) == pytest.approx(1.0)
    assert p["heads"] == [int(h) for h in carried.split(";")]
  f3 = pages[3]
  assert f3["histogram"] == [[1.0, 2.0, 30], [4.0, 5.0, 270]]
  upos = next(x for x in f3["labels"] if x["set"] == "upos")
  assert upos["rows"] == [["NOUN", 5, 0.5], ["VERB", 3, 0.3], ["DET", 2, 0.2]] and upos["best"] == "NOUN"
  assert [t for t, _, _ in f3["logits"]["promoted"]] == [SAE_TOKEN_MARKUP, " the", "up3.2"]
  assert [v for _, v, _ in f3["logits"]["suppressed"]] == [-3.0, -2.0, -1.0]
  html = (sae_run / f3["path"]).read_text()
  assert "<mark>rank</mark>" in html and "ctx 3 " in html  # the context's word marked
  assert SAE_TOKEN_MARKUP not in html and "&lt;b&gt;tok&lt;/b&gt;" in html  # table text is text, never markup
  assert "Direct path" in html and "<svg" in html and "300 tokens in all" in html
  assert "<script" not in html and "default-src 'none'" in html
  assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", html)


def test_without_logits_the_page_says_why(tmp_path):
  """An encoder's SAE (or one written before logits.csv existed) has no logit rows: the page says so."""
  run = write_run(tmp_path / "enc", probes=False, diversity=False, ablation=False, attention=False, sae=True)
  tables.write(tables.path_of(run, tables.SAE_LOGITS), [], tables.SAE_LOGITS)
  build_atlas(run)
  html = (run / "atlas_features" / "enc_step1000_z1_topk-f8-k2" / "f3.html").read_text()
  assert "Direct path" not in html and "an encoder&#x27;s masked-LM head" in html
  assert "is not linear" in NO_LOGITS


# --- the per-feature tables (headspec/sae/feature_data.py) ---


def test_histogram_counts_add_up_to_the_active_tokens():
  from headspec.sae import feature_data

  rng = np.random.default_rng(0)
  f_NF = np.where(rng.random((500, 4)) < 0.3, rng.exponential(2.0, (500, 4)), 0.0)
  f_NF[:, 2] = 0.0  # dead
  f_NF[:7, 3], f_NF[7:, 3] = 1.5, 0.0  # one value only: one bin
  rows = feature_data.histogram_rows(dict(model="m"), f_NF, bins=10)
  for f in (0, 1):
    mine = [r for r in rows if r["feature"] == f]
    assert sum(r["count"] for r in mine) == int((f_NF[:, f] > 0).sum())
    assert mine[0]["low"] == pytest.approx(f_NF[:, f][f_NF[:, f] > 0].min())
    assert mine[-1]["high"] == pytest.approx(f_NF[:, f].max()) and all(r["count"] > 0 for r in mine)
  assert not [r for r in rows if r["feature"] == 2]
  assert [(r["bin"], r["low"], r["high"], r["count"]) for r in rows if r["feature"] == 3] == [(0, 1.5, 1.5, 7)]


def _tiny_model(kind: str = "decoder", norm: str = "layernorm", seed: int = 0):
  import jax.numpy as jnp
  from flax import nnx

  from headspec.model.config import ModelConfig
  from headspec.model.transformer import Transformer

  cfg = ModelConfig(kind=kind, vocab_size=64, num_layers=2, num_heads=4, d_model=16, d_head=4, d_ff=32, max_len=16,
                    norm=norm, tie_embeddings=False)  # fmt: skip
  model = Transformer(cfg, rngs=nnx.Rngs(params=seed))
  gain = np.random.default_rng(seed).uniform(0.5, 2.0, cfg.d_model).astype(np.float32)
  model.ln_final.scale[...] = jnp.asarray(gain)  # a trained gain, not the initial ones
  return model


class _Tokenizer:
  vocab_size = 60  # fewer tokens than the model's 64 rows of W_U: the rest are never named

  def decode(self, ids):
    return "".join(f"<t{i}>" for i in ids)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_logit_effect_is_w_dec_through_w_o_and_w_u(norm):
  """logits.csv against numpy: W_dec[f] (as [H, K]) · W_O^h summed over heads, centred (LayerNorm), times the
  final norm's gain, · W_U; the 10 largest and smallest of each live feature, among the tokenizer's 60."""
  from headspec.sae import feature_data

  model = _tiny_model(norm=norm)
  H, K, D = 4, 4, 16
  rng = np.random.default_rng(1)
  w_dec_FK = rng.normal(size=(6, H * K)).astype(np.float32)
  sae = type("SAE", (), {"W_dec_FK": w_dec_FK})()
  w_o_HKD = np.asarray(model.blocks[1].attention.w_o_HKD[...], np.float64)
  r_FD = np.einsum("fhk,hkd->fd", w_dec_FK.reshape(6, H, K).astype(np.float64), w_o_HKD)
  if norm == "layernorm":
    r_FD -= r_FD.mean(1, keepdims=True)
  logits_FV = (r_FD * np.asarray(model.ln_final.scale[...], np.float64)) @ np.asarray(model.unembed_DV[...])[:, :60]
  live = np.array([True, True, False, True, True, True])
  key = dict(model="m", step=0, site="z", layer=1, sae="s")
  rows = feature_data.logit_rows(key, model, _Tokenizer(), sae, "z", 1, live)
  assert len(rows) == 5 * 2 * 10 and not [r for r in rows if r["feature"] == 2]  # live features only
  for f in (0, 1, 3, 4, 5):
    for direction, order in (("promoted", np.argsort(-logits_FV[f])), ("suppressed", np.argsort(logits_FV[f]))):
      mine = sorted((r for r in rows if r["feature"] == f and r["direction"] == direction), key=lambda r: r["rank"])
      assert [r["token_id"] for r in mine] == list(order[:10])
      np.testing.assert_allclose([r["value"] for r in mine], logits_FV[f, order[:10]], rtol=1e-4, atol=1e-5)
      assert mine[0]["token"] == f"<t{order[0]}>"
  # a site of the residual width skips W_O; sites q, k, v and encoders have no direct path to the logits
  direct = feature_data.residual_directions(model, rng.normal(size=(2, D)), "resid_post", 1)
  assert direct.shape == (2, D)
  assert feature_data.residual_directions(model, w_dec_FK, "q", 1) is None
  assert feature_data.logit_rows(key, model, _Tokenizer(), sae, "q", 1, live) == []
  assert feature_data.logit_rows(key, _tiny_model("encoder"), _Tokenizer(), sae, "z", 1, live) == []


def test_feature_tables_of_one_sae():
  from headspec.sae import feature_data

  model = _tiny_model()
  rng = np.random.default_rng(2)
  f_NF = np.where(rng.random((50, 3)) < 0.5, rng.random((50, 3)), 0.0)
  f_NF[:, 1] = 0.0
  sae = type("SAE", (), {"W_dec_FK": rng.normal(size=(3, 16)).astype(np.float32)})()
  a_FH = rng.dirichlet(np.ones(4), 3)
  key = dict(model="m", step=0, site="z", layer=0, sae="s")
  kw = dict(sae=sae, f_NF=f_NF, a_FH=a_FH, model=model, tokenizer=_Tokenizer(), site="z", layer=0)
  out = feature_data.feature_tables(key, lm_head=True, **kw)
  assert set(out) == set(feature_data.TABLES)
  assert sorted({r["feature"] for r in out[tables.SAE_LOGITS]}) == [0, 2]  # feature 1 never fires
  shares = out[tables.SAE_SHARES]
  assert len(shares) == 12 and shares[5]["share"] == a_FH[1, 1]
  for table, rows in out.items():  # every row is the table's contract
    assert all(set(r) == set(table.columns) for r in rows)
  assert feature_data.feature_tables(key, lm_head=False, **kw)[tables.SAE_LOGITS] == []  # no trained LM head


@pytest.mark.slow  # one `headspec sae` on the tests' tiny decoder, then the atlas
def test_headspec_sae_writes_the_feature_tables_and_the_atlas_their_pages(train_tiny_decoder, synthetic_data_dir,
                                                                           tmp_path):  # fmt: skip
  from test_sae import SMALL, sae_cli

  import headspec

  run = train_tiny_decoder(2, (), name="sae_pages")
  tiny = dict(SMALL, sae__features=32, sae__k=4, sae__train_steps=60)
  assert sae_cli(tmp_path, run, synthetic_data_dir, **tiny) == 0
  read = lambda name: headspec.read_table(run, name)
  features, metrics = read("sae_features"), read("sae_metrics")
  eval_tokens = int(metrics[metrics["metric"] == "eval_tokens"]["value"].iloc[0])
  live = features[features["firing_rate"] > 0]
  counts = read("sae_histograms").groupby("feature")["count"].sum()
  assert sorted(counts.index) == sorted(live["feature"])
  for f, rate in zip(live["feature"], live["firing_rate"]):
    assert counts[f] == round(rate * eval_tokens)  # the histogram holds every token where it fires
  shares = read("sae_shares")
  assert len(shares) == 32 * 4
  np.testing.assert_allclose(shares.groupby("feature")["share"].sum(), 1.0, rtol=1e-9)
  top = shares.loc[shares.groupby("feature")["share"].idxmax()].set_index("feature")
  np.testing.assert_allclose(top["share"], features.set_index("feature")["top_head_fraction"].loc[top.index], rtol=1e-9)
  logits = read("sae_logits")
  assert len(logits) == len(live) * 2 * 10 and set(logits["direction"]) == {"promoted", "suppressed"}
  by = logits.groupby(["feature", "direction"])["value"]
  assert (by.min().xs("promoted", level=1) >= by.max().xs("suppressed", level=1)).all()
  build_atlas(run)
  folder = run / "atlas_features" / "sae_pages_step2_z0_topk-f32-k4"
  assert sorted(p.name for p in folder.iterdir()) == sorted(f"f{f}.html" for f in live["feature"])
  html = (folder / f"f{live['feature'].iloc[0]}.html").read_text()
  assert "Direct path" in html and "<mark>" in html and "<svg" in html


def test_a_bad_per_feature_row_is_left_out_with_one_warning(tmp_path, capsys):
  run = write_run(tmp_path / "bad", probes=False, diversity=False, ablation=False, attention=False, sae=True)
  path = tables.path_of(run, tables.SAE_SHARES)
  rows = tables.read(path, tables.SAE_SHARES)
  rows[0] = rows[0] | {"head": "9"}  # the grid has 4 heads
  tables.write(path, rows, tables.SAE_SHARES)
  capsys.readouterr()
  build_atlas(run)
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and "sae/shares.csv:2: head=9 is outside the 4 heads" in err
  assert (run / "atlas_features" / "bad_step1000_z1_topk-f8-k2" / "f0.html").is_file()
