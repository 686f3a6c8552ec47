"""headspec atlas: tables -> JSON (headspec.atlas.data), the self-contained page, the CLI and its errors.
The page in a real browser: tests/test_atlas_browser.py."""

import json
import re

import pytest
from test_atlas_fixtures import write_run

from headspec.atlas import PAGE_NAME, atlas_data, build_atlas, run_data
from headspec.cli import main as cli
from headspec.errors import UserError
from headspec.io import tables


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
  """Diversity/results.csv holds every model analysed into the folder; the atlas shows the
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


# ------------------------------------------------------------------------------ SAE features and circuit edges


@pytest.fixture(scope="module")
def sae_circuit_run(tmp_path_factory):
  """Only the SAE and circuit tables (known answers: tests/test_atlas_fixtures.py write_sae, write_circuit)."""
  run = tmp_path_factory.mktemp("runs") / "features"
  return write_run(run, probes=False, diversity=False, ablation=False, attention=False, sae=True, circuit=True)


def test_sae_head_numbers_are_metrics_and_the_card_lists_the_strongest_features(sae_circuit_run):
  """Sae/heads.csv's numbers colour the grid (per site and SAE, every step, another model as its own);
  head (1, 2)'s card lists the live features it carries, its largest shares first, with contexts and labels."""
  data = run_data(sae_circuit_run)
  assert data["tables"] == ["sae/heads.csv", "sae/features.csv", "circuit/edges.csv"]
  by_id = {m["id"]: m for m in data["metrics"]}
  spec = by_id["sae/z/topk-f8-k2/specialization"]
  assert spec["group"] == "SAE features" and spec["steps"] == [0, 100, 1000] and not spec["integer"]
  assert (
    spec["label"] == "feature specialization S_h · topk-f8-k2 on z" and "Kissane et al. 2024" in spec["description"]
  )
  cell = spec["grids"]["1000"][1][2]
  assert cell["v"] == pytest.approx(0.3 + 0.1) and cell["note"] == "SAE FVU 0.125, L0 2.0, 12.5% dead, 8 features"
  assert spec["grids"]["1000"][0][2] is None  # the SAE is layer 1's
  carried = by_id["sae/z/topk-f8-k2/features_carried"]
  assert carried["integer"] and carried["grids"]["1000"][1][2]["v"] == 6 and carried["grids"]["0"][1][0]["v"] == 8
  assert "sae/z/topk-f8-k2/specialization@minilm" in by_id  # another model: its own metric, not on the cards
  assert not [i for i in by_id if "probe_selectivity" in i]  # probes/results.csv's metric already
  (card,) = data["heads_extra"]["1,2"]["sae"]
  assert (card["site"], card["sae"], card["layer"], card["step"]) == ("z", "topk-f8-k2", 1, 1000)
  assert card["specialization"] == pytest.approx(0.4) and card["exclusive_features"] == 1 and card["carried"] == 6
  assert card["quality"] == "SAE FVU 0.125, L0 2.0, 12.5% dead, 8 features"
  features = card["features"]
  assert [f["feature"] for f in features] == [3, 1, 5, 6, 7]  # f4 (share 0.99) is dead; f0 (3rd) is the 6th
  assert [f["share"] for f in features] == [0.95, 0.7, 0.6, None, None] and [f["place"] for f in features] == [
    0,
    0,
    0,
    1,
    1,
  ]
  assert features[1]["heads"] == [2, 1] and features[1]["firing_rate"] == 0.2 and features[1]["mean_activation"] == 1.5
  assert features[0]["contexts"] == [["ctx 3 [[rank]] 0", 4.0], ["ctx 3 [[rank]] 1", 3.0], ["ctx 3 [[rank]] 2", 2.0]]
  upos, deprel = features[0]["labels"]  # head_distance: no label, no profile in the fixture, so not shown
  assert upos == {
    "set": "upos",
    "best": "NOUN",
    "selectivity": 0.25,
    "top": [["NOUN", 0.5], ["VERB", 0.3], ["DET", 0.2]],
  }
  assert deprel["top"] == [["nsubj", 1.0]] and deprel["best"] == "nsubj"
  # head 3 carries f0 (its largest share) only; layers without an SAE have no section
  assert [f["feature"] for f in data["heads_extra"]["1,3"]["sae"][0]["features"]] == [0]
  assert all("sae" not in data["heads_extra"].get(f"{layer},{h}", {}) for layer in (0, 2) for h in range(4))
  page = build_atlas(sae_circuit_run).read_text()
  assert "Strongest SAE features" in page and _embedded(page)["runs"][0]["heads_extra"]["1,2"]["sae"] == [card]


def test_an_sae_per_layer_fills_each_layer_and_its_cards(tmp_path):
  """`headspec sae --config.layers=all` writes one SAE per layer under one name: one metric, a row per layer."""
  from test_atlas_fixtures import write_sae

  run = write_run(tmp_path / "layers", probes=False, diversity=False, ablation=False, attention=False, sae=True)
  write_sae(run, 4, (0, 100, 1000), layer=0)
  data = run_data(run)
  grid = {m["id"]: m for m in data["metrics"]}["sae/z/topk-f8-k2/features_carried"]["grids"]["1000"]
  assert data["layers"] == 2 and [grid[layer][2]["v"] for layer in (0, 1)] == [6, 6]  # the tables give the shape
  for layer in (0, 1):
    (card,) = data["heads_extra"][f"{layer},2"]["sae"]
    assert card["layer"] == layer and [f["feature"] for f in card["features"]] == [3, 1, 5, 6, 7]


def test_circuit_edges_are_metrics_and_the_card_lists_the_strongest_edges(sae_circuit_run):
  """Per method, each head's strongest incoming and outgoing edge colours the grid (every step);
  the card lists the last step's top edges each way, ranked by the exact scores, every method's beside."""
  data = run_data(sae_circuit_run)
  assert (data["layers"], data["heads"]) == (3, 4)  # no config.json: the tables' shape, the logits (layer 3) not a row
  by_id = {m["id"]: m for m in data["metrics"]}
  assert sorted(i for i in by_id if i.startswith("circuit/")) == [
    f"circuit/induction/{m}/{side}" for m in ("eap", "eap_ig-5", "exact") for side in ("incoming", "outgoing")
  ]
  incoming = by_id["circuit/induction/exact/incoming"]
  assert incoming["diverging"] and incoming["steps"] == [0, 100, 1000] and incoming["group"] == "Circuit edges"
  assert incoming["grids"]["1000"][1][2] == {"v": 2.0, "note": "from L0H1 into k; 18 incoming edges"}
  assert incoming["grids"]["0"][1][2]["v"] == 5.0  # step 0: embed → L1H2's q
  assert incoming["grids"]["1000"][0][1]["note"].endswith("; 3 incoming edges")  # layer 0: the embeddings' only
  eap = by_id["circuit/induction/eap/incoming"]["grids"]["1000"][1][2]
  assert eap == {"v": 3.0, "note": "from embed into v; 18 incoming edges"}  # EAP's own strongest edge
  assert by_id["circuit/induction/exact/outgoing"]["grids"]["1000"][0][1]["note"].startswith("into L1H2's k;")
  assert by_id["circuit/induction/exact/outgoing"]["grids"]["1000"][1][2]["note"].startswith("into logits;")
  assert "EAP-IG (5 steps)" in by_id["circuit/induction/eap_ig-5/incoming"]["label"]
  (card,) = data["heads_extra"]["1,2"]["circuit"]
  assert (card["task"], card["step"], card["methods"]) == ("induction", 1000, ["exact", "EAP-IG (5 steps)", "EAP"])
  edges = [(e["upstream"], e["input"], e["scores"]) for e in card["incoming"][:3]]
  assert edges == [
    ("L0H1", "k", [2.0, 1.8, 1.5]),
    ("embed", "q", [-1.0, -0.9, -0.75]),
    ("embed", "v", [0.05, 0.05, 3.0]),
  ]
  assert len(card["incoming"]) == 5 and card["incoming_total"] == 18  # embed, L0's 4 heads and MLP0 × q, k, v
  assert card["outgoing"][0] == {
    "upstream": "L1H2",
    "downstream": "logits",
    "input": "logits",
    "scores": [1.5, 1.35, 1.125],
  }
  (source,) = data["heads_extra"]["0,1"]["circuit"]
  assert (source["outgoing"][0]["downstream"], source["outgoing"][0]["input"]) == ("L1H2", "k")
  assert all(0 <= int(h) < 4 and 0 <= int(layer) < 3 for layer, h in (k.split(",") for k in data["heads_extra"]))
  page = build_atlas(sae_circuit_run).read_text()
  assert "Circuit edges · " in page and _embedded(page)["runs"][0]["heads_extra"]["1,2"]["circuit"] == [card]


def test_grouped_query_key_and_value_edges_are_on_every_head_of_the_group(tmp_path):
  """A k or v edge of a grouped-query model enters a K/V group (L1G1): it is an incoming edge of each of the
  group's heads (heads 2 and 3 of 4 with 2 groups), named with the group, and of no other head."""
  run = write_run(tmp_path / "gqa", probes=False, diversity=False, ablation=False, attention=False)
  from test_atlas_fixtures import write_circuit

  write_circuit(run, 3, 4, (0, 1000), groups=2)
  data = run_data(run)
  for head in (2, 3):
    top = data["heads_extra"][f"1,{head}"]["circuit"][0]["incoming"][0]
    assert (top["upstream"], top["downstream"], top["input"], top["scores"][0]) == ("L0H1", "L1G1", "k", 2.0)
  assert all(e["downstream"] != "L1G1" for e in data["heads_extra"]["1,0"]["circuit"][0]["incoming"])
  cell = {m["id"]: m for m in data["metrics"]}["circuit/induction/exact/incoming"]["grids"]["1000"][1][3]
  assert cell["note"] == "from L0H1 into k of L1G1; 18 incoming edges"  # 6 nodes × its q and the group's k, v


def test_key_and_value_groups_that_do_not_divide_the_heads_are_one_warning(tmp_path, capsys):
  """edges.csv names a third K/V group (L1G2) of a 4-head model: its groups cannot be the heads' (h // (H/G)),
  so its key and value edges are left off the heads, with one warning; the query edges stay."""
  from test_atlas_fixtures import write_circuit

  run = write_run(tmp_path / "odd", probes=False, diversity=False, ablation=False, attention=False)
  write_circuit(run, 3, 4, (1000,), groups=2)
  path = tables.path_of(run, tables.CIRCUIT_EDGES)
  edges = tables.read(path, tables.CIRCUIT_EDGES)
  for r in edges:
    if r["downstream"] == "L1G1" and r["upstream"] == "MLP0":
      r["downstream"], r["downstream_head"] = "L1G2", "2"
  tables.write(path, edges, tables.CIRCUIT_EDGES)
  capsys.readouterr()
  data = run_data(run)
  (err,) = capsys.readouterr().err.strip().splitlines()
  assert "edges.csv: odd's 3 K/V groups do not divide the 4 heads; its key and value edges are left off" in err
  incoming = data["heads_extra"]["1,2"]["circuit"][0]["incoming"]
  assert {e["input"] for e in incoming} == {"q"} and data["heads_extra"]["1,2"]["circuit"][0]["incoming_total"] == 6


def test_no_sae_or_circuit_tables_no_section(full_run):
  data = run_data(full_run)
  assert not [m for m in data["metrics"] if m["id"].startswith(("sae/", "circuit/"))]
  assert not [k for k, extra in data["heads_extra"].items() if "sae" in extra or "circuit" in extra]


def test_malformed_sae_and_circuit_rows_are_left_out_with_one_warning_each(tmp_path, capsys):
  """A features.csv `heads` cell that is no head list or names a head outside the grid, and an edge into an
  unknown input or from a layer outside the grid, are left out (one warning per file, naming its line); the
  page is still written."""
  run = write_run(
    tmp_path / "bad", probes=False, diversity=False, ablation=False, attention=False, sae=True, circuit=True
  )
  path = tables.path_of(run, tables.SAE_FEATURES)
  rows = tables.read(path, tables.SAE_FEATURES)
  line = 2 + next(i for i, r in enumerate(rows) if r["step"] == "1000" and r["feature"] == "3")
  rows[line - 2]["heads"] = "2;x"
  rows[line - 1]["heads"] = "2;9"  # feature 4 (dead anyway)
  tables.write(path, rows, tables.SAE_FEATURES)
  edges_path = tables.path_of(run, tables.CIRCUIT_EDGES)
  edges = tables.read(edges_path, tables.CIRCUIT_EDGES)
  edges[0]["input"] = "x"
  edges[1]["upstream_layer"] = "100000"  # beyond any grid (no config.json: the tables give the shape)
  tables.write(edges_path, edges, tables.CIRCUIT_EDGES)
  capsys.readouterr()
  data = run_data(run)
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 2, err
  assert f"sae/features.csv:{line}: heads='2;x' is not ';'-separated head numbers; left out 2 row(s)" in err[0]
  assert "circuit/edges.csv:2: input='x' is not one of q, k, v, mlp, logits; left out 2 row(s)" in err[1]
  assert [f["feature"] for f in data["heads_extra"]["1,2"]["sae"][0]["features"]] == [1, 5, 6, 7, 0]
  assert data["heads_extra"]["1,2"]["circuit"][0]["incoming"][0]["upstream"] == "L0H1"
  assert build_atlas(run).is_file()


@pytest.mark.slow  # trains the tiny decoder 2 steps, then `headspec sae` and `headspec circuit` on it (compiles)
def test_cards_read_the_tables_headspec_sae_and_circuit_write(train_tiny_decoder, synthetic_data_dir):
  """On real tables (an SAE of layer 1's z; EAP and EAP-IG edge scores): each head's card lists as many
  carried features as sae/heads.csv counts, only features carrying it, its largest shares first, with the
  contexts of contexts.csv; its first incoming and outgoing edges are the largest |EAP-IG| of edges.csv."""
  from headspec.patching import circuit as circuit_run
  from headspec.sae import run as sae_run
  from headspec.sae.config import sae_config

  run = train_tiny_decoder(2, name="atlas_real")
  s = sae_config()
  s.data_dir, s.layer, s.train_tokens, s.eval_tokens = str(synthetic_data_dir), 1, 1000, 500
  s.sae.features, s.sae.k, s.sae.train_steps, s.sae.batch_size, s.sae.warmup_steps = 32, 4, 20, 256, 2
  s.analysis.treebank, s.analysis.max_sentences, s.analysis.batch_tokens, s.analysis.top = "synthetic", 10, 512, 3
  sae_run.run(s, run)
  c = circuit_run.circuit_config()
  c.count, c.induction_n, c.methods, c.ig_steps, c.sizes, c.random_sets = 4, 3, "eap,eap_ig", 2, "5", 0
  c.figure_edges = 0  # no figure: the cards read only the tables
  circuit_run.run(c, run)
  data = run_data(run)
  read = lambda t: tables.read_frame(tables.path_of(run, t), t)
  features, heads, contexts, edges = (read(t) for t in (tables.SAE_FEATURES, tables.SAE_HEADS, tables.SAE_CONTEXTS,
                                                        tables.CIRCUIT_EDGES))  # fmt: skip
  live = features[features["firing_rate"] > 0]
  for h in range(4):
    (card,) = data["heads_extra"][f"1,{h}"]["sae"]
    counted = heads[(heads["head"] == h) & (heads["metric"] == "features_carried")]["value"]
    assert card["carried"] == int(counted.iloc[0]) > 0
    assert 0 < len(card["features"]) == min(5, card["carried"])
    tops = live[live["top_head"] == h].sort_values("top_head_fraction", ascending=False)["feature"].tolist()
    assert [f["feature"] for f in card["features"] if f["place"] == 0] == tops[: len(card["features"])][: sum(
      f["place"] == 0 for f in card["features"])]  # fmt: skip
    for f in card["features"]:
      row = live[live["feature"] == f["feature"]].iloc[0]
      assert str(h) in row["heads"].split(";") and f["heads"] == [int(x) for x in row["heads"].split(";")]
      mine = contexts[contexts["feature"] == f["feature"]].sort_values("rank")["context"].tolist()
      assert [x[0] for x in f["contexts"]] == mine[:3] and all("[[" in x for x in mine)
      assert {x["set"] for x in f["labels"]} <= {"upos", "deprel", "head_distance"}
  ig = edges[edges["method"] == "eap_ig"]
  for layer, h in ((0, 1), (1, 2)):
    (card,) = data["heads_extra"][f"{layer},{h}"]["circuit"]
    assert card["methods"] == ["EAP-IG (2 steps)", "EAP"]
    into = ig[(ig["downstream_layer"] == layer) & (ig["downstream_head"] == h) & ig["input"].isin(["q", "k", "v"])]
    out = ig[(ig["upstream_layer"] == layer) & (ig["upstream_head"] == h)]
    assert card["incoming_total"] == len(into) and card["outgoing_total"] == len(out)
    for side, rows in (("incoming", into), ("outgoing", out)):
      best = rows.loc[rows["score"].abs().idxmax()]
      first = card[side][0]
      assert (first["upstream"], first["downstream"], first["input"]) == tuple(
        best[["upstream", "downstream", "input"]]
      )
      assert first["scores"][0] == pytest.approx(best["score"])


def test_the_atlas_knows_every_per_head_patching_site():
  """atlas/head_data.py keeps a JAX-free copy of the sites with a head axis; it must follow headspec.model.sites.SITES."""
  from headspec.atlas import head_data
  from headspec.model.sites import SITES

  assert set(head_data.PATCHING_HEAD_SITES) == {site for site, axes in SITES.items() if "H" in axes}
