"""The induction step of `headspec attention` (decoders): scores, labels, ICL, the causal check, formation.

Per (model, step) of `targets.plan` (headspec/attention/run.py calls `analyse`):
  attention/roles.csv    data=repeated_random (previous_token, duplicate_token, induction),
                         data=natural_text (the same three on the run's evaluation split),
                         data=weights (copying), with 95% bootstrap CIs over sequences (copying: NaN CIs)
  attention/labels.csv   previous_token / duplicate_token / induction at score >= induction.label_min on
                         repeated_random, copying at >= induction.copying_min (each rule names its threshold)
  attention/icl.csv      loss_at_position (every position of the natural-text rows) and icl_score
                         (loss at the late position − at the early one, `induction.icl_positions`);
                         repeat_first, repeat_second, repeat_drop (the repeated random sequences' loss
                         on each copy and first − second, `induction.repeat_loss_cis`)
  ablation/causal.csv    kind=induction: the top-k induction heads ablated (headspec/ablation/causal.py),
                         chosen (and the unlabelled control's heads) on the first half of the repeated
                         sequences, measured on the second (`induction.causal_split`)
After every step (`formation`): attention/induction_formation.png (per-head induction and previous-token
scores, the ICL score and the training loss of metrics.jsonl on one step axis) and
attention/induction_summary.md (the formation window) when two or more steps have scores.
Rows of the other analyses in the same files (treebank roles, Clark labels, probe_selective causal
rows) are kept: `table_rows`.
"""

from __future__ import annotations

import dataclasses
import sys
import time

import ml_collections
import numpy as np
from absl import logging
from etils import epath

from headspec.ablation import causal as causal_lib
from headspec.attention import induction as ind
from headspec.errors import UserError
from headspec.io import metrics, remote, tables
from headspec.runs import targets
from headspec.words import jobloop

ENCODER_REFUSAL = (
  "induction.enabled='on': induction scores need a decoder; {name} is an encoder, which sees the whole "
  "sequence (a query in the first repeat already attends to the second), so previous-token, duplicate and "
  "induction attention mean something else there (set induction.enabled='auto' or 'off')"
)


def wanted(config, jobs) -> bool:
  """Whether the induction step runs; induction.enabled='on' on an encoder is one UserError line."""
  e = config.induction.enabled
  if e == "off":
    return False
  encoders = [j for j in jobs if j.kind != "decoder"]
  if encoders and e == "on":
    raise UserError(ENCODER_REFUSAL.format(name=encoders[0].name))
  return not encoders


@dataclasses.dataclass
class Data:
  repeated_NT: np.ndarray
  specials: np.ndarray
  prefix: int  # tokens before r_1 (the BOS)
  n: int  # the repeat length used: induction.n, or what fits the context
  natural_NT: np.ndarray | None
  natural_valid_NT: np.ndarray | None
  natural_source: str
  causal_at: frozenset = frozenset()  # the (model, step) pairs the causal check runs at (induction.causal.steps)


def _causal_at(config, jobs) -> frozenset:
  """induction.causal.steps: 'all' the planned steps, or 'last', each model's last planned step only."""
  last = {}
  for j in jobs:
    last[j.name] = max(last.get(j.name, j.step), j.step)
  every = config.induction.causal.steps == "all"
  return frozenset((j.name, j.step) for j in jobs if every or j.step == last[j.name])


def load_data(config, workdir, jobs) -> Data:
  """The repeated random sequences and the natural-text rows; every problem a UserError before any work.
  A context shorter than [BOS] + 2·induction.n tokens gets the largest n that fits (said in one line)."""
  i = config.induction
  if i.causal.enabled:  # the causal check selects on one half of the sequences, measures on the other
    ind.causal_split(i.num_sequences, i.causal.num_sequences)
  model, tokenizer = jobs[0].load()
  T = model.cfg.max_len
  bos = ind.bos_ids(tokenizer)
  n = i.n
  if len(bos) + 2 * n > T:
    n = (T - len(bos)) // 2
    if n < 2:
      raise UserError(f"induction: a context of {T} tokens holds no repeated sequence ([BOS] + 2n with n >= 2)")
    logging.info(f"induction.n={i.n}: [BOS] + 2n tokens exceed the context of {T}; using n={n}")
  specials = ind.special_ids(tokenizer)
  natural, valid, source = None, None, ""
  if i.natural_text or i.draw == "text" or (i.icl and any(j.lm_head for j in jobs)):
    from headspec.runs.evaltext import evaluation_tokens  # the evaluation split every analysis reads

    c = ml_collections.ConfigDict(
      dict(
        num_tokens=i.num_tokens,
        sample="first",
        seed=config.seed,
        corpus=i.corpus,
        seq_len=min(i.seq_len, T),
        data_dir=config.data_dir,
        model=dict(pretrained=config.model.pretrained),
      )
    )
    natural, valid = evaluation_tokens(c, workdir, tokenizer)
    source = f"text/{i.corpus} valid" if config.model.pretrained else "the run's validation rows"
    source += f", {int(valid.sum())} tokens in rows of {natural.shape[1]}"
  among = None
  if i.draw == "text":
    among = np.unique(natural[valid])
    logging.info(f"induction.draw='text': r drawn from the {len(among)} token ids that occur in {source}")
  repeated = ind.repeated_random_tokens(
    tokenizer.vocab_size, specials, n=n, count=i.num_sequences, seed=i.seed, bos=bos, among=among
  )
  return Data(repeated, specials, len(bos), n, natural, valid, source, _causal_at(config, jobs))


def _role_rows(out: dict, data: str, *, model: str, step: int) -> list[dict]:
  rows = []
  for role, (score, low, high) in out.items():
    for l, h in np.ndindex(*score.shape):
      rows.append(dict(model=model, step=step, data=data, layer=l, head=h, role=role, score=float(score[l, h]),
                       ci_low=float(low[l, h]), ci_high=float(high[l, h])))  # fmt: skip
  return rows


def label_rows(scores: dict, config, *, model: str, step: int, n: int) -> list[dict]:
  """labels.csv rows of the induction roles (a head meeting none gets no row here; `combine_labels`)."""
  i = config.induction
  rows = []
  L, H = scores["copying"][0].shape
  for l, h in np.ndindex(L, H):
    for role in ind.ATTENTION_ROLES:
      value = scores[role][0][l, h]
      if value >= i.label_min:
        rule = (
          f"{role} score {value:.3f} on repeated random tokens (n={n}) >= {i.label_min:.2f} "
          f"({ind.SOURCES[role]}; docs/attention.md)"
        )
        rows.append(dict(model=model, step=step, layer=l, head=h, label=role, rule=rule))
    value = scores["copying"][0][l, h]
    if value >= i.copying_min:
      rule = (
        f"copying score Re(Σλ)/Σ|λ| = {value:.3f} of the OV circuit (direct path from tokens) >= "
        f"{i.copying_min:.2f} (Elhage et al. 2021)"
      )
      rows.append(dict(model=model, step=step, layer=l, head=h, label="copying", rule=rule))
  return rows


def combine_labels(rows: list[dict], L: int, H: int, model: str, step: int) -> list[dict]:
  """A head's rows of every analysis: its 'none' row dropped when another label exists, one added when
  it has no row at all."""
  by = {}
  for r in rows:
    by.setdefault((int(r["layer"]), int(r["head"])), []).append(r)
  out = []
  for l, h in np.ndindex(L, H):
    got = by.get((l, h), [])
    real = [r for r in got if r["label"] != "none"]
    out += real or got[:1] or [dict(model=model, step=step, layer=l, head=h, label="none", rule="no rule met")]
  return out


def analyse(job: targets.Target, model, data: Data, config) -> dict:
  """Rows of one (model, step): {'roles', 'labels', 'icl', 'causal'} (module docstring)."""
  i, R, seed = config.induction, config.roles.bootstrap_resamples, config.seed
  t0 = time.perf_counter()
  tag = f"  {job.name} step {job.step}"
  rep = ind.run(model, data.repeated_NT, np.ones(data.repeated_NT.shape, bool), data.specials, batch_size=i.batch_size)
  scores = ind.attention_scores(rep, resamples=R, seed=seed)
  L, H = scores["induction"][0].shape
  nan = np.full((L, H), np.nan)
  copying = ind.copying_scores(model)
  roles = _role_rows(scores, "repeated_random", model=job.name, step=job.step)
  roles += _role_rows({"copying": (copying, nan, nan)}, "weights", model=job.name, step=job.step)
  first, second = ind.repeat_losses(rep.nll_NT, data.n, data.prefix)
  best = np.unravel_index(np.nanargmax(scores["induction"][0]), (L, H))
  logging.info(
    f"{tag}: repeated random tokens (n={data.n}): best induction head L{best[0]}H{best[1]} "
    f"{scores['induction'][0][best]:.3f}, best previous-token {np.nanmax(scores['previous_token'][0]):.3f}; "
    f"loss first repeat {first.mean():.3f}, second {second.mean():.3f} ({time.perf_counter() - t0:.1f} s)"
  )
  icl_rows = []
  if job.lm_head:  # the copies' losses mean something only with a trained LM head
    for kind, (v, lo, hi) in ind.repeat_loss_cis(first, second, resamples=R, seed=seed).items():
      icl_rows.append(dict(model=job.name, step=job.step, kind=kind, position="", value=v, ci_low=lo, ci_high=hi))
  if data.natural_NT is not None:
    nat = ind.run(model, data.natural_NT, data.natural_valid_NT, data.specials, batch_size=i.batch_size)
    if i.natural_text:
      roles += _role_rows(
        ind.attention_scores(nat, resamples=R, seed=seed), "natural_text", model=job.name, step=job.step
      )
    if i.icl and job.lm_head:
      pos, value, low, high = ind.loss_by_position(nat.nll_NT, data.natural_valid_NT, resamples=R, seed=seed)
      for p, v, lo, hi in zip(pos, value, low, high):
        icl_rows.append(dict(model=job.name, step=job.step, kind="loss_at_position", position=int(p), value=v,
                             ci_low=lo, ci_high=hi))  # fmt: skip
      early, late = ind.icl_positions(data.natural_NT.shape[1])
      v, lo, hi = ind.icl_score(nat.nll_NT, data.natural_valid_NT, early, late, resamples=R, seed=seed)
      icl_rows.append(
        dict(model=job.name, step=job.step, kind="icl_score", position="", value=v, ci_low=lo, ci_high=hi)
      )
      logging.info(f"{tag}: ICL score loss(token {late}) − loss(token {early}) = {v:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    elif i.icl:
      logging.info(f"{tag}: ICL score skipped: {job.name} has no trained LM head (its losses mean nothing)")
  causal_rows = []
  c = i.causal
  if c.enabled and job.lm_head and (job.name, job.step) in data.causal_at:
    # chosen on one half of the sequences, measured on the other (`ind.causal_split`)
    select, measure = ind.causal_split(len(data.repeated_NT), c.num_sequences)
    chosen = ind.attention_scores(ind.subset(rep, select), resamples=R, seed=seed)
    unlabelled = np.all([chosen[role][0] < i.label_min for role in ind.ATTENTION_ROLES], axis=0)  # no role label
    causal_rows = causal_lib.induction_rows(
      model, data.repeated_NT[measure], data.n, data.prefix, chosen["induction"][0], c, resamples=R, seed=seed,
      unlabelled_LH=unlabelled,
    )  # fmt: skip
    for r in causal_rows:
      r.update(model=job.name, step=job.step, kind="induction")
    for line in causal_lib.induction_verdicts(causal_rows):
      logging.info(f"{tag}: {line}")
  elif c.enabled and job.lm_head:
    logging.info(f"{tag}: induction causal check at the last step only (induction.causal.steps='last')")
  elif c.enabled:
    logging.info(f"{tag}: induction causal check skipped: no trained LM head")
  all_scores = dict(scores, copying=(copying, nan, nan))
  labels = label_rows(all_scores, config, model=job.name, step=job.step, n=data.n)
  logging.info(f"{tag}: induction step done ({time.perf_counter() - t0:.1f} s)")
  return dict(roles=roles, labels=labels, icl=icl_rows, causal=causal_rows)


def table_rows(rows: dict, L: int, H: int, model: str, step: int, *, with_treebank_rows: dict | None = None) -> dict:
  """{table: rows} of one step for the job loop (jobloop.Rows: the rows other analyses wrote in the same
  tables are kept); `with_treebank_rows`: the Clark/roles rows of the same step, written together."""
  tb = with_treebank_rows or {}
  ours_role = lambda r: r["data"] in ind.DATA or (bool(tb) and r["data"] == "treebank")
  ran = {"induction": "labels" in rows, "treebank": bool(tb)}  # the labels of an analysis not run now are kept
  ours_label = lambda r: ran["induction" if r["label"] in ind.LABELS else "treebank"]
  keys = (str(model), str(step))

  def labels(old: list[dict]) -> list[dict]:  # under the table's lock: another writer's labels are not lost
    kept = [r for r in old if (r["model"], r["step"]) == keys and not ours_label(r)]
    return combine_labels(kept + tb.get("labels", []) + rows.get("labels", []), L, H, model, step)

  out = {
    tables.ROLES: jobloop.Rows(tb.get("roles", []) + rows.get("roles", []), others=lambda r: not ours_role(r)),
    tables.LABELS: labels,
  }
  if rows.get("icl"):
    out[tables.ICL] = rows["icl"]
  if rows.get("causal"):
    out[tables.ABLATION_CAUSAL] = jobloop.Rows(rows["causal"], others=lambda r: r["kind"] != "induction")
  return out


def write(workdir, rows: dict, L: int, H: int, model: str, step: int, *, with_treebank_rows: dict | None = None):
  """Merges one step's rows (`table_rows`) into WORKDIR's tables."""
  for table, part in table_rows(rows, L, H, model, step, with_treebank_rows=with_treebank_rows).items():
    jobloop.merge(workdir, table, part)


# --- formation over training ---


def training_loss(workdir) -> tuple[np.ndarray, np.ndarray]:
  """(steps, loss) of the training records in RUN/metrics.jsonl (empty when there is none; damaged lines are
  skipped with one warning, `metrics.read_metrics`)."""
  records = [r for r in metrics.read_metrics(workdir) if isinstance(r.get("loss"), (int, float))]
  records = [r for r in records if not isinstance(r["loss"], bool)]
  return np.asarray([r["step"] for r in records]), np.asarray([float(r["loss"]) for r in records])


def formation(workdir, model: str, threshold: float) -> epath.Path:
  """attention/induction_summary.md (best heads per step; the formation window) and, with two or more
  steps scored, induction_formation.png of `model`, from the tables and metrics.jsonl. Returns the .md."""
  workdir = remote.run_path(workdir)
  path, shape = tables.path_of(workdir, tables.ROLES), tables.grid_shape(workdir)
  bound, roles, outside = shape or tables.MAX_GRID, [], []
  for line, r in enumerate(tables.read(path, tables.ROLES), start=2):  # line 1 is the header
    if r["model"] == model and r["data"] == "repeated_random":
      inside = 0 <= int(r["layer"]) < bound[0] and 0 <= int(r["head"]) < bound[1]
      (roles if inside else outside).append((line, r))
  if outside:  # another model's, or a hand-edited layer=100000: never an array sized by it
    line, r = outside[0]
    print(
      f"headspec: warning: {path}:{line}: layer={r['layer']}, head={r['head']} is outside the {bound[0]} layers "
      f"× {bound[1]} heads of {workdir / 'config.json' if shape else 'the largest grid (no config.json)'}; "
      f"left out {len(outside)} row(s) of the formation figure",
      file=sys.stderr,
      flush=True,
    )
  roles = [r for _, r in roles]
  steps = sorted({int(r["step"]) for r in roles})
  L, H = shape or (1 + max(int(r["layer"]) for r in roles), 1 + max(int(r["head"]) for r in roles))
  score = {role: np.full((len(steps), L, H), np.nan) for role in ("induction", "previous_token")}
  index = {s: n for n, s in enumerate(steps)}
  for r in roles:
    if r["role"] in score:
      score[r["role"]][index[int(r["step"])], int(r["layer"]), int(r["head"])] = float(r["score"])
  best_S = np.nanmax(score["induction"].reshape(len(steps), -1), axis=1)
  lo, hi = ind.formation_window(steps, best_S, threshold)
  mine = [r for r in tables.read(tables.path_of(workdir, tables.ICL), tables.ICL) if r["model"] == model]
  icl = sorted((r for r in mine if r["kind"] == "icl_score"), key=lambda r: int(r["step"]))
  drop_by = {int(r["step"]): float(r["value"]) for r in mine if r["kind"] == "repeat_drop"}
  out = workdir / "attention"
  out.mkdir(parents=True, exist_ok=True)
  if len(steps) >= 2:
    _figure(out / "induction_formation.png", model, steps, score, icl, training_loss(workdir), threshold, lo, hi)
  if len(steps) < 2:
    window = "needs two or more analysed steps (steps='all' on a run with train.keep_steps)"
  elif hi is None:
    window = f"the best induction score never reaches {threshold:.2f} (max {np.nanmax(best_S):.3f})"
  elif lo is None:
    window = f"the best induction score is already >= {threshold:.2f} at the first analysed step {hi}"
  else:
    window = f"between step {lo} and step {hi} the best induction score crosses {threshold:.2f} (and stays above)"
  lines = [
    f"# Induction heads: {model}",
    "",
    f"Formation window (best head's induction score on repeated random tokens vs {threshold:.2f}): {window}.",
    "",
    "| step | best induction (head) | best previous-token (head) | ICL score | repeat drop (1st − 2nd copy) |",
    "|---:|---|---|---:|---:|",
  ]
  icl_by = {int(r["step"]): float(r["value"]) for r in icl}
  for n, s in enumerate(steps):
    bi = np.unravel_index(np.nanargmax(score["induction"][n]), (L, H))
    bp = np.unravel_index(np.nanargmax(score["previous_token"][n]), (L, H))
    lines.append(
      f"| {s} | {score['induction'][n][bi]:.3f} (L{bi[0]}H{bi[1]}) | {score['previous_token'][n][bp]:.3f} "
      f"(L{bp[0]}H{bp[1]}) | {icl_by.get(s, float('nan')):+.3f} | {drop_by.get(s, float('nan')):+.3f} |"
    )
  md = out / "induction_summary.md"
  remote.write_bytes_atomic(md, ("\n".join(lines) + "\n").encode())
  logging.info(f"  {model}: formation window: {window}")
  return md


def _figure(png, model, steps, score, icl, loss_curve, threshold, lo, hi) -> None:
  """Per-head induction and previous-token scores, the ICL score and the training loss against step."""
  loss_steps, loss = loss_curve
  L, H = score["induction"].shape[1:]
  import matplotlib

  from headspec.words import figures

  fig, axes = figures.new_figure(3, 1, figsize=(8, 9), sharex=True)
  x = np.asarray(steps, float)
  cmap = matplotlib.colormaps["viridis"]
  for l in range(L):
    for h in range(H):
      color = cmap(l / max(L - 1, 1))
      axes[0].plot(x, score["induction"][:, l, h], color=color, lw=1, alpha=0.8)
      axes[0].plot(x, score["previous_token"][:, l, h], color=color, lw=0.8, ls="--", alpha=0.6)
  axes[0].axhline(threshold, color="grey", lw=0.8, ls=":")
  axes[0].set_ylabel("score on repeated random tokens")
  title = f"{model}: induction (solid) and previous-token (dashed) per head, colour = layer"
  axes[0].set_title(title, parse_math=False)  # a model name with `$` is drawn as written, not as mathtext
  if icl:
    xs = np.array([int(r["step"]) for r in icl], float)
    v = np.array([float(r["value"]) for r in icl])
    axes[1].plot(xs, v, "o-", color="C1")
    axes[1].fill_between(
      xs, [float(r["ci_low"]) for r in icl], [float(r["ci_high"]) for r in icl], color="C1", alpha=0.2
    )
  axes[1].axhline(0, color="grey", lw=0.8)
  axes[1].set_ylabel("ICL score (nats)\nlate − early token loss")
  if len(loss):
    axes[2].plot(loss_steps, loss, color="C3", lw=1)
  axes[2].set_ylabel("training loss")
  axes[2].set_xlabel("step")
  for ax in axes:
    ax.set_xscale("symlog", linthresh=max(1.0, float(min(s for s in steps if s > 0) if any(steps) else 1)))
    if lo is not None and hi is not None:
      ax.axvspan(lo, hi, color="gold", alpha=0.25)
  fig.tight_layout()
  remote.save_figure(fig, png, dpi=110)  # locally beside it, then renamed; remote: one object
