"""A run's results tables -> the JSON the atlas page draws (pure Python: no JAX, no pandas, no NumPy).

The page needs, per run, the layer × head grid shape, one entry per *metric* (a number per head, at one
or more steps, optionally with a 95% CI and notes), the heads' role labels and best-matched dependency
relations, their strongest SAE features (sae/*.csv) and circuit edges (circuit/edges.csv), and the attention
pictures found under RUN/attention/. Tables are read only through `headspec.io.tables`; a run may have any
subset of them. `run_data` reads one run:

- headspec/atlas/grid.py (`RunData`): the tables read and checked against the run's grid, and the metrics,
  card entries and layer notes the readers below fill;
- headspec/atlas/head_data.py: the per-head tables of probing, diversity, ablation, attention and patching;
- headspec/atlas/sae_data.py: the SAE tables (metrics and the cards' features; the feature pages' paths);
- headspec/atlas/circuit_data.py: circuit/edges.csv (metrics and the cards' edges);
- here: the attention pictures, the training curve (metrics.jsonl) and the heads' K/V groups.

A run directory may be a URL (gs://bucket/run): everything is read through etils.epath. Temporary folders
(`*.tmp-<pid>`, left by a killed writer) are never read.
"""

from __future__ import annotations

import base64
import re

from etils import epath

from headspec.atlas import circuit_data, head_data, sae_data
from headspec.atlas.grid import HEAD_TABLES, RunData, num
from headspec.errors import UserError
from headspec.io import metrics, remote, tables

# Attention pictures embedded at most (base64 grows them by a third): the page must stay openable.
MAX_IMAGE_BYTES = 24 * 2**20
_HEAD_IN_NAME = re.compile(r"(?:^|[^a-z0-9])(?:l|layer)[_-]?(\d+)[_-]?(?:h|head)[_-]?(\d+)(?=[^0-9]|$)", re.I)


def images(run: RunData) -> tuple[list[dict], int]:
  """Attention pictures under RUN/attention/ (any PNG, any name) as data: URIs; the per-head ones (a
  name with layer and head numbers, e.g. `L3H5`, `layer3_head5`) go to the head's card."""
  folder = run.workdir / "attention"
  run_level, budget, skipped = [], MAX_IMAGE_BYTES, 0
  pngs = [p for p in remote.files_under(folder) if p.suffix == ".png"]
  for path in (p for p in pngs if not any(remote.TEMP_NAME.search(part) for part in p.relative_to(folder).parts)):
    size = path.stat().length
    if size > budget:
      skipped += 1
      continue
    budget -= size
    image = {"name": path.relative_to(folder).as_posix(), "src": _data_uri(path)}
    match = _HEAD_IN_NAME.search(path.stem)
    if match:
      layer, head = int(match.group(1)), int(match.group(2))
      if layer >= run.shape[0] or head >= run.shape[1]:
        continue  # a picture of another model's head: no card to put it on
      run.extra(layer, head).setdefault("images", []).append(image)
    else:
      run_level.append(image)
  return run_level, skipped


def training(workdir: epath.Path) -> list[dict]:
  """(step, loss) points from metrics.jsonl (not a table: one JSON object per line, at least `step`).
  A line that is no such record (cut off by a killed run, not UTF-8, a step that is not an integer) is
  left out, with one warning naming the file and its first such line; records without a loss (eval
  lines) are skipped quietly."""
  records = metrics.read_metrics(workdir)  # the one reader: it skips and warns
  return [{"step": r["step"], "loss": num(r["loss"])} for r in records if num(r.get("loss")) is not None]


def _kv_groups(workdir: epath.Path, num_heads: int) -> list[int] | None:
  """Each head's K/V group for a run trained with grouped-query attention (config.json model.num_kv_heads,
  head h in group h // (H / num_kv_heads), as ModelConfig.kv_group_of_head); None otherwise (every head its
  own K/V, or no config.json: a pretrained model's folder)."""
  if tables.grid_shape(workdir) is None:
    return None
  groups = remote.read_json(workdir / "config.json")["model"].get("num_kv_heads") or num_heads
  if not isinstance(groups, int) or groups >= num_heads or num_heads % groups:
    return None
  return [h // (num_heads // groups) for h in range(num_heads)]


def _data_uri(path: epath.Path) -> str:
  return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def run_data(workdir, pages: bool = True) -> dict:
  """The page's JSON for one run directory. Raises UserError if it is not a directory or has no
  per-head table at all. `pages`: the cards link each SAE feature to its page (`sae_data.feature_page`,
  relative to the run directory; headspec/atlas/features.py writes them)."""
  workdir = remote.run_path(workdir)
  if not workdir.is_dir():
    raise UserError(f"{workdir}: no such run directory")
  run = RunData(workdir, pages)
  if not any(run.rows.values()):
    names = ", ".join(t.path for t in HEAD_TABLES)
    raise UserError(
      f"{workdir}: no results tables ({names}); run `headspec probe`, `diversity`, `ablate`, `attention`, `patch`,"
      " `sae` or `circuit` first"
    )
  head_data.probes(run)
  head_data.structural(run)
  head_data.mdl(run)
  head_data.diversity(run)
  head_data.ablation(run)
  head_data.attention(run)
  head_data.patching(run)
  sae_data.sae(run)
  circuit_data.circuit(run)
  num_layers, num_heads = run.shape
  pictures, skipped = images(run)
  found = [t.path for t in HEAD_TABLES if run.rows[t.path]]
  return {
    "name": workdir.name,
    "path": str(workdir),  # local: absolute, symlinks resolved (remote.run_path)
    "model": run.primary,
    "layers": num_layers,
    "heads": num_heads,
    "kv_groups": _kv_groups(workdir, num_heads),
    "tables": found,
    "metrics": [m.to_json(num_layers, num_heads) for m in run.metrics.values()],
    "layer_notes": run.layer_notes,
    "heads_extra": run.extras,
    "images": pictures,
    "images_skipped": skipped,
    "training": training(workdir),
  }


def atlas_data(workdir, compare=()) -> dict:
  """The JSON blob of the page: one entry per run, the first the run the page is written into."""
  compare = list(compare)
  for other in compare:
    remote.check_url(other, "--compare")
    if not remote.run_path(other).is_dir():
      raise UserError(f"--compare: no such run directory {other}")
  return {"runs": [run_data(w, pages=i == 0) for i, w in enumerate([workdir, *compare])]}  # pages: the first's
