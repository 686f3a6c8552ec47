"""Activation store: the activations of chosen sites at every real token of many texts, kept in memory or
streamed to a folder of .npy shards, and read back lazily in batches of tokens (what `headspec.fit_sae`
and probes read).

After SAELens's `ActivationsStore` (a model run over a corpus at fixed shapes, one hook's activations kept
per token, served in batches for SAE training) and TransformerLens's `utils.tokenize_and_concatenate`
(texts tokenized, each followed by EOS, joined and cut into rows of the context length). Why it is
written this way:
  - fixed shapes: each row (a text, or a cut of the concatenated stream) is right-padded to the next
    power of two of its length (model/capture.py `bucket_length`, the one bucket rule) and rows go through in
    batches of `batch_tokens` tokens per bucket (words.window_batches), so a corpus compiles one program
    per bucket (cache.forward, the program `headspec.capture` runs, with one layer cut on the device),
    never one per batch length;
  - padding counts nowhere: `valid_BT` marks the real tokens and only those are kept, so no count, mean or
    array of the store includes padding (an id list padded by hand, given with its mask, is the unpadded
    list);
  - tokens are kept in the order the batches ran (by bucket), each with its row (`sequence_N`: the input's
    index, or the concatenated row's) and position, so a probe joins them back to its labels.

On disk (`to=DIR`, local or gs:// through etils.epath): DIR/manifest.json, and per column (each site, and
`tokens`, `sequence`, `position`) a folder of shards 000000.npy, ... (one per batch; [n, *shape] float32
for sites, int32 [n] for the others). The manifest is written last: a folder without one is unfinished.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections.abc import Iterable, Iterator, Sequence

import jax
import numpy as np
from etils import epath
from flax import nnx

from headspec import arguments as check
from headspec.api.load import Loaded, model_and_tokenizer, model_rule
from headspec.api.tokens import site_names
from headspec.data.tokenizer import bos_ids
from headspec.errors import UserError
from headspec.io import remote
from headspec.model import capture as cache_lib
from headspec.model import tokens as tokens_lib
from headspec.model.sites import SITES
from headspec.words import batches as words_layer
from headspec.words import jobloop

FORMAT = "headspec-activations/1"
INDEX = ("tokens", "sequence", "position")  # the int32 columns stored beside the sites
_TL_NAME = re.compile(r"blocks\.(\d+)\.(.+)")


class ActivationStore:
  """Activations at every real token: `store[name]` [N, *shape] (float32) for each stored site name (as
  given to `activations`: 'resid_post' is [N, L, D], 'blocks.0.attn.hook_z' [N, H, K]); `tokens_N`,
  `sequence_N`, `position_N` say which token of which row each is. `batches(...)` reads them lazily in
  batches of tokens; `mean(name)` is the mean over the N tokens. In memory, or on disk (`path`; read a
  saved one with `ActivationStore.open(path)`)."""

  def __init__(self, manifest: dict, folder: epath.Path | None = None, memory: dict | None = None):
    self.manifest, self.path, self._memory = manifest, folder, memory

  @classmethod
  def open(cls, path) -> ActivationStore:
    """The store saved at `path` (a folder `activations(..., to=path)` wrote); UserError if it holds none."""
    folder = epath.Path(path)
    if not (folder / "manifest.json").is_file():
      raise UserError(f"ActivationStore.open: {folder} holds no manifest.json (no store, or an unfinished one)")
    manifest = remote.read_json(folder / "manifest.json")
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
      raise UserError(f"ActivationStore.open: {folder}/manifest.json is not a {FORMAT} manifest")
    return cls(manifest, folder)

  @property
  def sites(self) -> tuple[str, ...]:
    return tuple(s["name"] for s in self.manifest["sites"])

  @property
  def num_tokens(self) -> int:
    """Real tokens stored (padding is never stored)."""
    return int(self.manifest["num_tokens"])

  @property
  def num_sequences(self) -> int:
    return int(self.manifest["num_sequences"])

  def __len__(self) -> int:
    return self.num_tokens

  def __repr__(self) -> str:
    where = f"at {self.path}" if self.path is not None else "in memory"
    shapes = ", ".join(f"{s['name']} {s['shape']}" for s in self.manifest["sites"])
    return f"ActivationStore({self.num_tokens} tokens of {self.num_sequences} sequences; {shapes}; {where})"

  def shape(self, name: str) -> tuple[int, ...]:
    """One token's shape of site `name`."""
    return tuple(self._entry(name)["shape"])

  def _entry(self, name: str) -> dict:
    if name in INDEX:
      return {"name": name, "folder": name, "shape": []}
    if not isinstance(name, str):
      raise UserError(f"ActivationStore[{name!r}]: give a site's name (str); stored: {', '.join(self.sites)}")
    for entry in self.manifest["sites"]:
      if name == entry["name"]:
        return entry
    match = _TL_NAME.fullmatch(name)
    layer, rest = (int(match.group(1)), match.group(2)) if match else (None, name)
    try:
      (site,) = cache_lib.check_sites((rest,), "ActivationStore", embed_parts=True)
    except UserError:
      site = None
    for entry in self.manifest["sites"]:
      if (site, layer) == (entry["site"], entry["layer"]):
        return entry
    raise UserError(f"ActivationStore: {name!r} is not stored; stored: {', '.join(self.sites)}")

  def _shards(self, name: str) -> Iterator[np.ndarray]:
    """The shards of column `name`, one at a time (memory-mapped from a local folder)."""
    folder = self._entry(name)["folder"]
    if self._memory is not None:
      yield from self._memory[folder]
      return
    for i in range(len(self.manifest["shards"])):
      path = self.path / folder / f"{i:06d}.npy"
      if remote.is_remote(path):
        yield np.load(io.BytesIO(path.read_bytes()))
      else:
        yield np.load(os.fspath(path), mmap_mode="r")

  def __getitem__(self, name: str) -> np.ndarray:
    """[N, *shape]: site `name` at every stored token (all read at once; `batches` reads a few at a time)."""
    entry = self._entry(name)
    parts = list(self._shards(name))
    dtype = np.int32 if name in INDEX else np.float32
    return np.concatenate(parts) if parts else np.zeros((0, *entry["shape"]), dtype)

  @property
  def tokens_N(self) -> np.ndarray:
    return self["tokens"]

  @property
  def sequence_N(self) -> np.ndarray:
    return self["sequence"]

  @property
  def position_N(self) -> np.ndarray:
    return self["position"]

  def batches(self, names: str | Sequence[str] | None = None, batch_tokens: int = 4096) -> Iterator:
    """Batches of `batch_tokens` tokens (the last one shorter), read shard by shard: arrays of one site
    when `names` is a name, else dicts {name: array} (default every site, with tokens, sequence, position)."""
    if isinstance(batch_tokens, bool) or not isinstance(batch_tokens, int) or batch_tokens < 1:
      raise UserError(f"ActivationStore.batches: batch_tokens={batch_tokens!r} must be an int >= 1")
    one = isinstance(names, str)
    wanted = (names,) if one else tuple(self.sites + INDEX) if names is None else tuple(names)
    for name in wanted:
      self._entry(name)
    readers = {name: self._shards(name) for name in wanted}
    held = {name: [] for name in wanted}
    count = 0
    for shard_size in self.manifest["shards"]:
      for name, reader in readers.items():
        held[name].append(next(reader))
      count += shard_size
      while count >= batch_tokens:
        out = {}
        for name in wanted:
          joined = np.concatenate(held[name])
          out[name], held[name] = joined[:batch_tokens], [joined[batch_tokens:]]
        count -= batch_tokens
        yield out[names] if one else out
    if count:
      out = {name: np.concatenate(held[name]) for name in wanted}
      yield out[names] if one else out

  def mean(self, name: str) -> np.ndarray:
    """The mean of site `name` over the stored tokens (float64, [*shape]); padding is in no shard."""
    entry = self._entry(name)
    total = np.zeros(entry["shape"], np.float64)
    for shard in self._shards(name):
      total += np.asarray(shard, np.float64).sum(0)
    return total / max(self.num_tokens, 1)


# ----------------------------------------------------------------------------------------------- inputs


_INPUTS = "texts, token-id lists, word lists, a text file (a pathlib.Path) or an iterator of texts"


def _inputs(value):
  """The `inputs` rule: texts, token ids, word lists or treebank sentences, a text file, or an iterator."""
  if isinstance(value, str | os.PathLike):
    return value
  array = hasattr(value, "__array__")
  if isinstance(value, bytes | dict) or (array and np.ndim(value) == 0) or not isinstance(value, Iterable | Sequence):
    raise check.Wrong(f"={check.short(value)} must be {_INPUTS}, not {type(value).__name__}")
  if (isinstance(value, Sequence) or array) and not len(value):
    raise check.Wrong(f"=[] is empty: give {_INPUTS}")
  return value


def _site_keys(sites, cfg) -> list[tuple[str, str, int | None]]:
  """(name, capture name, layer or None) per distinct site: a capture name (all layers: [L, *rest] per token)
  or 'blocks.{l}.' and a name (one layer); UserError for an unknown name, a layer out of range or an
  attention map (two token axes: no one vector per token)."""
  out, seen = [], set()
  for name in sites:
    match = _TL_NAME.fullmatch(name)
    layer, rest = (int(match.group(1)), match.group(2)) if match else (None, name)
    (site,) = cache_lib.check_sites((rest,), "activations", embed_parts=True)
    if site not in cache_lib.EMBED_PARTS and len(cache_lib.token_axes(site)) > 1:
      raise UserError(
        f"activations: sites={name!r} is an attention map (a row over every key per token, no vector of its "
        "own); read it with headspec.capture"
      )
    if layer is not None and site not in SITES:
      raise UserError(f"activations: sites={name!r}: {site!r} has no layer axis; give {site!r}")
    if layer is not None and not 0 <= layer < cfg.num_layers:
      raise UserError(f"activations: sites={name!r}: layer {layer} is out of range 0..{cfg.num_layers - 1}")
    if (site, layer) not in seen:
      seen.add((site, layer))
      out.append((name, site, layer))
  return out


def _prefix_suffix(tokenizer, prepend_bos) -> tuple[list[int], list[int]]:
  """The specials around each row, as tokens.token_ids puts them around a text."""
  if prepend_bos is None:
    prefix = list(tokenizer.prefix_ids)
  else:
    prefix = bos_ids(tokenizer) if prepend_bos else []
  return [int(i) for i in prefix], [int(i) for i in tokenizer.suffix_ids]


def _documents(path: epath.Path) -> Iterator[str]:
  """The blank-line-separated documents of a UTF-8 text file (the data directory's text/<corpus>/*.txt)."""
  lines = []
  try:
    with path.open("r", encoding="utf-8-sig") as f:
      for line in f:
        if line.strip():
          lines.append(line.strip())
        elif lines:
          yield "\n".join(lines)
          lines = []
  except UnicodeDecodeError as e:
    raise UserError(f"activations: {path}: not UTF-8 ({e.reason})") from None
  if lines:
    yield "\n".join(lines)


def _concatenated(texts: Iterable, tokenizer, width: int, prefix, suffix) -> Iterator[np.ndarray]:
  """TransformerLens's tokenize_and_concatenate: each text's ids then EOS (lm_pipeline.tokenize_stream's
  stream), cut into rows of `width` tokens with the specials around each; the last row shorter (kept)."""
  content = width - len(prefix) - len(suffix)
  if content < 1:
    raise UserError(f"activations: context={width} leaves no room for the {len(prefix) + len(suffix)} special tokens")
  held: list[int] = []
  for i, text in enumerate(texts):
    if not isinstance(text, str):
      raise UserError(f"activations: inputs[{i}]={check.short(text)} is not a text but a {type(text).__name__}")
    problem = check.unicode_problem(text)
    if problem:
      raise UserError(f"activations: inputs[{i}]: {problem}; give valid Unicode text")
    held += [*map(int, tokenizer.encode(text)), int(tokenizer.eos_id)]
    while len(held) >= content:
      yield np.asarray(prefix + held[:content] + suffix, np.int32)
      del held[:content]
  if held:
    yield np.asarray(prefix + held + suffix, np.int32)


def _id_rows(inputs, mask, vocab_size: int) -> list[np.ndarray]:
  """Token-id rows ([T], [B, T] or a list of id lists), each cut to its `mask` (a [B, T] bool mask, or one
  per row) when given: an id list padded by hand is given with its mask and keeps only its real tokens."""
  rows = tokens_lib.texts_or_ids(inputs, "activations: inputs")
  if mask is not None:
    masks = tokens_lib.texts_or_ids(mask, "activations: mask")
    if len(masks) != len(rows):
      raise UserError(f"activations: mask has {len(masks)} rows for {len(rows)} rows of inputs")
  out = []
  for b, row in enumerate(rows):
    what = f"activations: inputs[{b}]"
    if mask is not None:
      keep = np.asarray(masks[b])
      if keep.shape != (len(row),) or keep.dtype.kind not in "biu" or not np.isin(keep, (0, 1)).all():
        raise UserError(f"activations: mask[{b}] must be {len(row)} bools (True at the real tokens of inputs[{b}])")
      row = [t for t, k in zip(row, keep) if k]
    ids = tokens_lib.check_ids(row, vocab_size, what)
    if not ids:
      raise UserError(f"{what} is empty (no tokens)")
    out.append(np.asarray(ids, np.int32))
  return out


def _rows(inputs, tokenizer, cfg, *, mask, context, prepend_bos) -> tuple[Iterable[np.ndarray], int | None]:
  """(the rows of token ids, how many when known up front): one row per text, id list or word list, or
  with `context` (and for a file or an iterator, at the model's context by default) the texts' tokens
  concatenated and cut into rows."""
  if context is not None and not 1 <= context <= cfg.max_len:
    raise UserError(f"activations: context={context} must be in 1..{cfg.max_len} (the model's context)")
  items = [inputs] if isinstance(inputs, str) else inputs
  ids = hasattr(items, "__array__") or (
    isinstance(items, Sequence)
    and not isinstance(items, os.PathLike)
    and (check.is_token_id(items[0]) or (_is_sequence(items[0]) and all(map(check.is_token_id, items[0]))))
  )
  if mask is not None and not ids:
    raise UserError("activations: mask= goes with token ids (inputs as [B, T] ids or id lists), not with text")
  if ids and context is not None:
    raise UserError("activations: context= cuts text into rows; token ids are rows already (give them cut)")
  if ids:
    rows = _id_rows(items, mask, cfg.vocab_size)
    return rows, len(rows)
  if tokenizer is None:
    raise UserError("activations: text needs a tokenizer; pass headspec.load(...)'s result or tokenizer=")
  prefix, suffix = _prefix_suffix(tokenizer, prepend_bos)
  if isinstance(items, os.PathLike):
    path = epath.Path(items)
    if not path.is_file():
      raise UserError(f"activations: inputs={os.fspath(items)}: no such file")
    return _concatenated(_documents(path), tokenizer, context or cfg.max_len, prefix, suffix), None
  if not isinstance(items, Sequence):  # an iterator: streamed
    return _concatenated(items, tokenizer, context or cfg.max_len, prefix, suffix), None
  if context is not None:
    rows = list(_concatenated(items, tokenizer, context, prefix, suffix))
    return rows, len(rows)
  rows = []
  for i, item in enumerate(items):
    what = f"activations: inputs[{i}]"
    if isinstance(item, str):
      problem = check.unicode_problem(item)
      if problem:
        raise UserError(f"{what}: {problem}; give valid Unicode text")
      row = tokens_lib.token_ids(tokenizer, item, prepend_bos)
    else:  # a word list or a treebank sentence: its words' pieces, as the probes tokenize them
      words = getattr(item, "words", item)
      if not _is_sequence(words) or not words or not all(isinstance(w, str) and w.strip() for w in words):
        raise UserError(f"{what}={check.short(item)} is neither a text nor a list of words")
      row = prefix + [int(p) for pieces in tokenizer.word_pieces(list(words)) for p in pieces] + suffix
    if not row:
      raise UserError(f"{what} is empty (no tokens)")
    if len(row) > cfg.max_len:
      raise UserError(
        f"{what}: {len(row)} tokens exceed the model's context of {cfg.max_len}; give context={cfg.max_len} to "
        "concatenate the texts and cut them into rows (TransformerLens's tokenize_and_concatenate)"
      )
    rows.append(np.asarray(row, np.int32))
  return rows, len(rows)


def _is_sequence(value) -> bool:
  return (isinstance(value, Sequence) and not isinstance(value, str)) or type(value).__name__ == "ndarray"


def _batches(rows: Iterable[np.ndarray], max_len: int, batch_tokens: int) -> Iterator[tuple[int, int, list]]:
  """(T, B, [(row number, ids), ...]) batches of words.window_batches (one bucket per batch, B = batch_tokens
  // T rows), over rows that arrive one by one: full batches go as soon as their rows are there, the rest
  wait for more rows (and go last, part empty)."""
  held, limit = [], batch_tokens // 4 + 64  # at most batch_tokens / 8 rows wait between flushes

  def flush(final: bool):
    lengths = np.array([len(ids) for _, ids in held])
    ready, waiting = [], []
    for T, B, members in words_layer.window_batches(lengths, max_len, batch_tokens):
      chosen = [held[i] for i in members]
      (ready if final or len(members) == B else waiting).append((T, B, chosen))
    return ready, [item for _, _, chosen in waiting for item in chosen]

  for item in enumerate(rows):
    held.append(item)
    if len(held) >= limit:
      ready, held = flush(False)
      yield from ready
  if held:
    yield from flush(True)[0]


# ------------------------------------------------------------------------------------------------ writing


def _destination(to) -> epath.Path:
  """`to` as a new or empty folder we can write; UserError otherwise (a store is never written over)."""
  remote.check_url(to, "activations: to")
  folder = epath.Path(to if remote.is_remote(to) else os.path.abspath(os.path.expanduser(os.fspath(to))))
  try:
    if folder.exists() and not folder.is_dir():
      raise UserError(f"activations: to={os.fspath(to)} is a file; give a new or empty folder")
    if folder.is_dir() and any(True for _ in folder.iterdir()):
      raise UserError(f"activations: to={os.fspath(to)} is not empty; give a new or empty folder")
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / ".write-check"
    probe.write_bytes(b"")
    probe.unlink()
  except OSError as e:
    raise UserError(f"activations: to={os.fspath(to)}: cannot write there ({e.strerror or e})") from None
  return folder


class _Shards:
  """Where each batch's columns go: lists in memory, or DIR/<column>/<shard>.npy."""

  def __init__(self, folder: epath.Path | None, columns: list[str]):
    self.folder, self.columns, self.sizes = folder, columns, []
    self.memory = None if folder is not None else {c: [] for c in columns}

  def add(self, values: dict[str, np.ndarray]) -> None:
    n = len(values["tokens"])
    if self.folder is None:
      for column, value in values.items():
        self.memory[column].append(value)
    else:
      for column, value in values.items():
        path = self.folder / column / f"{len(self.sizes):06d}.npy"
        buffer = io.BytesIO()
        np.save(buffer, value)
        try:
          remote.write_bytes_atomic(path, buffer.getvalue())  # whole, or not at all (a full disk)
        except OSError as e:
          raise UserError(f"activations: writing {path}: {e.strerror or e}") from None
    self.sizes.append(n)

  def remove(self) -> None:
    """After a failure: the shards written so far, so the folder holds no unfinished store."""
    if self.folder is not None:
      for column in self.columns:
        if (self.folder / column).exists():
          (self.folder / column).rmtree()


# ------------------------------------------------------------------------------------------------ the run


@check.arguments(
  model=model_rule,
  inputs=_inputs,
  sites=site_names,
  to=check.optional(check.path),
  context=check.optional(check.integer(1)),
  batch_tokens=check.integer(1),
  prepend_bos=check.optional(check.boolean),
  progress=check.boolean,
  tokenizer=check.optional(check.tokenizer),
)
def activations(
  model,
  inputs,
  *,
  sites,
  to=None,
  mask=None,
  context: int | None = None,
  batch_tokens: int = 4096,
  prepend_bos: bool | None = None,
  progress: bool = True,
  tokenizer=None,
) -> ActivationStore:
  """The activations of `sites` at every real token of `inputs` (module docstring): an `ActivationStore`.

  model: `load(...)`'s result, a (model, tokenizer) pair, or a Transformer (token ids). inputs: a text or a
  list of texts (each one row, tokenized as `to_tokens`), token ids ([T], [B, T] or id lists; `mask`: True
  at the real tokens of ids padded by hand), word lists or treebank sentences (their words' pieces, as
  the probes tokenize them), a text file (a pathlib.Path; documents separated by blank lines) or an
  iterator of texts. context: concatenate the texts (each followed by EOS) and cut them into rows of this
  many tokens, specials included (TransformerLens's tokenize_and_concatenate); a file or an iterator is
  cut at the model's context by default. sites: names as `capture` takes them: 'resid_post' ([L, D] per
  token), 'blocks.3.attn.hook_z' ([H, K]: one layer), 'hook_embed' (the token embedding, computed from the
  weights as `capture` does); attention maps are refused. to: None
  (numpy, in memory) or a new or empty folder (local or gs://) for .npy shards and a manifest.
  batch_tokens: tokens per batch (B = batch_tokens // T rows of a bucket T). progress: a tqdm bar (stderr).
  Bad input is one UserError, before the model runs where it can be seen up front.
  """
  net, tokenizer = model_and_tokenizer(model, tokenizer)
  cfg = net.cfg
  keys = _site_keys(sites, cfg)
  rows, total = _rows(inputs, tokenizer, cfg, mask=mask, context=context, prepend_bos=prepend_bos)
  folder = _destination(to) if to is not None else None
  folders = {name: site if layer is None else f"blocks.{layer}.{site}" for name, site, layer in keys}
  shards = _Shards(folder, [*folders.values(), *INDEX])
  run = [(name, site, layer) for name, site, layer in keys if site not in cache_lib.EMBED_PARTS]
  parts = [(name, site) for name, site, _ in keys if site in cache_lib.EMBED_PARTS]  # from the weights
  graphdef, state = nnx.split(net)
  if run:
    captured = cache_lib.check_sites([site for _, site, _ in run], "activations")
    program = cache_lib.forward(graphdef, captured, "hidden", tuple((site, layer) for _, site, layer in run))
  pad_id = int(getattr(tokenizer, "pad_id", 0) or 0)
  shapes, buckets, num_sequences = {}, {}, 0
  bar = jobloop.progress(total, "activations", unit="seq", disable=not progress)
  try:
    for T, B, members in _batches(rows, cfg.max_len, batch_tokens):
      tokens_BT, valid_BT = np.full((B, T), pad_id, np.int32), np.zeros((B, T), bool)
      sequence_BT = np.zeros((B, T), np.int32)
      for b, (number, ids) in enumerate(members):
        tokens_BT[b, : len(ids)], valid_BT[b, : len(ids)], sequence_BT[b] = ids, True, number
      picked = jax.device_get(program(state, tokens_BT, valid_BT, None)[1]) if run else ()
      values = {"tokens": tokens_BT[valid_BT], "sequence": sequence_BT[valid_BT]}
      values["position"] = np.nonzero(valid_BT)[1].astype(np.int32)
      for (name, site, layer), value in zip(run, picked):
        if layer is None and site in SITES:  # [L, B, T, ...] -> [B, T, L, ...]
          value = np.moveaxis(value, 0, 2)
        values[folders[name]] = np.asarray(value[valid_BT], np.float32)
      for name, site in parts:
        values[folders[name]] = np.asarray(
          cache_lib.embed_part(net, tokens_BT, site, "activations")[valid_BT], np.float32
        )
      for name in folders:
        shapes[name] = list(values[folders[name]].shape[1:])
      shards.add(values)
      buckets[T] = buckets.get(T, 0) + 1
      num_sequences = max(num_sequences, max(number for number, _ in members) + 1)
      bar.set_postfix(tokens=sum(shards.sizes), refresh=False)
      bar.update(len(members))
    if not shards.sizes:
      raise UserError("activations: inputs gave no tokens (an empty file or iterator)")
  except BaseException:
    shards.remove()
    raise
  finally:
    bar.close()
  loaded = model if isinstance(model, Loaded) else None
  manifest = {
    "format": FORMAT,
    "model": loaded.name if loaded else None,
    "step": loaded.step if loaded else None,
    "sites": [
      {"name": name, "site": site, "layer": layer, "shape": shapes[name], "dtype": "float32", "folder": folders[name]}
      for name, site, layer in keys
    ],
    "num_tokens": int(sum(shards.sizes)),
    "num_sequences": num_sequences,
    "shards": shards.sizes,
    "buckets": {str(T): n for T, n in sorted(buckets.items())},
    "batch_tokens": batch_tokens,
    "context": context,
  }
  if folder is not None:
    remote.write_bytes_atomic(folder / "manifest.json", json.dumps(manifest, indent=1).encode())
  return ActivationStore(manifest, folder, shards.memory)
