"""`headspec study --workdir=ROOT`: an experiment's results across runs, steps and conditions (docs/study.md).

Reads ROOT/experiment.json (the runs, their condition and seed) and every run's tables, and writes
ROOT/study/: the tables below as CSV, figures, and summary.md. Only measured values; heads are always
chosen on dev and reported on test (the maximum over 48 noisy dev estimates is biased upwards on dev).

  training.csv    per run and logged step: the training loss and, where evaluated, the validation loss.
  emergence.csv   per run, step, task: the best head (highest dev selectivity, probes/selectivity.csv
                  dev_rank 1), its test selectivity and paired 95% CI; the median head's test selectivity
                  (best − median: how far one head stands out from the others); `selective_heads`, the heads whose
                  test selectivity CI lies above 0 (uncorrected for the 48 comparisons: a count to follow
                  over steps, not a test); `above_init_heads`, the heads whose CI lies above the best
                  head of the same run at step 0 (its untrained weights: random features already
                  tell word types apart, so they are slightly selective); the best residual stream (chosen on dev) for reference.
  layers.csv      per run and task: the first kept step at which each layer has a head above init.
  formation.csv   per run and head: its formation step, the first kept step at which it is above init
                  (the rule of `above_init_heads`), per probe task (test selectivity) and per role
                  (attention/roles.csv score on repeated random sequences, its bootstrap CI); NaN: never.
  structural.csv  per run, step and metric of Hewitt & Manning's structural probes (UUAS and DSpr. of the
                  distance probe, root accuracy and NSpr. of the depth probe; probes/structural.csv): per
                  `choice`, the head and the residual stream with the highest dev value (best_value: the
                  one whose raw value is compared over steps and with the baseline) and with the highest
                  dev selectivity (most_selective: value − control-tree value, as the other probes are
                  chosen), their test value with its 95% CI, the control value and selectivity, beside
                  H&M's linear-structure baseline on test.
  diversity.csv   per run, step, metric: the mean over layers and head pairs (or heads) of
                  diversity/results.csv.
  roles.csv       per run and step: the best previous-token, duplicate-token and induction scores of any
                  head on repeated random sequences (attention/roles.csv, data=repeated_random), and the
                  median head's (best − median: whether one head carries the role).
  induction.csv   per run, step and measure (decoders with the induction step of `headspec attention`): from
                  attention/icl.csv the loss on the first and second copy of repeated random sequences and
                  repeat_drop = first − second (the in-context loss drop induction heads bring), and the ICL
                  score on text; from ablation/causal.csv (kind=induction) the top-k induction heads ablated,
                  the second copy's loss change and its excess over k layer-matched and k unlabelled random
                  heads, with CIs and `mde` (the check's power, `mde()`).
                  formation.csv also gets source=loss, task=repeat_drop (layer, head −1): the first kept step
                  whose repeat_drop CI lies above step 0's value + 1 nat (DROP_FORMED).
  causal.csv      per run and task at the last step: ablating the k most selective heads vs k
                  layer-matched random heads (ablation/causal.csv `*_vs_random` rows, paired CIs:
                  probe_accuracy_vs_random is decodability after ablation, a probe refitted on the ablated
                  model, not whether the model uses the heads; loss_delta_vs_random the LM loss), with
                  `mde`, the smallest effect the test detects at 80% power (`mde()`; not an equivalence bound).
  conditions.csv  per non-baseline condition and task: condition − baseline at the last step, paired by seed
                  (Welch where the conditions share fewer than 2 seeds): best head's test selectivity, best −
                  median; task '': each diversity metric; per task and k: the causal test's decodability and
                  LM-loss rows. Mean, 95% t interval, the test, its p and Holm's p within its `family`.
  causal_seeds.csv  per condition, task, k and metric (decodability after ablation, LM loss): the causal test
                  over seeds, one-sample t test with Holm, and the TOST of |mean| < tost_margin.
  formation_tests.csv  per quantity that forms (a role's label step, the repeat drop) and pair of conditions:
                  Fisher's exact test of the seeds formed, Mann–Whitney U of the steps, Holm over the pairs.
  rankings.csv    per run, task and measure of how much the model needs a head, at the last step:
                  Spearman's ρ between that measure and test selectivity over all heads, with a
                  permutation p-value over all heads; the mean of the per-layer ρ with a permutation
                  p-value that shuffles heads only within their layer (so the layers' different levels
                  of selectivity and importance cannot make the correlation); both p-values Holm-adjusted
                  over the run's family of tests (every task × measure × test). Measures (ablation/heads.csv):
                  zero_ablation and mean_ablation, the SIGNED loss change when the head alone is removed
                  (> 0: the model needs it); importance_raw, Michel et al. 2019's E|∂ℓ/∂m_h|; importance,
                  the same normalised per layer (the pruning ranking; comparable only within a layer).
  sae_heads.csv   per run, kept step and head (sae/heads.csv of `headspec sae` on z, every layer): the head's
                  feature specialization S_h, its exclusive and carried features, its z RMS (docs/sae.md).
  sae.csv         per run and kept step, from sae_heads.csv: `specialization_mean` and `_max` over heads,
                  `exclusive_features` (summed over heads), `heads_with_exclusive`; per probe task where the
                  step was probed, Spearman's ρ over heads of S_h with the head's test selectivity
                  (`spearman_selectivity`, permutation p), its within-layer mean (`within_layer_spearman`,
                  heads shuffled within their layer), and `spearman_change`: ρ over heads of S_h's change
                  since the first step probed with the selectivity's change (does specialization rise where
                  selectivity does?); p Holm-adjusted over the run's ρ rows; `spearman_z_rms`: ρ over the same
                  heads of S_h with the head's z RMS (its output scale; Holm over those rows apart).
  reference.csv   the best head's test selectivity per task, the structural-probe value per metric of the
                  head with the best dev value (beside the linear baseline) and the best head's Clark accuracy per relation
                  (beside the best fixed offset), all chosen on dev and reported on test, for each run's
                  last step and each reference model (all-MiniLM-L6-v2); n: test words, sentences or arcs.

Per condition, summary.md gives the mean over seeds, its 95% t interval over seeds (t_low, t_high) and the
range (min to max) of each figure.

The package: collect.py reads the runs' tables into these rows, statistics.py holds the tests, intervals and
families, figures.py draws ROOT/study/*.png, report.py writes summary.md; `write_study` here runs them.
"""

from __future__ import annotations

import os

from etils import epath

from headspec.io import provenance, remote, tables
from headspec.study import statistics  # noqa: F401  (tests patch statistics._label_min)
from headspec.study.collect import (  # noqa: F401  the public names tests and docs use
  COLUMNS,
  DROP_FORMED,
  OUT,
  ROLES,
  causal,
  collect,
  emergence,
  formation,
  induction,
  rankings,
  reference,
  roles,
  sae_heads,
  sae_summary,
  structural,
  tasks,
  training,
)
from headspec.study.figures import _figures, figure_tasks  # noqa: F401
from headspec.study.report import (
  STATISTICS,
  _emergence_sections,
  _formation_sections,
  _later_sections,
  _structural_sections,
)
from headspec.study.statistics import (  # noqa: F401
  CAUSAL_MEASURES,
  EQUIVALENCE_MARGINS,
  _by_condition,
  _formation_summary,
  _label_min,
  _label_steps,
  causal_seeds,
  conditions,
  formation_tests,
  holm,
  mde,
  seed_interval,
  spearman,
  within_layer_spearman,
)


@provenance.recorded("study")
def write_study(root) -> epath.Path:
  """ROOT/study/{*.csv, *.png, summary.md}; returns the summary's path."""
  import pandas as pd

  rows = collect(root)
  out = remote.run_path(root) / OUT
  out.mkdir(parents=True, exist_ok=True)
  frames = {k: pd.DataFrame(v, columns=COLUMNS[k].split(",")) for k, v in rows.items()}
  for name, frame in frames.items():
    tables.write(out / f"{name}.csv", frame.to_dict("records"), tables.STUDY[name])  # floats '%.6g', NaN empty
  figures = _figures(frames, out)
  parts = [f"# Study: {os.fspath(root)}", ""] + _emergence_sections(frames)
  parts += _formation_sections(frames) + _structural_sections(frames) + _later_sections(frames)
  parts += ["", STATISTICS, "", "Figures: " + ", ".join(figures), ""]
  summary = out / "summary.md"
  remote.write_bytes_atomic(summary, "\n".join(parts).encode())
  return summary
