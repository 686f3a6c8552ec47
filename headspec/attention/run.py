"""`headspec attention`: Clark et al. (2019) syntax-from-attention tables, head roles and attention pictures.

For each (model, step) of `targets.plan` (a pretrained model at step 0, or a run's saved steps), every
word of the treebank's selection split (dev) and report split (test) is run through the model once;
word-level attention is reduced on device (words.py), scored per relation, direction and head against
fixed-offset baselines (clark.py), turned into head roles with bootstrap CIs and labels (roles.py), and a
few example sentences are drawn (pictures.py, with rollout and flow from flow.py). Writes, under RUN/:
  attention/clark.csv, clark_baselines.csv, roles.csv, labels.csv   (headspec/io/tables.py contracts; the
      rows of each (model, step) computed are replaced, others kept)
  attention/clark_summary.md        best head per relation: chosen on dev, reported on test
  attention/pictures/<model>-step<step>/   see pictures.py
For decoders (`induction.enabled`, 'auto' by default) the induction step also runs at every step
(headspec/attention/induction_run.py): previous-token, duplicate-token, induction and copying scores
into roles.csv / labels.csv, the ICL score into attention/icl.csv, the top-k induction heads' causal
check into ablation/causal.csv (kind=induction), and, over two or more steps, induction_formation.png
and induction_summary.md. `treebank=''` runs only that step.
RUN may be a URL (gs://bucket/run): tables, summaries, pictures and maps.npz are written there whole.
Every input problem (no treebank, a relation filter matching nothing, an unknown role label, a table
with other columns, a split none of whose sentences the model can represent) is a UserError before
anything is written; a sentence the model cannot represent (a word of more pieces than its context holds)
is skipped and counted in the log and clark_summary.md (headspec/words/alignment.py's `representable`).
"""

from __future__ import annotations

import dataclasses
import io
import os
import pathlib
import shutil
import time

import numpy as np
from absl import logging
from etils import epath

from headspec.attention import clark as clark_lib
from headspec.attention import flow as flow_lib
from headspec.attention import induction_run, report
from headspec.attention import pictures as pictures_lib
from headspec.attention import roles as roles_lib
from headspec.attention import words as words_lib
from headspec.attention.config import check_config
from headspec.data import treebank as treebank_lib
from headspec.errors import UserError
from headspec.io import filenames, provenance, remote, tables
from headspec.runs import directory as runs
from headspec.runs import targets
from headspec.words import alignment as align_lib
from headspec.words import batches as shared_words
from headspec.words import jobloop

OUT = "attention"
TABLES = (tables.CLARK, tables.CLARK_BASELINES, tables.ROLES, tables.LABELS)
INDUCTION_TABLES = (tables.ROLES, tables.LABELS, tables.ICL, tables.ABLATION_CAUSAL)


@dataclasses.dataclass
class Split:
  key: str  # '<treebank>/<split>'
  sentences: list
  arcs: clark_lib.Arcs
  punct_N: np.ndarray


@dataclasses.dataclass
class Data:
  select: Split
  report: Split | None
  relations: list[str]
  examples: list[tuple[str, ...]]
  frequencies: dict
  frequency_source: str


def _split(data_dir, treebank: str, split: str, max_sentences: int) -> Split:
  sentences = treebank_lib.load_split(data_dir, treebank, split)
  if max_sentences:
    sentences = sentences[:max_sentences]
  return _split_of(f"{treebank}/{split}", sentences)


def _split_of(key: str, sentences) -> Split:
  punct = np.array([u == "PUNCT" for s in sentences for u in s.upos], bool)
  return Split(key, sentences, clark_lib.split_arcs(sentences), punct)


def representable_data(data: Data, tokenizer, max_len: int) -> tuple[Data, list[str]]:
  """`data` with only the sentences the model can represent (align.representable: a split that keeps
  none is a UserError; example sentences that cannot be drawn are left out), and one line per split
  that lost some, for the summary."""
  notes, splits = [], []
  for split in [data.select] + ([data.report] if data.report else []):
    sentences, kept = shared_words.representable_sentences(split.sentences, tokenizer, max_len, where=split.key)
    splits.append(_split_of(split.key, sentences) if kept.num_skipped else split)
    notes += [kept.summary()] if kept.num_skipped else []
  examples = data.examples
  if examples:
    kept = align_lib.representable(
      examples, tokenizer, max_len, where="pictures.sentences", required=False, log=logging.info
    )
    examples = kept.select(examples)
  report_split = splits[1] if data.report else None
  return dataclasses.replace(data, select=splits[0], report=report_split, examples=examples), notes


def word_frequencies(config, run_config, data_dir) -> tuple[dict, str]:
  """Lower-cased word counts for the rare-word role, and where they come from (roles.frequency_corpus)."""
  name = config.roles.frequency_corpus
  if not name:
    corpus = run_config.data.corpus if run_config is not None else ""
    name = corpus if corpus and not corpus.startswith("tfds:") else "treebank"
  if name == "treebank":
    sentences = treebank_lib.load_split(data_dir, config.treebank, "train")
    return roles_lib.count_words(" ".join(s.words) for s in sentences), f"{config.treebank}/train"
  roots = [pathlib.Path(data_dir)] + ([pathlib.Path(run_config.data_dir)] if run_config and run_config.data_dir else [])
  for root in roots:
    path = root / "text" / name / "train.txt"
    if path.is_file():
      with path.open(encoding="utf-8") as f:
        return roles_lib.count_words(f), f"text/{name}/train.txt"
  raise UserError(
    f"roles.frequency_corpus={name!r}: no text/{name}/train.txt under {', '.join(map(str, roots))} "
    "(name a corpus folder, or 'treebank' for the treebank's train split)"
  )


def load_data(config, data_dir, run_config) -> Data:
  """The splits, relations, example sentences and word frequencies; every problem a UserError."""
  select = _split(data_dir, config.treebank, config.select_split, config.max_sentences)
  report_split = None
  if config.report_split and config.report_split != config.select_split:
    report_split = _split(data_dir, config.treebank, config.report_split, config.max_sentences)
  relations = clark_lib.relation_set(
    select.arcs, min_count=config.clark.min_count, wanted=tuple(config.clark.relations), where=select.key
  )
  examples = []
  if len(config.pictures.sentences):
    pool = treebank_lib.load_split(data_dir, config.treebank, config.pictures.split)
    for i in config.pictures.sentences:
      if int(i) >= len(pool):
        raise UserError(
          f"pictures.sentences: {config.treebank}/{config.pictures.split} has {len(pool)} sentences, not {i + 1}"
        )
      examples.append(pool[int(i)].words)
  frequencies, source = word_frequencies(config, run_config, data_dir)
  return Data(select, report_split, relations, examples, frequencies, source)


def draw_pictures(model, tokenizer, examples, folder, config) -> None:
  """Every picture of pictures.py for one (model, step): locally written to a temporary folder, then
  swapped in; in a remote folder (gs://...) each file is written whole in place, then the files of an
  earlier drawing that this one did not write are removed (an object store has no folder to swap)."""
  p = config.pictures
  L = model.cfg.num_layers
  layer = L // 2 if p.line_layer < 0 else int(p.line_layer)
  if layer >= L:
    raise UserError(f"pictures.line_layer={p.line_layer}: the model has layers 0..{L - 1}")
  folder = epath.Path(folder)
  in_place = remote.is_remote(folder)
  tmp = folder if in_place else folder.with_name(f".{folder.name}{remote.temp_suffix()}")
  if not in_place:
    remote.remove_stale_temps(folder.parent)  # folders of killed drawings (kill -9 leaves them)
    shutil.rmtree(tmp, ignore_errors=True)
  tmp.mkdir(parents=True, exist_ok=True)
  maps = words_lib.sentence_maps(model, tokenizer, examples)
  written = pictures_lib.head_pictures(maps, examples, tmp, max_words=p.max_words)
  for i, (attn_LHNN, _) in enumerate(maps):
    written += [
      pictures_lib.line_view(
        attn_LHNN[layer],
        examples[i],
        tmp / f"lines_sentence{i}_layer{layer}.png",
        title=f"sentence {i}, layer {layer}",
        max_words=p.max_words,
      )
    ]
  chosen = None
  for i, words in enumerate(examples):
    probs_LHTT, tokens = words_lib.token_maps(model, tokenizer, words)
    if len(tokens) <= p.flow_max_tokens:
      chosen = (i, probs_LHTT, tokens, flow_lib.flow(probs_LHTT))
      break
  if chosen is None:  # no example short enough for flow: rollout of the first one only
    probs_LHTT, tokens = words_lib.token_maps(model, tokenizer, examples[0])
    chosen = (0, probs_LHTT, tokens, None)
    logging.info(
      f"  attention flow skipped: no example sentence has <= {p.flow_max_tokens} tokens (pictures.flow_max_tokens)"
    )
  i, probs_LHTT, tokens, flow_TT = chosen
  written.append(
    pictures_lib.rollout_flow_picture(
      flow_lib.rollout(probs_LHTT)[-1],
      flow_TT,
      tokens,
      tmp / f"rollout_flow_sentence{i}.png",
      title=f"sentence {i}: attention rollout and flow at the last layer (Abnar & Zuidema 2020)",
    )
  )
  arrays = {}
  for i, (words, (attn_LHNN, special_LHN)) in enumerate(zip(examples, maps)):
    arrays[f"words_{i}"], arrays[f"attn_{i}"], arrays[f"special_{i}"] = np.array(words), attn_LHNN, special_LHN
  buffer = io.BytesIO()
  np.savez_compressed(buffer, **arrays)
  remote.write_bytes_atomic(tmp / "maps.npz", buffer.getvalue())
  if in_place:  # the earlier drawing's leftovers, removed by the writer (process 0 of a multi-process command)
    names = {"maps.npz", *(epath.Path(path).name for path in written)}
    for old in remote.files_under(folder) if remote.is_writer() else []:
      if old.relative_to(folder).as_posix() not in names:
        old.unlink(missing_ok=True)
    return
  remote.swap_folder(tmp, folder)  # two drawings finishing together: the last one's stays, neither fails


def analyse_job(job: targets.Target, data: Data, config, out_dir, skipped=()):
  """Tables' rows and the summary section of one (model, step); draws its pictures. `data`: only the
  sentences the model can represent, `skipped`: the lines of `representable_data` for the summary."""
  t0 = time.perf_counter()
  model, tokenizer = job.load()
  causal = model.cfg.kind == "decoder"
  c = config.clark
  scores, stats = {}, {}
  for split in [data.select] + ([data.report] if data.report else []):
    names = [s.sent_id for s in split.sentences]
    stats[split.key] = words_lib.word_stats(
      model,
      tokenizer,
      [s.words for s in split.sentences],
      split.punct_N,
      batch_tokens=config.batch_tokens,
      names=names,
      log=logging.info,
    )
    scores[split.key] = clark_lib.score_split(
      stats[split.key],
      split.arcs,
      data.relations,
      causal=causal,
      arc_set=c.arcs,
      max_offset=c.max_offset,
    )
  logging.info(f"  {job.name} step {job.step}: attention read ({time.perf_counter() - t0:.1f} s)")
  select = scores[data.select.key]
  chosen = {key: clark_lib.best_offset(b) for key, b in select.baseline.items()}
  clark_rows, baseline_rows = [], []
  for key, s in scores.items():
    clark_rows += clark_lib.clark_rows(s, model=job.name, step=job.step, split=key)
    baseline_rows += clark_lib.baseline_rows(s, chosen, model=job.name, step=job.step, split=key)
  ws = stats[data.select.key]
  freq_N = np.array([data.frequencies.get(w.lower(), 0) for s in data.select.sentences for w in s.words], np.float64)
  bootstrap = dict(num_resamples=config.roles.bootstrap_resamples, seed=config.seed)
  out, info = roles_lib.role_scores(ws, freq_N, select, data.select.arcs, min_count=c.min_count, **bootstrap)
  role_rows = roles_lib.role_rows(out, model=job.name, step=job.step)
  confirmed = roles_lib.confirm_syntactic(info, scores[data.report.key]) if data.report else None
  label_rows = roles_lib.label_rows(
    out,
    info,
    config.roles,
    model=job.name,
    step=job.step,
    frequency_source=data.frequency_source,
    confirmed=confirmed,
    report_split=data.report.key if data.report else "",
  )
  logging.info(f"  {job.name} step {job.step}: Clark tables and roles ({time.perf_counter() - t0:.1f} s)")
  if data.examples:
    draw_pictures(
      model, tokenizer, data.examples, out_dir / "pictures" / f"{filenames.component(job.name)}-step{job.step}", config
    )
    logging.info(f"  {job.name} step {job.step}: pictures ({time.perf_counter() - t0:.1f} s)")
  report_split = data.report or data.select
  section = report.job_section(
    job,
    model.cfg.kind,
    config,
    data.select.key,
    select,
    data.report.key if data.report else "",
    scores[data.report.key] if data.report else None,
    report_split.arcs,
    chosen,
    skipped=skipped,
  )
  return dict(clark=clark_rows, baselines=baseline_rows, roles=role_rows, labels=label_rows), section


class Attention(jobloop.Analysis):
  """`headspec attention` in the job loop's parts (the induction step: induction_run.py)."""

  name = "attention"

  def plan(self):
    config, workdir = self.config, self.workdir
    self.t0 = time.perf_counter()
    check_config(config)
    jobs = targets.plan(config, workdir, steps=config.steps, model_name=config.model_name)
    self.treebank = bool(config.treebank)
    self.induction = induction_run.wanted(config, jobs)
    if not self.treebank and not self.induction:
      raise UserError("treebank='' and no induction step (encoders, or induction.enabled='off'): nothing to analyse")
    if self.treebank and config.clark.arcs == "all" and any(j.kind == "decoder" for j in jobs):
      raise UserError(
        "clark.arcs='all' cannot score a decoder: it never sees a word to its right ('auto' scores reachable arcs)"
      )
    self.run_config = None if config.model.pretrained else runs.read_config(workdir)
    return jobs

  def tables(self, jobs):
    return (*TABLES, *(INDUCTION_TABLES if self.induction else ()))

  def prepare(self, jobs):
    config, workdir = self.config, self.workdir
    self.data = self.ind_data = None
    if self.treebank:
      data_dir = targets.data_dir(config, self.run_config, purpose=f"the treebank ud/{config.treebank}")
      data = load_data(config, data_dir, self.run_config)
      logging.info(
        f"attention of {len(jobs)} model step(s) on {data.select.key} ({len(data.select.sentences)} sentences)"
        + (f" and {data.report.key} ({len(data.report.sentences)})" if data.report else "")
        + f"; relations: {', '.join(data.relations)}"
      )
      # Every job shares the first one's tokenizer and context (one run's steps, or one pretrained model), so
      # one check serves them all, and a split the model cannot represent fails here, before any job.
      model, tokenizer = jobs[0].load()
      self.data, self.skipped = representable_data(data, tokenizer, model.cfg.max_len)
    if self.induction:
      ind = self.ind_data = induction_run.load_data(config, workdir, jobs)
      logging.info(
        f"induction scores of {len(jobs)} model step(s): {len(ind.repeated_NT)} repeated random sequences "
        f"(n={ind.n})" + (f"; natural text: {ind.natural_source}" if ind.natural_source else "")
      )
    self.sections = []

  def job(self, job):
    out, treebank_rows = {}, None
    if self.treebank:
      rows, section = analyse_job(job, self.data, self.config, self.workdir / OUT, skipped=self.skipped)
      out = {tables.CLARK: rows["clark"], tables.CLARK_BASELINES: rows["baselines"]}
      self.sections.append(section)
      treebank_rows = dict(roles=rows["roles"], labels=rows["labels"])
    model, _ = job.load()
    L, H = model.cfg.num_layers, model.cfg.num_heads
    ind_rows = induction_run.analyse(job, model, self.ind_data, self.config) if self.induction else {}
    return out | induction_run.table_rows(ind_rows, L, H, job.name, job.step, with_treebank_rows=treebank_rows)

  def finish(self, jobs):
    out_dir, written = self.workdir / OUT, []
    if self.treebank:
      summary = report.summary(self.sections, self.data.frequency_source)
      remote.write_bytes_atomic(out_dir / "clark_summary.md", summary.encode())
      written.append("{clark,clark_baselines,roles,labels}.csv, clark_summary.md, pictures/")
    summary = None
    if self.induction:
      for name in dict.fromkeys(j.name for j in jobs):
        summary = induction_run.formation(self.workdir, name, self.config.induction.formation_threshold)
      written.append("roles.csv, labels.csv, icl.csv, induction_summary.md (induction), ablation/causal.csv")
    print(f"wrote {out_dir}/: {'; '.join(written)} ({time.perf_counter() - self.t0:.0f} s)", flush=True)
    return remote.native_path(out_dir / "clark_summary.md" if self.treebank else summary)


@provenance.recorded("attention")
def run(config, workdir) -> pathlib.Path | epath.Path:
  """Every table, summary and picture of this module's docstring; returns RUN/attention/clark_summary.md
  (with treebank='': induction_summary.md)."""
  return jobloop.run(Attention(config, workdir))


def quickstart(run_dir, data_dir) -> str:
  """`headspec attention` on a quickstart run (its last step) with the synthetic treebank in `data_dir`;
  returns clark_summary.md. Seconds on a CPU."""
  from headspec.attention.config import synthetic_attention_config

  return run(synthetic_attention_config(os.fspath(data_dir)), run_dir).read_text()
