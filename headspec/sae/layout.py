"""SAELens's folder layout, the writing half, and TransformerLens's hook names of the sites an SAE reads:
what the SAE itself needs (`SAE.save`, `SAE.layer`, `SAE.site`), below both the SAE (headspec/sae/model.py)
and the reader (headspec/sae/saelens.py, which builds SAEs and so imports the model). The layout and how
SAELens encodes: saelens.py's docstring and docs/sae.md, "SAELens format".
"""

from __future__ import annotations

import json
import re

import numpy as np
from etils import epath

from headspec.errors import UserError
from headspec.io import remote

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
ARCHITECTURES = {"relu": "standard", "topk": "topk", "jumprelu": "jumprelu"}  # headspec kind -> SAELens
SAELENS_VERSION = "6.0.0"  # metadata.sae_lens_version: SAELens reads the cfg.json as 6.x writes it (< 6 is renamed)
_HOOK = re.compile(r"blocks\.(\d+)\.(.+)")
# TransformerLens hooks of the per-token sites an SAE reads (headspec/model/capture.py TL_HOOKS), and the release ids'
# short form `blocks.3.hook_z` (SAELens's gpt2-small-hook-z-kk).
_SITE_OF_HOOK = {"hook_z": "z"}


def hook_name(site: str, layer: int) -> str:
  """TransformerLens's hook of `site` at block `layer`, e.g. 'blocks.3.attn.hook_z'."""
  from headspec.model.capture import TL_HOOKS

  for hook, name in TL_HOOKS.items():
    if name == site:
      return f"blocks.{int(layer)}.{hook}"
  raise UserError(f"SAELens format: site {site!r} has no TransformerLens hook; choose one of the per-token sites")


def parse_hook(name: str, where: str = "hook_name") -> tuple[str, int]:
  """(site, layer) of a TransformerLens hook name such as 'blocks.3.attn.hook_z'; UserError for another."""
  from headspec.model.capture import TL_HOOKS
  from headspec.sae.splice import PER_TOKEN_SITES

  match = _HOOK.fullmatch(str(name or ""))
  site = (TL_HOOKS.get(match.group(2)) or _SITE_OF_HOOK.get(match.group(2))) if match else None
  if site is None or site not in PER_TOKEN_SITES:
    raise UserError(
      f"{where}={name!r}: not the hook of a per-token site of a block (e.g. 'blocks.3.attn.hook_z'); headspec "
      f"reads SAEs on {', '.join(PER_TOKEN_SITES)}"
    )
  return site, int(match.group(1))


def save(sae, directory, *, hook_name: str | None = None, model_name: str = "", metadata: dict | None = None):
  """Writes `sae` as an SAELens folder (cfg.json, sae_weights.safetensors) at `directory`; returns its path.

  hook_name: the TransformerLens hook it reads ('blocks.3.attn.hook_z'); None: the SAE's own `hook_name`.
  model_name, metadata: recorded in cfg.json's `metadata` (SAELens's `model_name`; anything JSON beside it).
  """
  from safetensors.numpy import save as save_tensors

  name = hook_name or getattr(sae, "hook_name", "")
  if not name:
    raise UserError("SAE.save: hook_name is unknown; give hook_name='blocks.<layer>.attn.hook_z' (the hook it reads)")
  site, _ = parse_hook(name)
  if sae.kind not in ARCHITECTURES:
    raise UserError(f"SAE.save: kind={sae.kind!r} has no SAELens architecture; one of {', '.join(ARCHITECTURES)}")
  arrays = sae.numpy()
  tensors = dict(W_enc=arrays["W_enc_KF"], W_dec=arrays["W_dec_FK"], b_enc=arrays["b_enc_F"], b_dec=arrays["b_dec_K"])
  if sae.kind == "jumprelu":
    tensors["threshold"] = np.asarray(sae.threshold_F)
    if not (np.isfinite(tensors["threshold"]) & (tensors["threshold"] >= 0)).all():
      raise UserError("SAE.save: a JumpReLU threshold is negative or not finite; SAELens computes ReLU(π)·1[π > θ], "
                      "which equals headspec's π·1[π > θ] only for θ ≥ 0")  # fmt: skip
  tensors = {key: np.ascontiguousarray(value, np.float32) for key, value in tensors.items()}
  info = json.loads(json.dumps(getattr(sae, "info", {}) or {}, default=str))
  info.pop("saelens", None)
  head_scale = None if sae.head_scale_K is None else np.asarray(sae.head_scale_K, np.float32).tolist()
  from headspec import __version__

  cfg = dict(
    architecture=ARCHITECTURES[sae.kind], d_in=sae.width, d_sae=sae.num_features, dtype="float32", device="cpu",
    apply_b_dec_to_input=True, normalize_activations="none", reshape_activations="hook_z" if site == "z" else "none",
  )  # fmt: skip
  if sae.kind == "topk":
    cfg |= dict(k=int(sae.k), rescale_acts_by_decoder_norm=False)
  cfg["metadata"] = dict(
    sae_lens_version=SAELENS_VERSION, model_name=model_name, hook_name=name, hook_head_index=None,
    headspec=dict(version=__version__, kind=sae.kind, head_scale=head_scale, info=info, **(metadata or {})),
  )  # fmt: skip
  directory = epath.Path(directory)
  remote.write_bytes_atomic(directory / WEIGHTS_FILE, save_tensors(tensors, metadata={"format": "pt"}))
  remote.write_bytes_atomic(directory / CFG_FILE, (json.dumps(cfg, indent=2) + "\n").encode())
  return directory
