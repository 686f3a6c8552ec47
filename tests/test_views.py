"""Attention views in a notebook (headspec/api/views.py): the matplotlib panels and the interactive HTML view
show the captured pattern itself, token texts stay text, and the view works in a real browser offline."""

import json
import re

import numpy as np
import pytest
from test_atlas_browser import _check_clean, _load, browser  # noqa: F401  (the browser fixture)
from test_model import TOKENS, make

import headspec
from headspec.errors import UserError

HOSTILE = ["<b>", "</script><script>alert(1)</script>", "a&b", " sp", "é", "x", "y", "z"]


@pytest.fixture(scope="module")
def cache():
  return headspec.capture(make(), np.asarray(TOKENS)[:1], sites=["pattern"])


def _data(view) -> dict:
  (payload,) = re.findall(r'<script type="application/json">(.*?)</script>', view.html, re.S)
  return json.loads(payload)


def test_the_view_holds_the_captured_pattern_and_the_tokens_as_text(cache):
  T = int(cache.valid_BT[0].sum())
  tokens = (HOSTILE * 4)[:T]
  view = headspec.attention_view(cache, tokens, layer=1)
  data = _data(view)
  pattern_HTS = np.asarray(cache["pattern", 1][0])[:, :T, :T]
  np.testing.assert_allclose(np.asarray(data["attn"]), pattern_HTS, atol=5e-4)
  assert data["tokens"] == tokens and data["layer"] == 1 and view.heads == pattern_HTS.shape[0]
  assert view.html.count("</script>") == 2  # a token's '</script>' cannot end the data block
  assert view._repr_html_() == view.html
  assert headspec.attention_view(cache, tokens).html != view.html  # each view its own element id


def test_plot_attention_draws_each_head_from_the_pattern(cache):
  T = int(cache.valid_BT[0].sum())
  fig = headspec.plot_attention(cache, [f"t{i}" for i in range(T)], layer=0, heads=[2, 0])
  images = [ax.images[0] for ax in fig.axes if ax.images]
  assert [ax.get_title() for ax in fig.axes if ax.images] == ["L0H2", "L0H0"]
  pattern_HTS = np.asarray(cache["pattern", 0][0])
  np.testing.assert_allclose(images[0].get_array(), pattern_HTS[2, :T, :T], atol=1e-6)
  np.testing.assert_allclose(images[1].get_array(), pattern_HTS[0, :T, :T], atol=1e-6)
  assert [t.get_text() for t in fig.axes[0].get_xticklabels()] == [f"t{i}" for i in range(T)]


def test_bad_views_are_one_line(cache):
  with pytest.raises(UserError, match=r"attention_view: layer=7; the model has layers 0\.\.2"):
    headspec.attention_view(cache, layer=7)
  no_pattern = headspec.capture(make(), np.asarray(TOKENS)[:1], sites=["z"])
  with pytest.raises(UserError, match=r"holds no 'pattern'; capture it"):
    headspec.plot_attention(no_pattern)
  with pytest.raises(UserError, match=r"plot_attention: heads=\[4\]; the layer has heads 0\.\.3"):
    headspec.plot_attention(cache, heads=[4])


def test_the_view_in_a_browser_picks_heads_and_shades_tokens(cache, browser, tmp_path):  # noqa: F811
  """Offline in headless Chromium: no console message, no request; clicking head h draws head h's map
  (each row's darkest cell is that head's argmax); hovering a token shades the tokens it attends to."""
  from selenium.webdriver.common.action_chains import ActionChains
  from selenium.webdriver.common.by import By

  T = int(cache.valid_BT[0].sum())
  page = headspec.attention_view(cache, (HOSTILE * 4)[:T], layer=2).save(tmp_path / "view.html")
  _load(browser, page)
  pattern_HTS = np.asarray(cache["pattern", 2][0])[:, :T, :T]
  for h in (3, 1):
    browser.find_element(By.CSS_SELECTOR, f'.hs-heads button[data-head="{h}"]').click()
    alphas = browser.execute_script(
      "return [...document.querySelectorAll('.hs-grid tr')].slice(1).map(r => [...r.querySelectorAll('td')]"
      ".map(td => { const m = td.style.backgroundColor.match(/[\\d.]+/g); return m.length > 3 ? +m[3] : 1; }))"
    )
    rows = np.asarray(alphas)
    assert rows.shape == (T, T)
    np.testing.assert_allclose(rows, pattern_HTS[h] / pattern_HTS[h].max(), atol=6e-3)  # colours: 1/255 steps
    assert "head " + str(h) in browser.find_element(By.CSS_SELECTOR, ".hs-note").text
  spans = browser.find_elements(By.CSS_SELECTOR, ".hs-toks span")
  assert [s.text for s in spans][:2] == [t.strip() for t in HOSTILE[:2]]
  ActionChains(browser).move_to_element(spans[T - 1]).perform()
  shaded = [bool(s.get_attribute("style") and "rgba" in s.get_attribute("style")) for s in spans]
  assert sum(shaded) == T
  _check_clean(browser)
