"""SAELens's folder layout, the reading half: `load_sae(dir)` (docs/sae.md, "SAELens format"); the writing half,
`save(sae, dir, hook_name=...)` (`SAE.save`), is headspec/sae/layout.py.

A folder holds `cfg.json` and `sae_weights.safetensors` (SAELens ≥ 6, sae_lens/saes/sae.py `save_model`,
`load_from_disk`). cfg.json: `architecture` ('standard' | 'topk' | 'jumprelu' | 'gated'), `d_in`, `d_sae`,
`dtype`, `apply_b_dec_to_input`, `normalize_activations`, `reshape_activations` ('hook_z' for attention SAEs),
`k` and `rescale_acts_by_decoder_norm` for TopK, and `metadata` (`hook_name`, e.g. 'blocks.3.attn.hook_z',
`model_name`, `sae_lens_version`). The weights, `W_enc` [d_in, d_sae], `W_dec` [d_sae, d_in], `b_enc` [d_sae],
`b_dec` [d_in] (+ `threshold` [d_sae] for JumpReLU; gated: `b_gate`, `b_mag`, `r_mag` instead of `b_enc`).

SAELens encodes x' = x − b_dec·[apply_b_dec_to_input], π = x' W_enc + b_enc and then
  standard  f = ReLU(π)                                      headspec's 'relu'
  topk      f = ReLU of the k largest π, 0 elsewhere           headspec's 'topk' (the same ReLU after TopK);
            rescale_acts_by_decoder_norm: π·‖W_dec[f]‖ chosen, f/‖W_dec[f]‖ decoded, folded into W_enc, b_enc, W_dec
  jumprelu  f = ReLU(π)·1[π > θ] = π·1[π > max(θ, 0)]         headspec's 'jumprelu' with θ clamped at 0
  gated     f = 1[x' W_enc + b_gate > 0]·ReLU(x' (W_enc ⊙ e^{r_mag}) + b_mag): a JumpReLU with W_enc ⊙ e^{r_mag},
            b_enc = b_mag and θ = max(b_mag − e^{r_mag} b_gate, 0) (Rajamanoharan et al. 2024, "Jumping Ahead",
            §2: gated SAEs with tied weights are JumpReLU SAEs); the gate is then tested on π, not on the gate's
            own pre-activation, so inputs within float rounding of a threshold may differ
and decodes x̂ = f W_dec + b_dec. apply_b_dec_to_input = false is folded into b_enc (b_enc + b_dec W_enc), since
headspec always subtracts b_dec. normalize_activations 'none' is read as is; 'expected_average_only_in' needs
the release's `norm_scaling_factor` (SAELens's pretrained_saes.yaml holds it, not the folder), given to `load`
and folded as SAELens's `fold_activation_norm_scaling_factor` does; 'constant_norm_rescale' and 'layer_norm'
scale each input by its own norm, which no fixed linear SAE computes: refused. A pre-6 cfg.json (top-level
`hook_point`/`hook_name`, `activation_fn` 'relu' | 'topk' with `activation_fn_kwargs.k`, a boolean
`normalize_activations`; a `scaling_factor` tensor, folded into W_dec) is read as SAELens's
`handle_pre_6_0_config` reads it.

Kissane, Krzyzanowski, Bloom, Conmy & Nanda 2024's attention SAEs for GPT-2 small (SAELens release
'gpt2-small-hook-z-kk', loader `connor_rob_hook_z`) are stored otherwise: `<name>.pt` (a torch state dict:
W_enc, W_dec, b_enc, b_dec, a standard ReLU SAE) beside `<name>_cfg.json` (`act_size` = d_in, `dict_size` =
d_sae, `act_name` = the hook, `layer`, `site`, `concat_heads`). `load` reads such a folder, or the `.pt` file
of a folder holding several, without torch (`read_torch_state_dict`).

headspec's own SAEs read raw activations (their input scale folded in, headspec/sae/train.py `_folded`), so
they save as normalize_activations 'none'; per-head scales (`head_scale_K`, for the head shares) and how the SAE
was trained go into `metadata.headspec`, which SAELens keeps and ignores.
"""

from __future__ import annotations

import io
import math
import numbers
import pickle
import re
import zipfile

import numpy as np
from etils import epath

from headspec import arguments as args
from headspec.errors import UserError
from headspec.io import remote
from headspec.sae.layout import CFG_FILE, WEIGHTS_FILE, parse_hook

KINDS = {"standard": "relu", "topk": "topk", "jumprelu": "jumprelu", "gated": "jumprelu"}
TENSORS = {
  "standard": ("W_enc", "W_dec", "b_enc", "b_dec"),
  "topk": ("W_enc", "W_dec", "b_enc", "b_dec"),
  "jumprelu": ("W_enc", "W_dec", "b_enc", "b_dec", "threshold"),
  "gated": ("W_enc", "W_dec", "b_gate", "b_mag", "r_mag", "b_dec"),
}


def loaded_name(sae) -> str:
  """The tables' `sae` column of a loaded SAE: 'loaded-topk-f24576-k32', 'loaded-relu-f24576'."""
  return f"loaded-{sae.kind}-f{sae.num_features}" + (f"-k{sae.k}" if sae.kind == "topk" else "")


def _positive_number(value) -> float:
  if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (math.isfinite(value) and value > 0):
    raise args.Wrong(f"={args.short(value)} must be a positive number")
  return float(value)


@args.arguments(path=args.path, norm_scaling_factor=args.optional(_positive_number))
def load_sae(path, *, norm_scaling_factor: float | None = None, model=None):
  """The headspec SAE of an SAELens folder (or a Kissane et al. `.pt` with its `_cfg.json`), with `hook_name` set
  (`sae.layer`, `sae.site` from it). norm_scaling_factor: for normalize_activations 'expected_average_only_in',
  the release's factor (SAELens's pretrained_saes.yaml). model (`headspec.load`'s): for an SAE on z trained on
  TransformerLens's z, that layer's value bias is folded in (`for_headspec_z`), so it reads headspec's z. Anything
  headspec cannot compute exactly as SAELens does is one UserError line naming the file and the key."""
  cfg_file, weights_file = _locate(epath.Path(path))
  raw = remote.read_json(cfg_file)
  if not isinstance(raw, dict):
    raise UserError(f"{cfg_file}: not a JSON object")
  if weights_file.suffix == ".pt":
    cfg = _kissane_cfg(raw, cfg_file)
    tensors = read_torch_state_dict(weights_file)
  else:
    cfg = _saelens_cfg(raw, cfg_file)
    tensors = _read_safetensors(weights_file)
  sae = _build(cfg, tensors, cfg_file, weights_file, norm_scaling_factor)
  return sae if model is None else for_headspec_z(sae, model)


load = load_sae


def value_bias_K(model, layer: int, *, fold_ln: bool = True) -> np.ndarray | None:
  """What TransformerLens's from_pretrained takes out of `layer`'s z, flattened as z is ([H·K]; grouped K/V
  repeated over their heads): b_V, plus b_ln1 W_V with `fold_ln` (its LayerNorm bias, folded into b_V before
  b_V is folded into b_O) in a pre-norm block. None when both are absent (RMSNorm, no value bias)."""
  model = getattr(model, "model", model)  # headspec.load's Loaded, or the Transformer
  block = model.blocks[layer]
  attention, terms = block.attention, []
  if attention.b_v_HK is not None:
    terms.append(np.asarray(attention.b_v_HK[...], np.float64))
  norm_bias = getattr(block.ln_attention, "bias", None)
  pre_norm = getattr(block, "pre_layernorm", True) or getattr(block, "parallel_residual", False)
  if fold_ln and pre_norm and not getattr(block, "sublayer_norm", False) and norm_bias is not None:
    w_DGK = np.asarray(attention.w_v_DHK[...], np.float64)
    terms.append(np.einsum("d,dgk->gk", np.asarray(norm_bias[...], np.float64), w_DGK))
  if not terms:
    return None
  return np.sum(terms, axis=0).astype(np.float32)[list(model.cfg.kv_group_of_head)].reshape(-1)


def for_headspec_z(sae, model):
  """`sae` reading headspec's z of `model`. TransformerLens's `from_pretrained` folds the LayerNorm's bias into
  b_V (`fold_ln`) and b_V into b_O (`fold_value_biases`), both on by default, so its hook_z is A·(x̂ (w ⊙ W_V)),
  headspec's A·(LN(x) W_V + b_V) = that + b (b = b_V + b_ln1 W_V; attention rows sum to 1). An SAE trained there
  (`info['saelens']['value_bias_folded']`) reads headspec's z exactly with b_dec + b: encode sees x − b − b_dec,
  decode adds b back. Others are returned as they are."""
  import dataclasses

  import jax.numpy as jnp

  source = sae.info.get("saelens", {})
  if sae.site != "z" or not source.get("value_bias_folded") or source.get("value_bias_added") is not None:
    return sae
  b_K = value_bias_K(model, sae.layer, fold_ln=source.get("ln_folded", True))
  if b_K is None or b_K.shape != (sae.width,):
    return sae
  info = {**sae.info, "saelens": {**source, "value_bias_added": f"layer {sae.layer}"}}
  return dataclasses.replace(sae, b_dec_K=sae.b_dec_K + jnp.asarray(b_K), info=info)


def for_model(path, model, site: str, key: str = "sae.load"):
  """`load(path)` checked against a model: it reads `site`, its layer exists and its d_in is the site's width
  (H·K for z); UserError naming `key` otherwise. The value bias is folded per model (`for_headspec_z`)."""
  from headspec.sae import splice

  model_cfg = getattr(model, "model", model).cfg

  if not str(path) or not epath.Path(path).exists():
    raise UserError(f"sae: {key}={str(path)!r}: no such folder (an SAELens SAE: {CFG_FILE} and {WEIGHTS_FILE})")
  try:
    sae = load(path)
  except UserError as e:
    raise UserError(f"sae: {key}={str(path)!r}: {e}") from None
  if sae.site != site:
    raise UserError(
      f"sae: {key}={str(path)!r} reads {sae.hook_name}, the site {sae.site!r}, not site={site!r}; set site"
    )
  if not 0 <= sae.layer < model_cfg.num_layers:
    raise UserError(
      f"sae: {key}={str(path)!r} reads {sae.hook_name}, layer {sae.layer}, but the model has {model_cfg.num_layers} "
      f"layers (0..{model_cfg.num_layers - 1})"
    )
  shape = splice.site_shape(model_cfg, sae.site)
  width = int(np.prod(shape))
  if sae.width != width:
    what = f"H·K = {shape[0]}·{shape[1]}" if len(shape) == 2 else f"{shape[0]}"
    raise UserError(
      f"sae: {key}={str(path)!r} has d_in={sae.width}, but this model's {sae.site} is {width} wide ({what})"
    )
  return sae


def check_load(path, layers, key: str = "sae.load") -> None:
  """`headspec sae --config.sae.load=DIR`'s checks before any model is loaded: the folder holds an SAE, and
  `layers` is left empty (the layer is the hook's)."""
  if not str(path).strip():
    return
  if not epath.Path(path).exists():
    raise UserError(f"sae: {key}={str(path)!r}: no such folder (an SAELens SAE: {CFG_FILE} and {WEIGHTS_FILE})")
  try:
    _locate(epath.Path(path))
  except UserError as e:
    raise UserError(f"sae: {key}={str(path)!r}: {e}") from None
  if str(layers).strip():
    raise UserError(f"sae: layers={layers!r} with {key}: the SAE reads the layer of its hook_name; leave layers empty")


def folder_for_run(workdir, job_name: str, step: int, site: str, layer: int, sae_column: str) -> epath.Path:
  """RUN/sae/saelens/<model>-step<step>-<site><layer>-<sae>/: where `headspec sae` writes a trained SAE in
  this layout, named by the tables' key (model made one file-name component), beside RUN/sae/checkpoints/."""
  from headspec.io import filenames

  name = f"{filenames.component(job_name)}-step{step}-{site}{layer}-{sae_column}"
  return remote.run_path(workdir) / "sae" / "saelens" / name


def loaded_metrics(sae) -> dict:
  """metrics.csv's values that describe a loaded SAE rather than the config's training options."""
  return dict(features=sae.num_features, k=sae.k if sae.kind == "topk" else math.nan, l1=math.nan,
              l0_coefficient=math.nan, train_tokens=0, fvu_train=math.nan, train_seconds=0.0)  # fmt: skip


def _locate(path: epath.Path) -> tuple[epath.Path, epath.Path]:
  """(config file, weights file) of a folder or of a Kissane et al. `.pt` / `_cfg.json` file."""
  if not path.exists():
    raise UserError(f"{path}: no such folder (an SAELens SAE: {CFG_FILE} and {WEIGHTS_FILE})")
  if not path.is_dir():
    if path.name.endswith("_cfg.json"):
      pair = (path, path.with_name(path.name[: -len("_cfg.json")] + ".pt"))
    elif path.suffix == ".pt":
      pair = (path.with_name(path.stem + "_cfg.json"), path)
    else:
      raise UserError(f"{path}: give the folder holding {CFG_FILE} and {WEIGHTS_FILE} (or a Kissane et al. .pt file)")
  elif (path / CFG_FILE).exists():
    pair = (path / CFG_FILE, path / WEIGHTS_FILE)
  else:
    pairs = sorted(p for p in path.glob("*.pt") if p.with_name(p.stem + "_cfg.json").exists())
    if len(pairs) != 1:
      found = f"{len(pairs)} .pt files with their _cfg.json; name one" if pairs else "neither"
      raise UserError(
        f"{path}: holds no {CFG_FILE} (SAELens) and {found} (Kissane et al.'s <name>.pt + <name>_cfg.json)"
      )
    pair = (pairs[0].with_name(pairs[0].stem + "_cfg.json"), pairs[0])
  for file in pair:
    if not file.exists():
      raise UserError(f"{file}: missing (an SAE folder needs {pair[0].name} and {pair[1].name})")
  return pair


def _bad(file, key: str, what: str) -> UserError:
  return UserError(f"{file}: {key} {what}")


def _saelens_cfg(raw: dict, file) -> dict:
  """cfg.json as SAELens 6 reads it (a pre-6 file renamed as `handle_pre_6_0_config` does)."""
  meta = raw.get("metadata") if isinstance(raw.get("metadata"), dict) else {}
  version = str(raw.get("sae_lens_version") or meta.get("sae_lens_version") or "0")
  major = re.match(r"\d+", version)
  cfg = dict(raw)
  if not major or int(major.group()) < 6:  # pre-6: metadata at the top level, older names
    renames = {
      "hook_point": "hook_name",
      "hook_point_head_index": "hook_head_index",
      "activation_fn_str": "activation_fn",
    }
    cfg = {renames.get(key, key): value for key, value in raw.items()}
    cfg.setdefault("architecture", "standard")
    activation = cfg.get("activation_fn") or "relu"
    if activation == "topk":
      cfg["architecture"], cfg["k"] = "topk", (cfg.get("activation_fn_kwargs") or {}).get("k")
    elif activation != "relu" and cfg["architecture"] == "standard":
      raise _bad(file, "activation_fn", f"= {activation!r}: headspec reads 'relu' and 'topk' standard SAEs only")
    if isinstance(cfg.get("normalize_activations"), bool):
      cfg["normalize_activations"] = "expected_average_only_in" if cfg["normalize_activations"] else "none"
    meta = {**meta, **{key: cfg[key] for key in ("hook_name", "hook_head_index", "model_name") if key in cfg}}
  cfg.setdefault("apply_b_dec_to_input", True)
  cfg["normalize_activations"] = cfg.get("normalize_activations") or "none"
  cfg["hook_name"], cfg["hook_head_index"] = meta.get("hook_name"), meta.get("hook_head_index")
  cfg["headspec"] = meta.get("headspec") if isinstance(meta.get("headspec"), dict) else {}
  cfg["model_name"] = meta.get("model_name") or ""
  # trained on TransformerLens's HookedTransformer with fold_value_biases (its default), unless it says otherwise
  kwargs = (
    meta.get("model_from_pretrained_kwargs") if isinstance(meta.get("model_from_pretrained_kwargs"), dict) else {}
  )
  transformer_lens = meta.get("model_class_name") in (None, "HookedTransformer", "HookedSAETransformer")
  cfg["value_bias_folded"] = (
    not cfg["headspec"] and transformer_lens and kwargs.get("fold_value_biases", True) is not False
  )
  cfg["ln_folded"] = kwargs.get("fold_ln", True) is not False
  return cfg


def _kissane_cfg(raw: dict, file) -> dict:
  """Kissane et al.'s `<name>_cfg.json` as SAELens's `get_connor_rob_hook_z_config_from_hf` reads it: a standard
  SAE, d_in = act_size, d_sae = dict_size, the hook act_name (else blocks.<layer>.attn.hook_<site> from layer, site)."""
  for key in ("act_size", "dict_size"):
    if key not in raw:
      raise _bad(file, key, "is missing (Kissane et al.'s config: act_size, dict_size, act_name)")
  hook = raw.get("act_name")
  if not hook and "layer" in raw and raw.get("site"):
    attn = "attn." if raw["site"] in ("q", "k", "v", "z") else ""
    hook = f"blocks.{raw['layer']}.{attn}hook_{raw['site']}"
  if raw.get("concat_heads") is False and str(raw.get("site", "z")) in ("q", "k", "v", "z"):
    raise _bad(
      file,
      "concat_heads",
      f"is false: an SAE of head {raw.get('head')}'s {raw.get('site')} alone; headspec reads the concatenated heads",
    )
  return dict(architecture="standard", d_in=raw["act_size"], d_sae=raw["dict_size"], hook_name=hook, hook_head_index=None,
              apply_b_dec_to_input=True, normalize_activations="none", headspec={}, model_name=raw.get("model_name") or "",
              value_bias_folded=True)  # fmt: skip


def _read_safetensors(file) -> dict[str, np.ndarray]:
  import ml_dtypes
  import safetensors

  dtypes = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": ml_dtypes.bfloat16}
  try:
    entries = safetensors.deserialize(epath.Path(file).read_bytes())
  except Exception as e:  # SafetensorError: a damaged or truncated file
    raise UserError(f"{file}: not a safetensors file ({str(e).splitlines()[0][:120]})") from None
  out = {}
  for name, entry in entries:
    if entry["dtype"] not in dtypes:
      raise _bad(file, name, f"has dtype {entry['dtype']}; SAE weights are float64, float32, float16 or bfloat16")
    out[name] = np.frombuffer(bytes(entry["data"]), dtypes[entry["dtype"]]).reshape(entry["shape"])
  return out


class _TorchUnpickler(pickle.Unpickler):
  """torch.save's data.pkl read into numpy: only a state dict's classes (tensors, typed storages, OrderedDict)."""

  STORAGES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "BFloat16Storage": "bf16",
  }

  def __init__(self, data: bytes, archive: zipfile.ZipFile, prefix: str, file):
    super().__init__(io.BytesIO(data))
    self.archive, self.prefix, self.file = archive, prefix, file

  def find_class(self, module, name):
    if (module, name) == ("collections", "OrderedDict"):
      import collections

      return collections.OrderedDict
    if module == "torch._utils" and name == "_rebuild_tensor_v2":
      return self.rebuild_tensor
    if module == "torch._utils" and name == "_rebuild_parameter":
      return lambda data, requires_grad=False, hooks=None: data
    if module == "torch" and name in self.STORAGES:
      return name
    raise UserError(f"{self.file}: holds {module}.{name}, not a plain state dict of tensors; save it as safetensors")

  def persistent_load(self, pid):
    if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
      raise UserError(f"{self.file}: an unknown torch storage {str(pid)[:60]}")
    _, storage, key, _, numel = pid
    dtype = self.STORAGES[storage]
    if dtype == "bf16":
      import ml_dtypes

      dtype = ml_dtypes.bfloat16
    data = self.archive.read(f"{self.prefix}data/{key}")
    return np.frombuffer(data, dtype)[:numel]

  @staticmethod
  def rebuild_tensor(storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
    item = storage.itemsize
    view = np.lib.stride_tricks.as_strided(storage[offset:], tuple(size), tuple(s * item for s in stride))
    return np.array(view)


def read_torch_state_dict(file) -> dict[str, np.ndarray]:
  """A torch.save'd state dict of tensors (the zip format, torch ≥ 1.6) as numpy arrays, without torch and without
  running any pickled code: only tensors, their storages and OrderedDict are rebuilt."""
  try:
    archive = zipfile.ZipFile(io.BytesIO(epath.Path(file).read_bytes()))
  except zipfile.BadZipFile:
    raise UserError(
      f"{file}: not a torch zip archive (torch.save of torch ≥ 1.6); save the weights as safetensors"
    ) from None
  pickles = [name for name in archive.namelist() if name.endswith("data.pkl")]
  if len(pickles) != 1:
    raise UserError(f"{file}: not a torch.save archive (no data.pkl)")
  prefix = pickles[0][: -len("data.pkl")]
  order = (
    archive.read(f"{prefix}byteorder").decode().strip() if f"{prefix}byteorder" in archive.namelist() else "little"
  )
  if order != "little":
    raise UserError(f"{file}: byte order {order!r}; headspec reads little-endian torch files")
  try:
    state = _TorchUnpickler(archive.read(pickles[0]), archive, prefix, file).load()
  except UserError:
    raise
  except (pickle.UnpicklingError, KeyError, ValueError, TypeError, EOFError) as e:
    raise UserError(f"{file}: damaged torch file ({type(e).__name__}: {str(e)[:100]})") from None
  if not isinstance(state, dict) or not all(isinstance(v, np.ndarray) for v in state.values()):
    raise UserError(f"{file}: not a state dict of tensors")
  return dict(state)


def _build(cfg: dict, tensors: dict, cfg_file, weights_file, norm_scaling_factor):
  """The headspec SAE of a normalised config and its tensors (module docstring), folded in float64."""
  import jax.numpy as jnp

  from headspec.sae.model import SAE

  arch = cfg.get("architecture")
  if arch not in KINDS:
    raise _bad(cfg_file, "architecture", f"= {arch!r}; headspec reads {', '.join(KINDS)}")
  ints = {}
  for key in ("d_in", "d_sae") + (("k",) if arch == "topk" else ()):
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise _bad(cfg_file, key, f"= {value!r}; a positive integer")
    ints[key] = value
  d_in, d_sae = ints["d_in"], ints["d_sae"]
  if arch == "topk" and ints["k"] > d_sae:
    raise _bad(cfg_file, "k", f"= {ints['k']} is more than d_sae = {d_sae}")
  parse_hook(cfg.get("hook_name"), where=f"{cfg_file}: metadata.hook_name")
  if cfg.get("hook_head_index") is not None:
    raise _bad(
      cfg_file,
      "hook_head_index",
      f"= {cfg['hook_head_index']!r}: an SAE of one head; headspec reads the concatenated heads",
    )
  if cfg.get("reshape_activations", "none") not in ("none", "hook_z"):
    raise _bad(cfg_file, "reshape_activations", f"= {cfg['reshape_activations']!r}; 'none' or 'hook_z'")
  norm = cfg["normalize_activations"]
  if norm not in ("none", "expected_average_only_in"):
    raise _bad(cfg_file, "normalize_activations", f"= {norm!r} scales each input by its own norm, which no fixed "
                                                   "SAE computes; headspec reads 'none' (or 'expected_average_only_in' with its factor)")  # fmt: skip
  if norm == "expected_average_only_in" and norm_scaling_factor is None:
    raise _bad(cfg_file, "normalize_activations", "= 'expected_average_only_in' needs the release's norm_scaling_factor "
                                                   "(SAELens's pretrained_saes.yaml); pass load(..., norm_scaling_factor=s)")  # fmt: skip
  if not isinstance(cfg.get("apply_b_dec_to_input"), bool):
    raise _bad(cfg_file, "apply_b_dec_to_input", f"= {cfg.get('apply_b_dec_to_input')!r}; true or false")
  t = {key: np.asarray(value, np.float64) for key, value in tensors.items()}
  scaling = t.pop("scaling_factor", None)  # pre-6 SAELens's finetuning scaling factor of f
  extra = sorted(set(t) - set(TENSORS[arch]))
  if extra:
    raise _bad(
      weights_file, extra[0], f"is not a tensor of a {arch} SAE ({', '.join(TENSORS[arch])}); headspec cannot use it"
    )
  shapes = dict(W_enc=(d_in, d_sae), W_dec=(d_sae, d_in), b_dec=(d_in,))
  for key in TENSORS[arch]:
    if key not in t:
      raise _bad(weights_file, key, f"is missing (a {arch} SAE has {', '.join(TENSORS[arch])})")
    want = shapes.get(key, (d_sae,))
    if t[key].shape != want:
      raise _bad(
        weights_file,
        key,
        f"has shape {list(t[key].shape)}, not {list(want)} (d_in={d_in}, d_sae={d_sae} in {CFG_FILE})",
      )
    if not np.isfinite(t[key]).all():
      raise _bad(weights_file, key, "holds NaN or inf")
  w_enc, w_dec, b_dec = t["W_enc"], t["W_dec"], t["b_dec"]
  if arch == "gated":
    gain_F = np.exp(t["r_mag"])
    b_gate, b_mag = t["b_gate"], t["b_mag"]
    if not cfg["apply_b_dec_to_input"]:
      b_gate, b_mag = b_gate + b_dec @ w_enc, b_mag + b_dec @ (w_enc * gain_F)
    w_enc, b_enc, threshold = w_enc * gain_F, b_mag, b_mag - gain_F * b_gate
  else:
    b_enc, threshold = t["b_enc"], t.get("threshold")
    if not cfg["apply_b_dec_to_input"]:
      b_enc = b_enc + b_dec @ w_enc
  if arch == "topk" and cfg.get("rescale_acts_by_decoder_norm"):
    norm_F = np.linalg.norm(w_dec, axis=1)
    if not (norm_F > 0).all():
      raise _bad(weights_file, "W_dec", "has a zero row, and rescale_acts_by_decoder_norm divides by its norm")
    w_enc, b_enc, w_dec = w_enc * norm_F, b_enc * norm_F, w_dec / norm_F[:, None]
  if scaling is not None and not np.allclose(scaling, 1.0):
    if scaling.shape != (d_sae,):
      raise _bad(weights_file, "scaling_factor", f"has shape {list(scaling.shape)}, not [{d_sae}]")
    w_dec = w_dec * scaling[:, None]
  if norm == "expected_average_only_in":
    s = float(norm_scaling_factor)
    w_enc, w_dec, b_dec = w_enc * s, w_dec / s, b_dec / s
  if threshold is not None:
    threshold = np.maximum(threshold, 0.0)  # SAELens: ReLU(π)·1[π > θ]
  extras = cfg["headspec"]
  head_scale = extras.get("head_scale")
  if head_scale is not None and (not isinstance(head_scale, list) or len(head_scale) != d_in):
    raise _bad(cfg_file, "metadata.headspec.head_scale", f"is not a list of d_in = {d_in} numbers")
  info = dict(extras.get("info") or {})
  info["saelens"] = dict(path=str(cfg_file.parent), architecture=arch, model_name=cfg["model_name"],
                         cfg_file=cfg_file.name, weights_file=weights_file.name,
                         value_bias_folded=bool(cfg.get("value_bias_folded")), ln_folded=cfg.get("ln_folded", True))  # fmt: skip
  as32 = lambda a: jnp.asarray(np.asarray(a, np.float32))
  return SAE(
    W_enc_KF=as32(w_enc), b_enc_F=as32(b_enc), W_dec_FK=as32(w_dec), b_dec_K=as32(b_dec),
    threshold_F=None if threshold is None else as32(threshold),
    head_scale_K=None if head_scale is None else as32(head_scale),
    kind=KINDS[arch], k=ints.get("k", 0), info=info, hook_name=cfg["hook_name"],
  )  # fmt: skip
