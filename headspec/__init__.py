"""headspec: attention-head specialization in JAX transformers.

Importing `headspec` (or `headspec.io.tables`, `headspec.atlas`) imports no JAX: the package's own
attributes are resolved lazily (PEP 562), so analysis scripts and the atlas run on a laptop with only
the `analysis` extra (pandas, matplotlib). Submodules that need JAX (model, train, probing, ...) import
it themselves when imported.
"""

from __future__ import annotations

import importlib

from headspec import arguments as _check

__version__ = "0.1.0"

# name -> (module, attribute): loaded on first access.
_LAZY = {
  "build_atlas": ("headspec.atlas", "build_atlas"),
  "TABLES": ("headspec.io.tables", "TABLES"),
  # The notebook API (headspec/api/, docs/api.md): these import JAX when first used.
  "load": ("headspec.api.load", "load"),
  "run": ("headspec.api.run", "run"),
  "probe": ("headspec.api.probe", "probe"),
  "ablate": ("headspec.api.ablate", "ablate"),
  "patch": ("headspec.api.patch", "patch"),
  "attribution_patch": ("headspec.api.patch", "attribution_patch"),
  "path_patch": ("headspec.api.patch", "path_patch"),
  "circuit": ("headspec.api.patch", "circuit"),
  "Circuit": ("headspec.api.patch", "Circuit"),
  "split_words": ("headspec.api.run", "split_words"),
  # Generation with a KV cache (headspec/model/generation.py, docs/api.md).
  "generate": ("headspec.model.generation", "generate"),
  # Attention in a notebook (headspec/api/views.py): matplotlib and an offline interactive HTML view.
  "plot_attention": ("headspec.api.views", "plot_attention"),
  "attention_view": ("headspec.api.views", "attention_view"),
  "to_tokens": ("headspec.api.tokens", "to_tokens"),
  "to_str_tokens": ("headspec.api.tokens", "to_str_tokens"),
  "to_single_token": ("headspec.api.tokens", "to_single_token"),
  "capture": ("headspec.api.tokens", "capture"),
  "Cache": ("headspec.model.capture", "Cache"),
  # Modules of the notebook API: `from headspec import edits` (ready-made edits: head masks, SAE splices) and
  # `from headspec import mesh` (device meshes, docs/scale.md); attribute None: the module itself.
  "edits": ("headspec.model.edits", None),
  "mesh": ("headspec.parallel.mesh", None),
  "Loaded": ("headspec.api.load", "Loaded"),
  "Captured": ("headspec.api.run", "Captured"),
  "Ablation": ("headspec.api.ablate", "Ablation"),
  # Sparse autoencoders on attention outputs (headspec/sae/, docs/sae.md).
  "fit_sae": ("headspec.sae.train", "fit_sae"),
  "sae_head_fractions": ("headspec.sae.metrics", "sae_head_fractions"),
  "load_sae": ("headspec.sae.saelens", "load_sae"),  # an SAELens folder (docs/sae.md, "SAELens format")
  # The activation store (headspec/api/store.py, docs/api.md): many texts' activations at fixed shapes.
  "activations": ("headspec.api.store", "activations"),
  "ActivationStore": ("headspec.api.store", "ActivationStore"),
}

__all__ = [
  "Ablation",
  "ActivationStore",
  "Cache",
  "Captured",
  "Circuit",
  "Loaded",
  "TABLES",
  "__version__",
  "ablate",
  "activations",
  "attention_view",
  "attribution_patch",
  "build_atlas",
  "capture",
  "circuit",
  "edits",
  "fit_sae",
  "generate",
  "load",
  "mesh",
  "load_sae",
  "patch",
  "path_patch",
  "plot_attention",
  "probe",
  "read_table",
  "read_tables",
  "run",
  "sae_head_fractions",
  "split_words",
  "to_single_token",
  "to_str_tokens",
  "to_tokens",
]


@_check.arguments(workdir=_check.path, name=_check.text)
def read_table(workdir, name: str):
  """Table `name` of a run (a key of headspec.io.tables.TABLES: 'probes', 'diversity', 'ablation_heads',
  ...) as a pandas DataFrame with the documented dtypes; UserError if the run has no such table (or for a
  wrong argument, headspec/arguments.py)."""
  from headspec.errors import UserError
  from headspec.io import tables

  if name not in tables.TABLES:
    raise UserError(f"no table {name!r}; choose from {', '.join(tables.TABLES)}")
  table = tables.TABLES[name]
  return tables.read_frame(tables.path_of(workdir, table), table)


@_check.arguments(runs=_check.runs, name=_check.text)
def read_tables(runs, name: str):
  """Table `name` of several runs, concatenated, with a first column `run`: `runs` is a list of run
  directories (`run` = each folder's name, or its path as given when two folders share a name) or a
  dict {label: directory}. UserError naming the run that lacks the table (or a wrong argument)."""
  import os

  import pandas as pd

  if isinstance(runs, dict):
    labelled = [(str(label), path) for label, path in runs.items()]
  else:
    paths = [os.fspath(p) for p in ([runs] if isinstance(runs, str | os.PathLike) else runs)]
    names = [os.path.basename(os.path.normpath(os.path.abspath(p))) for p in paths]
    labelled = list(zip(names if len(set(names)) == len(names) else paths, paths))
  if not labelled:
    from headspec.errors import UserError

    raise UserError("read_tables: no run directories given")
  frames = []
  for label, path in labelled:
    frame = read_table(path, name)
    frame.insert(0, "run", pd.Series([label] * len(frame), dtype="string", index=frame.index))
    frames.append(frame)
  return pd.concat(frames, ignore_index=True)


def __getattr__(name: str):
  if name in _LAZY:
    module, attribute = _LAZY[name]
    value = importlib.import_module(module)
    value = value if attribute is None else getattr(value, attribute)
    globals()[name] = value
    return value
  raise AttributeError(f"module 'headspec' has no attribute {name!r}")


def __dir__():
  return sorted(set(globals()) | set(_LAZY))
