"""The atlas page in a real browser (headless Chromium through Selenium): it loads from disk with no
console error and no network request, the metric menu and step slider redraw the grid, clicking a head
or pressing Enter on it opens its card, and screenshots are kept (tmp dir; $HEADSPEC_ARTIFACTS too).

Needs `apt-get install chromium chromium-driver` and `pip install -e ".[test]"` (selenium); skipped with
that message otherwise."""

import os
import pathlib
import shutil

import pytest
from test_atlas_fixtures import write_run

from headspec.atlas import build_atlas

INSTALL = 'the browser tests need Chromium: apt-get install chromium chromium-driver (and pip install -e ".[test]")'


def _binaries():
  chrome = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
  driver = shutil.which("chromedriver")
  return chrome, driver


@pytest.fixture(scope="module")
def browser():
  webdriver = pytest.importorskip("selenium.webdriver", reason=INSTALL)
  from selenium.webdriver.chrome.service import Service

  chrome, driver = _binaries()
  if not chrome or not driver:
    pytest.fail(INSTALL, pytrace=False) if os.environ.get("CI") else pytest.skip(INSTALL)  # .ci/run installs it
  options = webdriver.ChromeOptions()
  options.binary_location = chrome
  for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1000"):
    options.add_argument(arg)
  options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
  session = webdriver.Chrome(options=options, service=Service(driver))
  yield session
  session.quit()


def _screenshot(browser, tmp_path: pathlib.Path, name: str, full_page: bool = True) -> pathlib.Path:
  if full_page:
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1400, min(max(height, 600), 6000))
  path = tmp_path / name
  assert browser.save_screenshot(str(path)) and path.stat().st_size > 10_000
  artifacts = os.environ.get("HEADSPEC_ARTIFACTS")
  if artifacts:
    pathlib.Path(artifacts).mkdir(parents=True, exist_ok=True)
    shutil.copy(path, pathlib.Path(artifacts) / name)
  browser.set_window_size(1400, 1000)
  return path


def _load(browser, page: pathlib.Path) -> None:
  browser.get_log("browser")
  browser.get_log("performance")  # drop what earlier pages logged
  browser.get(page.resolve().as_uri())
  assert browser.execute_script("return document.readyState") == "complete"


def _check_clean(browser) -> None:
  """No console message at all (errors, CSP violations, warnings), no request but the file itself."""
  messages = browser.get_log("browser")
  assert messages == [], messages
  import json

  requests = [
    json.loads(e["message"])["message"]["params"]["request"]["url"]
    for e in browser.get_log("performance")
    if '"Network.requestWillBeSent"' in e["message"]
  ]
  assert requests and all(url.startswith(("file://", "data:")) for url in requests), requests


def test_atlas_in_browser(browser, tmp_path):
  from selenium.webdriver.common.by import By
  from selenium.webdriver.common.keys import Keys
  from selenium.webdriver.support.select import Select

  run = write_run(tmp_path / "run_a", layers=12, heads=12, steps=(0, 100, 1000, 10000))
  other = write_run(tmp_path / "run_b", layers=12, heads=12, steps=(0, 100, 1000, 10000), seed=1, shift=0.05)
  _load(browser, build_atlas(run, compare=[other]))
  _check_clean(browser)
  assert len(browser.find_elements(By.CSS_SELECTOR, "#grid-0 .cell")) == 144
  assert len(browser.find_elements(By.CSS_SELECTOR, "#grid-1 .cell")) == 144
  cell = browser.find_element(By.ID, "cell-0-1-2")
  assert "layer 1 head 2" in cell.get_attribute("title")

  # The metric menu redraws both grids.
  menu = Select(browser.find_element(By.ID, "metric"))
  assert len(menu.options) > 20
  menu.select_by_value("ablation/zero/loss_delta")
  assert "[" in cell.get_attribute("title")  # this metric has CIs
  assert browser.find_element(By.ID, "cell-1-1-2").text != "·"
  # The step slider: diversity has four steps.
  menu.select_by_value("diversity/attention_entropy")
  slider = browser.find_element(By.ID, "step")
  assert slider.is_displayed() and slider.get_attribute("max") == "3"
  before = cell.text
  browser.execute_script("arguments[0].value = 0; arguments[0].dispatchEvent(new Event('input'))", slider)
  assert browser.find_element(By.ID, "step-label").text.startswith("0 ")
  assert cell.text != before

  # Clicking a head opens its card: numbers with CIs, role label and scores, relations, pictures.
  menu.select_by_value("probe/upos/synth/dev/selectivity")
  cell.click()
  card = browser.find_element(By.ID, "card")
  assert card.find_element(By.ID, "card-title").text == "run_a · layer 1, head 2"
  assert "95% CI" in card.text and "upos accuracy · dev" in card.text and "control" in card.text
  assert "nsubj" in card.find_element(By.CLASS_NAME, "relations").text
  assert card.find_element(By.CLASS_NAME, "label-chip").text
  assert "<b>html</b> & co" in card.text  # table text is shown as text
  image = card.find_element(By.CSS_SELECTOR, ".images img")
  assert image.get_attribute("src").startswith("data:image/png") and image.get_attribute("naturalWidth") == "240"
  _screenshot(browser, tmp_path, "atlas_compare_12x12.png")

  # Keyboard: from the focused head, arrows move, Enter opens that head's card; Space works too.
  browser.find_element(By.ID, "cell-1-0-0").send_keys(Keys.ARROW_DOWN, Keys.ARROW_RIGHT, Keys.ARROW_RIGHT, Keys.ENTER)
  assert card.find_element(By.ID, "card-title").text == "run_b · layer 1, head 2"
  active = browser.switch_to.active_element
  assert active.get_attribute("id") == "cell-1-1-2"
  active.send_keys(Keys.ARROW_UP, Keys.SPACE)
  assert card.find_element(By.ID, "card-title").text == "run_b · layer 0, head 2"
  assert browser.get_log("browser") == []


def test_partial_run_in_browser(browser, tmp_path):
  """A run with only probes and diversity (what the quickstart writes today)."""
  from selenium.webdriver.common.by import By
  from selenium.webdriver.support.select import Select

  run = write_run(tmp_path / "quick", layers=2, heads=4, steps=(20, 50, 100, 300), ablation=False, attention=False)
  _load(browser, build_atlas(run))
  _check_clean(browser)
  Select(browser.find_element(By.ID, "metric")).select_by_value("diversity/js_distance/mean_other")
  browser.find_element(By.ID, "cell-0-1-3").click()
  card = browser.find_element(By.ID, "card")
  assert "None measured" in card.text and "No role label" in card.text and "No per-head pictures" in card.text
  _screenshot(browser, tmp_path, "atlas_partial.png")
  assert browser.get_log("browser") == []


def test_sae_and_circuit_sections_in_browser(browser, tmp_path):
  """Issues 66 and 67: a head's card lists its strongest SAE features (contexts with the word marked, label
  profiles) and its strongest incoming and outgoing circuit edges; counts are written without decimals."""
  from selenium.webdriver.common.by import By
  from selenium.webdriver.support.select import Select

  run = write_run(tmp_path / "features", layers=3, heads=4, attention=False, sae=True, circuit=True)
  _load(browser, build_atlas(run))
  _check_clean(browser)
  Select(browser.find_element(By.ID, "metric")).select_by_value("sae/z/topk-f8-k2/features_carried")
  cell = browser.find_element(By.ID, "cell-0-1-2")
  assert cell.text == "6" and browser.find_element(By.ID, "cell-0-0-2").text == "·"  # an SAE of layer 1 only
  cell.click()
  card = browser.find_element(By.ID, "card")
  assert "Strongest SAE features" in card.text and "feature specialization S_h 0.400" in card.text
  rows = card.find_elements(By.CSS_SELECTOR, "table.sae-features tr")
  assert [r.text.split()[0] for r in rows[1:]] == ["f3", "f1", "f5", "f6", "f7"]
  assert "0.950" in rows[1].text and "NOUN 0.500" in rows[1].text and "#2 of 2" in rows[4].text
  assert rows[1].find_element(By.TAG_NAME, "mark").text == "rank"  # the context's word, marked as text
  assert "Circuit edges · induction (step 1000)" in card.text and "Ranked by |exact|" in card.text
  incoming = card.find_elements(By.CSS_SELECTOR, "table.circuit-incoming tr")
  assert incoming[0].text.split() == ["from", "input", "exact", "EAP-IG", "(5", "steps)", "EAP"]
  assert incoming[1].text.split() == ["L0H1", "k", "2.000", "1.800", "1.500"]
  assert card.find_elements(By.CSS_SELECTOR, "table.circuit-outgoing tr")[1].text.split()[:2] == ["logits", "logits"]
  _screenshot(browser, tmp_path, "atlas_sae_circuit.png")
  assert browser.get_log("browser") == []


def test_sae_feature_page_in_browser(browser, tmp_path):
  """A head's card links to its features' pages; a feature page loads from disk with no console message and no
  network request, shows the context's word marked, the histogram, the head shares and the logit effect, and
  its link back opens the head's card in the atlas (atlas.html#L1H2)."""
  from selenium.webdriver.common.by import By

  run = write_run(tmp_path / "pages", layers=3, heads=4, probes=False, attention=False, sae=True)
  _load(browser, build_atlas(run))
  _check_clean(browser)
  browser.find_element(By.ID, "cell-0-1-2").click()
  link = browser.find_element(By.CSS_SELECTOR, "#card table.sae-features a.feature-link")
  assert link.text == "f3"
  assert [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#card .sae-more a")] == ["f0"]
  browser.get_log("browser")
  browser.get_log("performance")
  link.click()
  assert browser.current_url.endswith("atlas_features/pages_step1000_z1_topk-f8-k2/f3.html")
  _check_clean(browser)
  assert browser.find_element(By.TAG_NAME, "h1").text == "headspec atlas — pages · feature f3"
  assert browser.find_element(By.CSS_SELECTOR, "table.contexts mark").text == "rank"  # the word, highlighted
  assert len(browser.find_elements(By.CSS_SELECTOR, "svg.histogram rect")) == 2
  assert browser.find_element(By.CSS_SELECTOR, "table.shares").text.split()[2:4] == ["L1H2", "0.950"]
  promoted = browser.find_element(By.CSS_SELECTOR, "table.logits-promoted")
  assert "<b>tok</b>" in promoted.text and "Direct path" in browser.find_element(By.TAG_NAME, "body").text
  _screenshot(browser, tmp_path, "atlas_feature_page.png")
  browser.find_element(By.CSS_SELECTOR, "a.head-link").click()
  assert browser.current_url.endswith("atlas.html#L1H2")
  assert browser.find_element(By.ID, "card-title").text == "pages · layer 1, head 2"
  assert browser.get_log("browser") == []
