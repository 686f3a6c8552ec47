"""The atlas's feature pages: one static, self-contained HTML page per live SAE feature of the SAEs on the
head cards (per site, layer and SAE, the primary model's latest step), written beside atlas.html as
RUN/atlas_features/<model>_step<step>_<site><layer>_<sae>/f<feature>.html (`sae_data.feature_page`).

A page joins what `headspec sae` wrote about the feature (docs/sae.md, docs/outputs.md): its numbers
(features.csv), its top contexts with the word marked (contexts.csv), the histogram of its nonzero
activations on the evaluation tokens (histograms.csv), its decoder direction's share a_fh in every head
(shares.csv; Kissane et al. 2024), its treebank label profile with counts (labels.csv) and its direct-path
logit effect (logits.csv: W_dec[f] through W_O and the unembedding, headspec/sae/feature_data.py). It links
back to the cards of the heads carrying it (atlas.html#L<layer>H<head>, which opens that card) and to the
SAE's previous and next live feature; the cards link to it.

Pages are HTML and inline CSS only, built here with every table text escaped (no script, no data blob): the
same Content-Security-Policy as the atlas forbids any fetch, and the histogram is inline SVG. Pure Python:
no JAX, no NumPy.
"""

from __future__ import annotations

import collections
import html

from headspec.atlas.grid import RunData, feature_heads, num
from headspec.atlas.page import PAGE_NAME, write_page
from headspec.atlas.sae_data import SAE_LABEL_SETS, feature_page, sae_card_keys, sae_key, sae_quality
from headspec.io import remote, tables

PAGE_LABELS = 15  # labels per label set on a page, most frequent first
LOGIT_NOTE = (
  "Direct path: the feature's decoder direction W_dec[f] (per unit of activation) through each head's W_O into "
  "the residual stream, summed, then the final norm's gain (centred for LayerNorm; its scale left out) and the "
  "unembedding W_U. Later layers, MLPs and biases are left out, so this is what the feature writes straight to "
  "the logits, not its whole effect (direct logit attribution, Elhage et al. 2021)."
)
NO_LOGITS = (
  "No logit effect in sae/logits.csv for this SAE. `headspec sae` computes it for decoders with a trained LM "
  "head, on z or a residual-stream site: an encoder's masked-LM head (dense, activation, LayerNorm before W_U) "
  "is not linear, so a direction has no fixed effect on the vocabulary, and a model without a trained head "
  "predicts nothing. SAEs written before the table existed have none either: rerun headspec sae."
)


def _context(text: str) -> str:
  """A context 'a [[word]] b' as HTML with the word in <mark> (everything escaped)."""
  before, sep, rest = text.partition("[[")
  word, sep2, after = rest.partition("]]")
  if not sep or not sep2:
    return html.escape(text)
  return f"{html.escape(before)}<mark>{html.escape(word)}</mark>{html.escape(after)}"


def _fmt(value, digits: int = 3) -> str:
  if value is None:
    return "–"
  if isinstance(value, int):
    return str(value)
  size = abs(value)
  return f"{value:.0f}" if size >= 100 else f"{value:.{digits}f}" if size >= 1e-3 or size == 0 else f"{value:.1e}"


def features_data(workdir) -> list[dict]:
  """One dict per feature page of the run (module docstring): `path` (relative to the run) and what it shows."""
  workdir = remote.run_path(workdir)
  if not tables.path_of(workdir, tables.SAE_FEATURES).exists():
    return []  # no SAE: the head tables are not read a second time
  run = RunData(workdir, pages=True, quiet=True)  # atlas_data has warned of bad rows
  feature_rows = run.rows[tables.SAE_FEATURES.path]
  keys = sae_card_keys(run, feature_rows)
  if not keys:
    return []
  mine = lambda table: [r for r in run.aux(table) if sae_key(r) in keys]
  by_feature = lambda: collections.defaultdict(list)
  quality, contexts, labels, bins, shares, logits = collections.defaultdict(dict), *(by_feature() for _ in range(5))
  for r in mine(tables.SAE_METRICS):
    quality[sae_key(r)][r["metric"]] = num(r["value"])
  for r in mine(tables.SAE_CONTEXTS):
    contexts[(sae_key(r), int(r["feature"]))].append(
      (int(r["rank"]), r["context"], num(r["activation"]), r["split"], int(r["sentence"]), int(r["word_index"]))
    )
  for r in mine(tables.SAE_LABELS):
    labels[(sae_key(r), int(r["feature"]))].append((r["label_set"], -int(r["count"]), r["label"], num(r["fraction"])))
  run.quiet = False  # the per-feature tables only the pages read: their bad rows are warned of here
  for r in mine(tables.SAE_HISTOGRAMS):
    bins[(sae_key(r), int(r["feature"]))].append((int(r["bin"]), num(r["low"]), num(r["high"]), int(r["count"])))
  for r in mine(tables.SAE_SHARES):
    shares[(sae_key(r), int(r["feature"]))].append((int(r["head"]), num(r["share"])))
  has_logits = set()
  for r in mine(tables.SAE_LOGITS):
    has_logits.add(sae_key(r))
    logits[(sae_key(r), int(r["feature"]))].append(
      (r["direction"], int(r["rank"]), r["token"], num(r["value"]), int(r["token_id"]))
    )
  live = collections.defaultdict(list)  # key -> [feature row], by feature
  for r in feature_rows:
    if sae_key(r) in keys and (num(r["firing_rate"]) or 0.0) > 0:
      live[sae_key(r)].append(r)
  pages = []
  for key in sorted(live):
    rows = sorted(live[key], key=lambda r: int(r["feature"]))
    for i, r in enumerate(rows):
      feature = int(r["feature"])
      path = feature_page(key, feature)
      up = "../" * path.count("/")  # from the page back to the run directory
      carried = feature_heads(r["heads"]) or []
      profile = collections.defaultdict(list)
      for label_set, count, label, fraction in sorted(labels[(key, feature)]):
        profile[label_set].append([label, -count, fraction])
      sets = [s for s in SAE_LABEL_SETS if r[s] or s in profile] + sorted(set(profile) - set(SAE_LABEL_SETS))
      histogram = [[lo, hi, n] for _, lo, hi, n in sorted(bins[(key, feature)]) if lo is not None and hi is not None]
      by_direction = collections.defaultdict(list)
      for direction, _, token, value, token_id in sorted(logits[(key, feature)], key=lambda x: x[:2]):
        by_direction[direction].append([token, value, token_id])
      pages.append(
        {
          "path": path,
          "run": workdir.name,
          "model": key[0],
          "step": key[1],
          "site": key[2],
          "layer": key[3],
          "sae": key[4],
          "feature": feature,
          "quality": sae_quality(quality.get(key)),
          "eval_tokens": quality.get(key, {}).get("eval_tokens"),
          "firing_rate": num(r["firing_rate"]),
          "mean_activation": num(r["mean_activation"]),
          "entropy_bits": num(r["entropy_bits"]),
          "treebank_fires": int(r["treebank_fires"]),
          "top_head": int(r["top_head"]),
          "heads": carried,
          "shares": [list(x) for x in sorted(shares[(key, feature)], key=lambda x: (-(x[1] or 0.0), x[0]))],
          "histogram": histogram,
          "active": sum(count for _, _, count in histogram) if histogram else None,
          "contexts": [list(c[1:]) for c in sorted(contexts[(key, feature)])],
          "labels": [
            {"set": s, "best": r.get(s, ""), "selectivity": num(r.get(f"{s}_selectivity")), "rows": profile[s]}
            for s in sets
          ],
          "logits": dict(by_direction) if key in has_logits else None,
          "atlas": f"{up}{PAGE_NAME}",
          "head_links": [[h, f"{up}{PAGE_NAME}#L{key[3]}H{h}"] for h in carried],
          "previous": feature_page(key, int(rows[i - 1]["feature"])).rsplit("/", 1)[1] if i else None,
          "next": feature_page(key, int(rows[i + 1]["feature"])).rsplit("/", 1)[1] if i + 1 < len(rows) else None,
        }
      )
  return pages


def _histogram_svg(histogram: list, active) -> str:
  """Inline SVG bars of the non-empty bins [low, high, count] over [lowest low, highest high]."""
  W, H, P, B = 520, 150, 28, 18  # size, left padding, bottom band for the axis labels
  lo, hi = histogram[0][0], histogram[-1][1]
  most = max(c for _, _, c in histogram)
  x = lambda v: P + (W - P - 8) * ((v - lo) / (hi - lo) if hi > lo else 0.5)
  bars = []
  for low, high, count in histogram:
    left, right = x(low), x(high) if hi > lo else x(low) + 8
    h = (H - B - 6) * count / most
    bars.append(
      f'<rect x="{left:.1f}" y="{H - B - h:.1f}" width="{max(right - left - 1, 1):.1f}" height="{h:.1f}" '
      f'fill="#1a73e8">'
      f"<title>{_fmt(low)} – {_fmt(high)}: {count}</title></rect>"
    )
  label = f"histogram of {active} nonzero activations from {_fmt(lo)} to {_fmt(hi)}"
  axis = (
    f'<line x1="{P}" y1="{H - B}" x2="{W - 8}" y2="{H - B}" stroke="#5f6368"/>'
    f'<text x="{P}" y="{H - 4}" font-size="11">{_fmt(lo)}</text>'
    f'<text x="{W - 8}" y="{H - 4}" font-size="11" text-anchor="end">{_fmt(hi)}</text>'
    f'<text x="{P - 4}" y="12" font-size="11" text-anchor="end">{most}</text>'
    f'<text x="{P - 4}" y="{H - B}" font-size="11" text-anchor="end">0</text>'
  )
  svg = f'<svg class="histogram" width="{W}" height="{H}" role="img" aria-label="{html.escape(label)}">'
  return f"{svg}{axis}{''.join(bars)}</svg>"


def _table(head: list[str], rows: list[list[str]], cls: str = "") -> str:
  """An HTML table of already-escaped cells."""
  th = "".join(f"<th>{h}</th>" for h in head)
  body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
  return f'<table class="{cls}"><tr>{th}</tr>{body}</table>'


def render_feature(page: dict) -> str:
  """A feature page's HTML (module docstring); every table text escaped."""
  e = html.escape
  f, where = page["feature"], f"{page['sae']} on {page['site']} of layer {page['layer']}"
  title = f"headspec atlas — {page['run']} · feature f{f}"
  nav = [f'<a href="{e(page["atlas"])}">← atlas</a>']
  nav += [f'<a class="head-link" href="{e(href)}">head L{page["layer"]}H{h}</a>' for h, href in page["head_links"]]
  if page["previous"]:
    nav.append(f'<a href="{e(page["previous"])}">← previous feature</a>')
  if page["next"]:
    nav.append(f'<a href="{e(page["next"])}">next feature →</a>')
  facts = [
    f"firing rate {_fmt(page['firing_rate'])}"
    + (
      f" ({page['active']} of {page['eval_tokens']:.0f} evaluation tokens)"
      if page["active"] and page["eval_tokens"]
      else ""
    ),
    f"mean activation where it fires {_fmt(page['mean_activation'])}",
    f"head entropy {_fmt(page['entropy_bits'])} bits" if page["entropy_bits"] is not None else None,
    f"fires on {page['treebank_fires']} treebank words" if page["treebank_fires"] >= 0 else None,
    page["quality"] or None,
  ]
  parts = [
    f"<h1>{e(title)}</h1>",
    f'<p class="muted">{e(page["model"])}, step {page["step"]}: {e(where)}.</p>',
    f"<nav>{' · '.join(nav)}</nav>",
    f"<p>{e('; '.join(x for x in facts if x))}.</p>",
    "<h2>Top contexts (treebank words where it fires most)</h2>",
  ]
  if page["contexts"]:
    rows = [[e(_fmt(a)), _context(c), e(f"{split} sentence {s}, word {w}")] for c, a, split, s, w in page["contexts"]]
    parts.append(_table(["activation", "context", "where"], rows, "contexts"))
  else:
    parts.append('<p class="muted">No contexts (sae/contexts.csv: run headspec sae with a treebank).</p>')
  parts.append("<h2>Activation histogram (nonzero activations on the evaluation tokens)</h2>")
  if page["histogram"]:
    parts.append(_histogram_svg(page["histogram"], page["active"]))
    parts.append(
      f'<p class="muted">{page["active"]} tokens in all; equal bins between its smallest and largest nonzero '
      "activation (empty bins left out of sae/histograms.csv).</p>"
    )
  else:
    parts.append('<p class="muted">No histogram (sae/histograms.csv: rerun headspec sae).</p>')
  parts.append("<h2>Head shares a_fh of its decoder direction (Kissane et al. 2024)</h2>")
  if page["shares"]:
    rows = [
      [f'<a href="{e(page["atlas"])}#L{page["layer"]}H{h}">L{page["layer"]}H{h}</a>', e(_fmt(s)),
       f'<span class="bar" style="width:{200 * (s or 0):.0f}px"></span>']
      for h, s in page["shares"]
    ]  # fmt: skip
    parts.append(_table(["head", "share", ""], rows, "shares"))
    parts.append(
      f'<p class="muted">Carried by {", ".join(f"h{h}" for h in page["heads"]) or "no head"} '
      "(share ≥ analysis.carry_min).</p>"
    )
  else:
    parts.append(
      '<p class="muted">No head shares (a site without heads, or sae/shares.csv missing: rerun headspec sae).</p>'
    )
  parts.append("<h2>Treebank label profile (words where it fires)</h2>")
  if any(x["rows"] for x in page["labels"]):
    for x in page["labels"]:
      best = f" — most selective: {e(x['best'])} ({_fmt(x['selectivity'])})" if x["best"] else ""
      parts.append(f"<h3>{e(x['set'].replace('_', ' '))}{best}</h3>")
      rows = [[e(label), str(count), e(_fmt(fraction))] for label, count, fraction in x["rows"][:PAGE_LABELS]]
      parts.append(_table(["label", "count", "fraction"], rows, "labels"))
      if len(x["rows"]) > PAGE_LABELS:
        parts.append(f'<p class="muted">{len(x["rows"]) - PAGE_LABELS} more labels in sae/labels.csv.</p>')
  else:
    parts.append('<p class="muted">No label profile (sae/labels.csv: run headspec sae with a treebank).</p>')
  parts.append("<h2>Logit effect (direct path)</h2>")
  if page["logits"]:
    parts.append(f'<p class="muted">{e(LOGIT_NOTE)}</p>')
    columns = []
    for direction in ("promoted", "suppressed"):
      rows = [
        [f'<code class="token">{e(t)}</code>', e(f"{v:+.3f}" if v is not None else "–")]
        for t, v, _ in page["logits"].get(direction, [])
      ]
      columns.append(
        f"<div><h3>{direction}</h3>{_table(['token', 'logit per unit'], rows, 'logits-' + direction)}</div>"
      )
    parts.append(f'<div class="columns">{"".join(columns)}</div>')
  else:
    parts.append(f'<p class="muted logit-note">{e(NO_LOGITS)}</p>')
  return _TEMPLATE.replace("@@TITLE@@", e(title)).replace("@@CSS@@", _CSS).replace("@@BODY@@", "\n".join(parts))


def write_feature_pages(workdir) -> list:
  """Writes every feature page of the run (`features_data`), each atomically; returns their paths."""
  root = remote.run_path(workdir)
  return [write_page(root / page["path"], render_feature(page)) for page in features_data(workdir)]


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; style-src 'unsafe-inline'">
<link rel="icon" href="data:,">
<title>@@TITLE@@</title>
<style>@@CSS@@</style>
</head>
<body>
@@BODY@@
<footer>Written by <code>headspec atlas</code>. Opens offline: no script, every style in this file.</footer>
</body>
</html>
"""

_CSS = """
body { font: 14px/1.4 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: #1d1d1f; margin: 0 24px 24px;
  max-width: 1100px; }
h1 { font-size: 20px; margin: 16px 0 4px; }
h2 { font-size: 16px; margin: 18px 0 6px; }
h3 { font-size: 14px; margin: 10px 0 4px; }
.muted, footer { color: #5f6368; }
nav a { color: #1a73e8; }
table { border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; }
th, td { text-align: left; padding: 2px 10px 2px 0; border-bottom: 1px solid #eceff1; vertical-align: top; }
mark { background: #fde68a; padding: 0 1px; }
.bar { display: inline-block; height: 10px; background: #1a73e8; }
code.token { white-space: pre; background: #f1f3f4; border: 1px solid #dadce0; padding: 0 3px; }
.columns { display: flex; gap: 40px; flex-wrap: wrap; }
svg.histogram { border: 1px solid #d0d4da; background: #fafafa; }
footer { margin-top: 24px; }
"""
