"""Causal test of probe selectivity: once the heads a probe finds most selective are ablated, is the task
still linearly decodable from the model (DECODABILITY AFTER ABLATION), and does the LM loss need them?

For each label task of the probing registry (headspec/probing/tasks.py `REGISTRY`, its `LabelTask`s: upos,
xpos, deprel and any task added there; arc and structural probes are not refitted here) with rows in
RUN/probes/results.csv, labelled as the probe stage read them (its `probe.*` settings from
RUN/probes/run_info.json, e.g. `probe.deprel_subtypes`), on whole-sentence subsamples drawn as the probes draw
theirs (`stats.subsample`) and with the probes' paired sentence bootstrap (`resampling.bootstrap_accuracies`):
heads are ranked by selectivity (accuracy − control accuracy, Hewitt & Liang 2019) on the treebank's DEV split,
and the effect is measured on its TEST split, so selection and measurement never share data. For k = 1, 2, 4, ... up to half of the heads:
  selective             the k most selective heads are ablated;
  random_layer_matched  as many heads per layer as the selective set has in that layer, from that layer's
                        NON-selected heads (a random set that shares selective heads pulls selective −
                        random toward 0); where fewer remain than are needed, all of them plus the fewest
                        selective heads, and the overlap is reported. EVERY such set when there are at most
                        `causal.random_seeds` of them (`layer_matched_masks`: with 4 heads a layer and k = 1
                        there are 3), else `causal.random_seeds` distinct sets drawn uniformly (never one
                        twice); `candidate_sets` says how many exist.
Ablation is MEAN ablation (Z_h replaced by its mean over the probe's training tokens). Metrics:
  probe_accuracy        DECODABILITY AFTER ABLATION: a probe on the LAST layer's residual stream,
                        re-extracted with the heads ablated, REFITTED on ablated train features (l2 chosen on
                        ablated dev) and scored on ablated test: whether the information is still linearly
                        decodable, not whether the model uses the heads (a refitted probe reads whatever
                        other heads still carry);
  probe_accuracy_fixed  the probe fitted on unablated features, scored on ablated test features;
  loss_delta            LM loss change on the LM evaluation set (only for a model with a trained LM head):
                        what the model's own objective loses;
  overlap_with_selective  (random rows) the fraction of the random set's heads that are selective heads:
                        0 unless a layer holds more selective heads than non-selected ones;
  candidate_sets        (random rows, seed −1) how many layer-matched sets exist (CI empty): at most
                        `causal.random_seeds` means every one was ablated;
  *_vs_random           selective minus the mean over the random sets, with a PAIRED bootstrap CI over test
                        sentences (LM: sequences) and, where the sets are a sample of the candidates, over
                        the sets too (`resampling.mean_over_draws_R`): a CI entirely below 0 for probe
                        accuracy (above 0 for loss) means less is decodable (the loss needs them more) without
                        the selective heads than without random heads of the same layers.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import jax.numpy as jnp
import numpy as np
from etils import epath

from headspec.ablation import core, metrics
from headspec.data import treebank as treebank_lib
from headspec.errors import UserError
from headspec.model.edits import head_mask
from headspec.probing import probe, stats
from headspec.probing import tasks as probe_tasks
from headspec.words import alignment as align_lib
from headspec.words import batches as words_lib
from headspec.words import evalset, resampling
from headspec.words.alignment import resolve_pooling


def probe_settings(workdir):
  """The probe stage's config as it ran: `probe_config()`'s defaults with the `probe.*` values recorded in
  RUN/probes/run_info.json (the defaults where the file or a key is missing), so the causal test labels words as
  the probes that ranked the heads did (e.g. `probe.deprel_subtypes`)."""
  from headspec.io import provenance
  from headspec.probing.config import probe_config

  config = probe_config()
  path = epath.Path(workdir) / "probes" / provenance.FILE
  recorded = json.loads(path.read_text()).get("config", {}).get("probe", {}) if path.exists() else {}
  for key, value in recorded.items():
    if key in config.probe:
      default = config.probe[key]
      config.probe[key] = tuple(value) if isinstance(default, tuple) and isinstance(value, list) else value
  return config


def label_tasks() -> tuple[str, ...]:
  """The probing registry's label tasks, in its order: the tasks the causal test refits."""
  return tuple(name for name, task in probe_tasks.REGISTRY.items() if isinstance(task, probe_tasks.LabelTask))


def ks(num_heads_total: int) -> list[int]:
  """1, 2, 4, ... up to half of all heads."""
  out, k = [], 1
  while k <= num_heads_total // 2:
    out.append(k)
    k *= 2
  return out


def selective_mask(selectivity_LH, k: int) -> np.ndarray:
  order = np.argsort(-np.asarray(selectivity_LH).ravel(), kind="stable")[:k]
  mask = np.ones(np.size(selectivity_LH), np.float32)
  mask[order] = 0.0
  return mask.reshape(np.shape(selectivity_LH))


def unlabelled_mask(unlabelled_LH, top_LH, k: int, seed: int) -> np.ndarray | None:
  """k heads drawn uniformly from the heads of any layer that `top_LH` does not ablate (mask 1) and that
  have no previous-token, duplicate-token or induction label (`unlabelled_LH` true; copying labels are not
  considered); None when fewer than k such heads exist. Not layer-matched: the control for a layer whose heads
  all carry the role, where a layer-matched draw picks another of them."""
  pool = np.flatnonzero((np.asarray(top_LH).ravel() != 0) & np.asarray(unlabelled_LH, bool).ravel())
  if len(pool) < k:
    return None
  mask = np.ones(np.size(top_LH), np.float32)
  mask[np.random.default_rng(seed).choice(pool, k, replace=False)] = 0.0
  return mask.reshape(np.shape(top_LH))


def _layer_options(selective_LH) -> list[list[tuple[int, ...]]]:
  """Per layer, every head subset a layer-matched draw can remove there: as many heads as `selective_LH` removes
  in that layer, from the heads it keeps there; a layer with too few kept heads gives all of them plus the fewest
  of its removed heads."""
  out = []
  for row in np.asarray(selective_LH):
    removed, kept = np.flatnonzero(row == 0), np.flatnonzero(row != 0)
    if len(removed) <= len(kept):
      out.append([tuple(c) for c in itertools.combinations(kept.tolist(), len(removed))])
    else:  # all kept heads plus the fewest removed ones
      out.append([tuple(kept.tolist()) + c for c in itertools.combinations(removed.tolist(), len(removed) - len(kept))])
  return out


def _sets(options: list[list[tuple[int, ...]]], count: int, seed: int, shape) -> tuple[list[np.ndarray], int]:
  """(masks, candidates): every candidate set when there are at most `count` of them (enumerated), else
  `count` distinct sets drawn uniformly (no set twice). A set picks one option per group; `shape` [L, H]."""
  candidates = math.prod(len(o) for o in options)

  def mask(choice) -> np.ndarray:
    m = np.ones(shape, np.float32)
    for layer, heads in choice:
      m[layer, list(heads)] = 0.0
    return m

  groups = [(layer, o) for layer, o in enumerate(options)]
  if candidates <= count:
    return [mask(zip(range(len(options)), c)) for c in itertools.product(*options)], candidates
  rng, seen, out = np.random.default_rng(seed), set(), []
  while len(out) < count:
    pick = tuple(int(rng.integers(len(o))) for _, o in groups)
    if pick not in seen:
      seen.add(pick)
      out.append(mask((layer, o[i]) for (layer, o), i in zip(groups, pick)))
  return out, candidates


def layer_matched_masks(selective_LH, count: int, seed: int) -> tuple[list[np.ndarray], int]:
  """(masks, candidates): the layer-matched random sets of `selective_LH` (`_layer_options`' rule) —
  all of them when there are at most `count` (`candidates` <= count: the mean over them is exact), else
  `count` distinct ones drawn uniformly. Independent draws would repeat a set: with 4 heads a layer and k = 1
  there are 3 candidates, and 3 independent draws repeat one with probability 7/9."""
  return _sets(_layer_options(selective_LH), count, seed, np.shape(selective_LH))


def unlabelled_masks(unlabelled_LH, top_LH, k: int, count: int, seed: int) -> tuple[list[np.ndarray], int]:
  """(masks, candidates): sets of k heads from `unlabelled_mask`'s pool (any layer, not in `top_LH`, no role
  label): all of them when C(pool, k) <= `count`, else `count` distinct ones; ([], 0) when the pool has
  fewer than k heads."""
  L, H = np.shape(top_LH)
  pool = np.flatnonzero((np.asarray(top_LH).ravel() != 0) & np.asarray(unlabelled_LH, bool).ravel())
  if len(pool) < k:
    return [], 0
  candidates = math.comb(len(pool), k)
  flat = lambda heads: [(int(i) // H, (int(i) % H,)) for i in heads]
  if candidates <= count:
    sets = [flat(c) for c in itertools.combinations(pool.tolist(), k)]
  else:
    rng, seen, sets = np.random.default_rng(seed), set(), []
    while len(sets) < count:
      pick = tuple(sorted(rng.choice(pool, k, replace=False).tolist()))
      if pick not in seen:
        seen.add(pick)
        sets.append(flat(pick))
  masks = []
  for heads in sets:
    m = np.ones((L, H), np.float32)
    for layer, (head,) in heads:
      m[layer, head] = 0.0
    masks.append(m)
  return masks, candidates


def overlap(selective_LH, random_LH) -> float:
  """Fraction of the heads `random_LH` removes that `selective_LH` removes too."""
  removed = np.asarray(random_LH) == 0
  return float((removed & (np.asarray(selective_LH) == 0)).sum() / max(removed.sum(), 1))


@dataclasses.dataclass
class _Split:
  words: list
  labels: np.ndarray
  sentence_N: np.ndarray
  batches: list  # ((tokens_BT, positions_BT, segment_BT, pool_BWT), word index per (b, w) or -1)
  windows: list


def _subsample(sentences, max_words: int, seed: int):
  """A seeded subset of whole sentences of about `max_words` words, as the probes draw theirs (all for 0)."""
  if max_words <= 0:
    return sentences
  return [sentences[i] for i in stats.subsample([len(s.words) for s in sentences], max_words, seed)]


def _make_split(sentences, labels, tokenizer, max_len, causal, pooling, batch_tokens) -> _Split:
  """A split's words in one-window rows (headspec/words/batches.py), pooled at `pooling`, with their labels."""
  words = [s.words for s in sentences]
  al = align_lib.align(words, tokenizer, max_len, causal=causal)
  of_window = words_lib.words_of_windows(al)
  lengths = np.array([len(w) for w in al.windows])
  batches = [
    words_lib.window_inputs(T, B, windows, al, of_window, tokenizer.pad_id, pooling)
    for T, B, windows in words_lib.window_batches(lengths, max_len, batch_tokens)
  ]
  return _Split(words, labels, al.word_sentence_N, batches, al.windows)


def word_features(model, split: _Split, mask_LH, replacement_LHK) -> np.ndarray:
  """[N, D] the last block's output (the last layer's residual stream) per word, pooled from its pieces, with
  the heads of `mask_LH` mean-ablated (an Edit of z, `edits.head_mask`) through the shared word forward.

  A pre-LN model's final LayerNorm is applied (the hidden state its LM head reads); probing's residual
  features of the last layer are the block output before it, which a probe on standardised features
  sees up to a per-word scale.
  """
  edit = {"z": head_mask(jnp.asarray(mask_LH, jnp.float32), jnp.asarray(replacement_LHK, jnp.float32))}
  return words_lib.hidden_words(model, split.batches, len(split.labels), edit)


@dataclasses.dataclass
class TaskData:
  task: str
  num_classes: int
  train: _Split
  dev: _Split
  test: _Split


def load_task_data(
  data_root, treebank: str, tasks, tokenizer, model_cfg, config, probe_config=None, log=print
) -> list[TaskData]:
  """Train/dev/test of `treebank`: the sentences the model can represent (align.representable, which
  logs what it skips), subsampled to `causal.max_*_words` whole sentences, labelled per task by the probing
  registry's task under `probe_config` (a config with the probe stage's `probe.*` keys; None: the probes'
  defaults)."""
  if probe_config is None:
    from headspec.probing.config import probe_config as defaults

    probe_config = defaults()
  c = config.causal
  present = treebank_lib.available_splits(data_root, treebank)
  for needed in ("train", "dev", "test"):
    if needed not in present:
      raise UserError(f"causal test: treebank {treebank} has no {needed} split under {data_root}/ud/{treebank}")

  def representable(split):
    sentences = treebank_lib.load_split(data_root, treebank, split)
    where = f"causal test: {treebank}/{split}"
    return words_lib.representable_sentences(sentences, tokenizer, model_cfg.max_len, where=where, log=log)[0]

  splits = {
    s: _subsample(representable(s), n, config.seed)
    for s, n in (("train", c.max_train_words), ("dev", c.max_eval_words), ("test", c.max_eval_words))
  }
  pooling = resolve_pooling(c.pooling, model_cfg.kind)  # as `headspec probe` read the heads it ranked
  out = []
  for name in tasks:
    task = probe_tasks.REGISTRY[name]
    vocab = task.vocabulary(splits["train"], probe_config)
    made = {
      s: _make_split(
        splits[s],
        task.labels(splits[s], vocab, probe_config),
        tokenizer,
        model_cfg.max_len,
        model_cfg.kind == "decoder",
        pooling,
        c.batch_tokens,
      )  # fmt: skip
      for s in splits
    }
    out.append(TaskData(name, len(vocab.classes), made["train"], made["dev"], made["test"]))
  return out


def _fit(x_train, x_dev, data: TaskData, config):
  c = data.num_classes
  spec = probe.ProbeSpec(
    data.task, c, data.train.labels, np.where(data.dev.labels < c, data.dev.labels, -1).astype(np.int32)
  )
  return probe.fit_softmax_probes(
    x_train[:, None], x_dev[:, None], [spec], l2_grid=tuple(config.causal.l2_grid), seed=config.seed,
    refine_samples=config.causal.refine_samples,
  )  # fmt: skip


def causal_rows(model, data: TaskData, selectivity_LH, lm_set, lm_replacement, config, progress=None) -> list[dict]:
  """causal.csv rows (without model, step, kind) for one task; see the module docstring."""
  c = config.causal
  R, seed = config.bootstrap_resamples, config.seed
  L, H = selectivity_LH.shape
  train_set = evalset.sentence_embedding_set(
    data.train.windows, pad_id=0, max_len=model.cfg.max_len, batch_tokens=c.batch_tokens
  )
  mean_z, _ = core.head_statistics(model, train_set)  # Z_h averaged over the probe's training tokens
  ones = np.ones((L, H), np.float32)
  feats = lambda split, mask: word_features(model, split, mask, mean_z)
  base = [feats(s, ones) for s in (data.train, data.dev, data.test)]
  fixed = _fit(base[0], base[1], data, config)
  test_labels = data.test.labels
  correct = lambda fitted, x: probe.predict(fitted, x[:, None], data.task)[:, 0] == test_labels
  rows = []

  def row(k, selection, seed_value, metric, value, low, high):
    rows.append(
      dict(task=data.task, k=k, selection=selection, seed=seed_value, metric=metric, value=float(value),
           ci_low=float(low), ci_high=float(high))
    )  # fmt: skip

  base_correct = correct(fixed, base[2])
  acc, low, high = resampling.bootstrap_ci(base_correct, data.test.sentence_N, num_resamples=R, seed=seed)
  for metric in ("probe_accuracy", "probe_accuracy_fixed"):
    row(0, "selective", -1, metric, acc[0], low[0], high[0])
  for k in ks(L * H):
    sel = selective_mask(selectivity_LH, k)
    drawn, candidates = layer_matched_masks(sel, c.random_seeds, seed + 1000 * k)
    masks = [sel] + drawn
    resample_draws = candidates > len(drawn)  # a sample of the candidate sets: resample the draws too
    row(k, "random_layer_matched", -1, "candidate_sets", candidates, np.nan, np.nan)
    for s, mask in enumerate(masks[1:]):
      row(k, "random_layer_matched", s, "overlap_with_selective", overlap(sel, mask), np.nan, np.nan)
    refit_cols, fixed_cols = [], []
    for mask in masks:
      x = [feats(s, mask) for s in (data.train, data.dev, data.test)]
      refit_cols.append(correct(_fit(x[0], x[1], data, config), x[2]))
      fixed_cols.append(correct(fixed, x[2]))
      if progress is not None:
        progress.update(1)
    for metric, cols in (("probe_accuracy", refit_cols), ("probe_accuracy_fixed", fixed_cols)):
      correct_NG = np.stack(cols, 1)
      _, boot_RG = resampling.bootstrap_accuracies(correct_NG, data.test.sentence_N, num_resamples=R, seed=seed)
      value_G = correct_NG.mean(0)
      low_G, high_G = np.percentile(boot_RG, [2.5, 97.5], axis=0)
      for g in range(len(masks)):
        row(k, "selective" if g == 0 else "random_layer_matched", -1 if g == 0 else g - 1, metric, value_G[g],
            low_G[g], high_G[g])  # fmt: skip
      diff_R = boot_RG[:, 0] - resampling.mean_over_draws_R(boot_RG[:, 1:], resample_draws=resample_draws, seed=seed)
      row(
        k, "selective", -1, f"{metric}_vs_random", value_G[0] - value_G[1:].mean(), *np.percentile(diff_R, [2.5, 97.5])
      )
    if lm_set is not None:
      full, *ablated = core.run_masks(model, lm_set, [ones] + masks, lm_replacement)
      d = metrics.deltas("lm", full, np.stack(ablated), resamples=R, seed=seed, return_boot=True)
      value_G, low_G, high_G, boot_RG = d["loss_delta"]
      for g in range(len(masks)):
        row(k, "selective" if g == 0 else "random_layer_matched", -1 if g == 0 else g - 1, "loss_delta",
            value_G[g], low_G[g], high_G[g])  # fmt: skip
      diff_R = boot_RG[:, 0] - resampling.mean_over_draws_R(boot_RG[:, 1:], resample_draws=resample_draws, seed=seed)
      row(
        k, "selective", -1, "loss_delta_vs_random", value_G[0] - value_G[1:].mean(), *np.percentile(diff_R, [2.5, 97.5])
      )
  return rows


def verdicts(rows: list[dict]) -> list[str]:
  """One line per (task, k): whether less is decodable without the selective heads than without layer-matched
  random ones (decodability after ablation, a refitted probe: not whether the model uses them)."""
  lines = []
  for r in rows:
    if r["metric"] == "probe_accuracy_vs_random":
      more = r["ci_high"] < 0
      lines.append(
        f"{r['task']} k={r['k']}: decodability after ablation (refitted probe accuracy), selective − random = "
        f"{r['value']:+.4f} [{r['ci_low']:+.4f}, {r['ci_high']:+.4f}]: "
        + (
          "LESS is decodable without the selective heads than without random heads of the same layers"
          if more
          else "no less decodable than without random heads of the same layers (CI reaches 0)"
        )
      )
  return lines


# --- induction heads (kind=induction) ---

INDUCTION_METRICS = (
  "loss_delta_first",
  "loss_delta_second",
  "second_minus_first",
  "loss_delta_second_vs_random",
  "loss_delta_second_vs_unlabelled",
  "overlap_with_selective",
  "candidate_sets",
)


def repeat_eval_sets(tokens_NT, n: int, prefix: int, batch_size: int):
  """(first, second): the same repeated sequences `prefix tokens, r_1..r_n, r_1..r_n` scored on the
  predictions of r_2..r_n in the first repeat, and in the second (r_1 is unpredictable in both)."""
  tokens_NT = np.asarray(tokens_NT, np.int32)
  N, T = tokens_NT.shape
  targets_NT = np.concatenate([tokens_NT[:, 1:], tokens_NT[:, -1:]], axis=1)
  valid_NT = np.ones((N, T), bool)
  out = []
  for start in (prefix, prefix + n):  # position t predicts token t + 1
    weights_NT = np.zeros((N, T), np.float32)
    weights_NT[:, start : start + n - 1] = 1.0
    batches = evalset._batches(tokens_NT, valid_NT, targets_NT, weights_NT, batch_size)
    out.append(evalset.EvalSet("lm", batches, N, f"{N} repeated random sequences, n={n}"))
  return tuple(out)


def induction_rows(
  model, tokens_NT, n: int, prefix: int, induction_LH, c, *, resamples: int, seed: int, unlabelled_LH=None,
  batch_size=25,
):  # fmt: skip
  """ablation/causal.csv rows (without model, step, kind) of the induction-head causal check.

  For each method (zero, mean) and k: the k heads with the largest induction score (`top_induction`,
  seed −1), the layer-matched random sets (`random_layer_matched`, seed s, from the heads outside the top k,
  `layer_matched_masks`: every candidate set when there are at most `c.random_seeds`, else that many distinct
  ones; with their `overlap_with_selective`) and, given `unlabelled_LH` (the heads that no previous-token,
  duplicate-token or induction label names), sets of k of those heads from any layer (`random_unlabelled`,
  `unlabelled_masks`, the same rule; none for a k that fewer such heads allow) are ablated; `candidate_sets`
  (seed −1) counts the candidates of each control; `task` is 'repeated_random/<method>'. The caller picks
  `induction_LH` on other sequences than `tokens_NT` (headspec/attention/induction_run.py: one half selects,
  the other measures). Metrics (loss in nats, ablated − unablated, on the same tokens):
    loss_delta_first / loss_delta_second   on the first / second repeat (r_2..r_n of each)
    second_minus_first                     their difference (paired bootstrap over sequences)
    loss_delta_second_vs_random            (top_induction rows only) its second-repeat delta minus the
                                           mean over the layer-matched sets (paired bootstrap over
                                           sequences, and over the sets where they are a sample)
    loss_delta_second_vs_unlabelled        (top_induction rows only) the same against the unlabelled
                                           sets: the control when a layer's other heads are induction
                                           heads too, which the layer-matched draw then ablates
  Induction heads matter when second_minus_first and a *_vs_ control have CIs above 0.
  """
  L, H = np.shape(induction_LH)
  first, second = repeat_eval_sets(tokens_NT, n, prefix, batch_size)
  mean_z, _ = core.head_statistics(model, second)  # Z_h averaged over every token of the sequences
  replacements = {"zero": core.zero_replacement(model), "mean": mean_z}
  ones = np.ones((L, H), np.float32)
  ks_ = [int(k) for k in c.ks if 0 < int(k) <= L * H]
  masks, labels, candidates = [ones], [None], {}
  for k in ks_:
    top = selective_mask(induction_LH, k)
    masks.append(top)
    labels.append((k, "top_induction", -1))
    drawn = {"random_layer_matched": layer_matched_masks(top, c.random_seeds, seed + 1000 * k)}
    if unlabelled_LH is not None:
      drawn["random_unlabelled"] = unlabelled_masks(unlabelled_LH, top, k, c.random_seeds, seed + 1000 * k + 500)
    for selection, (sets, count) in drawn.items():
      candidates[(k, selection)] = (count, len(sets))
      for s, mask in enumerate(sets):
        masks.append(mask)
        labels.append((k, selection, s))
  rows = []
  for method in c.methods:
    if method not in replacements:
      raise UserError(f"induction.causal.methods: unknown {method!r}; use zero and/or mean")
    per = {}
    for name, es in (("first", first), ("second", second)):
      full, *ablated = core.run_masks(model, es, masks, replacements[method])
      per[name] = metrics.deltas("lm", full, np.stack(ablated), resamples=resamples, seed=seed, return_boot=True)
    v1, _, _, b1 = per["first"]["loss_delta"]
    v2, _, _, b2 = per["second"]["loss_delta"]
    lo = lambda b: np.percentile(b, 2.5, axis=0)
    hi = lambda b: np.percentile(b, 97.5, axis=0)
    series = {
      "loss_delta_first": (v1, lo(b1), hi(b1)),
      "loss_delta_second": (v2, lo(b2), hi(b2)),
      "second_minus_first": (v2 - v1, lo(b2 - b1), hi(b2 - b1)),
    }
    task = f"repeated_random/{method}"
    for (k, selection), (count, _) in candidates.items():
      rows.append(dict(task=task, k=k, selection=selection, seed=-1, metric="candidate_sets", value=float(count),
                       ci_low=np.nan, ci_high=np.nan))  # fmt: skip
    for g, label in enumerate(labels[1:]):
      k, selection, s = label
      if selection == "random_layer_matched":
        rows.append(dict(task=task, k=k, selection=selection, seed=s, metric="overlap_with_selective",
                         value=overlap(selective_mask(induction_LH, k), masks[g + 1]), ci_low=np.nan,
                         ci_high=np.nan))  # fmt: skip
      for metric, (v, low, high) in series.items():
        rows.append(dict(task=task, k=k, selection=selection, seed=s, metric=metric, value=float(v[g]),
                         ci_low=float(low[g]), ci_high=float(high[g])))  # fmt: skip
      if selection != "top_induction":
        continue
      for control, metric in (("random_layer_matched", "loss_delta_second_vs_random"),
                              ("random_unlabelled", "loss_delta_second_vs_unlabelled")):  # fmt: skip
        rand = [i for i, x in enumerate(labels[1:]) if x[0] == k and x[1] == control]
        if rand:
          count, used = candidates[(k, control)]
          diff_R = b2[:, g] - resampling.mean_over_draws_R(b2[:, rand], resample_draws=count > used, seed=seed)
          rows.append(dict(task=task, k=k, selection=selection, seed=-1, metric=metric,
                           value=float(v2[g] - v2[rand].mean()), ci_low=float(np.percentile(diff_R, 2.5)),
                           ci_high=float(np.percentile(diff_R, 97.5))))  # fmt: skip
  return rows


def induction_verdicts(rows: list[dict]) -> list[str]:
  """One line per (method, k) of the top-k induction heads."""
  by = {(r["task"], r["k"], r["metric"]): r for r in rows if r["selection"] == "top_induction"}
  lines = []
  for (task, k, metric), r in sorted(by.items()):
    if metric != "second_minus_first":
      continue
    controls = [
      (by[(task, k, m)], what)
      for m, what in (
        ("loss_delta_second_vs_random", "random heads of the same layers"),
        ("loss_delta_second_vs_unlabelled", "random unlabelled heads"),
      )
      if (task, k, m) in by
    ]
    ok = r["ci_low"] > 0 and any(vr["ci_low"] > 0 for vr, _ in controls)
    lines.append(
      f"{task} k={k}: loss +{by[(task, k, 'loss_delta_second')]['value']:.3f} on the second repeat vs "
      f"+{by[(task, k, 'loss_delta_first')]['value']:.3f} on the first (difference {r['value']:+.3f} "
      f"[{r['ci_low']:+.3f}, {r['ci_high']:+.3f}])"
      + "".join(f"; vs {what} {vr['value']:+.3f} [{vr['ci_low']:+.3f}, {vr['ci_high']:+.3f}]" for vr, what in controls)
      + ": "
      + ("the induction heads do the in-context copying" if ok else "not clearly (a CI reaches 0)")
    )
  return lines
