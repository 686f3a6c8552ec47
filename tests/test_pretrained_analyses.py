"""An imported modern decoder through every analysis, end to end: a tiny random Llama (rotary with
Llama-3 scaling, grouped-query attention: 4 query heads over 2 K/V groups) saved as transformers does, then
`headspec attention` (with induction scores), `headspec ablate`, `headspec probe` and the atlas on the
synthetic treebank. Each table describes the 4 query heads of both layers."""

import csv
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
from test_pretrained_families import _tiny  # noqa: E402

pytest.importorskip("transformers")

L, H = 2, 4


def _rows(path):
  with open(path, newline="") as f:
    return list(csv.DictReader(f))


def _heads(rows):
  return {(int(r["layer"]), int(r["head"])) for r in rows if r.get("head", "") not in ("", "-1")}


@pytest.mark.slow  # about a minute on 2 CPU cores: three analyses compile for the model
def test_llama_through_attention_ablation_probe_and_atlas(synthetic_data_dir, tmp_path):
  from headspec.ablation.config import quickstart_ablate_config
  from headspec.ablation.run import run as run_ablation
  from headspec.atlas import build_atlas
  from headspec.attention.config import attention_config
  from headspec.attention.run import run as run_attention
  from headspec.probing.config import probe_config
  from headspec.probing.run import run as run_probe

  model_dir = str(_tiny("llama", str(tmp_path / "models")))
  workdir = tmp_path / "analyses"
  every_head = {(layer, head) for layer in range(L) for head in range(H)}

  c = attention_config()
  c.model.pretrained, c.data_dir, c.treebank = model_dir, str(synthetic_data_dir), "synthetic"
  c.max_sentences, c.report_split, c.clark.min_count = 12, "", 5
  c.roles.bootstrap_resamples, c.pictures.sentences, c.induction.natural_text = 20, (), False
  c.induction.n, c.induction.num_sequences, c.induction.batch_size = 8, 8, 8
  c.induction.corpus, c.induction.seq_len, c.induction.num_tokens = "synthetic", 32, 256
  run_attention(c, workdir)
  assert _heads(_rows(workdir / "attention" / "labels.csv")) == every_head

  a = quickstart_ablate_config(str(synthetic_data_dir))
  a.model.pretrained, a.corpus, a.treebank, a.steps = model_dir, "synthetic", "synthetic", "all"
  a.seq_len, a.num_tokens, a.bootstrap_resamples, a.methods = 32, 256, 20, "zero,importance"
  run_ablation(a, workdir)
  heads = _rows(workdir / "ablation" / "heads.csv")
  assert _heads(heads) == every_head and {r["model"] for r in heads} == {"llama"}

  p = probe_config()
  p.model.pretrained, p.data_dir, p.probe.treebank = model_dir, str(synthetic_data_dir), "synthetic"
  p.probe.tasks, p.probe.residuals, p.probe.eval_splits = ("upos",), False, ("dev",)
  p.probe.l2_grid, p.probe.max_iter, p.probe.bootstrap_resamples = (1e-3,), 50, 20
  run_probe(p, workdir)
  probes = _rows(workdir / "probes" / "results.csv")
  assert _heads(probes) == every_head and all(0.0 <= float(r["accuracy"]) <= 1.0 for r in probes)

  page = build_atlas(workdir)
  assert page.is_file() and "llama" in page.read_text()
