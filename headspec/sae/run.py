"""`headspec sae`: an SAE on one layer's activations at every requested step, measured, attributed to heads
and laid against a treebank (docs/sae.md). Through the one job loop (headspec/words/jobloop.py); writes
RUN/sae/metrics.csv, features.csv, heads.csv, contexts.csv, labels.csv and the per-feature histograms.csv,
shares.csv and logits.csv (headspec/sae/feature_data.py; docs/outputs.md), and per
(model, step) the figures heads_<tag>.png and entropy_<tag>.png (headspec/sae/plots.py).

Per (model, step): the model reads the evaluation text (headspec/runs/evaltext.py: a run's validation rows, or
a pretrained model's corpus); the site's activations at the valid tokens of the first `train_tokens` train
the SAE (headspec/sae/train.py; checkpointed, so a rerun resumes or reuses it), those of the next
`eval_tokens` measure it (headspec/sae/metrics.py) and score the splice (headspec/sae/splice.py; models
with a trained LM head only); every word of the treebank split gives the features' contexts and label
profiles (headspec/sae/labels.py), and probes/results.csv, if present, the heads' probe selectivity.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
import time

import ml_collections
import numpy as np
from absl import logging

from headspec import bounds
from headspec.errors import UserError
from headspec.io import filenames, provenance, remote, tables
from headspec.runs import targets
from headspec.sae import config as sae_config
from headspec.sae import feature_data, layout, saelens, splice
from headspec.sae import labels as labels_lib
from headspec.sae import metrics as m
from headspec.sae import train as sae_train
from headspec.words import evalset as evalset_lib
from headspec.words import jobloop

TABLES = (tables.SAE_METRICS, tables.SAE_FEATURES, tables.SAE_HEADS, tables.SAE_CONTEXTS, tables.SAE_LABELS,
          *feature_data.TABLES)  # fmt: skip
POOLINGS = ("auto", "first", "last", "mean")


def check_config(c) -> None:
  """UserError naming the first bad key, before any model is loaded."""
  splice.check_site(c.site)
  parse_layers(c.layers)
  if c.sample not in ("first", "random"):
    raise UserError(f"sae: sample={c.sample!r}; choose 'first' or 'random'")
  s = c.sae
  if s.normalize not in sae_train.NORMALIZATIONS:
    raise UserError(f"sae: sae.normalize={s.normalize!r}; choose one of {', '.join(sae_train.NORMALIZATIONS)}")
  if s.normalize == "per_head" and splice.SITES[c.site] != "BTHK":
    raise UserError(f"sae: sae.normalize='per_head' needs a site with heads, not {c.site!r}; use 'global'")
  if s.features is not None and (isinstance(s.features, bool) or s.features <= 0):
    raise UserError(f"sae: sae.features={s.features} must be a positive number of SAE features")
  if s.features is None and s.expansion <= 0:
    raise UserError(f"sae: sae.expansion={s.expansion} must be positive")
  if s.kind == "topk" and s.features is not None and not 1 <= s.k <= s.features:
    raise UserError(f"sae: sae.k={s.k} must be between 1 and sae.features={s.features}")
  if s.kind == "topk" and s.k < 1:
    raise UserError(f"sae: sae.k={s.k} must be at least 1")
  a = c.analysis
  if a.pooling not in POOLINGS:
    raise UserError(f"sae: analysis.pooling={a.pooling!r}; choose one of {', '.join(POOLINGS)}")
  bounds.check(c, sae_config.BOUNDS, "sae")  # every numeric option: NaN, inf, absurd sizes (sae/config.py)
  saelens.check_load(c.sae.load, c.layers)  # sae.load: the folder holds an SAE (its width and layer: prepare)


def _fit_check(values) -> None:
  """fit_sae's checks of `values` (its arguments), on a tiny input: bad ones are refused before training."""
  sae_train.fit_sae(np.ones((4, 8), np.float32), progress=False, **values)


bounds.declare("sae", sae_config.BOUNDS, defaults=sae_config.sae_config, check=check_config)


def _fit_defaults() -> dict:
  """fit_sae's defaults of its bounded arguments, with 8 features and k=2."""
  names = {b.key for b in sae_config.FIT_BOUNDS}
  given = inspect.signature(sae_train.fit_sae).parameters.items()
  return {name: p.default for name, p in given if name in names} | dict(features=8, k=2)


bounds.declare("fit_sae", sae_config.FIT_BOUNDS, defaults=_fit_defaults, check=_fit_check)


def parse_layers(text: str) -> tuple[int, ...] | str:
  """`layers`: '' (the one `layer`), 'all', or comma-separated 0-based blocks; UserError otherwise."""
  text = str(text).strip()
  if text in ("", "all"):
    return text
  parts = [p.strip() for p in text.split(",")]
  if not all(p.isascii() and p.isdigit() for p in parts) or len(set(parts)) != len(parts):
    raise UserError(f"sae: layers={text!r}; give '' (the one `layer`), 'all', or distinct 0-based layers like '0,2'")
  return tuple(int(p) for p in parts)


def resolve_layers(c, num_layers: int) -> tuple[int, ...]:
  """The layers the SAEs read (one SAE per layer), checked against the model's `num_layers`."""
  chosen = parse_layers(c.layers)
  if chosen == "":
    return (splice.check_layer(c.layer, num_layers),)
  if chosen == "all":
    return tuple(range(num_layers))
  bad = [layer for layer in chosen if layer >= num_layers]
  if bad:
    raise UserError(
      f"sae: layers={c.layers!r} names layer {bad[0]}, but the model has {num_layers} (0..{num_layers - 1})"
    )
  return chosen


def options(c, width: int, heads: int = 0) -> sae_train.Options:
  """The training options of the config for inputs of `width` (`heads` blocks); UserError for a bad combination."""
  s = c.sae
  features = int(s.features) if s.features is not None else int(round(s.expansion * width))
  if features < 1:
    raise UserError(f"sae: sae.expansion={s.expansion} × input width {width} gives {features} features; raise it")
  o = sae_train.Options(
    features=features, kind=s.kind, k=int(s.k), l1=float(s.l1), l0=float(s.l0), bandwidth=float(s.bandwidth),
    threshold_init=float(s.threshold_init), steps=int(s.train_steps), batch_size=int(s.batch_size),
    lr=float(s.lr), lr_schedule=s.lr_schedule, warmup_steps=int(s.warmup_steps), decay_fraction=float(s.decay_fraction),
    b_dec_init=s.b_dec_init, aux_k=int(s.aux_k), aux_coefficient=float(s.aux_coefficient),
    dead_after_tokens=int(s.dead_after_tokens), seed=int(c.seed), normalize=s.normalize, heads=int(heads),
  )  # fmt: skip
  sae_train.check_options(o, where="sae")
  if s.checkpoint_every < 1:
    raise UserError(f"sae: sae.checkpoint_every={s.checkpoint_every} must be at least 1")
  return o


def sae_name(o: sae_train.Options) -> str:
  """The tables' `sae` column: 'topk-f256-k16', 'relu-f256-l15' or 'jumprelu-f256-l01'."""
  if o.kind == "topk":
    return f"topk-f{o.features}-k{o.k}"
  return f"relu-f{o.features}-l1{o.l1:g}" if o.kind == "relu" else f"jumprelu-f{o.features}-l0{o.l0:g}"


def _token_batches(tokens_NT, valid_NT, batch_size: int) -> list[evalset_lib.Batch]:
  """Plain rows (no LM targets), padded to whole batches."""
  out = []
  for start in range(0, len(tokens_NT), batch_size):
    t, v = tokens_NT[start : start + batch_size], valid_NT[start : start + batch_size]
    pad = batch_size - len(t)
    t = np.concatenate([t, np.zeros((pad, t.shape[1]), t.dtype)])
    v = np.concatenate([v, np.zeros((pad, v.shape[1]), bool)])
    out.append(evalset_lib.Batch(t, v, np.zeros_like(t), np.zeros(t.shape, np.float32), np.arange(len(t))))
  return out


def split_rows(tokens_NT, valid_NT, train_tokens: int, eval_tokens: int):
  """(train rows, eval rows): the first rows holding `train_tokens` valid tokens, then the rest; a text with
  fewer than train_tokens + eval_tokens tokens is cut in that proportion (logged). UserError for one row."""
  cum_N = np.cumsum(valid_NT.sum(1))
  total = int(cum_N[-1]) if len(cum_N) else 0
  wanted = train_tokens
  if total < train_tokens + eval_tokens:
    wanted = int(total * train_tokens / (train_tokens + eval_tokens))
    logging.info(f"sae: the evaluation text has {total} tokens, fewer than train_tokens + eval_tokens; "
                 f"{wanted} train the SAE, the rest measure it")  # fmt: skip
  cut = min(int(np.searchsorted(cum_N, wanted) + 1), len(tokens_NT) - 1)
  if cut < 1:
    raise UserError(
      f"sae: the evaluation text has {total} tokens in {len(tokens_NT)} row(s); it needs two rows at least"
    )
  return (tokens_NT[:cut], valid_NT[:cut]), (tokens_NT[cut:], valid_NT[cut:])


def _encode_all(sae, x_NE, chunk: int = 8192) -> np.ndarray:
  return np.concatenate([np.asarray(sae.encode(x_NE[i : i + chunk])) for i in range(0, len(x_NE), chunk)])


def _decode_all(sae, f_NF, chunk: int = 8192) -> np.ndarray:
  return np.concatenate([np.asarray(sae.decode(f_NF[i : i + chunk])) for i in range(0, len(f_NF), chunk)])


class SAEAnalysis(jobloop.Analysis):
  name = "sae"

  def plan(self):
    check_config(self.config)
    return targets.plan(self.config, self.workdir, steps=self.config.steps, model_name=self.config.model_name)

  def tables(self, jobs):
    return TABLES

  def prepare(self, jobs):
    c = self.config
    model, tokenizer = jobs[0].load()
    cfg = model.cfg
    self.layers = resolve_layers(c, cfg.num_layers)
    self.width = int(np.prod(splice.site_shape(cfg, c.site)))
    self.options = options(c, self.width, splice.site_heads(cfg, c.site))
    self.loaded = saelens.for_model(c.sae.load, model, c.site) if str(c.sae.load).strip() else None
    if self.loaded is not None:  # sae.load: analysed, not trained, on the layer of its hook (headspec/sae/saelens.py)
      self.layers = (self.loaded.layer,)
    from headspec.words.selectivity import read_selectivity

    # probes/results.csv's dev selectivity per (model, step), read (and checked) before any computation
    self.probes = {(j.name, j.step): read_selectivity(self.workdir, j.name, j.step, cfg.num_layers, cfg.num_heads)
                   for j in jobs}  # fmt: skip
    self.sentences = []
    if c.analysis.treebank:
      from headspec.data import treebank as treebank_lib
      from headspec.runs import directory as runs

      run_config = None if c.model.pretrained else runs.read_config(self.workdir)
      data_dir = targets.data_dir(c, run_config, purpose=f"the treebank {c.analysis.treebank}")
      sentences = treebank_lib.load_split(data_dir, c.analysis.treebank, c.analysis.split)
      self.sentences = sentences[: c.analysis.max_sentences] if c.analysis.max_sentences else sentences
    from headspec.runs.evaltext import evaluation_tokens

    text_config = ml_collections.ConfigDict(c.to_dict())
    text_config.num_tokens = c.train_tokens + c.eval_tokens
    tokens_NT, valid_NT = evaluation_tokens(text_config, self.workdir, tokenizer)
    self.train_rows, self.eval_rows = split_rows(tokens_NT, valid_NT, c.train_tokens, c.eval_tokens)

  def sae_name(self) -> str:
    """The tables' `sae` column: the trained configuration's, or a loaded SAE's (saelens.loaded_name)."""
    loaded = getattr(self, "loaded", None)
    return saelens.loaded_name(loaded) if loaded is not None else sae_name(self.options)

  def checkpoint_dir(self, job, layer: int):
    key = dict(identity=job.identity, options=self.options.__dict__, site=self.config.site, layer=layer,
               rows=hashlib.sha256(self.train_rows[0].tobytes()).hexdigest())  # fmt: skip
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]
    name = filenames.component(job.name)  # the one rule for a name in a path (headspec/io/filenames.py)
    return (
      remote.run_path(self.workdir)
      / "sae"
      / "checkpoints"
      / f"{name}-step{job.step}-{self.config.site}{layer}-{digest}"
    )

  def job(self, job):
    """Every table's rows of one (model, step): one SAE per layer of `layers`. Each SAE's rows replace all the
    rows of its (model, step, site, layer, sae) in every table, those it has none of too (no treebank)."""
    out = {table: [] for table in TABLES}
    for layer in self.layers:
      for table, rows in self.layer_rows(job, layer).items():
        out[table] += rows
    key = dict(model=job.name, step=job.step, site=self.config.site, sae=self.sae_name())
    groups = tuple(key | dict(layer=layer) for layer in self.layers)
    return {table: jobloop.Rows(rows, groups=groups) for table, rows in out.items()}

  def layer_rows(self, job, layer: int) -> dict:
    c, o, site = self.config, self.options, self.config.site
    model, tokenizer = job.load()
    cfg = model.cfg
    if self.loaded is None:
      x_train, _ = splice.capture(model, _token_batches(*self.train_rows, c.batch_size), site, layer)
      sae_train.check_activations(x_train, where=f"{job.name} step {job.step}: {site} of layer {layer}")
      t0 = time.perf_counter()
      sae = sae_train.fit_sae(x_train, **{**o.__dict__, "checkpoint_dir": self.checkpoint_dir(job, layer),
                                          "checkpoint_every": c.sae.checkpoint_every})  # fmt: skip
      seconds = time.perf_counter() - t0
      folder = saelens.folder_for_run(self.workdir, job.name, job.step, site, layer, self.sae_name())
      layout.save(sae, folder, hook_name=layout.hook_name(site, layer), model_name=job.name,
                   metadata=dict(step=job.step, checkpoint=self.checkpoint_dir(job, layer).name))  # fmt: skip
    else:  # sae.load: nothing trained, the training rows unread; z_rms is over the evaluation tokens
      sae, x_train, seconds = saelens.for_headspec_z(self.loaded, model), None, 0.0
    evalset = evalset_lib.lm_eval_set(*self.eval_rows, model_kind=cfg.kind, tokenizer=tokenizer,
                                      batch_size=c.batch_size, seed=c.seed)  # fmt: skip
    # quality on the plain evaluation rows (an encoder's eval set has masked inputs, not what the SAE trained on)
    x_eval, _ = splice.capture(model, _token_batches(*self.eval_rows, c.batch_size), site, layer)
    x_train = x_eval if x_train is None else x_train
    f_eval = _encode_all(sae, x_eval)
    rates_F = m.firing_rates(f_eval)
    sample = x_train[np.random.default_rng(c.seed).permutation(len(x_train))[: len(x_eval)]]
    values = dict(
      features=o.features, width=self.width, k=o.k if o.kind == "topk" else math.nan,
      l1=o.l1 if o.kind == "relu" else math.nan, l0_coefficient=o.l0 if o.kind == "jumprelu" else math.nan,
      train_tokens=len(x_train), eval_tokens=len(x_eval),
      l0=m.l0(f_eval), fvu=m.fvu(x_eval, _decode_all(sae, f_eval)),
      fvu_train=m.fvu(sample, _decode_all(sae, _encode_all(sae, sample))),
      dead_fraction=m.dead_fraction(rates_F), dense_fraction=m.dense_fraction(rates_F, c.analysis.dense_min),
      train_seconds=seconds,
    )  # fmt: skip
    if self.loaded is not None:
      values |= saelens.loaded_metrics(sae)
    if job.lm_head:
      x_scored = x_eval if cfg.kind == "decoder" else splice.capture(model, evalset.batches, site, layer)[0]
      scores = splice.scores(model, evalset.batches, site, layer, sae, x_scored.astype(np.float64).mean(0))
      loss = scores["loss"]
      values |= {f"loss_{name}": v for name, v in loss.items()}
      values["loss_recovered_zero"] = m.loss_recovered(loss["clean"], loss["splice"], loss["zero_ablation"])
      values["loss_recovered_mean"] = m.loss_recovered(loss["clean"], loss["splice"], loss["mean_ablation"])
      values |= {f"{what}_{name}": v for what in ("kl", "agreement") for name, v in scores[what].items()}
      values["kl_recovered_zero"] = m.loss_recovered(0.0, scores["kl"]["splice"], scores["kl"]["zero_ablation"])
    key = dict(model=job.name, step=job.step, site=site, layer=layer, sae=self.sae_name())
    metric_rows = [key | dict(metric=name, value=float(v)) for name, v in values.items()]

    heads = splice.site_heads(cfg, site)
    a_FH = m.sae_head_fractions(sae, heads=heads) if heads else None
    profile, al = (None, None)
    if self.sentences:
      profile, al = labels_lib.profile(model, tokenizer, self.sentences, sae, site=site, layer=layer,
                                       pooling=c.analysis.pooling, batch_tokens=c.analysis.batch_tokens,
                                       top=c.analysis.top)  # fmt: skip
    feature_rows, selectivity = self.feature_rows(key, sae, f_eval, rates_F, a_FH, profile)
    head_rows = self.head_rows(key, job, layer, a_FH, rates_F, selectivity, m.head_rms(x_train, heads)) if heads else []
    context_rows, label_rows = self.treebank_rows(key, profile, al) if profile is not None else ([], [])
    per_feature = feature_data.feature_tables(key, sae=sae, f_NF=f_eval, a_FH=a_FH, model=model, tokenizer=tokenizer,
                                              site=site, layer=layer, lm_head=job.lm_head)  # fmt: skip
    return {tables.SAE_METRICS: metric_rows, tables.SAE_FEATURES: feature_rows, tables.SAE_HEADS: head_rows,
            tables.SAE_CONTEXTS: context_rows, tables.SAE_LABELS: label_rows, **per_feature}  # fmt: skip

  def feature_rows(self, key, sae, f_eval, rates_F, a_FH, profile):
    a = self.config.analysis
    F = sae.num_features
    fires_F = (f_eval > 0).sum(0)
    mean_F = np.where(fires_F > 0, f_eval.sum(0) / np.maximum(fires_F, 1), np.nan)
    selectivity = {}
    if profile is not None:
      selectivity = {name: profile.selectivity(name, a.min_fires) for name in labels_lib.LABEL_SETS}
    entropy_F = m.entropy_bits(a_FH) if a_FH is not None else np.full(F, np.nan)
    rows = []
    for f in range(F):
      row = key | dict(feature=f, firing_rate=float(rates_F[f]), mean_activation=float(mean_F[f]))
      if a_FH is not None:
        order = np.argsort(-a_FH[f], kind="stable")
        carried = [int(h) for h in order if a_FH[f, h] >= a.carry_min]
        row |= dict(top_head=int(order[0]), top_head_fraction=float(a_FH[f, order[0]]),
                    entropy_bits=float(entropy_F[f]), heads=";".join(map(str, carried)))  # fmt: skip
      else:
        row |= dict(top_head=-1, top_head_fraction=math.nan, entropy_bits=math.nan, heads="")
      row["treebank_fires"] = int(profile.fires_F[f]) if profile is not None else -1
      for name in labels_lib.LABEL_SETS:
        sel_F, best = selectivity.get(name, (np.full(F, np.nan), [""] * F))
        row |= {name: best[f], f"{name}_selectivity": float(sel_F[f])}
      rows.append(row)
    return rows, selectivity

  def head_rows(self, key, job, layer, a_FH, rates_F, selectivity, z_rms_H):
    """Per head: features carried and exclusive, specialization S_h, the carried features' mean entropy, z's RMS
    in the head on the training tokens (z_rms_H), the carried features' label selectivity beside the head's
    probe selectivity (probes/results.csv, dev split) when present."""
    a = self.config.analysis
    live_F = rates_F > 0
    S_H = m.specialization(a_FH, live_F)
    entropy_F = m.entropy_bits(a_FH)
    probes = self.probes[(job.name, job.step)]
    rows = []
    for h in range(a_FH.shape[1]):
      carried_F = live_F & (a_FH[:, h] >= a.carry_min)
      values = dict(
        features_carried=int(carried_F.sum()),
        exclusive_features=int((live_F & (a_FH[:, h] >= a.exclusive_min)).sum()),
        specialization=float(S_H[h]),
        mean_entropy_bits=float(entropy_F[carried_F].mean()) if carried_F.any() else math.nan,
        z_rms=float(z_rms_H[h]),  # the head's output scale on the training tokens
      )
      for name, (sel_F, _) in selectivity.items():
        mine = sel_F[carried_F & np.isfinite(sel_F)]
        values[f"max_feature_selectivity_{name}"] = float(mine.max()) if len(mine) else math.nan
        values[f"selective_features_{name}"] = int((mine >= a.selective_min).sum())
      if probes is not None:
        for task, sel_LH in sorted(probes.by_task.items()):
          values[f"probe_selectivity_{task}"] = float(sel_LH[layer, h])
      rows += [key | dict(head=h, metric=name, value=float(v)) for name, v in values.items()]
    return rows

  def treebank_rows(self, key, profile, al):
    a = self.config.analysis
    split = f"{a.treebank}/{a.split}"
    offsets = np.concatenate([[0], np.cumsum([len(s.words) for s in self.sentences])])
    contexts = []
    for f in range(len(profile.fires_F)):
      for rank, (n, value) in enumerate(zip(profile.top_word_Fn[f], profile.top_value_Fn[f])):
        if n < 0:
          break
        s = int(al.word_sentence_N[n])
        i = int(n - offsets[s])
        words = self.sentences[s].words
        contexts.append(key | dict(feature=f, rank=rank, split=split, sentence=s, word_index=i, word=words[i],
                                   context=labels_lib.context(words, i, a.context_words), activation=float(value)))  # fmt: skip
    label_rows = []
    for name in labels_lib.LABEL_SETS:
      counts_FC = profile.counts[name]
      for f, c_idx in zip(*np.nonzero(counts_FC)):
        count = int(counts_FC[f, c_idx])
        label_rows.append(key | dict(feature=int(f), label_set=name, label=profile.labels[name][c_idx], count=count,
                                     fraction=count / int(profile.fires_F[f])))  # fmt: skip
    return contexts, label_rows

  def merged(self, job):
    """heads_<tag>.png and entropy_<tag>.png of this job's SAEs (headspec/sae/plots.py), from the merged tables:
    the heatmap holds every layer heads.csv has for this model, step, site and SAE configuration."""
    from headspec.sae import plots

    c, name = self.config, self.sae_name()
    mine = lambda frame: frame[(frame["model"] == job.name) & (frame["step"] == job.step)
                               & (frame["site"] == c.site) & (frame["sae"] == name)]  # fmt: skip
    heads = mine(tables.read_frame(tables.path_of(self.workdir, tables.SAE_HEADS), tables.SAE_HEADS))
    if heads.empty:  # a site of the residual width: no heads to draw
      return
    features = mine(tables.read_frame(tables.path_of(self.workdir, tables.SAE_FEATURES), tables.SAE_FEATURES))
    H = int(heads["head"].max()) + 1
    tag, out = plots.tag(job.name, job.step, c.site, name), remote.run_path(self.workdir) / "sae"
    title = f"{job.name} step {job.step}: {name} on {c.site}"
    for path in (plots.heads(heads.to_dict("records"), H, out / f"heads_{tag}.png", title),
                 plots.entropy(features.to_dict("records"), H, out / f"entropy_{tag}.png", title)):  # fmt: skip
      logging.info(f"  wrote {path}")

  def finish(self, jobs):
    return tables.path_of(self.workdir, tables.SAE_METRICS)


@provenance.recorded("sae")
def run(config, workdir):
  """Every requested step; returns RUN/sae/metrics.csv. Bad input is one UserError line before anything is written."""
  return jobloop.run(SAEAnalysis(config, workdir))
