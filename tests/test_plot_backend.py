"""headspec leaves a notebook's plotting alone: importing any module keeps the backend the user chose, and
every figure is a Figure made outside pyplot (headspec/words/figures.py). pyplot never holds one (nothing shows
it twice, nothing leaks), a file is still written, and a figure returned to a notebook shows once, as PNG."""

import json
import os
import subprocess
import sys

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.figure import Figure

from headspec.io import remote
from headspec.words import figures

PNG = b"\x89PNG\r\n\x1a\n"

# Imports every module of headspec after choosing a backend other than Agg, as a notebook has one. `__main__`
# modules are left out: they are the command line itself (importing one runs it). Every other module must
# import: a failure is reported, not skipped.
_IMPORT_ALL = """
import importlib, json, pkgutil
import matplotlib
matplotlib.use("svg")
import headspec
failed, names = {}, []
for m in pkgutil.walk_packages(headspec.__path__, "headspec.", onerror=lambda n: failed.setdefault(n, "walk")):
  if m.name.rsplit(".", 1)[-1] == "__main__":
    continue
  names.append(m.name)
  try:
    importlib.import_module(m.name)
  except Exception as e:
    failed[m.name] = repr(e)
print(json.dumps({"backend": matplotlib.get_backend(), "failed": failed, "modules": names}))
"""


def test_importing_every_module_keeps_the_chosen_backend():
  env = {k: v for k, v in os.environ.items() if k != "MPLBACKEND"}
  done = subprocess.run([sys.executable, "-c", _IMPORT_ALL], env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-3000:]
  result = json.loads(done.stdout.strip().splitlines()[-1])
  assert result["failed"] == {}
  assert {"headspec.sae.plots", "headspec.ablation.plots", "headspec.probing.report", "headspec.api.views"} <= set(
    result["modules"]
  )
  assert result["backend"] == "svg"


@pytest.fixture
def drawn(monkeypatch):
  """The figures each drawing call saved; `matplotlib.use` and pyplot's figure list must stay untouched."""
  saved, switched = [], []
  save_figure = remote.save_figure

  def recording(fig, path, **kwargs):
    saved.append(fig)
    return save_figure(fig, path, **kwargs)

  monkeypatch.setattr(remote, "save_figure", recording)
  monkeypatch.setattr(matplotlib, "use", lambda *a, **k: switched.append(a))
  open_before = plt.get_fignums()
  yield saved
  assert not switched, f"matplotlib.use{switched[0]} called"
  assert plt.get_fignums() == open_before == []
  for fig in saved:
    assert isinstance(fig, Figure) and fig.canvas.manager is None  # pyplot's figures have a manager


def _pngs(folder, *names):
  for name in names:
    assert (folder / name).read_bytes()[:8] == PNG, name


def test_ablation_figures_are_written_without_pyplot(drawn, tmp_path):
  from headspec.ablation import plots

  plots.heads([dict(method="zero", metric="loss", layer=l, head=h, value=0.1 * h) for l in (0, 1) for h in (0, 1)],
              2, 2, tmp_path / "heads.png")  # fmt: skip
  plots.pruning([dict(metric="loss", ranking="r", fraction_pruned=f, value=f) for f in (0.0, 0.5)], tmp_path / "p.png")
  plots.gates([dict(layer=-1, penalty=p, heads_kept=k, metric="loss", value=v) for p, k, v in ((0.1, 3, 2.0), (1, 1, 3))],
              tmp_path / "gates.png")  # fmt: skip
  causal = [dict(task="upos", metric="probe_accuracy", k=1, selection="selective", value=0.5, ci_low=0.4, ci_high=0.6)]
  causal += [dict(task="upos", metric="probe_accuracy", k=1, selection="random_layer_matched", value=0.7)]
  plots.causal(causal, tmp_path / "causal.png")
  pair = dict(layer_a=0, head_a=0, layer_b=0, head_b=1, interaction=0.3, metric="loss")
  plots.interactions([pair, pair | dict(head_b=2, interaction=-0.1)], tmp_path / "interactions.png")
  assert len(drawn) == 5
  _pngs(tmp_path, "heads.png", "p.png", "gates.png", "causal.png", "interactions.png")


def test_sae_and_probing_figures_are_written_without_pyplot(drawn, tmp_path):
  from headspec.probing import complexity, report
  from headspec.sae import plots

  heads = [dict(metric=m, layer=0, head=h, value=0.5) for m in ("features_carried", "specialization") for h in (0, 1)]
  plots.heads(heads, 2, tmp_path / "heads.png", "t")
  plots.entropy([dict(layer=0, entropy_bits=b, firing_rate=0.1) for b in (0.2, 0.9)], 2, tmp_path / "entropy.png", "t")
  rows = [dict(layer=l, head=h, accuracy=0.5, selectivity=0.1) for l in (-1, 0) for h in ([-1] if l < 0 else (-1, 0))]
  report.heatmap(rows, "upos", tmp_path / "heatmap.png")
  sweep = [
    dict(model="m", step=0, task="upos", split="dev", layer=0, head=h, l2=l2, accuracy=0.5, control_accuracy=0.3)
    | dict(selectivity=0.2)
    for h in (-1, 0)
    for l2 in (0.1, 1.0)
  ]
  complexity.figure(sweep, tmp_path / "complexity.png")
  assert len(drawn) == 4
  _pngs(tmp_path, "heads.png", "entropy.png", "heatmap.png", "complexity.png")


def test_attention_patching_and_study_figures_are_written_without_pyplot(drawn, tmp_path):
  import pandas as pd

  from headspec import study
  from headspec.attention import induction_run, pictures
  from headspec.patching import run as patch_run

  attn_LHNN = np.random.default_rng(0).random((1, 2, 3, 3))
  pictures.head_pictures([(attn_LHNN, None)], [["a", "b", "c"]], tmp_path)
  pictures.line_view(attn_LHNN[0], ["a", "b", "c"], tmp_path / "lines.png")
  pictures.rollout_flow_picture(attn_LHNN[0, 0], None, ["a", "b", "c"], tmp_path / "flow.png")
  score = {k: np.full((2, 1, 2), 0.5) for k in ("induction", "previous_token")}
  curve = (np.array([1, 10]), np.array([3.0, 2.0]))
  induction_run._figure(tmp_path / "induction.png", "m", [1, 10], score, [], curve, 0.4, None, None)
  frame = pd.DataFrame([dict(layer=0, head=h, position=t, value=0.1 * t) for h in (-1, 0) for t in (0, 1)])
  patch_run.heatmap(frame, "patching", tmp_path / "patching.png")
  run = dict(run="r", condition="c", seed=0)
  em = [dict(run, task="upos", step=s, selectivity=0.1, ci_low=0, ci_high=0.2, above_init_heads=1) for s in (0, 10)]
  frames = {
    "emergence": pd.DataFrame(em),
    "diversity": pd.DataFrame(columns=["run", "condition", "seed", "step", "metric", "value"]),
    "training": pd.DataFrame([dict(run, step=s, loss=3.0, eval_loss=2.5) for s in (1, 10)]),
    "roles": pd.DataFrame(columns=["run", "condition", "seed", "step", "role", "score"]),
  }
  assert study._figures(frames, tmp_path) == ["emergence.png", "loss.png"]
  assert len(drawn) == 2 + 1 + 1 + 1 + 1 + 2
  _pngs(tmp_path, "L0H1.png", "lines.png", "flow.png", "induction.png", "patching.png", "emergence.png", "loss.png")


def _notebook_images(fig) -> list:
  """The image outputs IPython makes of `fig` as a cell's value: with its default formatters, and with a
  Figure formatter registered as the inline backend does once pyplot is used (`%matplotlib inline`)."""
  from IPython.core.formatters import DisplayFormatter

  shown = []
  for inline in (False, True):
    formatter = DisplayFormatter()
    if inline:
      formatter.formatters["image/png"].for_type(Figure, lambda f: PNG + b"inline")
    data, _ = formatter.format(fig)
    shown.append(sorted(k for k in data if k.startswith("image/")))
    assert data["image/png"].startswith(PNG)
  return shown


def test_figures_returned_to_a_notebook_show_once_and_stay_out_of_pyplot(monkeypatch):
  pytest.importorskip("IPython")
  import headspec

  monkeypatch.setattr(matplotlib, "use", lambda *a: pytest.fail("matplotlib.use called"))
  fig = headspec.plot_attention(np.eye(3)[None], ["a", "b", "c"])
  assert isinstance(fig, figures.NotebookFigure) and fig.canvas.manager is None
  assert plt.get_fignums() == []
  assert _notebook_images(fig) == [["image/png"], ["image/png"]]


def test_the_circuit_figure_shows_once_and_stays_out_of_pyplot(tmp_path):
  pytest.importorskip("IPython")
  from headspec.model.config import ModelConfig
  from headspec.patching import circuit, edges

  sizes = dict(kind="decoder", vocab_size=8, num_layers=1, num_heads=2, d_model=8, d_head=4, d_ff=8, max_len=4)
  g = edges.graph(ModelConfig(**sizes))
  shown = circuit.figure(g, np.linspace(-1, 1, g.E), top_n=3)
  saved = circuit.figure(g, np.linspace(-1, 1, g.E), top_n=3, path=tmp_path / "circuit.png")
  assert plt.get_fignums() == []
  assert all(f.canvas.manager is None for f in (shown, saved))
  assert (tmp_path / "circuit.png").read_bytes()[:8] == PNG
  assert _notebook_images(shown) == [["image/png"], ["image/png"]]
