"""`headspec.patch`, `attribution_patch`, `path_patch` and `circuit`: prompts in, patching tables and edge scores out.

Part of the notebook API (docs/api.md); `import headspec` reaches it lazily (headspec/__init__.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from headspec import arguments as check
from headspec.api.load import model_and_tokenizer, model_rule
from headspec.errors import UserError
from headspec.patching import edges as edges_lib
from headspec.patching import patch as patch_lib


def _is_id_row(value) -> bool:
  """Whether `value` is one prompt's token ids (a non-empty 1-D list, tuple or array of ints), not a list of prompts."""
  if isinstance(value, np.ndarray):
    return value.ndim == 1 and value.size > 0 and value.dtype.kind in "iu"
  return isinstance(value, list | tuple) and bool(value) and all(check.is_token_id(t) for t in value)


def _prompt_or_prompts(value) -> list:
  """The `clean`/`corrupt` rule of patch, attribution_patch, path_patch and circuit: one prompt (a text, or
  one list of token ids) is a list of one; else a list of prompts (check.prompts)."""
  if isinstance(value, str):
    return [check.text(value)]
  if _is_id_row(value):
    return [value]
  return check.prompts(value)


_PATCH_RULES = dict(
  model=model_rule,
  clean=_prompt_or_prompts,
  corrupt=_prompt_or_prompts,
  site=check.text,
  metric=check.metric,
  by_position=check.boolean,
  direction=check.text,
  tokenizer=check.optional(check.tokenizer),
)


def _answer_id(tokenizer, prompt, answer: str, where: str) -> int:
  """A text answer's token id (patching/patch.py answer_id), after the API's checks of the text."""

  if tokenizer is None:
    raise UserError(f"{where}={answer!r} is a text but no tokenizer was given; pass a token id or tokenizer=")
  try:
    check.text(answer)
  except check.Wrong as e:
    raise UserError(f"{where}{e.text}") from None
  return patch_lib.answer_id(tokenizer, prompt, answer, where)


def _answers(tokenizer, clean: list, answers):
  """answers with each text made its token id (`_answer_id`); one prompt's pair may be given bare,
  `(" Mary", " John")`. Anything else is left to patching/patch.prompts' checks."""
  bare = lambda a: isinstance(a, str) or check.is_token_id(a)
  if isinstance(answers, list | tuple) and len(clean) == 1 and len(answers) == 2 and all(map(bare, answers)):
    answers = [answers]
  if not isinstance(answers, list | tuple):
    return answers
  out = []
  for i, pair in enumerate(answers):
    if isinstance(pair, list | tuple) and any(isinstance(a, str) for a in pair):
      prompt = clean[i] if i < len(clean) else None
      pair = tuple(
        _answer_id(tokenizer, prompt, a, f"answers[{i}][{j}]") if isinstance(a, str) else a for j, a in enumerate(pair)
      )
    out.append(pair)
  return out


def _prompts(net, tokenizer, clean, corrupt, answers, metric):

  answers = _answers(tokenizer, clean, answers)
  return patch_lib.prompts(net.cfg, clean, corrupt, answers, metric, tokenizer, getattr(tokenizer, "pad_id", 0))


@check.arguments(
  **_PATCH_RULES,
  layers=check.optional(check.ints),
  heads=check.optional(check.ints),
  positions=check.optional(check.ints),
)
def patch(
  model,
  clean,
  corrupt,
  *,
  site: str,
  metric="logit_diff",
  answers=None,
  by_position: bool = True,
  direction: str = "denoising",
  layers=None,
  heads=None,
  positions=None,
  tokenizer=None,
):
  """Activation patching (docs/patching.md): a pandas DataFrame `layer, head, position, value`, value the
  metric when the corrupted run gets that site's clean activation there (direction='denoising', as
  TransformerLens; 'noising': the clean run gets the corrupted one). head −1 for per-layer sites, position
  −1 when by_position=False. `frame.attrs`: 'base' and 'source', the metric of the unpatched runs.

  model: `load(...)`'s result, a (model, tokenizer) pair or a Transformer. clean, corrupt: equal-length
  lists of texts (with a tokenizer) or of token-id lists, pairwise of equal token count; or one prompt each
  (a text or one token-id list). site: a name of headspec.model.sites.SITES. metric: a name of the patching
  registry (headspec/patching/core.py METRICS: 'logit_diff', the logit difference at each prompt's last
  token with answers one (correct, wrong) pair per prompt, each a token id or a text of one token (" Mary":
  the token it adds after the clean prompt, as `headspec circuit`'s pairs file; a bare pair for one
  prompt); 'prob', 'loss'; mean over prompts) or a callable on the float32 logits [B,T,V]
  (rows right-padded). layers, heads, positions: restrict the grid (default all). One compiled sweep does
  every patch. Bad input is one headspec.errors.UserError naming the value.
  """

  net, tokenizer = model_and_tokenizer(model, tokenizer)
  p = _prompts(net, tokenizer, clean, corrupt, answers, metric)
  return patch_lib.patch(net, p, site=site, metric=metric, by_position=by_position, direction=direction,
                         layers=layers, heads=heads, positions=positions)  # fmt: skip


@check.arguments(**_PATCH_RULES)
def attribution_patch(
  model, clean, corrupt, *, site: str, metric="logit_diff", answers=None, by_position=True, direction="denoising",
  tokenizer=None,
):  # fmt: skip
  """Attribution patching (Nanda 2023; Syed et al. 2023): `patch`'s table with value the first-order estimate
  of the metric's change, (a_source − a_base)·∂metric/∂a, for every head and position from one forward and
  one backward pass. `headspec.patching.patch.agreement(exact, estimate)` is its correlation with `patch`."""

  net, tokenizer = model_and_tokenizer(model, tokenizer)
  p = _prompts(net, tokenizer, clean, corrupt, answers, metric)
  return patch_lib.attribution(net, p, site=site, metric=metric, by_position=by_position, direction=direction)


@check.arguments(
  **{k: v for k, v in _PATCH_RULES.items() if k not in ("site", "by_position")},
  receivers=check.optional(check.pairs),
  receiver_site=check.text,
  senders=check.optional(check.pairs),
)
def path_patch(
  model, clean, corrupt, *, receivers=None, receiver_site="q", metric="logit_diff", answers=None, senders=None,
  direction="denoising", tokenizer=None,
):  # fmt: skip
  """Path patching (Wang et al. 2022): per sender head, the metric when only its path into the receivers'
  `receiver_site` ('q', 'k', 'v'; receivers (layer, head) pairs) or, with 'logits', its paths to the logits
  through no other head (directly and through the downstream MLPs, which recompute) carry the source
  activation. Columns `layer, head` (the sender), `position` −1, `value`."""

  net, tokenizer = model_and_tokenizer(model, tokenizer)
  p = _prompts(net, tokenizer, clean, corrupt, answers, metric)
  return patch_lib.path(net, p, metric=metric, receivers=receivers, receiver_site=receiver_site,
                        direction=direction, senders=senders)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Circuit:
  """What `circuit` returns. edges: one row per edge of the graph (docs/circuits.md), columns `upstream,
  downstream, input, upstream_layer, upstream_head, downstream_layer, downstream_head` and one score column
  per method. faithfulness: `method, edges, set, faithfulness`, the curve of the top-n circuits of each method
  and of random sets (method 'random'). clean_metric, corrupt_metric: the unpatched runs' metric."""

  edges: object  # pandas DataFrame
  faithfulness: object  # pandas DataFrame
  clean_metric: float
  corrupt_metric: float
  graph: object  # headspec.patching.edges.Graph

  def figure(self, method: str | None = None, top_n: int = 20):
    """The matplotlib Figure of the top_n edges by |score| of `method` (default the last one scored),
    drawn by layer as `headspec circuit` draws circuit/<task>_<method>_<model>_step<step>.png."""
    from headspec.patching import circuit as circuit_run

    methods = [c for c in self.edges.columns if c in CIRCUIT_METHODS]
    method = methods[-1] if method is None else method
    if method not in methods:
      raise UserError(f"Circuit.figure: method={method!r}; this circuit has {', '.join(methods)}")
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 1:
      raise UserError(f"Circuit.figure: top_n={top_n!r} must be an int >= 1")
    return circuit_run.figure(self.graph, self.edges[method].to_numpy(), top_n=top_n, title=f"top {top_n} by {method}")


CIRCUIT_METHODS = ("eap", "eap_ig", "exact", "eap_denoising", "eap_ig_denoising", "exact_denoising")


@check.arguments(
  **{k: v for k, v in _PATCH_RULES.items() if k not in ("site", "by_position", "direction")},
  methods=check.texts,
  steps=check.integer(1),
  sizes=check.ints,
  random_sets=check.integer(0),
  seed=check.seed,
  batch_size=check.optional(check.integer(1)),
)
def circuit(
  model, clean, corrupt, *, answers=None, methods=("eap", "eap_ig"), steps: int = 5, metric="logit_diff",
  sizes=(5, 10, 20, 40), random_sets: int = 3, seed: int = 0, batch_size=None, tokenizer=None,
):  # fmt: skip
  """Edge attribution patching and circuit faithfulness (docs/circuits.md): every edge's score by each of
  `methods` ('eap', Syed et al. 2023; 'eap_ig' with `steps` interpolation points, Hanna et al. 2024; 'exact'
  edge patching, one forward per edge; all noising, the papers' convention: score ≈ m(clean, edge corrupted)
  − m(clean); 'eap_denoising', 'eap_ig_denoising', 'exact_denoising' the reverse), and the faithfulness
  curve of the top-n circuits for n in `sizes`, with `random_sets` random edge sets of each size. Returns a `Circuit` (its `.figure()` draws the graph).
  model, clean, corrupt, answers, metric, tokenizer as in `patch`. As `headspec circuit` computes
  circuit/edges.csv and circuit/faithfulness.csv; bad input is one headspec.errors.UserError."""

  methods = [m.replace("-", "_") for m in methods]  # 'eap-ig' as the paper spells it
  bad = [m for m in methods if m not in CIRCUIT_METHODS]
  if bad or not methods:
    raise UserError(f"circuit: methods={methods!r}; name one or more of {', '.join(CIRCUIT_METHODS)}")
  net, tokenizer = model_and_tokenizer(model, tokenizer)
  g = edges_lib.graph(net.cfg)  # refuses a model whose stream is not a sum of its components' outputs
  if not sizes or min(sizes) < 1 or max(sizes) > g.E:
    raise UserError(f"circuit: sizes={sizes!r}; give edge counts in 1..{g.E} (an empty circuit has nothing)")
  p = _prompts(net, tokenizer, clean, corrupt, answers, metric)
  scores = {}
  for method in methods:
    if method.startswith("exact"):
      scores[method], clean_m, corrupt_m = edges_lib.exact(net, p, metric=metric, batch_size=batch_size,
                                                           direction=edges_lib.direction_of(method))  # fmt: skip
    else:
      scores[method], clean_m, corrupt_m = edges_lib.scores(net, p, method=method, steps=steps, metric=metric,
                                                            batch_size=batch_size)  # fmt: skip
  curve = edges_lib.curve(net, p, scores, sizes, random_sets=random_sets, seed=seed, metric=metric,
                          batch_size=batch_size)  # fmt: skip
  return Circuit(edges_lib.edge_frame(g, scores), curve, clean_m, corrupt_m, g)
