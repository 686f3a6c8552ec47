"""Per-word features of a treebank split: every head's Z_h, every layer's residual stream, the embeddings.

The model runs under `jax.jit` on windows of word pieces (headspec/words/alignment.py), packed side by
side into rows of words.ROW_TOKENS tokens (headspec/words/batches.py, the word layer every analysis shares; each window
keeps its own positions and
attends only within itself, so its outputs are those of running it alone), a fixed number of tokens
per batch, so a split compiles once per row width and rows are ~95% tokens, not padding (EWT train:
98%; one window per row padded to a power of two would be 66%). Inside the jitted function each word's
vector is pooled from its pieces with a [B, W, T] matrix, so only word vectors leave the device.

Batches are dealt round-robin over every local device (data parallel: on a CPU host the CLI gives XLA
one device per core; on a GPU host, one per GPU), with up to two batches in flight per device, and a
batch's results are read back on this thread once newer ones are queued, and a writer thread writes them
to disk while the next batches are dispatched, so the device does not wait on the disk (nor the host on
one device). Only numpy arrays cross to the writer: no JAX array is touched off the main thread.
Memory stays bounded whatever the split size: each batch is appended to `.npy` files on disk (no
array of the whole split is ever held), one file per layer, in processing order; `Features.z(layer)`
reads one layer back in word order. The files form a cache at `cache_dir/<name>-<hash>/`, keyed by the
model identity and step, the words of the split (so any change of file or subsample is a new key),
pooling, dtype and this module's FORMAT_VERSION; a second run reads it instead of recomputing. A folder
is written as `<name>-<hash>.tmp-<pid>` and renamed when whole; one left by a killed process is removed
by the next extraction into the cache (`headspec.io.remote.remove_stale_temps`). One that fails (a full
disk) removes its own and raises an OSError naming the cache folder (the CLI prints it as one line).
The cache is always on local disk (it is memory-mapped and appended to, which object stores cannot
do): a remote `cache_dir` (`gs://bucket/run/probes/cache`) stands for a folder on local scratch
(`headspec.io.remote.scratch_dir`, under HEADSPEC_SCRATCH); `run_cache_dir(workdir)` is a run's.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import dataclasses
import hashlib
import json
import os
import pathlib
import shutil
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np
from flax import nnx

from headspec.errors import UserError
from headspec.io import filenames, remote
from headspec.parallel import mesh as mesh_lib
from headspec.words import alignment as align_lib
from headspec.words import batches as words_lib

FORMAT_VERSION = 2  # 2: windows packed into rows
CACHE_DTYPES = ("float16", "float32")
_META = "meta.json"
CAPTURE = ("z", "resid_post", "embeddings")  # the sites a split's features hold, pooled per word


@dataclasses.dataclass(frozen=True)
class Features:
  """The features of one split in a cache folder; arrays are read per layer, as float32, in word order.

  word_sentence_N: each word's sentence index (for bootstrap over sentences). order_N: stored row r is
  word order_N[r].
  """

  path: pathlib.Path
  num_layers: int
  num_heads: int
  d_head: int
  d_model: int
  word_sentence_N: np.ndarray
  order_N: np.ndarray
  num_sentences: int
  num_split_sentences: int
  num_truncated_words: int
  from_cache: bool

  @property
  def num_words(self) -> int:
    return len(self.order_N)

  def _read(self, name: str) -> np.ndarray:
    stored = np.load(self.path / f"{name}.npy", mmap_mode="r")
    out = np.empty(stored.shape, np.float32)
    out[self.order_N] = stored
    return out

  def z(self, layer: int) -> np.ndarray:
    """[N, H, K] context vectors Z_h of every head of block `layer` (before W_O)."""
    return self._read(f"z_{layer}")

  def residual(self, layer: int) -> np.ndarray:
    """[N, D] residual stream after block `layer`; layer -1 is the embedding output."""
    return self._read("embeddings") if layer == -1 else self._read(f"residual_{layer}")


def run_cache_dir(workdir) -> pathlib.Path:
  """A run's feature cache: RUN/probes/cache for a local run; for a remote one (gs://...) a folder on
  local scratch standing for it (HEADSPEC_SCRATCH, default the temp dir; the same URL, the same folder)."""
  return local_cache_dir(remote.run_path(workdir) / "probes" / "cache")


def local_cache_dir(path) -> pathlib.Path:
  """`path` as a local folder: itself when local, its scratch stand-in when it is a URL."""
  if remote.is_remote(path):
    return remote.scratch_dir(path, "features")
  return pathlib.Path(os.fspath(path))


def check_options(pooling: str, dtype: str) -> None:
  """UserError unless `pooling` is 'auto' or one of align.POOLINGS and `dtype` one of CACHE_DTYPES."""
  if pooling != "auto":
    align_lib.check_pooling(pooling)
  if dtype not in CACHE_DTYPES:
    raise UserError(f"probe.cache_dtype={dtype!r}: use one of {', '.join(CACHE_DTYPES)}")


def words_fingerprint(sentences: Sequence[Sequence[str]]) -> str:
  """SHA-256 of the words of a split: the same text gives the same key, any edit or subsample a new one."""
  digest = hashlib.sha256()
  for words in sentences:
    digest.update("\t".join(words).encode())
    digest.update(b"\n")
  return digest.hexdigest()


class _NpyAppender:
  """Writes a .npy file of known shape row block by row block (numpy's header, then raw rows), so no
  full-size array or memory map of it is ever resident."""

  def __init__(self, path: pathlib.Path, shape: tuple[int, ...], dtype: np.dtype):
    self.file = pathlib.Path(path).open("wb")  # local scratch or a local run: appended to
    self.dtype = np.dtype(dtype)
    np.lib.format.write_array_header_2_0(
      self.file, {"descr": np.lib.format.dtype_to_descr(self.dtype), "fortran_order": False, "shape": shape}
    )

  def append(self, rows: np.ndarray) -> None:
    self.file.write(np.ascontiguousarray(rows, self.dtype).tobytes())

  def close(self) -> None:
    self.file.close()


def _cache_name(identity: dict, name: str, sentences, pooling: str, dtype: str, max_len: int, interventions) -> str:
  key = dict(
    identity=identity,
    words=words_fingerprint(sentences),
    pooling=pooling,
    dtype=dtype,
    max_len=max_len,
    version=FORMAT_VERSION,
  )
  if interventions:  # an edited model is another computation (unedited keys stay as they were)
    key["interventions"] = words_lib.interventions_fingerprint(interventions)
  digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:20]
  return f"{filenames.component(name)}-{digest}"


def _load(folder: pathlib.Path, from_cache: bool) -> Features:
  meta = json.loads((folder / _META).read_text())
  return Features(
    path=folder,
    num_layers=meta["num_layers"],
    num_heads=meta["num_heads"],
    d_head=meta["d_head"],
    d_model=meta["d_model"],
    word_sentence_N=np.load(folder / "word_sentence.npy"),
    order_N=np.load(folder / "order.npy"),
    num_sentences=meta["num_sentences"],
    num_split_sentences=meta["num_split_sentences"],
    num_truncated_words=meta["num_truncated_words"],
    from_cache=from_cache,
  )


class _Files:
  """The .npy files a split's features are appended to: z per layer [N,H,K], residual per layer [N,D],
  embeddings [N,D]."""

  def __init__(self, tmp, num_words: int, cfg, dtype: str):
    N, H, K, D = num_words, cfg.num_heads, cfg.d_head, cfg.d_model
    self.z = [_NpyAppender(tmp / f"z_{l}.npy", (N, H, K), dtype) for l in range(cfg.num_layers)]
    self.residual = [_NpyAppender(tmp / f"residual_{l}.npy", (N, D), dtype) for l in range(cfg.num_layers)]
    self.embeddings = _NpyAppender(tmp / "embeddings.npy", (N, D), dtype)

  def append(self, outputs, words: list[np.ndarray]) -> np.ndarray:
    """Appends one batch's pooled outputs, row by row in `words` order; returns the words written."""
    z_LBWHK, residual_LBWD, embeddings_BWD = (np.asarray(outputs[name]) for name in CAPTURE)
    rows = [(b, k) for b, mine in enumerate(words) for k in range(len(mine))]
    b_idx, w_idx = (np.array(v, np.int64) for v in zip(*rows)) if rows else (np.zeros(0, np.int64),) * 2
    for l, (z, residual) in enumerate(zip(self.z, self.residual)):
      z.append(z_LBWHK[l, b_idx, w_idx])
      residual.append(residual_LBWD[l, b_idx, w_idx])
    self.embeddings.append(embeddings_BWD[b_idx, w_idx])
    return np.concatenate(words) if words else np.zeros(0, np.int64)

  def close(self) -> None:
    for f in self.z + self.residual + [self.embeddings]:
      f.close()


def _run_batches(
  model, tokenizer, al, lengths, batches, batch_tokens, pooling, devices, files: _Files, interventions=None
) -> np.ndarray:
  """Runs every batch (round-robin over devices, or sharded over the command's mesh when one is set) and
  appends its features; returns the words in written order.

  This thread reads each batch back once more than two per device are in flight (which bounds device
  memory) and hands the numpy arrays to one writer thread, fed in batch order (so rows land in dispatch
  order), which appends them to the files while this thread dispatches the next ones."""
  graphdef, state = nnx.split(model)
  forward = words_lib.pooled_forward(graphdef, CAPTURE)
  grid = mesh_lib.current()
  if grid is not None:  # one sharded forward per batch: weights by the rules, rows over data×fsdp
    states, devices = [mesh_lib.place(state, grid)], [grid]
    put = lambda inputs, d: mesh_lib.put_batch(inputs, grid)
  else:
    states = [jax.device_put(state, d) for d in devices]  # the weights once per device
    put = lambda inputs, d: jax.device_put(inputs, devices[d])
  words_of_window = words_lib.words_of_windows(al)
  in_flight, written = collections.deque(), []
  with concurrent.futures.ThreadPoolExecutor(1) as writer:

    def read_back_oldest():  # on this thread: the writer only ever sees numpy arrays, never a JAX one
      outputs, words = in_flight.popleft()
      written.append(writer.submit(files.append, jax.device_get(outputs), words))

    for i, (T, rows) in enumerate(batches):
      inputs, words = words_lib.packed_inputs(
        T, rows, al, lengths, words_of_window, tokenizer.pad_id, batch_tokens, pooling
      )
      d = i % len(devices)
      outputs = forward(states[d], *put(inputs, d), interventions)  # asynchronous
      in_flight.append((outputs, words))
      if len(in_flight) > 2 * len(devices):
        read_back_oldest()
    while in_flight:
      read_back_oldest()
    order = [f.result() for f in written]
  files.close()
  return np.concatenate(order).astype(np.int64)


def extract_features(
  model,
  tokenizer,
  sentences: Sequence[Sequence[str]],
  *,
  cache_dir,
  identity: dict,
  name: str = "split",
  pooling: str = "first",
  dtype: str = "float16",
  batch_tokens: int = 4096,
  log: Callable[[str], None] | None = print,
  devices: Sequence[jax.Device] | None = None,
  interventions: dict | None = None,
) -> Features:
  """Features of every word of `sentences` (each a sequence of word strings), cached under `cache_dir`.

  identity: what makes the model's computation unique (run directory, step, model config, or the
  pretrained weights' path; for random models the seed); with the words, pooling and dtype it keys the cache.
  name: a readable prefix for the cache folder (e.g. `minilm-step0-en_ewt-train`).
  cache_dir: a local folder; a URL (gs://...) is cached on local scratch instead (`local_cache_dir`).
  devices: where batches run, round-robin (default: every local device). The stored features do not
  depend on it: every batch runs the same compiled program, whichever device it lands on.
  interventions: model.py's {site: edit} applied in every pass (e.g. `{"z": edits.head_mask(m, r)}`: the
  features of a model with heads ablated); part of the cache key.
  """
  check_options(pooling, dtype)
  if not sentences:
    raise UserError(f"{name}: no sentences to extract features from")
  cfg = model.cfg
  cache_dir = local_cache_dir(cache_dir)
  for stale in remote.remove_stale_temps(cache_dir):  # a killed extraction's half-written folder
    if log:
      log(f"  removed {stale} (left by a process that no longer runs)")
  folder = cache_dir / _cache_name(identity, name, sentences, pooling, dtype, cfg.max_len, interventions)
  if (folder / _META).is_file():
    return _load(folder, from_cache=True)

  t0 = time.perf_counter()
  al = align_lib.align(sentences, tokenizer, cfg.max_len, causal=cfg.kind == "decoder")
  tmp = cache_dir / f"{folder.name}{remote.temp_suffix()}"
  shutil.rmtree(tmp, ignore_errors=True)
  files = None
  try:  # a failed write (a full disk) leaves no half-written folder and names the cache folder
    tmp.mkdir(parents=True)
    files = _Files(tmp, al.num_words, cfg, dtype)
    lengths = np.array([len(w) for w in al.windows])
    widths, batches = words_lib.packed_batches(lengths, cfg.max_len, batch_tokens)
    devices = list(devices or jax.local_devices())
    order_N = _run_batches(model, tokenizer, al, lengths, batches, batch_tokens, pooling, devices, files, interventions)
    assert len(order_N) == al.num_words and np.array_equal(np.sort(order_N), np.arange(al.num_words)), "every word once"
    np.save(tmp / "order.npy", order_N)
    np.save(tmp / "word_sentence.npy", al.word_sentence_N)
    meta = dict(
      name=name,
      identity=identity,
      num_words=al.num_words,
      num_sentences=len(sentences),
      num_layers=cfg.num_layers,
      num_heads=cfg.num_heads,
      d_head=cfg.d_head,
      d_model=cfg.d_model,
      pooling=pooling,
      dtype=dtype,
      max_len=cfg.max_len,
      num_windows=len(al.windows),
      num_split_sentences=al.num_split_sentences,
      num_truncated_words=al.num_truncated_words,
      row_widths=sorted(int(t) for t in np.unique(widths)),
      fill=round(float(lengths.sum()) / sum(max(1, batch_tokens // T) * T for T, _ in batches), 3),
      seconds=round(time.perf_counter() - t0, 2),
      devices=len(devices),
      version=FORMAT_VERSION,
    )
    (tmp / _META).write_text(json.dumps(meta, indent=1, default=str) + "\n")
    try:
      tmp.rename(folder)
    except OSError:
      if not folder.is_dir():
        raise
      shutil.rmtree(tmp, ignore_errors=True)  # another process finished the same cache first: keep its copy
  except BaseException as e:
    if files is not None:
      with contextlib.suppress(OSError):
        files.close()
    shutil.rmtree(tmp, ignore_errors=True)
    if isinstance(e, OSError):
      raise OSError(e.errno, e.strerror, str(folder)) from None
    raise
  if log:
    log(
      f"  features {name}: {len(sentences)} sentences, {al.num_words} words, {al.num_split_sentences} split into "
      f"windows, rows of {'/'.join(map(str, meta['row_widths']))} tokens ({meta['fill']:.0%} filled), "
      f"{meta['seconds']:.1f} s on {len(devices)} device(s)"
    )
  return _load(folder, from_cache=False)
