"""Minimum description length probing: the online (prequential) code of Voita & Titov (2020).

Source: E. Voita and I. Titov, "Information-Theoretic Probing with Minimum Description Length",
EMNLP 2020 (arXiv:2003.12298), §3.2.2 and their code (github.com/lena-voita/description-length-probing,
control_tasks/mdl_configs/online_*.yml and mdl_eval_notebooks/Eval_MDL_online_code.ipynb).

The labels y_1..y_N of N words are transmitted to a receiver who already has the features x_1..x_N.
Voita & Titov portion examples, i.e. sentences: given each word's sentence (`sentence_N`; the probe suite
passes it), the S sentences are shuffled once (`seed`), their words kept together, and the blocks end at
sentence boundaries: t_i = the words of the first ⌊f_i·S⌋ shuffled sentences, for the fractions
f = (0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.25, 12.5, 25, 50, 100)% of sentences (the paper's portions;
without `sentence_N`, the earlier behaviour, the words are shuffled and cut at t_i = ⌊f_i·N⌋). The first
block is sent with the uniform code over the K classes; every later block i is sent with p_i, the
probe θ_i fitted on all words before it (t_0 .. t_i − 1, which the receiver has and can refit θ_i on):

  L_online = t_1·log2 K − Σ_{i=1}^{B−1} Σ_{n=t_i}^{t_{i+1}−1} log2 p_i(y_n | x_n)     (bits)
  L_uniform = N·log2 K,     compression = L_uniform / L_online.

The probe is headspec's own (probe.fit_softmax_probes: multinomial logistic regression on features
standardised with the training portion's mean and std, LDA start, Adam, L-BFGS) with ONE fixed penalty
(no dev selection, which would cost bits the code does not count), refitted from scratch on each
portion: λ_i = prior_precision / t_i in the fitter's per-word units, i.e. the same Gaussian prior
(precision `prior_precision`, default 1) on the standardised weights whatever the portion size,
W_i = argmin Σ_{n < t_i} −ln p_W(y_n | x_n) + (prior_precision/2)‖W‖²_F (exactly so when every word of
the portion is labelled; the fitter averages over labelled words). (A λ fixed in per-word units
would regularise a 200-word portion a thousand times less than the same prior does, and overconfident
early probes lengthen the code.)

Classes: every probe is over all K classes (a class absent from its portion keeps a very negative bias
in the fitter, probe.py), and two rules, both reproducible by the receiver, make every codelength finite:
  1. escape (Laplace's rule for the unseen): when m of the K classes have no labelled word in the
     portion (n_i labelled words), each of them gets probability 1/(n_i + K) and the probe's
     distribution over the seen classes is renormalised to the remaining 1 − m/(n_i + K); with every
     class seen (m = 0, the usual case after the first portions) the probe is used as it is;
  2. a floor: the result is mixed with the uniform code, p = (1 − ε)·p + ε/K (ε = `uniform_mix`,
     default 1e-4), costing at most −log2(1 − ε) ≈ 1.4e-4 bits more per word and bounding every word's
     cost by log2(K/ε) bits, however confidently wrong the probe is.
So  p_i(y | x) = (1 − ε)·[y seen: (1 − m/(n_i + K))·p_θi(y | x) / Σ_{c seen} p_θi(c | x);
                          y unseen: 1/(n_i + K)] + ε/K.

Differences from the reference code, on purpose: the first block holds at least `min_first_block` words
(whole sentences); every cost is in bits (their evaluation notebook
adds each portion's summed PyTorch cross-entropy, a natural log, to t_1·log2 K); the probe is the linear
softmax probe with the prior above instead of a probe trained with early stopping on dev; the escape
and the floor above.

Cost: one probe fit per portion (10), every label set and every group of x_NGK together in each, as
probe.fit_softmax_probes does. The prefixes add up to about N words (Σ_i t_i ≈ N), so the passes over
the data cost about what one ordinary fit's do; on top come, per portion, the fitter's fixed costs (LDA
start, eigendecompositions) and a JIT compilation of each new prefix length (shared by every later layer
of the same shape), and up to DEFAULT_MAX_ITER L-BFGS iterations. See docs/probing_core.md (MDL) for timings.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

import numpy as np

from headspec.errors import UserError

DEFAULT_FRACTIONS = (0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.0625, 0.125, 0.25, 0.5, 1.0)
DEFAULT_PRIOR_PRECISION = 1.0  # α: the penalty (α/2)‖W‖² on the summed cross-entropy, every portion
DEFAULT_UNIFORM_MIX = 1e-4  # ε: the coding distribution is (1 − ε)·probe + ε·uniform
REFINE_PASSES = 4  # Adam passes over a portion at most before L-BFGS (none when that is less than one batch)
DEFAULT_REFINE_SAMPLES = 200_000  # and at most this many words (probe.fit_softmax_probes' default)
# L-BFGS iterations at most per portion's fit: a probe stopped early codes worse (MiniLM layer 3's
# residual stream on 30.6k EWT words, UPOS: compression 6.29 / 7.29 / 7.57 after 20 / 100 / 300)
DEFAULT_MAX_ITER = 300
MIN_FIRST_BLOCK = 10  # words sent with the uniform code at least (the first fraction of a small N is tiny)
# Options of probe.fit_softmax_probes an online code passes on (anything else it sets itself).
FIT_OPTIONS = ("refine_samples", "batch_size", "learning_rate", "cov_samples", "lda_ridge", "max_devices", "tol")
FIT_OPTIONS += ("max_iter", "pass_chunk", "chunk")


@dataclasses.dataclass(frozen=True)
class OnlineCode:
  """The online code of one label set over G feature groups (bits; `n` labelled words).

  boundaries: t_0 = 0 < t_1 < ... < t_B = N (positions in the shuffled order; block i is [t_i, t_{i+1}));
  block_bits_GB: bits of every block, block 0 (and any block before which no word of this label set is
  labelled) with the uniform code; codelength_bits_G = block_bits_GB.sum(1); uniform_bits = n·log2 K;
  compression_G = uniform_bits / codelength_bits_G; block_accuracy_GB: the probe's accuracy on each block
  (NaN for uniform-coded blocks), the learning curve the code is made of.
  """

  num_classes: int
  n: int
  boundaries: tuple
  block_bits_GB: np.ndarray
  block_accuracy_GB: np.ndarray
  uniform_bits: float
  codelength_bits_G: np.ndarray
  compression_G: np.ndarray


def block_boundaries(n: int, fractions: Sequence[float] = DEFAULT_FRACTIONS, min_first_block: int = MIN_FIRST_BLOCK):
  """t_0 = 0 < t_1 < ... < t_B = n: t_i = ⌊f_i·n⌋ (the reference's int(f·n)), the first at least
  min(min_first_block, n), repeated or too small cut points dropped, the last always n."""
  f = [float(v) for v in fractions]
  if not f or any(not 0 < v <= 1 for v in f) or any(b <= a for a, b in zip(f, f[1:])) or f[-1] != 1.0:
    raise UserError(f"MDL fractions must increase in (0, 1] and end at 1.0, got {tuple(fractions)}")
  if n < 1:
    raise UserError("MDL needs at least one word")
  cuts = [0]
  first = max(int(f[0] * n), min(min_first_block, n), 1)
  for t in [first] + [int(v * n) for v in f[1:]]:
    if t > cuts[-1]:
      cuts.append(min(t, n))
  if cuts[-1] != n:
    cuts.append(n)
  return tuple(cuts)


def sentence_block_boundaries(
  words_S, fractions: Sequence[float] = DEFAULT_FRACTIONS, min_first_block: int = MIN_FIRST_BLOCK
) -> tuple:
  """t_0 = 0 < ... < t_B = n in words, every cut at a sentence boundary: words_S is the number of words of each
  sentence in the (shuffled) order sent, and t_i the words of its first c_i = ⌊f_i·S⌋ sentences (Voita & Titov
  portion examples); the first block holds at least one sentence and min(min_first_block, n) words (whole
  sentences), repeated cut points dropped, the last always n."""
  words = np.asarray(words_S, np.int64)
  block_boundaries(max(len(words), 1), fractions)  # the fractions' checks
  if not len(words) or words.sum() < 1 or (words < 0).any():
    raise UserError("MDL needs at least one word")
  ends = np.cumsum(words)
  n, f = int(ends[-1]), [float(v) for v in fractions]
  first = max(int(f[0] * len(words)), 1)
  first = max(first, int(np.searchsorted(ends, min(min_first_block, n))) + 1)  # enough words, whole sentences
  cuts = [0]
  for c in [first] + [int(v * len(words)) for v in f[1:]]:
    t = int(ends[min(c, len(words)) - 1]) if c > 0 else 0
    if t > cuts[-1]:
      cuts.append(t)
  if cuts[-1] != n:
    cuts.append(n)
  return tuple(cuts)


def sentence_order(sentence_N, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """(order, words_S): the words in the order sent — the sentences of `sentence_N` shuffled with `seed`, each
  sentence's words together in their own order — and the number of words of each sentence in that order
  (what `sentence_block_boundaries` cuts)."""
  _, sentence = np.unique(np.asarray(sentence_N), return_inverse=True)
  num_s = int(sentence.max()) + 1 if len(sentence) else 0
  rank = np.empty(num_s, np.int64)
  rank[np.random.default_rng(seed).permutation(num_s)] = np.arange(num_s)
  order = np.lexsort((np.arange(len(sentence)), rank[sentence]))
  return order, np.bincount(rank[sentence], minlength=num_s)


def _log2_probs(fitted, name, x_NGK, y_N, uniform_mix, seen_C, n_train, chunk=8192):
  """log2 p_i(y_n | x_n) (N, G): the fitted probe `name` with the escape for the classes unseen in its
  portion (seen_C false; n_train labelled words) and the uniform floor (module docstring); 0 where y < 0.
  Also whether the probe's argmax is right (N, G)."""
  k_all = len(seen_C)
  unseen = int(k_all - seen_C.sum())
  escape = unseen / (n_train + k_all)  # Laplace: each class unseen in the portion gets 1/(n + K)
  w = np.asarray(fitted.weights[name], np.float32)
  b = np.asarray(fitted.biases[name], np.float64)
  mean, std = np.asarray(fitted.mean_GK, np.float32), np.asarray(fitted.std_GK, np.float32)
  k = w.shape[-1]
  out = np.zeros((len(y_N), w.shape[0]), np.float64)
  correct = np.zeros((len(y_N), w.shape[0]), bool)
  for s in range(0, len(y_N), chunk):
    xs = (np.asarray(x_NGK[s : s + chunk], np.float32) - mean) / std
    z = np.einsum("ngk,gkc->ngc", xs, w).astype(np.float64) + b[None]
    logp = z - z.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    y = np.asarray(y_N[s : s + chunk])
    if unseen:  # the probe's distribution renormalised over the seen classes, scaled by 1 − escape
      top = np.where(seen_C, logp, -np.inf).max(-1, keepdims=True)
      lse = top + np.log(np.where(seen_C, np.exp(logp - top), 0.0).sum(-1, keepdims=True))
      logp = np.where(seen_C, np.log1p(-escape) + logp - lse, math.log(1.0 / (n_train + k_all)))
    picked = np.take_along_axis(logp, np.maximum(y, 0)[:, None, None], -1)[..., 0]
    if uniform_mix > 0:
      picked = np.logaddexp(np.log1p(-uniform_mix) + picked, math.log(uniform_mix / k))
    out[s : s + chunk] = np.where((y >= 0)[:, None], picked / math.log(2.0), 0.0)
    correct[s : s + chunk] = (z.argmax(-1) == y[:, None]) & (y >= 0)[:, None]
  return out, correct


def online_codelengths(
  x_NGK,
  label_sets: Mapping[str, tuple],
  *,
  fractions: Sequence[float] = DEFAULT_FRACTIONS,
  prior_precision: float = DEFAULT_PRIOR_PRECISION,
  uniform_mix: float = DEFAULT_UNIFORM_MIX,
  seed: int = 0,
  min_first_block: int = MIN_FIRST_BLOCK,
  fit_options: Mapping | None = None,
  sentence_N=None,
) -> dict[str, OnlineCode]:
  """The online code of every label set, for every feature group of x_NGK (see the module docstring).

  label_sets: name -> (y_N int labels in [0, K) or -1 = not transmitted, K): e.g. a task and its
  control task on the same words. All label sets share the shuffle (`seed`) and, in each portion, one
  probe.fit_softmax_probes call (L2 λ_i = prior_precision / t_i, the single value of its grid; the block
  serves as its 'dev' set, which with one L2 value only reports the block accuracy). fit_options: other
  keyword arguments of probe.fit_softmax_probes (FIT_OPTIONS: e.g. max_iter, default DEFAULT_MAX_ITER
  here; tol; max_devices; refine_samples, capped at REFINE_PASSES passes over each portion).
  sentence_N: each word's sentence id: sentences are shuffled and portioned (blocks end at sentence
  boundaries, `sentence_block_boundaries`), as Voita & Titov portion examples; None: words are (the older rule).
  Deterministic given `seed`.
  """
  from headspec.probing import probe  # JAX only when a code is computed

  x_NGK = np.asarray(x_NGK) if not hasattr(x_NGK, "shape") else x_NGK
  if len(x_NGK.shape) != 3:
    raise UserError(f"MDL features must be x_NGK (words, groups, dims), got shape {tuple(x_NGK.shape)}")
  n_words, num_g = x_NGK.shape[0], x_NGK.shape[1]
  if not label_sets:
    raise UserError("MDL needs at least one label set")
  if not prior_precision > 0 or not 0 <= uniform_mix < 1:
    raise UserError(f"MDL: prior_precision must be > 0 and uniform_mix in [0, 1); got {prior_precision}, {uniform_mix}")
  options = dict(fit_options or {})
  unknown = sorted(set(options) - set(FIT_OPTIONS))
  if unknown:
    raise UserError(f"MDL fit_options: unknown {unknown}; use any of {', '.join(FIT_OPTIONS)}")
  sets = {}
  for name, (y_N, k) in label_sets.items():
    y_N, k = np.asarray(y_N), int(k)
    if y_N.shape != (n_words,) or k < 2:
      raise UserError(f"MDL label set {name!r}: need {n_words} labels and K >= 2 classes, got {y_N.shape}, K={k}")
    if y_N.size and (y_N.min() < -1 or y_N.max() >= k):
      raise UserError(f"MDL label set {name!r}: labels outside [-1, {k})")
    sets[name] = (y_N.astype(np.int32), k)
  refine_samples = options.pop("refine_samples", DEFAULT_REFINE_SAMPLES)
  options.setdefault("max_iter", DEFAULT_MAX_ITER)
  if sentence_N is None:
    cuts = block_boundaries(n_words, fractions, min_first_block)
    order = np.random.default_rng(seed).permutation(n_words)
  else:
    if np.shape(sentence_N) != (n_words,):
      raise UserError(f"MDL sentence_N: need the sentence of each of the {n_words} words, got {np.shape(sentence_N)}")
    order, words_S = sentence_order(sentence_N, seed)
    cuts = sentence_block_boundaries(words_S, fractions, min_first_block)
  num_blocks = len(cuts) - 1
  bits = {name: np.zeros((num_g, num_blocks)) for name in sets}
  accuracy = {name: np.full((num_g, num_blocks), np.nan) for name in sets}
  shuffled = {name: y[order] for name, (y, _) in sets.items()}
  for i in range(num_blocks):
    lo, hi = cuts[i], cuts[i + 1]
    block = {name: shuffled[name][lo:hi] for name in sets}
    fitted_names = [name for name in sets if i > 0 and (shuffled[name][:lo] >= 0).any()]
    for name in sets:
      if name not in fitted_names:  # the uniform code: the first block, or nothing labelled before this block
        bits[name][:, i] = (block[name] >= 0).sum() * math.log2(sets[name][1])
    if not fitted_names:
      continue
    idx_train, idx_block = np.sort(order[:lo]), order[lo:hi]  # sorted: reads a memory-mapped x in order
    y_train = {name: sets[name][0][idx_train] for name in fitted_names}
    x_train = np.asarray(x_NGK[idx_train], np.float32)
    x_block = np.asarray(x_NGK[np.sort(idx_block)], np.float32)
    unsort = np.argsort(np.argsort(idx_block))  # x_block[unsort] is in the block's (shuffled) order
    x_block = x_block[unsort]
    specs = [probe.ProbeSpec(name, sets[name][1], y_train[name], block[name]) for name in fitted_names]
    fit = dict(options, refine_samples=min(refine_samples, REFINE_PASSES * lo))
    fitted = probe.fit_softmax_probes(x_train, x_block, specs, l2_grid=(prior_precision / lo,), seed=seed + i, **fit)
    for name in fitted_names:
      known = y_train[name][y_train[name] >= 0]  # the labels the receiver has decoded so far
      seen = np.bincount(known, minlength=sets[name][1]) > 0
      log2p, correct = _log2_probs(fitted, name, x_block, block[name], uniform_mix, seen, len(known))
      bits[name][:, i] = -log2p.sum(0)
      sent = (block[name] >= 0).sum()
      if sent:
        accuracy[name][:, i] = correct.sum(0) / sent
  out = {}
  for name, (y, k) in sets.items():
    n = int((y >= 0).sum())
    uniform = n * math.log2(k)
    total = bits[name].sum(1)
    compression = np.where(total > 0, uniform / np.maximum(total, 1e-300), 1.0)  # total 0 only when n = 0
    out[name] = OnlineCode(k, n, cuts, bits[name], accuracy[name], uniform, total, compression)
  return out


def online_codelength(
  x_NF,
  y_N,
  num_classes: int,
  *,
  fractions: Sequence[float] = DEFAULT_FRACTIONS,
  prior_precision: float = DEFAULT_PRIOR_PRECISION,
  uniform_mix: float = DEFAULT_UNIFORM_MIX,
  seed: int = 0,
  min_first_block: int = MIN_FIRST_BLOCK,
  fit_options: Mapping | None = None,
) -> dict:
  """The online codelength of labels y_N (in [0, K), -1 = not sent) given features x_NF of one group.

  Returns {'codelength_bits', 'uniform_bits', 'compression', 'n', 'first_block_bits', 'block_bits' (B,),
  'block_accuracy' (B,), 'boundaries'}: see OnlineCode and the module docstring.
  """
  x_NF = np.asarray(x_NF)
  if x_NF.ndim != 2:
    raise UserError(f"online_codelength: features must be x_NF, got shape {x_NF.shape}")
  code = online_codelengths(
    x_NF[:, None, :],
    {"y": (y_N, num_classes)},
    fractions=fractions,
    prior_precision=prior_precision,
    uniform_mix=uniform_mix,
    seed=seed,
    min_first_block=min_first_block,
    fit_options=fit_options,
  )["y"]
  return dict(
    codelength_bits=float(code.codelength_bits_G[0]),
    uniform_bits=float(code.uniform_bits),
    compression=float(code.compression_G[0]),
    n=code.n,
    first_block_bits=float(code.block_bits_GB[0, 0]),
    block_bits=code.block_bits_GB[0],
    block_accuracy=code.block_accuracy_GB[0],
    boundaries=code.boundaries,
  )


def mdl_rows(
  model: str,
  step: int,
  layer: int,
  heads: Sequence[int],
  x_NGK,
  tasks: Mapping[str, tuple],
  **options,
) -> list[dict]:
  """probes/mdl.csv rows (tables.MDL) for one layer's feature groups: one per (task, group).

  heads: the `head` value of each of the G groups of x_NGK (-1: the residual stream, one group).
  tasks: task name -> (y_task_N, y_control_N, K): the task's labels and its control task's labels
  (Hewitt & Liang 2019) on the same words, both in [0, K) (-1: not sent). Task and control share the
  shuffle and the fits (online_codelengths, which `options` go to). `n` is the number of words the
  task's code transmits (its labelled words).
  """
  heads = [int(h) for h in heads]
  if len(heads) != x_NGK.shape[1]:
    raise UserError(f"mdl_rows: {len(heads)} head ids for {x_NGK.shape[1]} feature groups")
  label_sets = {}
  for task, (y, y_control, k) in tasks.items():
    label_sets[task] = (y, k)
    label_sets[f"{task}/control"] = (y_control, k)
  codes = online_codelengths(x_NGK, label_sets, **options)
  rows = []
  for task in tasks:
    code, control = codes[task], codes[f"{task}/control"]
    for g, head in enumerate(heads):
      rows.append(
        dict(
          model=model,
          step=int(step),
          task=task,
          layer=int(layer),
          head=head,
          codelength_bits=float(code.codelength_bits_G[g]),
          uniform_bits=float(code.uniform_bits),
          compression=float(code.compression_G[g]),
          control_codelength_bits=float(control.codelength_bits_G[g]),
          control_compression=float(control.compression_G[g]),
          n=int(code.n),
        )
      )
  return rows
