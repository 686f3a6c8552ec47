"""Probe tasks: what a probe predicts for each word, its control task, its baseline, its fitter and scorer.

Every task is ONE entry of `REGISTRY` (docs/probing.md, "Adding a probe task"). A `Task` provides:

  vocabulary(train_sentences, config) -> what the task learns from the train split alone (its classes
      and their counts; for arcs the most frequent head offset), passed to the methods below;
  labels(sentences, vocab, config) -> the gold labels of a split, in the form `score` reads;
  control(sentences, vocab, config) -> the Hewitt & Liang (2019) control labels of a split (controls.py);
  baseline(vocab, train_gold, gold) -> (baseline name, accuracy) for probes/baselines.csv;
  fit(tasks, x_train_NGK, x_tune_NGK, data, config) -> {task name: fitted}: fits the probes of every
      task in `tasks` (all share this `fit`, so tasks that can share one pass over the features, like
      the softmax tasks, are fitted together) for the G feature groups of one layer, on data.train with
      the L2 penalty picked on data.tune (`data` is a labels.Data);
  score(fitted, x_NGK, split) -> (correct_NG, control_correct_NG[, scored_N]): per word and group,
      whether the probe and the control probe are right on `split`; an optional third value marks the
      words that are scored (arcs leave punctuation out when `probe.arc_ignore_punct`);
  missing(sentences, config, role, vocab) -> '' or what a split lacks for the task (role 'train': nothing
      to fit, vocab None; 'dev': nothing to pick λ or the epoch on; 'eval': nothing to score), checked by
      labels.load_data before any model is run (optional: a task without it is never refused).

The built-in tasks: 'upos', 'xpos', 'deprel' (softmax probes, probe.py; words labelled with a class
never seen in train count as wrong, never predicted) and 'arc' (bilinear head-selection probe, arc.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

import numpy as np

from headspec.errors import UserError
from headspec.probing import controls, stats


def _flat_words(sentences) -> list[str]:
  return [w for s in sentences for w in s.words]


@dataclasses.dataclass(frozen=True)
class Vocabulary:
  """A label task's classes (sorted) and their counts on train: label id c is classes[c]."""

  classes: list[str]
  counts_C: np.ndarray


CONTROL_LAMBDAS = ("tied", "separate")


def control_lambda(config) -> str:
  """`probe.control_lambda`: 'tied' (the default; Hewitt & Liang 2019 tune one probe configuration and fit
  it to the task and its control): each group's λ is chosen on the task's dev accuracy and the control is
  fitted at that λ, so selectivity compares one probe on two label sets; 'separate': each chooses its own λ
  on its own dev accuracy (best-tuned task minus best-tuned control)."""
  mode = config.probe.get("control_lambda", "tied")
  if mode not in CONTROL_LAMBDAS:
    raise UserError(f"probe.control_lambda={mode!r}: use one of {', '.join(CONTROL_LAMBDAS)}")
  return mode


def fit_softmax(tasks, x_train_NGK, x_tune_NGK, data, config) -> dict:
  """One `probe.fit_softmax_probes` for every softmax task and its control (labels unseen in train
  are ignored on tune); every task maps to the same FittedProbes, read by the task's name. The control's
  λ per group: the task's (`probe.control_lambda='tied'`) or its own best on dev ('separate')."""
  from headspec.probing import probe

  train, tune = data.train, data.tune
  specs = []
  for task in tasks:
    c = len(data.vocab[task.name].classes)
    tune_y = tune.labels[task.name]
    specs.append(probe.ProbeSpec(task.name, c, train.labels[task.name], np.where(tune_y < c, tune_y, -1)))
    specs.append(probe.ProbeSpec(f"{task.name}/control", c, train.controls[task.name], tune.controls[task.name]))
  p = config.probe
  tied = control_lambda(config) == "tied"
  fitted = probe.fit_softmax_probes(
    x_train_NGK,
    x_tune_NGK,
    specs,
    choose_with={f"{task.name}/control": task.name for task in tasks} if tied else None,
    l2_grid=tuple(p.l2_grid),
    seed=config.seed,
    refine_samples=p.refine_samples,
    tol=p.get("tol", probe.DEFAULT_TOL),
    max_iter=p.get("max_iter", probe.DEFAULT_MAX_ITER),
  )
  return {task.name: fitted for task in tasks}


def _is_structural(fitted) -> bool:
  return isinstance(fitted, tuple) and hasattr(fitted[0], "b_GKR")


def fit_report(task_name: str, fitted) -> str:
  """One log line on how a task's fits went (softmax: objective, L-BFGS iterations, convergence;
  arcs: train and dev UAS, kept epoch; structural: kept epoch, dev loss), '' if the fitter records nothing."""
  if _is_structural(fitted):
    f, c = fitted
    return (
      f"{task_name}: rank {f.rank}, epochs run {f.epochs_run} (kept {f.best_epoch_G.min()}-{f.best_epoch_G.max()}); "
      f"dev L1 loss {f.dev_loss_G.min():.3f}-{f.dev_loss_G.max():.3f}, control {c.dev_loss_G.min():.3f}-"
      f"{c.dev_loss_G.max():.3f}"
    )
  if isinstance(fitted, tuple):  # arcs: (task probe, control probe)
    f, c = fitted
    if f.train_uas_G is None:
      return ""
    return (
      f"{task_name}: rank {f.rank}, epochs run {f.epochs_run} (kept {f.best_epoch_G.min()}-{f.best_epoch_G.max()}); "
      f"train UAS {np.nanmin(f.train_uas_G):.3f}-{np.nanmax(f.train_uas_G):.3f}, dev UAS "
      f"{f.dev_uas_G.min():.3f}-{f.dev_uas_G.max():.3f}; control train {np.nanmax(c.train_uas_G):.3f} / dev "
      f"{c.dev_uas_G.max():.3f} (max over groups)"
    )
  parts = []
  for name in (task_name, f"{task_name}/control"):
    if name in fitted.train_objective:
      obj, it, conv = fitted.train_objective[name], fitted.iterations[name], fitted.converged[name]
      prior = int((fitted.start[name] == "prior").sum()) if name in fitted.start else 0
      parts.append(
        f"{name}: train objective {obj.min():.4f}-{obj.max():.4f}, L-BFGS iterations {it.min()}-{it.max()}, "
        f"converged {int(conv.sum())}/{conv.size}" + (f", {prior} prior start(s)" if prior else "")
      )
  return "; ".join(parts)


def fit_rows(task_name: str, fitted) -> list[dict]:
  """probes/fits.csv values per group, for the task's probe and its control: how each fit went
  (softmax: chosen λ, penalised train objective, L-BFGS iterations, convergence, start; arcs: chosen λ,
  the kept epoch as `iterations`, `converged` = dev loss rose after the kept epoch, train UAS, dev loss;
  both: the chosen probe's dev accuracy; structural: the kept epoch, its dev L1 loss, l2 0).
  Returns [{'group': g, 'probe': 'task' | 'control', ...}]."""
  rows = []
  if _is_structural(fitted):
    for probe, f in zip(("task", "control"), fitted):
      g, nan = len(f.dev_loss_G), np.full(len(f.dev_loss_G), np.nan)
      columns = dict(
        l2=np.zeros(g),
        train_objective=nan,
        iterations=f.best_epoch_G,
        converged=f.converged_G,
        start=[""] * g,
        train_accuracy=nan,
        dev_accuracy=nan,
        dev_loss=f.dev_loss_G,
      )
      rows += _per_group(probe, columns)
    return rows
  if isinstance(fitted, tuple):  # arcs: (task probe, control probe)
    for probe, f in zip(("task", "control"), fitted):
      g = len(f.l2_G)
      or_nan = lambda a, g=g: np.full(g, np.nan) if a is None else np.asarray(a, np.float64)
      kept = np.full(g, -1) if f.best_epoch_G is None else np.asarray(f.best_epoch_G)
      columns = dict(
        l2=f.l2_G,
        train_objective=np.full(g, np.nan),
        iterations=kept,
        converged=(kept >= 1) & (kept < f.epochs_run),
        start=[""] * g,
        train_accuracy=or_nan(f.train_uas_G),
        dev_accuracy=f.dev_uas_G,
        dev_loss=or_nan(f.dev_loss_G),
      )
      rows += _per_group(probe, columns)
    return rows
  for probe, name in (("task", task_name), ("control", f"{task_name}/control")):
    if name not in fitted.l2:
      continue
    g = len(fitted.l2[name])
    columns = dict(
      l2=fitted.l2[name],
      train_objective=fitted.train_objective.get(name, np.full(g, np.nan)),
      iterations=fitted.iterations.get(name, np.full(g, -1)),
      converged=fitted.converged.get(name, np.zeros(g, bool)),
      start=fitted.start.get(name, [""] * g),
      train_accuracy=np.full(g, np.nan),
      dev_accuracy=fitted.dev_accuracy_best[name],
      dev_loss=np.full(g, np.nan),
    )
    rows += _per_group(probe, columns)
  return rows


def _per_group(probe: str, columns: dict) -> list[dict]:
  kinds = dict(iterations=int, converged=lambda v: int(bool(v)), start=str)
  n = len(columns["l2"])
  return [{"group": g, "probe": probe} | {k: kinds.get(k, float)(v[g]) for k, v in columns.items()} for g in range(n)]


@dataclasses.dataclass(frozen=True)
class LabelTask:
  """A word-labelling task: `read(sentence, config)` gives each word's label (a string)."""

  name: str
  read: Callable
  fit = staticmethod(fit_softmax)

  def vocabulary(self, train_sentences, config) -> Vocabulary:
    values = [v for s in train_sentences for v in self.read(s, config)]
    classes = sorted(set(values))
    index = {c: i for i, c in enumerate(classes)}
    return Vocabulary(classes, np.bincount([index[v] for v in values], minlength=len(classes)))

  def labels(self, sentences, vocab: Vocabulary, config) -> np.ndarray:
    """label ids, int32 [N]; a label unseen in train gets id C (never predicted, so always wrong)."""
    index = {c: i for i, c in enumerate(vocab.classes)}
    return np.array([index.get(v, len(index)) for s in sentences for v in self.read(s, config)], np.int32)

  def control(self, sentences, vocab: Vocabulary, config) -> np.ndarray:
    return controls.control_labels_N(_flat_words(sentences), vocab.counts_C, config.seed)

  def baseline(self, vocab, train_gold, gold) -> tuple[str, float]:
    return "majority", stats.majority_baseline(train_gold, gold)

  def missing(self, sentences, config, role: str, vocab: Vocabulary | None) -> str:
    """Every word is scored; only dev can lack what is needed: a word whose label train has (λ is
    picked on those)."""
    if role == "dev" and not set(vocab.classes) & {v for s in sentences for v in self.read(s, config)}:
      return f"no word has a {self.name} label seen in train (the L2 penalty is picked on those)"
    return ""

  def score(self, fitted, x_NGK, split) -> tuple[np.ndarray, np.ndarray]:
    from headspec.probing import probe

    correct = probe.predict(fitted, x_NGK, self.name) == split.labels[self.name][:, None]
    control = probe.predict(fitted, x_NGK, f"{self.name}/control") == split.controls[self.name][:, None]
    return correct, control


def _deprels(sentence, config) -> tuple[str, ...]:
  if config.probe.deprel_subtypes:
    return sentence.deprels
  return tuple(d.split(":")[0] for d in sentence.deprels)


def _offset_heads(lengths, offset: int) -> list[np.ndarray]:
  """Head of word i = i + offset (1-based), or ROOT (0) when that falls outside the sentence."""
  out = []
  for n in lengths:
    i = np.arange(1, n + 1)
    out.append(np.where((i + offset >= 1) & (i + offset <= n), i + offset, 0))
  return out


def _ignore_punct(config) -> bool:
  return bool(config.probe.get("arc_ignore_punct", True))


def _punct(sentence) -> np.ndarray:
  return np.asarray([u == "PUNCT" for u in sentence.upos], bool)


def _structural_punct(sentence, config) -> np.ndarray:
  """The words the structural probes' UUAS and root accuracy leave out (probe.structural_punctuation)."""
  from headspec.probing import structural

  rule = config.probe.get("structural_punctuation", "upos")
  return structural.punctuation(sentence.upos, sentence.xpos, rule)


def _train_subset(train, max_words: int, config, *, max_length: int | None = None):
  """(sentence ids, word selector) of the train split a probe family fits on: every sentence, or with
  max_words > 0 a seeded subset of whole sentences of about that many words (stats.subsample)."""
  if not max_words:
    return np.arange(len(train.words)), slice(None)
  lengths_U = np.array([len(w) for w in train.words])
  chosen_U = stats.subsample(lengths_U, max_words, stats.train_sample_seed(config), max_length=max_length)
  return chosen_U, np.isin(train.sentence_N, chosen_U)


def fit_arc(tasks, x_train_NGK, x_tune_NGK, data, config) -> dict:
  """The bilinear arc probe and its control, trained on every train sentence (or, with
  `probe.arc_max_train_words` > 0, a seeded subset of about that many words of sentences that fit one
  packed row); rank `probe.arc_rank`, L2 from `probe.arc_l2_grid`, early stopping on dev loss."""
  from headspec.probing import arc

  p, train, tune = config.probe, data.train, data.tune
  chosen_U, chosen_N = _train_subset(train, p.arc_max_train_words, config, max_length=arc.PACK_WIDTH)
  tied = control_lambda(config) == "tied"
  out = {}
  for task in tasks:

    def fit(heads, tune_heads, l2_G=None):
      return arc.fit_arc_probes(
        x_train_NGK[chosen_N],
        [heads[u] for u in chosen_U],
        x_tune_NGK,
        tune_heads,
        rank=p.get("arc_rank", arc.DEFAULT_ARC_RANK),
        l2_grid=tuple(p.get("arc_l2_grid", arc.DEFAULT_ARC_L2_GRID)),
        seed=config.seed,
        epochs=p.arc_epochs,
        patience=p.get("arc_patience", 2),
        learning_rate=p.get("arc_learning_rate", arc.DEFAULT_ARC_LEARNING_RATE),
        l2_G=l2_G,
      )

    gold = fit(train.labels[task.name], tune.labels[task.name])
    control = fit(train.controls[task.name], tune.controls[task.name], gold.l2_G if tied else None)
    out[task.name] = (gold, control)
  return out


@dataclasses.dataclass(frozen=True)
class ArcTask:
  """Unlabelled dependency arcs: each word's head (1-based, 0 = ROOT), one int32 array per sentence."""

  name: str = "arc"
  fit = staticmethod(fit_arc)

  def vocabulary(self, train_sentences, config) -> int:
    """The most frequent non-zero head offset (head − word) on train: the offset baseline's offset."""
    offsets = np.concatenate(
      [np.where(h > 0, h - np.arange(1, len(h) + 1), 0) for h in self.labels(train_sentences, None, config)]
    )
    values, freq = np.unique(offsets[offsets != 0], return_counts=True)
    return int(values[np.argmax(freq)])  # labels.load_data refused a train split without such an arc

  def missing(self, sentences, config, role: str, vocab) -> str:
    """Train needs an arc between two words (a word whose head is another word; a one-word sentence has
    only its root); dev and evaluation splits need a scored word. Punctuation counts for neither with
    `probe.arc_ignore_punct`."""
    heads = np.concatenate([np.asarray(h) for h in self.labels(sentences, None, config)])
    left_out = " (punctuation is left out: probe.arc_ignore_punct)" if _ignore_punct(config) else ""
    if role == "train" and not (heads > 0).any():
      return f"no scorable arc, no word has another word as its head{left_out}"
    if role != "train" and not (heads >= 0).any():
      return "no scorable word, every word is punctuation, which probe.arc_ignore_punct leaves out"
    return ""

  def labels(self, sentences, vocab, config) -> list[np.ndarray]:
    """Gold heads; with `probe.arc_ignore_punct`, punctuation words (UPOS PUNCT) get -1 (not scored)."""
    out = []
    for s in sentences:
      heads = np.asarray(s.heads, np.int32).copy()
      if _ignore_punct(config):
        heads[_punct(s)] = -1
      out.append(heads)
    return out

  def control(self, sentences, vocab, config) -> list[np.ndarray]:
    return controls.control_heads(
      [s.words for s in sentences],
      config.seed,
      control=config.probe.get("arc_control", "hewitt_liang"),
      ignore=[_punct(s) for s in sentences] if _ignore_punct(config) else None,
    )

  def baseline(self, offset: int, train_gold, gold) -> tuple[str, float]:
    predicted = _offset_heads([len(h) for h in gold], offset)
    hit = np.concatenate([p == h for p, h in zip(predicted, gold)])
    scored = np.concatenate(gold) >= 0
    return f"offset{offset:+d}", float(hit[scored].mean())

  def score(self, fitted, x_NGK, split) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(correct_NG, control_correct_NG, scored_N): ignored words (head -1) are not scored."""
    from headspec.probing import arc

    lengths = [len(w) for w in split.words]
    gold, control = split.labels[self.name], split.controls[self.name]
    correct, control_correct = (
      arc.predict_heads(f, x_NGK, lengths) == np.concatenate(heads)[:, None]
      for f, heads in zip(fitted, (gold, control))
    )
    return correct, control_correct, np.concatenate(gold) >= 0


def fit_structural(tasks, x_train_NGK, x_tune_NGK, data, config) -> dict:
  """Hewitt & Manning's distance or depth probe and its control-tree probe (structural.py) per task, on
  every train sentence (or, with `probe.structural_max_train_words` > 0, a seeded subset of about that
  many words); rank `probe.structural_rank`, trained as H&M's regimen.py (structural.py): raw features
  (`probe.structural_scale='std'`: divided by their train std), sentences reshuffled every epoch into batches
  of `probe.structural_batch_sentences`, early stopping on dev loss."""
  from headspec.probing import structural

  p, train, tune = config.probe, data.train, data.tune
  chosen_U, chosen_N = _train_subset(train, p.get("structural_max_train_words", 0), config)
  out = {}
  for task in tasks:
    out[task.name] = tuple(
      structural.fit_structural_probes(
        x_train_NGK[chosen_N],
        [trees[u] for u in chosen_U],
        x_tune_NGK,
        tune_trees,
        kind=task.name,
        rank=p.get("structural_rank", structural.DEFAULT_RANK),
        epochs=p.get("structural_epochs", 40),
        patience=p.get("structural_patience", 5),
        learning_rate=p.get("structural_learning_rate", 1e-3),
        batch_sentences=p.get("structural_batch_sentences", 20),
        scale=p.get("structural_scale", "raw"),
        seed=config.seed,
      )
      for trees, tune_trees in (
        (train.labels[task.name], tune.labels[task.name]),
        (train.controls[task.name], tune.controls[task.name]),
      )
    )
  return out


@dataclasses.dataclass(frozen=True)
class StructuralTask:
  """Hewitt & Manning 2019's structural probes: 'distance' (tree distance between words) or 'depth' (tree
  depth of each word); labels are one structural.Tree per sentence. Scored by `rows` into
  probes/structural.csv (UUAS and DSpr., or root accuracy and NSpr.), not by per-word accuracy."""

  name: str
  fit = staticmethod(fit_structural)
  structural = True

  def vocabulary(self, train_sentences, config) -> None:
    return None

  def missing(self, sentences, config, role: str, vocab) -> str:
    """distance: a sentence with two words (train) or two non-punctuation words (UUAS's edges: dev and
    evaluation splits); depth: a non-punctuation word outside train (root accuracy's)."""
    sizes = [len(s.words) if role == "train" else int((~_structural_punct(s, config)).sum()) for s in sentences]
    words = "words" if role == "train" else "non-punctuation words"
    if self.name == "distance" and max(sizes) < 2:
      return f"no pair of {words} in one sentence (the distance probe's tree distances)"
    if role != "train" and max(sizes) < 1:
      return "no non-punctuation word (root accuracy's candidates)"
    return ""

  def labels(self, sentences, vocab, config) -> list:
    from headspec.probing import structural

    return [structural.Tree(np.asarray(s.heads, np.int64), _structural_punct(s, config)) for s in sentences]

  def control(self, sentences, vocab, config) -> list:
    from headspec.probing import structural

    heads = controls.control_tree_heads([s.words for s in sentences], config.seed)
    return [structural.Tree(h, _structural_punct(s, config)) for h, s in zip(heads, sentences)]

  def baseline(self, vocab, train_gold, gold) -> list[tuple[str, float]]:
    """H&M's linear-structure baseline: [(linear_uuas, ·), (linear_dspr, ·)] or the root/NSpr. pair."""
    from headspec.probing import structural

    scores = structural.score_sentences(structural.linear_predictions(gold, self.name), gold, self.name)
    return [(f"linear_{m}", float(v[0][0])) for m, v in structural.metrics(scores, num_resamples=1).items()]

  def rows(self, fitted, x_NGK, split, *, num_resamples: int, seed: int) -> list[dict]:
    """probes/structural.csv rows of one split (without model, step, layer, head): one per group and metric,
    the group's index under 'group'."""
    from headspec.probing import structural

    gold, control = split.labels[self.name], split.controls[self.name]
    scored = [
      structural.metrics(
        structural.score_sentences(structural.predictions(f, x_NGK, trees), trees, self.name),
        num_resamples=num_resamples,
        seed=seed,
      )
      for f, trees in zip(fitted, (gold, control))
    ]
    rows = []
    for metric, (value_G, low_G, high_G) in scored[0].items():
      control_G = scored[1][metric][0]
      for g in range(len(value_G)):
        rows.append(
          dict(task=self.name, group=g, split=split.key, metric=metric, value=value_G[g], ci_low=low_G[g],
               ci_high=high_G[g], control_value=control_G[g], selectivity=value_G[g] - control_G[g],
               rank=fitted[0].rank, n=len(gold))
        )  # fmt: skip
    return rows


REGISTRY: dict = {
  t.name: t
  for t in (
    LabelTask("upos", lambda sentence, config: sentence.upos),
    LabelTask("xpos", lambda sentence, config: sentence.xpos),
    LabelTask("deprel", _deprels),
    ArcTask(),
    StructuralTask("distance"),
    StructuralTask("depth"),
  )
}
"""Every probe task by name; `probe.tasks` in a config picks among them (probing/config.py)."""


def from_config(config) -> list:
  """The tasks named by `config.probe.tasks` (a sequence, or comma-separated text), in that order."""
  value = config.probe.tasks
  names: Sequence[str] = tuple(t for t in value.split(",") if t) if isinstance(value, str) else tuple(value)
  unknown = [t for t in names if t not in REGISTRY]
  if unknown or not names:
    raise UserError(f"probe.tasks: unknown task(s) {unknown or names!r}; choose from {', '.join(REGISTRY)}")
  return [REGISTRY[t] for t in names]
