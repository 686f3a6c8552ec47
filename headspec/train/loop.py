"""Training: masked-LM (encoder) or causal-LM (decoder) with optax, one step function for jit and pmap.

`train_and_evaluate(config, workdir)` prepares the corpus and tokenizer, builds the model, resumes from
the latest checkpoint, and trains, logging to WORKDIR/metrics.jsonl and TensorBoard events. Every config
value is checked first (`check_config`), and nothing is written before those checks, the resume checks
(runs.check_resume) and the restore have passed: a refused run leaves its workdir as it was.

Randomness is a function of (seed, step, example index), never of the device layout: MLM masks are drawn
per example from `fold_in(fold_in(key, step), example_id)`, so the jit mesh, pmap and a single device
see the same masks and (without dropout) the same losses. Dropout keys also fold in the pmap device.
"""

from __future__ import annotations

import contextlib
import functools
import math
import signal
import time

import flax.struct
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
from absl import logging
from etils import epath
from flax import nnx
from jax.experimental import multihost_utils

from headspec.data import lm_pipeline, text_tfds
from headspec.data import repeats as repeats_lib
from headspec.data import tokenizer as tokenizer_lib
from headspec.data.tokenizer import bos_ids, special_ids
from headspec.diversity import metrics as diversity
from headspec.errors import UserError
from headspec.io import locks, provenance, remote
from headspec.io.metrics import MetricsWriter
from headspec.model import edits
from headspec.model.config import ModelConfig, from_section
from headspec.model.objectives import Objective, eval_step, loss_inputs, token_nll
from headspec.model.transformer import Transformer
from headspec.parallel import distributed as parallel
from headspec.parallel import mesh as mesh_lib
from headspec.parallel.compilations import program_cache
from headspec.runs import checkpoints, targets
from headspec.runs import directory as runs
from headspec.train import regularizers
from headspec.words import jobloop


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: nnx.State
  opt_state: optax.OptState


def make_optimizer(train: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """AdamW (Loshchilov & Hutter 2019) with linear warmup, cosine decay to 10%, and global-norm clipping.

  Weight decay applies to matrices only (not biases, LayerNorm parameters or the output bias). The same
  options give the same object, so the jitted step that closes over it is found again (`_compiled_step`).
  """
  return _optimizer(
    float(train.grad_clip),
    float(train.learning_rate),
    int(train.warmup_steps),
    int(train.steps),
    float(train.weight_decay),
  )


@functools.lru_cache(maxsize=16)
def _optimizer(grad_clip, learning_rate, warmup_steps, steps, weight_decay) -> optax.GradientTransformation:
  schedule = _schedule(learning_rate, warmup_steps, steps)
  decay_mask = lambda params: jax.tree.map(lambda x: x.ndim > 1, params)
  return optax.chain(
    optax.clip_by_global_norm(grad_clip),
    optax.adamw(schedule, b1=0.9, b2=0.98, weight_decay=weight_decay, mask=decay_mask),
  )


def learning_rate_schedule(train: ml_collections.ConfigDict) -> optax.Schedule:
  return _schedule(float(train.learning_rate), int(train.warmup_steps), int(train.steps))


def _schedule(learning_rate: float, warmup_steps: int, steps: int) -> optax.Schedule:
  warmup = min(warmup_steps, max(steps - 1, 0))
  return optax.warmup_cosine_decay_schedule(
    0.0, learning_rate, warmup, max(steps, warmup + 1), end_value=0.1 * learning_rate
  )


def _psum(x, axis_name):
  return x if axis_name is None else jax.lax.psum(x, axis_name)


def train_step(state: TrainState, batch, base_key, *, graphdef, tx, obj: Objective, axis_name=None):
  """One optimisation step; pure. Under pmap (`axis_name` set) sums gradients and counts over devices.

  The loss is the mean cross-entropy over the global batch's scored tokens (sum over devices divided
  by the global count), so jit, pmap and one device optimise the same number.
  """
  mask_key, dropout_key = jax.random.split(jax.random.fold_in(base_key, state.step))
  inputs_BT, targets_BT, weights_BT = loss_inputs(batch, mask_key, obj)
  count = _psum(weights_BT.sum(), axis_name)
  if axis_name is not None:
    dropout_key = jax.random.fold_in(dropout_key, jax.lax.axis_index(axis_name))
  interventions, logged = None, {}
  if obj.drophead:
    rate = regularizers.drophead_rate(
      state.step, obj.total_steps, obj.drophead, obj.drophead_schedule, turn=obj.drophead_turn
    )
    mask_BLH = regularizers.drophead_mask(
      jax.random.fold_in(dropout_key, 1), rate, inputs_BT.shape[0], obj.num_layers, obj.num_heads
    )
    interventions = {"z": edits.head_mask(mask_BLH)}
    logged["drophead/rate"] = rate

  def loss_fn(params):
    model = nnx.merge(graphdef, params)
    logits_BTV, inter = model(
      inputs_BT, interventions=interventions, capture=obj.capture, dropout_rngs=nnx.Rngs(dropout=dropout_key)
    )
    token_loss_BT = token_nll(logits_BTV, targets_BT)
    loss = (token_loss_BT * weights_BT).sum() / count
    valid_BT = jnp.ones(inputs_BT.shape, bool)
    terms = (
      regularizers.disagreement_terms(
        inter, valid_BT, w_subspace=obj.subspace, w_position=obj.position, w_output=obj.output
      )
      if obj.capture
      else {}
    )
    if obj.query_orthogonality:
      w_q_LDHK = jnp.stack([block.attention.w_q_DHK[...] for block in model.blocks])
      terms["orthogonality/query"] = obj.query_orthogonality * regularizers.orthogonality_penalty(w_q_LDHK)
    # Regularizers are means over the local batch: scale so their psum over devices is the mean too.
    n_dev = 1 if axis_name is None else jax.lax.psum(1, axis_name)
    total = loss + sum(terms.values()) / n_dev
    return total, (loss, terms)

  grads, (loss, terms) = jax.grad(loss_fn, has_aux=True)(state.params)
  grads = _psum(grads, axis_name)
  loss = _psum(loss, axis_name)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics = {
    "loss": loss,
    "grad_norm": optax.tree.norm(grads),
    "scored_tokens": count,
    **{k: v if axis_name is None else jax.lax.pmean(v, axis_name) for k, v in {**terms, **logged}.items()},
  }
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


def objective(config: ml_collections.ConfigDict, tokenizer) -> Objective:
  reg = config.train.regularizers
  return Objective(
    kind=config.model.kind,
    vocab_size=tokenizer.vocab_size,
    mask_id=tokenizer.mask_id if tokenizer.mask_id is not None else tokenizer.unk_id,
    mlm_probability=config.train.mlm_probability,
    subspace=reg.subspace,
    position=reg.position,
    output=reg.output,
    query_orthogonality=reg.query_orthogonality,
    drophead=reg.drophead,
    drophead_schedule=reg.drophead_schedule,
    drophead_turn=reg.get("drophead_turn", 0.5),
    total_steps=config.train.steps,
    num_layers=config.model.num_layers,
    num_heads=config.model.num_heads,
  )


def _int(v) -> bool:
  return isinstance(v, int) and not isinstance(v, bool)


def _number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def check_config(config: ml_collections.ConfigDict) -> None:
  """Refuses, in one line naming the key, any data.*, model.* or train.* value training cannot use,
  before anything is read or written: a 0 that divides (log_every, checkpoint_every, seq_len), a negative
  count that skips training, a negative learning rate that ascends, a model with no heads."""
  if config.model.pretrained:
    raise UserError(
      f"model.pretrained={config.model.pretrained!r}: train trains a model from scratch; pretrained models "
      "are analysed as they are (step 0) by probe, diversity, ablate and attention"
    )
  train, reg = config.train, config.train.regularizers
  min_len = 2 if config.model.kind == "decoder" else 1  # a causal LM predicts each token from those before
  rules = [
    ("data.vocab_size", config.data.vocab_size, _int, 1),
    *((f"model.{k}", config.model[k], _int, 1) for k in ("num_layers", "num_heads", "d_model", "d_head", "d_ff")),
    ("train.steps", train.steps, _int, 1),
    ("train.batch_size", train.batch_size, _int, 1),
    ("train.seq_len", train.seq_len, _int, min_len),
    ("train.warmup_steps", train.warmup_steps, _int, 0),
    ("train.log_every", train.log_every, _int, 1),
    ("train.eval_every", train.eval_every, _int, 0),
    ("train.eval_batches", train.eval_batches, _int, 1),
    ("train.diversity_every", train.diversity_every, _int, 0),
    ("train.checkpoint_every", train.checkpoint_every, _int, 1),
    ("train.keep_last", train.keep_last, _int, 1),
    ("train.weight_decay", train.weight_decay, _number, 0),
    *(
      (f"train.regularizers.{k}", reg[k], _number, 0) for k in ("subspace", "position", "output", "query_orthogonality")
    ),
  ]
  for key, value, kind_ok, low in rules:
    if not (kind_ok(value) and value >= low):
      kind = "an integer" if kind_ok is _int else "a number"
      raise UserError(f"{key}={value!r}: must be {kind} >= {low}")
  ranges = [  # (key, value, ok, requirement)
    ("train.learning_rate", train.learning_rate, lambda v: v > 0, "> 0"),
    ("train.grad_clip", train.grad_clip, lambda v: v > 0, "> 0 (the largest global gradient norm)"),
    ("train.mlm_probability", train.mlm_probability, lambda v: 0 < v <= 1, "in (0, 1]"),
    ("model.dropout", config.model.dropout, lambda v: 0 <= v < 1, "in [0, 1)"),
    ("model.attention_dropout", config.model.attention_dropout, lambda v: 0 <= v < 1, "in [0, 1)"),
    ("train.regularizers.drophead", reg.drophead, lambda v: 0 <= v < 1, "in [0, 1)"),
    ("train.regularizers.drophead_turn", reg.drophead_turn, lambda v: 0 < v < 1, "in (0, 1)"),
  ]
  for key, value, ok, requirement in ranges:
    if not (_number(value) and ok(value)):
      raise UserError(f"{key}={value!r}: must be a number {requirement}")
  if reg.drophead_schedule not in ("constant", "v"):
    raise UserError(f"train.regularizers.drophead_schedule={reg.drophead_schedule!r}: must be 'constant' or 'v'")
  chunk = config.data.repeat_chunk or train.seq_len
  if not (_number(config.data.repeat_rows) and 0 <= config.data.repeat_rows <= 1):
    raise UserError(f"data.repeat_rows={config.data.repeat_rows!r}: must be a number in [0, 1]")
  if config.data.repeat_rows and not (_int(chunk) and 11 <= chunk and train.seq_len % chunk == 0):
    raise UserError(
      f"data.repeat_chunk={config.data.repeat_chunk!r}: must divide train.seq_len={train.seq_len} and be >= 11 "
      "(a BOS and twice a 5-token sequence)"
    )
  keep = train.keep_steps
  if not isinstance(keep, (tuple, list)) or not all(_int(s) and s >= 0 for s in keep):
    raise UserError(f"train.keep_steps={keep!r}: must be a tuple of integers >= 0, like (0, 100, 1000)")
  checkpoints.check_keep_last(train.keep_last)
  from_section(config.model, config.data.vocab_size, train.seq_len)  # kind, positions, activation, dtype


def _on_lead_first(make):
  """`make()` on every process; multi-host, process 0 first (it writes what the others then read)."""
  if jax.process_count() == 1:
    return make()
  if jax.process_index() == 0:
    make()
  multihost_utils.sync_global_devices("headspec: data prepared")
  return make()


def prepare_tokenizer(config: ml_collections.ConfigDict, workdir: epath.Path):
  """WORKDIR/tokenizer: loaded when there (and of data.vocab_size), else trained on the corpus' train
  split (once, by process 0)."""
  tok_dir = workdir / "tokenizer"

  def make():
    if (tok_dir / tokenizer_lib.INFO_FILE).is_file():
      tokenizer = tokenizer_lib.load_tokenizer(tok_dir)
      if tokenizer.vocab_size != config.data.vocab_size:
        raise UserError(
          f"{tok_dir} holds a tokenizer of {tokenizer.vocab_size} pieces, this config has data.vocab_size="
          f"{config.data.vocab_size} (use a new --workdir, or that vocab_size)"
        )
      return tokenizer
    docs, _ = _documents(config, "train"), _documents(config, "valid")  # both splits there before any write
    return tokenizer_lib.train_sentencepiece(docs, tok_dir, vocab_size=config.data.vocab_size, seed=config.seed)

  return _on_lead_first(make)


def prepare_rows(config: ml_collections.ConfigDict, workdir: epath.Path, tokenizer):
  """The packed train/valid token rows; the token streams are cached in WORKDIR/cache (by process 0)."""

  def make():
    return [_pack(config, workdir, tokenizer, split) for split in ("train", "valid")]

  return _on_lead_first(make)


def _pack(config, workdir, tokenizer, split: str):
  """One split's rows; its UserError (a split of fewer tokens than one row) names data.corpus and the split."""
  try:
    return lm_pipeline.pack_tokens(
      _documents(config, split), tokenizer, config.train.seq_len, cache_path=workdir / "cache" / f"{split}_tokens.npy"
    )
  except UserError as e:
    hint = " (use a smaller train.seq_len, or a longer corpus)" if "fewer than one row" in str(e) else ""
    raise UserError(f"data.corpus={config.data.corpus!r}, split {split}: {e}{hint}") from None


def _documents(config, split: str):
  tfds_dir = targets.tfds_dir(config.data_dir, config.data.tfds_dir)
  return text_tfds.load_documents(config.data_dir, config.data.corpus, split, tfds_dir=tfds_dir)


class _Preemption:
  """Turns SIGTERM into a flag the loop checks, so the run saves a checkpoint and exits cleanly."""

  def __init__(self):
    self.requested = False
    self._previous = signal.signal(signal.SIGTERM, self._handle)

  def _handle(self, signum, frame):
    logging.warning("SIGTERM: saving a checkpoint and stopping")
    self.requested = True

  def restore(self):
    signal.signal(signal.SIGTERM, self._previous)


def _run_lock(config, workdir, **_) -> dict:
  """The lock a training holds on its run (headspec/io/locks.py): another live training of it is refused in
  one line. One per process of a multi-process run, named by its index (so jax.distributed starts first)."""
  parallel.initialize_distributed(config.multihost)  # idempotent: train_and_evaluate's own call does nothing
  index = jax.process_index()
  return dict(folder=workdir, stage="train" if index == 0 else f"train-process{index}", wait=False, what="training")


@locks.holding(_run_lock)  # outermost: run_info.json is written under the lock too
@provenance.recorded("")
def train_and_evaluate(config: ml_collections.ConfigDict, workdir, *, devices=None) -> dict:
  """Trains per `config` in `workdir`, resuming from its latest checkpoint; returns the last metrics.

  devices: the devices to train on (default: all); tests pass one device to compare layouts.
  """
  workdir = remote.run_path(workdir)  # local: absolute; gs://...: stays a URL
  check_config(config)
  parallel.initialize_distributed(config.multihost)
  devices = list(devices or jax.devices())
  mesh = mesh_lib.parse(config.mesh, devices, key="config.mesh")
  pmap = config.parallelism == "pmap"
  if pmap and (mesh.shape["fsdp"] > 1 or mesh.shape["tensor"] > 1):
    raise UserError(
      f"config.parallelism='pmap' copies the model to every device: use config.mesh='' (got {config.mesh!r})"
    )
  batch_shards = len(devices) if pmap else mesh.shape["data"] * mesh.shape["fsdp"]
  local_batch = parallel.check_batch_size(config.train.batch_size, config.parallelism, batch_shards)
  # Nothing is written before every check and the restore have passed: a refused resume leaves the run as
  # it was. On a fresh run the tokenizer (and then the token cache) are the first things written.
  saved = runs.check_resume(workdir, config)
  with _nothing_left_if_refused(workdir, saved):  # the corpus' length is known only once it is tokenized
    tokenizer = prepare_tokenizer(config, workdir)
    cfg = from_section(config.model, tokenizer.vocab_size, config.train.seq_len)
    obj = objective(config, tokenizer)
    model = Transformer(cfg, rngs=nnx.Rngs(params=config.seed))
    graphdef, params = nnx.split(model)
    tx = make_optimizer(config.train)
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))
    base_key, eval_key = jax.random.split(jax.random.key(config.seed))

    state = jax.device_put(state, devices[0]) if pmap else mesh_lib.place(state, mesh)  # sharded by the rules
    state, data_state, mngr = _restore(config, workdir, saved, state)
    train_NT, valid_NT = prepare_rows(config, workdir, tokenizer)
    data_iter = _data_iterator(config, workdir, train_NT, data_state, saved, tokenizer)
  runs.save_config(workdir, config, is_lead=parallel.is_lead())  # checked by check_resume above
  if mngr is None:
    mngr = checkpoints.manager(workdir, keep_last=config.train.keep_last, keep_steps=config.train.keep_steps)

  stepper = _Stepper(config, graphdef, tx, obj, state, devices, mesh)
  loop = _Loop(
    config,
    workdir,
    mngr,
    evaluate=_evaluator(config, graphdef, obj, valid_NT, eval_key),
    div_probe=_diversity_tracker(config, cfg, graphdef, valid_NT),
    writer=MetricsWriter(workdir, is_lead=parallel.is_lead(), resume_step=int(state.step)),
  )
  batches = _batches(data_iter, local_batch, len(devices), pmap, mesh)
  with mesh_lib.using(None if pmap else mesh):  # the model's activation constraints read it when tracing
    return loop.run(stepper, int(state.step), batches, data_iter, base_key)


@contextlib.contextmanager
def _nothing_left_if_refused(workdir, saved):
  """A fresh run refused once it has begun writing (a corpus with fewer tokens than one row of
  `train.seq_len`, in either split: known only once the corpus is tokenized) leaves the workdir as it found
  it: the tokenizer/ and cache/ it wrote are removed, and the workdir too if it made it and it is empty."""
  made = [] if saved else [workdir / name for name in ("tokenizer", "cache") if not (workdir / name).exists()]
  existed = workdir.exists()
  try:
    yield
  except UserError:
    if parallel.is_lead():
      for path in made:
        if path.exists():
          path.rmtree()
      if not existed:
        with contextlib.suppress(OSError):
          workdir.rmdir()  # only when empty
    raise


def _restore(config, workdir, saved, state):
  """(state, data-iterator state, checkpoint manager) at the last saved step; (state, None, None) for a
  fresh run (its manager is made once the config is saved)."""
  if not saved:
    return state, None, None
  mngr = checkpoints.manager(workdir, keep_last=config.train.keep_last, keep_steps=config.train.keep_steps)
  try:
    state, data_state = checkpoints.restore(mngr, saved[-1], runs.abstract_like(state))
  except UserError:
    mngr.close()
    raise
  logging.info("resumed from step %d", int(state.step))
  return state, data_state, mngr


def _repeat_rows(config, train_NT, tokenizer) -> repeats_lib.RepeatRows | None:
  """data.repeat_rows' mixer, drawing from the ids the training text uses (specials excluded)."""
  if not config.data.repeat_rows:
    return None
  return repeats_lib.RepeatRows(
    fraction=config.data.repeat_rows,
    ids=np.setdiff1d(np.unique(train_NT), special_ids(tokenizer)),
    chunk=config.data.repeat_chunk or config.train.seq_len,
    bos=tuple(bos_ids(tokenizer)),
    vocab_size=tokenizer.vocab_size,
    seed=config.seed,
    process_index=jax.process_index(),
  )


def _data_iterator(config, workdir, train_NT, data_state, saved, tokenizer):
  """This process's share of the training rows, at the restored position when there is one."""
  data_iter = lm_pipeline.make_lm_iterator(
    train_NT,
    global_batch_size=config.train.batch_size,
    seed=config.seed,
    process_index=jax.process_index(),
    process_count=jax.process_count(),
    repeats=_repeat_rows(config, train_NT, tokenizer),
  )
  if data_state is not None:
    try:
      data_iter.set_state(data_state)
    except (KeyError, TypeError, ValueError):
      where = checkpoints.checkpoint_dir(workdir) / str(saved[-1]) / "data" / "metadata"
      raise UserError(f"{where}: not a data-iterator position ({str(data_state)[:80]}); the file is damaged") from None
  return data_iter


def _batches(data_iter, local_batch: int, num_devices: int, pmap: bool, mesh):
  """The global batches of the training steps, each row with its example id (the key of its randomness)."""
  while True:
    tokens_BT = next(data_iter)["tokens"]
    offset = jax.process_index() * local_batch
    local = {"tokens": tokens_BT, "example_id": np.arange(offset, offset + len(tokens_BT), dtype=np.int32)}
    yield parallel.pmap_batch(local, num_devices) if pmap else parallel.global_batch(local, mesh)


def jit_step(step_fn, state: TrainState, mesh):
  """`jax.jit` of a training step whose state (placed by `mesh.place`) keeps its layout from step to step
  and whose metrics come back replicated; the old state's buffers are donated."""
  layout = jax.tree.map(lambda x: x.sharding, state)
  return jax.jit(step_fn, donate_argnums=0, out_shardings=(layout, mesh_lib.replicated(mesh)))


@program_cache(8)
def _compiled_step(graphdef, tx, obj: Objective, layout, devices):
  """The jitted (layout: (treedef, shardings, mesh)) or pmapped (devices) training step, kept per static
  part: a second training of the same model, objective, optimizer and layout compiles nothing."""
  step_fn = functools.partial(train_step, graphdef=graphdef, tx=tx, obj=obj)
  if devices is not None:
    return jax.pmap(
      functools.partial(step_fn, axis_name=parallel.PMAP_AXIS),
      axis_name=parallel.PMAP_AXIS,
      in_axes=(0, 0, None),
      devices=devices,
      donate_argnums=0,
    )
  treedef, shardings, mesh = layout
  out = (jax.tree.unflatten(treedef, shardings), mesh_lib.replicated(mesh))
  return jax.jit(step_fn, donate_argnums=0, out_shardings=out)


class _Stepper:
  """The training step on one layout: jit over the data mesh, or pmap over the devices (state replicated)."""

  def __init__(self, config, graphdef, tx, obj, state, devices, mesh):
    self.pmap = config.parallelism == "pmap"
    if self.pmap:
      self._step = _compiled_step(graphdef, tx, obj, None, tuple(devices))
      self.state = parallel.replicate_for_pmap(state, devices)
    else:
      layout = jax.tree.map(lambda x: x.sharding, state)
      leaves, treedef = jax.tree.flatten(layout)
      self._step = _compiled_step(graphdef, tx, obj, (treedef, tuple(leaves), mesh), None)
      self.state = state

  def __call__(self, batch, base_key) -> dict:
    """One step; its metrics (one copy under pmap)."""
    self.state, metrics = self._step(self.state, batch, base_key)
    return parallel.unreplicate(metrics) if self.pmap else metrics

  def host_state(self) -> TrainState:
    return parallel.unreplicate(self.state) if self.pmap else self.state


class _Loop:
  """The training loop's schedule: log, evaluate, track diversity and checkpoint every so many steps, stop
  on a non-finite loss or a SIGTERM (saving first)."""

  def __init__(self, config, workdir, mngr, *, evaluate, div_probe, writer):
    self.train, self.workdir, self.mngr = config.train, workdir, mngr
    self.writer, self.evaluate, self.div_probe = writer, evaluate, div_probe
    self.schedule = learning_rate_schedule(config.train)
    self.tokens_per_step = config.train.batch_size * config.train.seq_len

  def run(self, stepper: _Stepper, step: int, batches, data_iter, base_key) -> dict:
    """Steps until train.steps or a SIGTERM (every process stops after the same step); the last logged metrics."""
    preemption = _Preemption()
    last = {}
    t0, steps_timed = time.perf_counter(), 0
    stop = False
    try:
      if step == 0 and 0 in self.train.keep_steps:  # the initial parameters, for studies over training
        _save(self.mngr, 0, stepper.host_state(), data_iter)
      bar = jobloop.progress(self.train.steps, "train", unit="step", initial=step)  # process 0 shows it
      with jobloop.lines_above_bars(), bar, jobloop.ticking(bar):  # metrics lines print above the bar
        bar.set_postfix_str("compiling the step…", refresh=True)  # the first step compiles: no frozen 0%
        pending = []  # (step, loss on device) not yet read back: the host syncs only when something is due
        while step < self.train.steps and not stop:
          metrics = stepper(next(batches), base_key)
          step, steps_timed = step + 1, steps_timed + 1
          pending.append((step, metrics["loss"]))
          stop = parallel.any_process(preemption.requested)  # every process stops after the same step
          if self._due(step) or stop:
            loss = self._finite_loss(pending)  # before anything is logged, evaluated or saved
            pending = []
            if step % self.train.log_every == 0 or step == self.train.steps:
              rate = steps_timed * self.tokens_per_step / max(time.perf_counter() - t0, 1e-9)
              last = self._log(step, loss, metrics, rate)
              t0, steps_timed = time.perf_counter(), 0
              bar.set_postfix_str(f"loss {loss:.4g}", refresh=False)
            self._after_step(step, stepper, data_iter)
          if step == 1 and not last:
            bar.set_postfix_str("", refresh=False)
          bar.update(1)
      if stop:
        _save(self.mngr, step, stepper.host_state(), data_iter)
        print(f"preempted: saved step {step} in {self.mngr.directory}; the same command resumes from it", flush=True)
    except BaseException:
      # The error that stopped the run (a failed save, a full disk under metrics.jsonl, a NaN loss) is the
      # one reported: closing may fail the same way and must not replace it with a second traceback.
      for close in (self.mngr.close, self.writer.close):
        with contextlib.suppress(Exception):
          close()
      raise
    else:
      self.mngr.wait_until_finished()
      self.mngr.close()
      self.writer.close()
    finally:
      preemption.restore()
    return last

  def _due(self, step: int) -> bool:
    """Whether `step` logs, evaluates, tracks diversity or checkpoints (the steps that read the loss back)."""
    train = self.train
    every = [train.log_every, train.checkpoint_every, train.eval_every, train.diversity_every if self.div_probe else 0]
    return step == train.steps or step in train.keep_steps or any(n and step % n == 0 for n in every)

  def _finite_loss(self, pending) -> float:
    """The last of the `pending` (step, loss) pairs, read back in one transfer; the first non-finite one
    stops the run, naming its step."""
    losses = jax.device_get([loss for _, loss in pending])
    for (step, _), loss in zip(pending, losses):
      if not math.isfinite(float(loss)):
        kept = self.mngr.latest_step()
        raise UserError(
          f"loss became {float(loss)} at step {step}; stopped. Last good checkpoint: "
          f"{'step ' + str(kept) if kept is not None else 'none'} in {self.workdir / 'checkpoints'} "
          f"(try a lower train.learning_rate)"
        )
    return float(losses[-1])

  def _log(self, step: int, loss: float, metrics, tokens_per_second: float) -> dict:
    last = {
      "step": step,
      "loss": loss,
      "perplexity": math.exp(min(loss, 50.0)),
      "learning_rate": float(self.schedule(step - 1)),
      "grad_norm": float(metrics["grad_norm"]),
      "tokens_per_second": tokens_per_second,
      **{k: float(v) for k, v in metrics.items() if "/" in k},
    }
    self.writer.write(last)
    return last

  def _after_step(self, step: int, stepper: _Stepper, data_iter) -> None:
    """Evaluation, diversity and checkpoints when they are due (and at the last step)."""
    train, final = self.train, step == self.train.steps
    if train.eval_every and (step % train.eval_every == 0 or final):
      self.writer.write({"step": step, **self.evaluate(stepper.host_state().params)})
    if self.div_probe and (step % train.diversity_every == 0 or final):
      self.writer.write({"step": step, **self.div_probe(stepper.host_state().params)})
    if step % train.checkpoint_every == 0 or final or step in train.keep_steps:
      _save(self.mngr, step, stepper.host_state(), data_iter)


def _save(mngr, step, state, data_iter):
  if step not in mngr.all_steps():
    checkpoints.save(mngr, step, state, data_iter.get_state())


def _evaluator(config, graphdef, obj: Objective, valid_NT, eval_key):
  """Validation loss and perplexity over the first `train.eval_batches` batches of the valid split."""
  bsz = config.train.batch_size
  n = min(config.train.eval_batches * bsz, len(valid_NT) // bsz * bsz)
  if n == 0:
    return lambda params: {}
  step = _compiled_eval(graphdef, obj)

  def evaluate(params):
    total = count = 0.0
    for start in range(0, n, bsz):
      rows = valid_NT[start : start + bsz]
      batch = {"tokens": rows, "example_id": np.arange(start, start + bsz, dtype=np.int32)}
      s, c = step(params, batch, eval_key)
      total, count = total + float(s), count + float(c)
    loss = total / max(count, 1.0)
    return {"eval/loss": loss, "eval/perplexity": math.exp(min(loss, 50.0))}

  return evaluate


@program_cache(8)
def _compiled_eval(graphdef, obj: Objective):
  return jax.jit(functools.partial(eval_step, graphdef=graphdef, obj=obj))


def _diversity_tracker(config, cfg: ModelConfig, graphdef, valid_NT):
  """Every `train.diversity_every` steps: head-diversity metrics on a fixed held-out batch, summarised
  per layer (mean and variance over heads) under `diversity/` keys (headspec/diversity/metrics.py)."""
  if not config.train.diversity_every:
    return None
  rows_BT = valid_NT[: config.train.batch_size]

  @jax.jit
  def compute(params):
    _, inter = nnx.merge(graphdef, params)(rows_BT, capture=diversity.CAPTURE)
    return diversity.compute(inter, jnp.ones(rows_BT.shape, bool), causal=cfg.kind == "decoder")

  def track(params):  # keys like diversity/js_distance/mean/layer0
    summary = diversity.summarize(jax.device_get(compute(params)))
    return {f"{k}/layer{layer}": float(v) for k, per_layer in summary.items() for layer, v in enumerate(per_layer)}

  return track
