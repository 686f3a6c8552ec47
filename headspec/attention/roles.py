"""Head roles: per-head scores on treebank sentences with 95% bootstrap CIs, and the labels they give.

Scores (one row each in attention/roles.csv, `data=treebank`; q runs over the query words of the split,
a over the word-level map of the head, headspec/attention/words.py):
  argmax_prev / argmax_next  share of query TOKENS whose most-attended token (pieces and special tokens) is
                             the token at relative position −1 / +1 (Voita et al. 2019, §4.1 "positional",
                             a rule about tokens: on word maps a perfect previous-token head reads 0.87 on
                             EWT with a 4k-piece vocabulary), over the query tokens that have a token there
                             (0 for a decoder's +1); summed per word on device (words.token_positional)
  positional                 the larger of the two (label `positional` when >= roles.positional_min, 0.9)
  attend_prev / attend_self / attend_next   mean a[q, q−1], a[q, q], a[q, q+1] (Clark et al. 2019 §3,
                             there between tokens, here between words)
  attend_special             mean attention on the special tokens [CLS]/[SEP]/BOS (Clark §3)
  attend_punct               mean attention on punctuation words, UPOS PUNCT (Clark §3)
  delimiter                  attend_special + attend_punct (label `delimiter` when >= roles.delimiter_min)
  entropy                    mean over queries of −Σ_v a[q, v] log a[q, v] (nats, over words and specials; Clark §3)
  entropy_uniform            mean over queries of log(columns q can see): the entropy of uniform attention
  entropy_ratio              entropy / entropy_uniform (labels `broad` when >= roles.broad_min, `focused`
                             when <= roles.focused_max; Clark §3 contrasts broad and focused heads)
  rare_word                  share of queries whose most-attended column is the least frequent word among
                             the words q can see (Voita et al. 2019 §4.1 "rare words"); frequencies of
                             lower-cased words counted on a named corpus; queries whose visible words
                             all have the same frequency are left out (label when >= roles.rare_word_min)
  syntactic                  the head's best Clark accuracy over relations (not `all`) and directions on
                             the selection split, the relation chosen by its margin over that relation's
                             best offset baseline (headspec/attention/clark.py)
  syntactic_margin           that accuracy minus the baseline (label `syntactic` when >= roles.syntactic_margin_min)

CIs: percentile bootstrap over sentences (Efron & Tibshirani 1993), the same resamples as
headspec/words/resampling.py (`bootstrap_resample_counts`); a ratio of sums (e.g. entropy / uniform
entropy) is resampled as a ratio.
"""

from __future__ import annotations

import collections
import re

import numpy as np

from headspec.attention import clark as clark_lib
from headspec.attention.words import WordStats
from headspec.errors import UserError
from headspec.words import resampling

LABELS = ("positional", "delimiter", "broad", "focused", "rare_word", "syntactic")
ROLES = (
  "positional",
  "argmax_prev",
  "argmax_next",
  "attend_prev",
  "attend_self",
  "attend_next",
  "attend_special",
  "attend_punct",
  "delimiter",
  "entropy",
  "entropy_uniform",
  "entropy_ratio",
  "rare_word",
  "syntactic",
  "syntactic_margin",
)
_WORD = re.compile(r"\S+")


def check_labels(labels) -> None:
  unknown = [x for x in labels if x not in LABELS]
  if unknown:
    raise UserError(f"roles.labels: unknown role(s) {', '.join(map(repr, unknown))}; choose from {', '.join(LABELS)}")


def count_words(lines) -> collections.Counter:
  """Counts of lower-cased whitespace-separated words (the corpora are tokenized: 'forces ,' not 'forces,')."""
  counts = collections.Counter()
  for line in lines:
    counts.update(line.lower().split())
  return counts


def ratio_ci(num_NG, den_NG, sentence_N, *, num_resamples: int, seed: int, confidence: float = 0.95):
  """(Σ num / Σ den, low, high) per group G, with a percentile bootstrap over sentences.

  den_NG may be [N] (shared by all groups). Resamples are resampling.bootstrap_resample_counts(U, R, seed).
  """
  num_NG = np.asarray(num_NG, np.float64)
  den_NG = np.broadcast_to(np.asarray(den_NG, np.float64).reshape(len(num_NG), -1), num_NG.shape)
  _, sent_N = np.unique(np.asarray(sentence_N), return_inverse=True)
  U = int(sent_N.max()) + 1
  order = np.argsort(sent_N, kind="stable")
  starts = np.searchsorted(sent_N[order], np.arange(U))
  num_UG = np.add.reduceat(num_NG[order], starts, axis=0)
  den_UG = np.add.reduceat(den_NG[order], starts, axis=0)
  counts_RU = resampling.bootstrap_resample_counts(U, num_resamples, seed)
  with np.errstate(invalid="ignore", divide="ignore"):
    value_RG = (counts_RU @ num_UG) / (counts_RU @ den_UG)
    alpha = (1.0 - confidence) / 2.0
    low_G, high_G = np.nanpercentile(value_RG, [100 * alpha, 100 * (1 - alpha)], axis=0)
    return num_UG.sum(0) / den_UG.sum(0), low_G, high_G


def _mean_ci(value_LHN, sentence_N, keep_N=None, **bootstrap):
  """Mean over queries per head, [L, H] value, low, high."""
  L, H, _ = value_LHN.shape
  value_NG = value_LHN.reshape(L * H, -1).T
  if keep_N is not None:
    value_NG, sentence_N = value_NG[keep_N], sentence_N[keep_N]
  return tuple(x.reshape(L, H) for x in ratio_ci(value_NG, np.ones(len(value_NG)), sentence_N, **bootstrap))


def rarest_visible(ws: WordStats, freq_N: np.ndarray):
  """(min_N, spread_N): the lowest frequency among the words each query can see, and whether those
  frequencies differ at all (else the query is left out of `rare_word`)."""
  min_N = np.empty(ws.num_words, np.float64)
  spread_N = np.zeros(ws.num_words, bool)
  freq_N = np.asarray(freq_N, np.float64)
  for n in range(ws.num_words):
    lo = ws.window_first_N[n]
    hi = n + 1 if ws.causal else ws.window_end_N[n]
    seen = freq_N[lo:hi]
    min_N[n], spread_N[n] = seen.min(), seen.max() > seen.min()
  return min_N, spread_N


def role_scores(
  ws: WordStats, freq_N, scores: clark_lib.SplitScores, arcs: clark_lib.Arcs, *, min_count: int, **bootstrap
):
  """{role: (score_LH, low_LH, high_LH)} for every ROLES entry, and {(l, h): syntactic relation info}."""
  sent_N = ws.word_sentence_N
  any_LHN = ws.argmax_any_LHN
  out = {}
  L, H = any_LHN.shape[:2]
  for name, field in (("argmax_prev", "token_prev"), ("argmax_next", "token_next")):  # tokens, summed per word
    hits_NG, there_N = ws.values[field].reshape(L * H, -1).T, ws.values[f"{field}_n"][0, 0]
    if there_N.any():
      keep = there_N > 0
      value = ratio_ci(hits_NG[keep], there_N[keep], sent_N[keep], **bootstrap)
      out[name] = tuple(x.reshape(L, H) for x in value)
    else:  # a decoder never sees the next token
      out[name] = tuple(np.zeros((L, H)) for _ in range(3))
  prev_wins = out["argmax_prev"][0] >= out["argmax_next"][0]
  out["positional"] = tuple(np.where(prev_wins, p, q) for p, q in zip(out["argmax_prev"], out["argmax_next"]))
  v = ws.values
  for name, field in (
    ("attend_prev", "prev"),
    ("attend_self", "self"),
    ("attend_next", "next"),
    ("attend_special", "special"),
    ("attend_punct", "punct"),
    ("entropy", "entropy"),
  ):
    out[name] = _mean_ci(v[field], sent_N, **bootstrap)
  out["delimiter"] = _mean_ci(v["special"] + v["punct"], sent_N, **bootstrap)
  uniform_N = np.log(np.maximum(ws.visible_words_N() + ws.visible_specials_N, 1))
  out["entropy_uniform"] = tuple(
    np.broadcast_to(x, (L, H)).copy() for x in _mean_ci(uniform_N[None, None], sent_N, **bootstrap)
  )
  entropy_NG = v["entropy"].reshape(L * H, -1).T
  out["entropy_ratio"] = tuple(x.reshape(L, H) for x in ratio_ci(entropy_NG, uniform_N, sent_N, **bootstrap))
  min_N, spread_N = rarest_visible(ws, freq_N)
  freq_N = np.asarray(freq_N, np.float64)
  rare_LHN = (any_LHN >= 0) & (freq_N[np.maximum(any_LHN, 0)] == min_N)
  if spread_N.any():
    out["rare_word"] = _mean_ci(rare_LHN, sent_N, keep_N=spread_N, **bootstrap)
  else:
    out["rare_word"] = tuple(np.full((L, H), np.nan) for _ in range(3))
  out["syntactic"], out["syntactic_margin"], info = _syntactic(scores, arcs, min_count, **bootstrap)
  return out, info


def _syntactic(scores: clark_lib.SplitScores, arcs: clark_lib.Arcs, min_count: int, **bootstrap):
  """Per head: the (relation, direction) with the largest accuracy − best-offset-baseline margin."""
  candidates = [key for key in scores.accuracy if key[0] != clark_lib.ALL and scores.n[key] >= max(min_count, 1)]
  L, H = next(iter(scores.accuracy.values())).shape
  nan = np.full((L, H), np.nan)
  if not candidates:
    return (nan, nan.copy(), nan.copy()), (nan.copy(), nan.copy(), nan.copy()), {}
  base = {key: scores.baseline[key][clark_lib.best_offset(scores.baseline[key])] for key in candidates}
  margin_CLH = np.stack([scores.accuracy[key] - base[key] for key in candidates])
  choice_LH = np.nan_to_num(margin_CLH, nan=-np.inf).argmax(0)
  acc, margin = (np.full((L, H), np.nan) for _ in range(2))
  low, high, mlow, mhigh = (np.full((L, H), np.nan) for _ in range(4))
  info = {}
  for c in np.unique(choice_LH):
    key = candidates[c]
    heads = np.argwhere(choice_LH == c)
    m = scores.mask[key]
    correct_NG = scores.correct[key[1]][heads[:, 0], heads[:, 1]][:, m].T
    value, lo, hi = ratio_ci(correct_NG, np.ones(int(m.sum())), arcs.sentence_N[m], **bootstrap)
    b = base[key]
    for g, (l, h) in enumerate(heads):
      acc[l, h], low[l, h], high[l, h] = value[g], lo[g], hi[g]
      margin[l, h], mlow[l, h], mhigh[l, h] = value[g] - b, lo[g] - b, hi[g] - b
      info[(int(l), int(h))] = dict(
        relation=key[0], direction=key[1], offset=clark_lib.best_offset(scores.baseline[key]), baseline=b
      )
  return (acc, low, high), (margin, mlow, mhigh), info


def role_rows(out: dict, *, model: str, step: int, data: str = "treebank") -> list[dict]:
  """Rows of attention/roles.csv."""
  rows = []
  for role in ROLES:
    score, low, high = out[role]
    for l, h in np.ndindex(*score.shape):
      rows.append(
        dict(
          model=model,
          step=step,
          data=data,
          layer=l,
          head=h,
          role=role,
          score=float(score[l, h]),
          ci_low=float(low[l, h]),
          ci_high=float(high[l, h]),
        )
      )
  return rows


def confirm_syntactic(info: dict, report: clark_lib.SplitScores) -> dict:
  """{(l, h): (accuracy, baseline)} on the report split for the relation, direction and offset each head's
  `syntactic` score chose on the selection split: the relation is the best of many candidates there, so its
  dev margin is biased upwards; the label is kept only when the margin holds on data the choice never saw."""
  out = {}
  for (l, h), i in info.items():
    key = (i["relation"], i["direction"])
    out[(l, h)] = (float(report.accuracy[key][l, h]), float(report.baseline[key][i["offset"]]))
  return out


def label_rows(
  out: dict,
  info: dict,
  roles_config,
  *,
  model: str,
  step: int,
  frequency_source: str,
  confirmed: dict | None = None,
  report_split: str = "",
) -> list[dict]:
  """Rows of attention/labels.csv: every label of `roles_config.labels` whose rule a head meets (the rule
  text names the score, its value and the threshold), or one `none` row for a head that meets none.

  `syntactic` is chosen on the selection split and, given `confirmed` (`confirm_syntactic` on `report_split`),
  kept only when the same relation, direction and offset still clear the margin there."""
  r = roles_config
  check_labels(r.labels)
  s = {role: out[role][0] for role in ROLES}
  rows = []
  L, H = s["positional"].shape
  for l, h in np.ndindex(L, H):
    got = []
    if "positional" in r.labels and s["positional"][l, h] >= r.positional_min:
      k = "-1" if s["argmax_prev"][l, h] >= s["argmax_next"][l, h] else "+1"
      got.append(
        (
          "positional",
          f"argmax at relative position {k} for {s['positional'][l, h]:.1%} of queries >= "
          f"{r.positional_min:.0%} (Voita et al. 2019)",
        )
      )
    if "delimiter" in r.labels and s["delimiter"][l, h] >= r.delimiter_min:
      got.append(
        (
          "delimiter",
          f"attention on special tokens {s['attend_special'][l, h]:.1%} + punctuation "
          f"{s['attend_punct'][l, h]:.1%} = {s['delimiter'][l, h]:.1%} >= {r.delimiter_min:.0%} (Clark et al. 2019 §3)",
        )
      )
    ratio = s["entropy_ratio"][l, h]
    if "broad" in r.labels and ratio >= r.broad_min:
      got.append(("broad", f"entropy / uniform entropy {ratio:.2f} >= {r.broad_min:.2f} (Clark et al. 2019 §3)"))
    if "focused" in r.labels and ratio <= r.focused_max:
      got.append(("focused", f"entropy / uniform entropy {ratio:.2f} <= {r.focused_max:.2f} (Clark et al. 2019 §3)"))
    if "rare_word" in r.labels and s["rare_word"][l, h] >= r.rare_word_min:
      got.append(
        (
          "rare_word",
          f"argmax on the least frequent visible word for {s['rare_word'][l, h]:.1%} of queries >= "
          f"{r.rare_word_min:.0%}, frequencies from {frequency_source} (Voita et al. 2019)",
        )
      )
    if "syntactic" in r.labels and s["syntactic_margin"][l, h] >= r.syntactic_margin_min:
      i = info[(l, h)]
      rule = (
        f"{i['relation']} {i['direction']} accuracy {s['syntactic'][l, h]:.3f} vs offset "
        f"{i['offset']:+d} baseline {i['baseline']:.3f}: margin >= {r.syntactic_margin_min:.2f}"
      )
      if confirmed is None:
        got.append(("syntactic", f"{rule} (Clark et al. 2019 §4.2; no report split to confirm on)"))
      else:
        acc, base = confirmed[(l, h)]
        if acc - base >= r.syntactic_margin_min:  # NaN (no such arcs there) fails
          got.append(
            (
              "syntactic",
              f"{rule} (chosen there); confirmed on {report_split}: accuracy {acc:.3f} vs baseline {base:.3f}, "
              f"margin {acc - base:.3f} (Clark et al. 2019 §4.2)",
            )
          )
    for label, rule in got or [("none", "no rule of roles.labels met")]:
      rows.append(dict(model=model, step=step, layer=l, head=h, label=label, rule=rule))
  return rows
