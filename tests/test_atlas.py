"""headspec atlas: tables -> JSON (headspec.atlas.data), the self-contained page, the CLI and its errors.
The page in a real browser: tests/test_atlas_browser.py."""

import json
import re

import pytest
from test_atlas_fixtures import write_run

from headspec import cli, tables
from headspec.atlas import PAGE_NAME, atlas_data, build_atlas, run_data
from headspec.errors import UserError


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
  return write_run(tmp_path_factory.mktemp("runs") / "full", layers=3, heads=4)


def _embedded(page_text: str) -> dict:
  blob = re.search(r'<script type="application/json" id="atlas-data">(.*?)</script>', page_text, re.S).group(1)
  return json.loads(blob)


def test_run_data_has_every_table_as_metrics(full_run):
  data = run_data(full_run)
  assert (data["layers"], data["heads"], data["model"]) == (3, 4, "full")
  ids = {m["id"] for m in data["metrics"]}
  for expected in (
    "probe/upos/synth/dev/accuracy",
    "probe/upos/synth/dev/selectivity",
    "probe/upos/synth/test/selectivity@random",  # the random-weights control, as its own metric
    "diversity/attention_entropy",
    "diversity/js_distance/mean_other",
    "ablation/zero/loss_delta",
    "ablation/importance/score",
    "clark/synth/dev/nsubj/dependent_to_head",
    "role/treebank/induction",
    "label",
  ):
    assert expected in ids, expected
  by_id = {m["id"]: m for m in data["metrics"]}
  accuracy = by_id["probe/upos/synth/dev/accuracy"]
  assert accuracy["steps"] == [0, 100, 1000]
  cell = accuracy["grids"]["1000"][1][2]
  assert cell["ci"][1] - cell["ci"][0] == pytest.approx(0.04) and "control" in cell["note"]
  assert by_id["ablation/zero/loss_delta"]["diverging"] and not accuracy["diverging"]
  assert by_id["label"]["categorical"]
  # The residual stream (head -1) and embedding output (layer -1) are beside the grid, not in it.
  notes = data["layer_notes"]["probe/upos/synth/dev/accuracy"]
  assert set(notes["residual"]["1000"]) == {"0", "1", "2"} and notes["embedding"]["1000"] is not None
  # Cards: best-matched relations (most accurate first), interactions, per-head pictures.
  extra = data["heads_extra"]["1,2"]
  assert extra["relations"][0]["relation"] == "nsubj" and len(extra["relations"]) == 5
  assert extra["interactions"][0]["other"] == [0, 0]
  assert [im["name"] for im in extra["images"]] == ["L1H2_sentence0.png"]
  assert data["heads_extra"]["0,1"]["images"][0]["src"].startswith("data:image/png;base64,")
  assert [im["name"] for im in data["images"]] == ["clark_summary.png"]
  assert len(data["training"]) > 5


def test_run_with_only_probes_and_diversity(tmp_path):
  run = write_run(tmp_path / "partial", ablation=False, attention=False)
  data = run_data(run)
  groups = {m["group"] for m in data["metrics"]}
  assert groups == {
    "Probe accuracy",
    "Probe selectivity",
    "Diversity (per head)",
    "Diversity (mean over the layer's other heads)",
  }
  assert data["images"] == [] and data["tables"] == ["probes/results.csv", "diversity/results.csv"]
  only_ablation = write_run(tmp_path / "ablation_only", probes=False, diversity=False, attention=False)
  assert {m["group"] for m in run_data(only_ablation)["metrics"]} == {"Ablation"}


def test_another_models_diversity_rows_are_their_own_metric(tmp_path):
  """Issue 62: diversity/results.csv holds every model analysed into the folder; the atlas shows the
  primary model's under the plain ids and another model's as `@<model>`, never one over the other."""
  run = write_run(tmp_path / "two", ablation=False, attention=False)
  path = tables.path_of(run, tables.DIVERSITY)
  own = tables.read(path, tables.DIVERSITY)
  other = [r | {"model": "minilm", "value": "9.0"} for r in own if r["metric"] == "attention_entropy"]
  tables.merge(path, other, tables.DIVERSITY)
  by_id = {m["id"]: m for m in run_data(run)["metrics"]}
  mine = by_id["diversity/attention_entropy"]
  step = str(mine["steps"][-1])
  assert mine["grids"][step][0][0]["v"] < 9.0  # the fixture's values are below 3
  theirs = by_id["diversity/attention_entropy@minilm"]
  assert theirs["grids"][step][0][0]["v"] == 9.0 and theirs["label"] == "attention entropy — model minilm"


def test_page_is_self_contained_and_escapes_data(full_run, tmp_path):
  path = build_atlas(full_run)
  assert path == full_run / PAGE_NAME
  text = path.read_text()
  assert not list(full_run.glob(".atlas.html.tmp*"))  # written atomically: no temporary file left
  # No external reference: nothing to fetch (the only URL is the SVG namespace, an identifier).
  assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", text)
  assert set(re.findall(r"https?://[^\s\"'<>]+", text)) <= {"http://www.w3.org/2000/svg"}
  assert "default-src 'none'" in text  # and the browser is told to refuse any fetch
  # Table text is data, never markup: the label rule's "<b>html</b>" stays escaped inside the JSON.
  assert text.count("</script>") == 2 and "<b>html</b>" not in text
  data = _embedded(text)
  rules = {
    c["note"] for m in data["runs"][0]["metrics"] if m["id"] == "label" for row in m["grids"]["1000"] for c in row
  }
  assert any("<b>html</b> & co" in r for r in rules)


def test_compare_puts_both_runs_in_one_page(full_run, tmp_path):
  other = write_run(tmp_path / "other", layers=2, heads=2, seed=3, attention=False)
  data = _embedded(build_atlas(full_run, compare=[other]).read_text())
  assert [r["name"] for r in data["runs"]] == ["full", "other"]
  assert (data["runs"][1]["layers"], data["runs"][1]["heads"]) == (2, 2)
  # Shared ids: the second run's own model is not "@other", so the menus line up.
  assert "probe/upos/synth/dev/selectivity" in {m["id"] for m in data["runs"][1]["metrics"]}
  assert build_atlas(full_run, compare=str(other)) == full_run / PAGE_NAME  # one path is fine too


def test_bad_input_is_one_user_error(tmp_path, full_run):
  with pytest.raises(UserError, match="no results tables"):
    build_atlas(tmp_path)
  with pytest.raises(UserError, match="no such run directory"):
    build_atlas(tmp_path / "missing")
  with pytest.raises(UserError, match="--compare: no such run directory"):
    atlas_data(full_run, [tmp_path / "nope"])
  foreign = tmp_path / "foreign"
  tables.path_of(foreign, tables.PROBES).parent.mkdir(parents=True)
  tables.path_of(foreign, tables.PROBES).write_text("a,b\n1,2\n")
  with pytest.raises(UserError, match="columns a,b"):
    build_atlas(foreign)
  assert not (tmp_path / PAGE_NAME).exists()


def test_cli(full_run, tmp_path, capsys):
  other = write_run(tmp_path / "b", layers=2, heads=2, ablation=False, attention=False)
  assert cli.main(["headspec", "atlas", f"--workdir={full_run}", f"--compare={other}"]) == 0
  assert capsys.readouterr().out.strip() == str(full_run / PAGE_NAME)
  assert len(_embedded((full_run / PAGE_NAME).read_text())["runs"]) == 2
  assert cli.main(["headspec", "atlas", f"--workdir={full_run}", "--compare", str(other)]) == 0
  capsys.readouterr()
  for argv, message in (
    (["atlas", f"--workdir={full_run}", f"--compare={tmp_path / 'nope'}"], "--compare: no such run directory"),
    (["atlas", f"--workdir={tmp_path / 'empty'}"], "no such run directory"),
    (["atlas"], "atlas needs --workdir"),
    (["atlas", f"--workdir={full_run}", "extra"], "atlas takes only --compare"),
  ):
    cli.FLAGS.unparse_flags()  # absl keeps flag values between in-process calls
    assert cli.main(["headspec", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("headspec: error: ") and message in err and len(err.strip().splitlines()) == 1


def test_headspec_exposes_build_atlas_lazily(full_run):
  import headspec

  assert headspec.build_atlas is build_atlas
  frame = headspec.read_table(full_run, "probes")
  assert frame["step"].dtype == "int64" and len(frame)
  with pytest.raises(UserError, match="no table"):
    headspec.read_table(full_run, "nope")


@pytest.fixture(scope="module")
def circuit_run(tmp_path_factory):
  """Only the structural-probe and patching tables (known answers: tests/test_atlas_fixtures.py)."""
  run = tmp_path_factory.mktemp("runs") / "circuit"
  return write_run(run, probes=False, diversity=False, ablation=False, attention=False, structural=True, patching=True)


def test_structural_probe_results_are_head_metrics(circuit_run):
  data = run_data(circuit_run)
  assert data["tables"] == ["probes/structural.csv", "patching/results.csv"]
  by_id = {m["id"]: m for m in data["metrics"]}
  uuas = by_id["structural/distance/synth/dev/uuas"]
  assert uuas["group"] == "Structural probe" and "distance uuas · dev" in uuas["label"]
  grid = uuas["grids"]["1000"]
  best = max((c["v"], layer, head) for layer, row in enumerate(grid) for head, c in enumerate(row))
  assert best[1:] == (1, 2) and grid[1][2]["ci"][1] - grid[1][2]["ci"][0] == pytest.approx(0.06)
  assert "rank 8" in grid[1][2]["note"] and "n=80 sentences" in grid[1][2]["note"]
  for expected in ("structural/distance/synth/test/dspr", "structural/depth/synth/dev/root_acc"):
    assert expected in by_id, expected
  notes = data["layer_notes"]["structural/depth/synth/test/nspr"]  # head −1 and layer −1: beside the grid
  assert set(notes["residual"]["1000"]) == {"0", "1", "2"} and notes["embedding"]["1000"] is not None


def test_patching_effect_is_a_head_metric_and_on_its_card(circuit_run):
  data = run_data(circuit_run)
  by_id = {m["id"]: m for m in data["metrics"]}
  assert {m["group"] for m in data["metrics"]} == {"Structural probe", "Patching"}
  assert sorted(i for i in by_id if i.startswith("patching/")) == [
    "patching/induction/z/activation/denoising",
    "patching/induction/z/attribution/denoising",
    "patching/induction/z/path_logits/denoising",
  ]  # resid_pre has no head: it is the resid column, not a metric
  z = by_id["patching/induction/z/activation/denoising"]
  assert z["diverging"] and z["steps"] == [1000]
  grid = z["grids"]["1000"]
  # (value − base) / (source − base) with base 1, source 3, at the head's strongest position (the last)
  assert (grid[1][2]["v"], grid[0][1]["v"], grid[2][3]["v"]) == (1.0, -0.5, 0.25)
  assert grid[1][2]["note"] == "position 3 of 0–3"
  assert by_id["patching/induction/z/attribution/denoising"]["grids"]["1000"][1][2]["v"] == 0.5  # already a change
  path = by_id["patching/induction/z/path_logits/denoising"]["grids"]["1000"][0][0]
  assert path["v"] == pytest.approx(0.1) and path["note"] == "all positions"
  assert data["layer_notes"]["patching/induction/z/activation/denoising"]["residual"]["1000"] == {
    "0": 1.0,
    "1": 1.0,
    "2": 1.0,
  }
  card = data["heads_extra"]["1,2"]["patching"]
  assert [x["label"] for x in card] == [
    "induction · z · activation (denoising)",
    "induction · z · attribution (denoising)",
  ]
  assert card[0]["positions"] == [[0, 0.0], [1, 0.0], [2, 0.0], [3, 1.0]]
  page = build_atlas(circuit_run).read_text()
  assert "Patching by position" in page and _embedded(page)["runs"][0]["heads_extra"]["1,2"]["patching"] == card


def test_patching_without_its_summary_is_left_out_with_a_warning(tmp_path, capsys):
  run = write_run(tmp_path / "nosummary", probes=False, diversity=False, ablation=False, attention=False, patching=True)
  tables.path_of(run, tables.PATCHING_SUMMARY).unlink()
  data = run_data(run)
  err = capsys.readouterr().err
  assert "summary.csv: no base and source logit difference for" in err and err.count("\n") == 1
  assert data["metrics"] == [] and data["tables"] == ["patching/results.csv"]
