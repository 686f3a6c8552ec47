"""The study's summary.md: its sections, drawn from the study tables."""

from __future__ import annotations

from headspec.study.collect import DROP_FORMED
from headspec.study.statistics import (
  CAUSAL_MEASURES,
  INDUCTION_PRIMARY,
  _by_condition,
  _formation_summary,
  _label_min,
  _label_steps,
  induction_tests,
)


def _markdown(frame, floats: str = ".3f") -> str:
  cols = list(frame.columns)
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  for _, r in frame.iterrows():
    cells = [format(v, floats) if isinstance(v, float) else str(v) for v in r]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


STATISTICS = """## Statistics: families of tests and their corrections
- rankings: per run, one family of every task × measure × {all heads, within layer} permutation test,
  Holm-adjusted (Holm 1979; p_holm, within_layer_p_holm).
- selective_heads, above_init_heads, layers and formation: one CI comparison per head and step, uncorrected:
  counts and first crossings to follow over training, not tests of a head.
- causal: one paired CI per run, task and k, uncorrected; mde is its power, not an equivalence bound.
  causal_seeds: over seeds, a one-sample t test per condition, task, k and metric, Holm within condition ×
  metric (every task × k); tost_p tests |mean| < tost_margin (Schuirmann 1987), for "no more than" statements,
  and tost_p_holm is its Holm adjustment within the same family.
  probe_accuracy_vs_random is decodability after ablation (a refitted probe), not use; loss_delta_vs_random
  is the LM loss.
- induction: the causal check of the top-k induction heads, one paired CI per run, kept step, k and ablation,
  uncorrected (a curve over training to read, not a family of tests); mde is its power. The repeat drop's
  formation step: its CI 1 nat above step 0's; the label steps: the best head's score at 0.4, no CI.
  formation_tests: per pair of conditions, Fisher's exact test of the seeds formed and Mann–Whitney U of the
  steps (never = after every step), Holm within each quantity and test over the pairs.
- conditions: condition − baseline per measure, paired t test by seed (Welch where fewer than 2 seeds are
  shared), Holm within each family: condition × {specialization (task × 2 measures), diversity (every
  metric), probe_accuracy_vs_random (task × k), loss_delta_vs_random (task × k)}.
- t_low, t_high in the per-condition tables: a 95% t interval over seeds (training, probe fit and control
  draw vary with the seed), one per row, uncorrected; NaN with one seed."""


def _emergence_sections(frames: dict) -> list[str]:
  """summary.md: training loss and the best head's selectivity over training, per condition."""
  em = frames["emergence"]
  last = em[em["step"] == em.groupby("run")["step"].transform("max")]
  tr = frames["training"]
  final = tr.dropna(subset=["eval_loss"]).groupby("run").tail(1) if len(tr) else tr
  parts = [
    "Every number below is measured in this experiment's runs; heads are chosen on dev and reported on test.",
    "Per condition: the mean over seeds, its 95% t interval over seeds (t_low, t_high; NaN with one seed), the "
    "range (min, max) and the number of seeds.",
    "",
    *(
      ["## Last validation loss (nats/token)", _markdown(final[["run", "condition", "seed", "step", "eval_loss"]]), ""]
      if len(final)
      else []
    ),
    "## Best head's test selectivity by step",
    _markdown(_by_condition(em, ["task", "step"], "selectivity")),
    "",
    "## Best head minus median head (test selectivity), by step: how far one head stands out",
    _markdown(_by_condition(em.assign(gap=em["selectivity"] - em["median_selectivity"]), ["task", "step"], "gap")),
    "",
    "## Heads with test selectivity CI above 0, by step",
    _markdown(_by_condition(em, ["task", "step"], "selective_heads"), ".1f"),
    "",
    "## Heads whose selectivity CI lies above the best head of the untrained model (step 0), by step",
    _markdown(_by_condition(em, ["task", "step"], "above_init_heads"), ".1f"),
    "",
    "## At the last step: best head vs best residual stream (test selectivity)",
    _markdown(
      last[
        ["run", "task", "best_layer", "best_head", "selectivity", "ci_low", "ci_high"]
        + [c for c in ("residual_layer", "residual_selectivity") if c in last]
      ]
    ),
  ]
  return parts


def _formation_sections(frames: dict) -> list[str]:
  """summary.md: when each layer's heads form, and the regularizers against baseline."""
  parts = []
  if len(frames["layers"]):
    parts += ["", "## First step with a head above step 0's best, per layer", _markdown(frames["layers"])]
  if len(frames["formation"]):
    parts += [
      "",
      "## Formation step per head (its CI above step 0's best head), median over a layer's heads, over seeds",
      "Per seed the median over the layer's heads (a head that never formed counts as never: NaN when half or "
      "more never did); median, min and max of those over seeds; seeds_formed: seeds with any head formed. "
      "probe: test selectivity; role: score on repeated random sequences; loss: the repeat drop of the whole "
      f"model (layer −1), formed when its CI lies {DROP_FORMED:g} nat above step 0's. Per head: "
      "study/formation.csv.",
      _markdown(_formation_summary(frames["formation"]), ".0f"),
    ]
  if len(frames["conditions"]):
    parts += [
      "",
      "## Regularizers vs baseline at the last step: condition − baseline, tested",
      "paired_t: a t test over the seeds both conditions ran (mean, 95% t interval); welch_t: Welch's t test where "
      "they share fewer than 2 seeds. p_holm: Holm within the family (condition:specialization, condition:diversity, "
      'condition:probe_accuracy_vs_random, condition:loss_delta_vs_random; docs/study.md "Statistics"). '
      "selectivity: the best head's test selectivity; best_minus_median: best − median head; rows without a task: "
      "the diversity metrics (mean over layers and head pairs); rows with k: the causal test's selective − random "
      "(probe_accuracy_vs_random: decodability after ablation; loss_delta_vs_random: the LM loss). NaN: one seed.",
      _markdown(frames["conditions"], ".4f"),
    ]
  return parts


def _structural_sections(frames: dict) -> list[str]:
  """summary.md: Hewitt & Manning's structural probes, by step and at the last step. The by-step value is the
  head with the best DEV VALUE (`choice` best_value): a raw UUAS/DSpr. compared across steps and with the
  linear baseline must come from the head chosen for that value; the most selective head's (value − control)
  is beside it at the last step."""
  parts = []
  if len(frames["structural"]):
    st = frames["structural"]
    st_last = st[st["step"] == st.groupby("run")["step"].transform("max")]
    parts += [
      "",
      "## Structural probes (Hewitt & Manning 2019): the best head's test value by step",
      "UUAS and DSpr. (distance probe), root accuracy and NSpr. (depth probe) of the head with the highest dev "
      "value (choice best_value; study/structural.csv also has the most selective head, choice most_selective).",
      _markdown(
        _by_condition(st[(st["source"] == "head") & (st["choice"] == "best_value")], ["metric", "step"], "value")
      ),  # fmt: skip
      "",
      "## Structural probes: the most selective head's test selectivity (value − control-tree value) by step",
      _markdown(
        _by_condition(
          st[(st["source"] == "head") & (st["choice"] == "most_selective")], ["metric", "step"], "selectivity"
        )
      ),  # fmt: skip
      "",
      "## At the last step: structural probes, both choices, head and residual stream (test; linear: H&M's baseline)",
      "best_value: the highest dev value (compare its value with linear); most_selective: the highest dev "
      "value − control (compare its selectivity).",
      _markdown(
        st_last[
          ["run", "metric", "source", "choice", "layer", "head", "value", "ci_low", "ci_high", "control_value"]
          + ["selectivity", "linear"]
        ]
      ),
    ]
  return parts


def _induction_section(frames: dict) -> list[str]:
  """summary.md's induction section: the repeat drop, ICL score and the causal checks (k = 1) by step,
  the check's power and the first step a head reaches the role's label."""
  ind = frames["induction"]
  shown = [
    "repeat_drop",
    "icl_score",
    "loss_delta_second_vs_random (zero)",
    "loss_delta_second_vs_unlabelled (zero)",
  ]
  ind = ind[ind["measure"].isin(shown) & (ind["k"].isna() | (ind["k"] == 1))]
  parts = [
    "",
    "## Induction by step: the in-context loss drop and the causal check",
    "repeat_drop: loss on the first copy of repeated random sequences − on the second (nats; > 0: the model "
    "copies from context); icl_score: loss at a late − an early token of the text (< 0: context helps); "
    "loss_delta_second_vs_random (zero), k = 1: the second copy's loss rise when the top induction head is "
    "zero-ablated, minus when a layer-matched random head is; loss_delta_second_vs_unlabelled (zero): the "
    "same minus a random head of any layer that no previous-token, duplicate-token or induction label names "
    "(the control where the top head's layer holds other induction heads, which the layer-matched draw then "
    "picks). Every k, mean ablation and CIs: "
    "study/induction.csv; the repeat drop's formation step: the formation table (source loss).",
    _markdown(_by_condition(ind, ["measure", "step"], "value")),
  ]
  if ind["mde"].notna().any():
    parts += [
      "",
      "Power of the causal check (k = 1, zero ablation): the median over runs and steps of mde, the smallest "
      f"excess it detects at 80% power: {ind['mde'].median():.3f} nats.",
    ]
  tests = induction_tests(frames["induction"], INDUCTION_PRIMARY)
  if tests:
    import pandas as pd

    family = (
      "Holm over every cell of the condition (both ablations × controls × k: no primary ablation declared)"
      if INDUCTION_PRIMARY is None
      else f"Holm over the primary ablation's ({INDUCTION_PRIMARY}) cells; a secondary cell over every cell"
    )
    parts += [
      "",
      "### The causal check over seeds at the last step (one-sample t test of 0)",
      f"Top-k induction heads minus k random heads (layer-matched or unlabelled), second copy's loss; {family} "
      "(headspec/study/statistics.py induction_tests, INDUCTION_PRIMARY).",
      _markdown(pd.DataFrame(tests), ".4g"),
    ]
  if len(frames.get("formation_tests", ())):
    parts += [
      "",
      "### Conditions compared: how many seeds formed (Fisher's exact test) and when (Mann–Whitney U)",
      "label/ROLE: the first kept step a run's best head reaches the label; loss/repeat_drop: the repeat drop's "
      "formation step. A run that never formed counts as later than every step in the Mann–Whitney test. Holm "
      "within each quantity and test over the condition pairs.",
      _markdown(frames["formation_tests"], ".4g"),
    ]
  if len(frames["roles"]):
    parts += [
      "",
      f"### First kept step with a head at or above {_label_min()} (the role's label), over seeds",
      "median, min and max over the seeds that reached it; seeds_reached of seeds. The per-head formation "
      "steps by the CI rule (above step 0's best head) are in the formation table.",
      _markdown(_label_steps(frames["roles"]), ".0f"),
    ]
  return parts


def _sae_section(frames: dict) -> list[str]:
  """summary.md: the SAEs' head specialization by step and its rank correlation with probe selectivity."""
  sae = frames["sae"]
  levels = sae[sae["task"].fillna("") == ""]
  rho = sae[sae["task"].fillna("") != ""]
  parts = [
    "",
    "## Heads through SAE features, by step (sparse autoencoders on each layer's z, docs/sae.md)",
    "specialization_mean / _max: S_h over the heads (1/H: every feature a head writes spread evenly over the "
    "heads; 1: all its own); exclusive_features: features with one head's decoder share ≥ exclusive_min, summed "
    "over heads; heads_with_exclusive: heads with at least one.",
    _markdown(_by_condition(levels, ["sae", "measure", "step"], "value")),
  ]
  if len(rho):
    parts += [
      "",
      "### Does feature specialization go with probe selectivity? Spearman ρ over heads, by step",
      "spearman_selectivity: S_h against the head's test selectivity at that step; within_layer_spearman: the "
      "mean per-layer ρ; spearman_change: S_h's change since the first probed step against the selectivity's "
      "(> 0: specialization rose where selectivity did); spearman_z_rms: S_h against the head's z RMS on the same "
      "heads (a large |ρ|: S_h follows the heads' output scale, which could drive spearman_selectivity). Per run p "
      "and Holm: "
      "study/sae.csv.",
      _markdown(_by_condition(rho, ["sae", "measure", "task", "step"], "value")),
    ]
  return parts


def _later_sections(frames: dict) -> list[str]:
  """summary.md: diversity, roles, the causal test, rankings and the reference models."""
  parts = []
  if len(frames["diversity"]):
    d = frames["diversity"]
    steps = sorted(set(d["step"]))
    parts += [
      "",
      "## Diversity (mean over layers and head pairs), first and last step",
      _markdown(_by_condition(d[d["step"].isin([steps[0], steps[-1]])], ["metric", "step"], "value"), ".4f"),
    ]
  if len(frames["roles"]):
    parts += [
      "",
      "## Best previous-token / duplicate-token / induction score by step",
      _markdown(_by_condition(frames["roles"], ["role", "step"], "score")),
      "",
      "### Best − median head's score, by step (whether one head carries the role)",
      _markdown(
        _by_condition(
          frames["roles"].assign(gap=frames["roles"]["score"] - frames["roles"]["median_score"]),
          ["role", "step"],
          "gap",
        )
      ),
    ]
  if len(frames["induction"]):
    parts += _induction_section(frames)
  if len(frames["causal"]):
    c = frames["causal"]
    parts += [
      "",
      "## Causal test: k most selective heads vs k layer-matched random heads (ablated − random)",
      "probe_accuracy_vs_random: DECODABILITY AFTER ABLATION, the accuracy of a probe refitted on the ablated last "
      "layer (< 0: less of the task is linearly decodable once the selective heads are gone; not whether the model "
      "uses them); loss_delta_vs_random: the LM loss change (> 0: the model's loss needs the selective heads more).",
      _markdown(
        c[c["metric"].isin(list(CAUSAL_MEASURES))][["run", "task", "k", "metric", "value", "ci_low", "ci_high", "mde"]],
        ".4f",
      ),
      "mde: the smallest effect this test detects with 80% power at α = 0.05, 2.8 × SE, SE = CI half-width / "
      '1.96 (Bloom 1995). It is not an equivalence bound: a "no more than" statement needs tost_p below.',
      "",
      "### Over seeds: the causal test per condition, decodability and LM loss (study/causal_seeds.csv)",
      _markdown(frames["causal_seeds"], ".4f"),
      "p_value: one-sample t test of 0 over seeds; p_holm: Holm within condition × metric (every task × k); "
      "below_0 / above_0: seeds whose own CI lies below / above 0; tost_p: Schuirmann's two one-sided t tests of "
      "|mean| < tost_margin (small: shown to be within the margin), tost_p_holm Holm over the same family.",
    ]
  if len(frames.get("sae", ())):
    parts += _sae_section(frames)
  if len(frames["rankings"]):
    parts += [
      "",
      "## How much the model needs a head vs its selectivity (Spearman ρ; permutation p, Holm-adjusted)",
      "zero_ablation / mean_ablation: the signed loss change when the head alone is removed (> 0: needed); "
      "importance_raw: E|∂ℓ/∂m_h| (a magnitude: also high for a head whose removal lowers the loss); importance: "
      "the same normalised per layer. within_layer: mean per-layer ρ, heads shuffled only within their layer.",
      _markdown(
        frames["rankings"][
          ["run", "task", "measure", "spearman", "p_holm", "within_layer_spearman", "within_layer_p_holm", "heads"]
        ]
      ),
      "",
      "### Over seeds: Spearman ρ per condition (mean, 95% t interval over seeds, range)",
      _markdown(_by_condition(frames["rankings"], ["task", "measure"], "spearman")),
    ]
  if len(frames["reference"]):
    ref = frames["reference"]
    wide = ref.pivot_table(index=["kind", "what"], columns="run", values="value", aggfunc="first")
    wide["baseline"] = ref.groupby(["kind", "what"])["baseline"].first()
    wide["n (test, first run)"] = ref.groupby(["kind", "what"])["n"].first()
    parts += [
      "",
      "## Runs' last step and reference models: the best head's test value (chosen on dev)",
      "probe_selectivity: selectivity; structural: the structural probe's value (UUAS, DSpr., root accuracy, "
      "NSpr.) beside H&M's linear baseline; clark/*: attention accuracy on the arcs both models see, beside the "
      "best fixed offset (baseline). Layers and heads: study/reference.csv.",
      _markdown(wide.reset_index()),
    ]
  return parts
