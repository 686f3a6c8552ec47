"""Attention in a notebook: `plot_attention` (matplotlib) and `attention_view` (an interactive HTML view).

Both read a pattern from a `headspec.capture` cache (`cache["pattern"]`, [L, B, H, T, S], padding cut by
the cache's `valid_BT`) or take an array ([H, T, S] for one layer, [T, S] for one head), with the token
texts of `headspec.to_str_tokens` (token ids as text when none are given). Rows are queries, columns the
keys they attend to, as in TransformerLens's `cache["pattern", l]` and CircuitsVis's attention views.

`attention_view` is one self-contained block of HTML and inline script (no network request, no package
beyond the standard library and numpy), so it renders offline in Jupyter, VS Code and a saved page: a
button per head (click to pick one, or "all" for their mean), the picked head's token × token map, and
hovering a token shades every token by how much the hovered one attends to it. It is hand-written
because CircuitsVis and bertviz fetch their scripts from the network when shown, and treescope draws
arrays, not a token-by-token attention map.
"""

from __future__ import annotations

import json
import uuid

import numpy as np

from headspec import arguments as check
from headspec.errors import UserError


def _pattern_HTS(pattern, layer, batch, what: str) -> np.ndarray:
  """The [H, T, S] weights of one layer and row: from a Cache, or an [H, T, S] / [T, S] array."""
  if hasattr(pattern, "activations") and hasattr(pattern, "valid_BT"):  # a headspec.model.capture.Cache
    cache = pattern
    if "pattern" not in cache:
      raise UserError(f"{what}: the cache holds no 'pattern'; capture it: headspec.capture(..., sites=['pattern'])")
    L, B = cache.cfg.num_layers, cache.valid_BT.shape[0]
    if not isinstance(layer, int | np.integer) or not -L <= layer < L:
      raise UserError(f"{what}: layer={layer!r}; the model has layers 0..{L - 1}")
    if not isinstance(batch, int | np.integer) or not -B <= batch < B:
      raise UserError(f"{what}: batch={batch!r}; the cache has rows 0..{B - 1}")
    n = int(cache.valid_BT[batch].sum())
    return np.asarray(cache["pattern", int(layer)][batch], np.float32)[:, :n, :n]
  array = np.asarray(pattern, np.float32)
  if array.ndim == 2:
    array = array[None]
  if array.ndim != 3 or array.shape[1] != array.shape[2] or not array.size:
    raise UserError(f"{what}: pattern of shape {np.shape(pattern)}; give a capture cache, [H, T, S] or [T, S] (T = S)")
  if not np.isfinite(array).all():
    raise UserError(f"{what}: the pattern holds NaN or infinite values")
  return array


def _tokens(tokens, n: int, what: str) -> list[str]:
  if tokens is None:
    return [str(i) for i in range(n)]
  tokens = [str(t) for t in tokens]
  if len(tokens) != n:
    raise UserError(f"{what}: {len(tokens)} tokens for a pattern over {n} positions; give one text per position")
  return tokens


def _heads(heads, H: int, what: str) -> list[int]:
  if heads is None:
    return list(range(H))
  heads = [heads] if isinstance(heads, int | np.integer) else list(heads)
  bad = [h for h in heads if not isinstance(h, int | np.integer) or not 0 <= h < H]
  if bad or not heads:
    raise UserError(f"{what}: heads={heads!r}; the layer has heads 0..{H - 1}")
  return [int(h) for h in heads]


@check.arguments(
  layer=check.integer(), heads=check.optional(lambda h: h), batch=check.integer(), max_tokens=check.integer(1)
)
def plot_attention(pattern, tokens=None, *, layer: int = 0, heads=None, batch: int = 0, max_tokens: int = 40):
  """A matplotlib Figure: one panel per head of `heads` (default all) with its query × key weights over
  the first `max_tokens` tokens, token texts on both axes; colour 0 (white) to each panel's max. Made
  outside pyplot (headspec/words/figures.py): shown once as a cell's value, and `.savefig(path)` writes it."""
  import matplotlib

  from headspec.attention.pictures import PLAIN_TEXT
  from headspec.words import figures

  what = "plot_attention"
  a_HTS = _pattern_HTS(pattern, layer, batch, what)
  texts = _tokens(tokens, a_HTS.shape[1], what)
  chosen = _heads(heads, a_HTS.shape[0], what)
  if not isinstance(max_tokens, int) or max_tokens < 1:
    raise UserError(f"{what}: max_tokens={max_tokens!r}; give a whole number >= 1")
  n = min(a_HTS.shape[1], max_tokens)
  cols = min(len(chosen), 4)
  rows = -(-len(chosen) // cols)
  side = max(2.5, 0.16 * n + 1.2)
  with matplotlib.rc_context(PLAIN_TEXT):
    fig, axes = figures.new_figure(rows, cols, figsize=(side * cols, side * rows), squeeze=False)
    for ax in axes.ravel()[len(chosen) :]:
      ax.set_axis_off()
    for ax, h in zip(axes.ravel(), chosen, strict=False):
      shown = a_HTS[h, :n, :n]
      ax.imshow(shown, cmap="Blues", vmin=0.0, vmax=max(float(shown.max()), 1e-6), interpolation="nearest")
      ax.set_xticks(range(n), texts[:n], rotation=90, fontsize=6)
      ax.set_yticks(range(n), texts[:n], fontsize=6)
      ax.set_title(f"L{layer}H{h}", fontsize=8)
    fig.supxlabel("key (attended to)", fontsize=8)
    fig.supylabel("query", fontsize=8)
    fig.tight_layout()
  return fig


class AttentionView:
  """The interactive view: `.html` (one self-contained block), shown inline by Jupyter (`_repr_html_`);
  `.save(path)` writes it as a page."""

  def __init__(self, html_text: str, heads: int, tokens: list[str]):
    self.html, self.heads, self.tokens = html_text, heads, tokens

  def _repr_html_(self) -> str:
    return self.html

  def __repr__(self) -> str:
    return f"AttentionView({self.heads} heads, {len(self.tokens)} tokens)"

  def save(self, path):
    from etils import epath

    from headspec.io import remote

    path = epath.Path(path)
    page = f"<!doctype html><meta charset='utf-8'><title>attention</title>{self.html}"
    remote.write_bytes_atomic(path, page.encode())  # whole or not at all (a full disk leaves no half page)
    return path


@check.arguments(layer=check.integer(), batch=check.integer(), decimals=check.integer(0))
def attention_view(pattern, tokens=None, *, layer: int = 0, batch: int = 0, decimals: int = 3) -> AttentionView:
  """An interactive view of one layer's heads (module docstring); weights rounded to `decimals`."""
  what = "attention_view"
  a_HTS = _pattern_HTS(pattern, layer, batch, what)
  texts = _tokens(tokens, a_HTS.shape[1], what)
  data = {"tokens": texts, "layer": int(layer), "attn": np.round(a_HTS, decimals).tolist()}
  payload = json.dumps(data, separators=(",", ":"))
  payload = payload.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")  # no </script>
  uid = "hsv" + uuid.uuid4().hex[:10]
  return AttentionView(_TEMPLATE.replace("@@ID@@", uid).replace("@@DATA@@", payload), a_HTS.shape[0], texts)


_TEMPLATE = """<div id="@@ID@@" class="hs-attn" style="font:12px sans-serif">
<style>
#@@ID@@ .hs-heads button{margin:1px;padding:2px 6px;border:1px solid #888;background:#fff;cursor:pointer}
#@@ID@@ .hs-heads button.on{background:#1f4e9c;color:#fff}
#@@ID@@ .hs-toks span{display:inline-block;margin:1px;padding:1px 3px;border-radius:3px;cursor:default;white-space:pre}
#@@ID@@ table{border-collapse:collapse;margin-top:6px}
#@@ID@@ td{width:14px;height:14px;padding:0;border:1px solid #eee}
#@@ID@@ th{font-weight:normal;font-size:10px;white-space:pre;padding:0 3px}
#@@ID@@ th.col{writing-mode:vertical-rl;transform:rotate(180deg);height:auto}
</style>
<div class="hs-heads"></div><div class="hs-note"></div><div class="hs-toks"></div><div class="hs-grid"></div>
<script type="application/json">@@DATA@@</script>
<script>
(function(){
const root=document.getElementById("@@ID@@");
const data=JSON.parse(root.querySelector('script[type="application/json"]').textContent);
const H=data.attn.length, T=data.tokens.length;
let head=0;
const weights=h=>h>=0?data.attn[h]:data.attn[0].map((row,i)=>row.map((_,j)=>
  data.attn.reduce((s,a)=>s+a[i][j],0)/H));
const blue=w=>"rgba(31,78,156,"+Math.min(1,Math.max(0,w)).toFixed(3)+")";
function buttons(){
  const box=root.querySelector(".hs-heads"); box.textContent="";
  for(let h=-1;h<H;h++){
    const b=document.createElement("button");
    b.textContent=h<0?"all (mean)":"L"+data.layer+"H"+h; b.dataset.head=h;
    if(h===head) b.className="on";
    b.onclick=()=>{head=h; draw();};
    box.appendChild(b);
  }
}
function draw(){
  buttons();
  const A=weights(head);
  root.querySelector(".hs-note").textContent=(head<0?"mean of the layer's heads":"layer "+data.layer+
    ", head "+head)+": rows are queries, columns the keys they attend to; hover a token to shade what it attends to";
  const toks=root.querySelector(".hs-toks"); toks.textContent="";
  const spans=data.tokens.map((t,i)=>{const s=document.createElement("span"); s.textContent=t;
    s.style.border="1px solid #ccc"; toks.appendChild(s); return s;});
  spans.forEach((s,i)=>{
    s.onmouseenter=()=>spans.forEach((o,j)=>{o.style.background=blue(A[i][j]);
      o.style.color=A[i][j]>0.5?"#fff":"#000";});
    s.onmouseleave=()=>spans.forEach(o=>{o.style.background="";o.style.color="";});
  });
  const grid=root.querySelector(".hs-grid"); grid.textContent="";
  const table=document.createElement("table"), top=table.insertRow();
  top.appendChild(document.createElement("th"));
  data.tokens.forEach(t=>{const th=document.createElement("th"); th.className="col"; th.textContent=t; top.appendChild(th);});
  let max=0; A.forEach(r=>r.forEach(w=>{if(w>max) max=w;}));
  A.forEach((row,i)=>{
    const tr=table.insertRow(), th=document.createElement("th"); th.textContent=data.tokens[i]; tr.appendChild(th);
    row.forEach((w,j)=>{const td=tr.insertCell(); td.style.background=blue(max>0?w/max:0);
      td.title=data.tokens[i]+" \\u2192 "+data.tokens[j]+": "+w;});
  });
  grid.appendChild(table);
}
draw();
})();
</script></div>"""
