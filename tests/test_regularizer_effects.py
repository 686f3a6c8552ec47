"""Each training regularizer, switched on alone, moves its target quantity the expected way.

Six short runs (150 steps, 2 layers × 4 heads, d_model 32, same seed and data order): a baseline and
one run per term. Quantities are measured on 64 held-out validation rows (2,048 tokens). Thresholds
are set well inside the effects seen on two seeds (the numbers in comments are seed 0 / seed 1 on a
2-core CPU; see docs/diversity.md).
"""

import json
import pathlib
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from headspec.cli.quickstart import quickstart_config
from headspec.model.edits import head_mask
from headspec.runs import directory as runs
from headspec.train import regularizers
from headspec.train.loop import train_and_evaluate

pytestmark = pytest.mark.slow
STEPS, L, H = 150, 2, 4
TERMS = ("disagreement/subspace", "disagreement/position", "disagreement/output", "orthogonality/query")


def config(data_dir, **terms):
  c = quickstart_config("decoder")
  c.data_dir = str(data_dir)
  c.data.vocab_size = 512
  c.model.num_layers, c.model.num_heads, c.model.d_model, c.model.d_head, c.model.d_ff = L, H, 32, 8, 64
  c.train.steps, c.train.batch_size, c.train.seq_len = STEPS, 16, 32
  c.train.learning_rate, c.train.warmup_steps = 1e-2, 10  # high enough that attention gets peaked
  c.train.log_every = 50
  c.train.eval_every = c.train.diversity_every = 0
  c.train.checkpoint_every, c.train.keep_steps = STEPS, ()
  for key, value in terms.items():
    c.train.regularizers[key] = value
  return c


class Run:
  """A finished run's final model on held-out rows, and the keys it logged."""

  def __init__(self, workdir: pathlib.Path):
    self.model, _ = runs.load_run_model(workdir, STEPS)
    rows = np.load(workdir / "cache" / "valid_tokens.npy")[: 64 * 32].reshape(64, 32)
    self.tokens_BT = jnp.asarray(rows)
    self.valid_BT = jnp.ones(rows.shape, bool)
    self.targets_BT = jnp.concatenate([self.tokens_BT[:, 1:], self.tokens_BT[:, -1:]], axis=1)
    self.weights_BT = jnp.ones(rows.shape).at[:, -1].set(0.0)
    _, self.inter = self.model(self.tokens_BT, capture=("v", "pattern", "z"))
    records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    self.logged = set().union(*records)

  def loss(self, mask=None) -> float:
    edit = None if mask is None else {"z": head_mask(mask)}
    logits_BTV, _ = self.model(self.tokens_BT, interventions=edit)
    token_loss_BT = optax.softmax_cross_entropy_with_integer_labels(logits_BTV, self.targets_BT)
    return float((token_loss_BT * self.weights_BT).sum() / self.weights_BT.sum())

  def max_single_head_ablation(self) -> float:
    """Largest loss increase from zeroing one head (Michel et al. 2019's single-head ablation)."""
    base = self.loss()
    return max(self.loss(jnp.ones((L, H)).at[l, h].set(0.0)) - base for l in range(L) for h in range(H))

  def random_drop_increase(self, p=0.3, draws=5) -> float:
    """Mean loss increase under DropHead masks (p, kept heads rescaled), as seen in training."""
    base = self.loss()
    B = self.tokens_BT.shape[0]
    return float(
      np.mean([self.loss(regularizers.drophead_mask(jax.random.key(i), p, B, L, H)) - base for i in range(draws)])
    )


@pytest.fixture(scope="module")
def train(synthetic_data_dir, tmp_path_factory):
  """train(**terms) -> Run; runs share the baseline's tokenizer and token cache (same data, less time)."""
  root = tmp_path_factory.mktemp("effects")
  done = {}

  def run(**terms) -> Run:
    name = "_".join(f"{k}{v}" for k, v in terms.items()) or "baseline"
    if name not in done:
      workdir = root / name
      if name != "baseline":
        base = root / "baseline"
        run()
        workdir.mkdir()
        for sub in ("tokenizer", "cache"):
          shutil.copytree(base / sub, workdir / sub)
      train_and_evaluate(config(synthetic_data_dir, **terms), workdir)
      done[name] = Run(workdir)
    return done[name]

  return run


def test_baseline_logs_no_regularizer(train):
  assert not train().logged & set(TERMS)


def test_position_disagreement_lowers_attention_overlap(train):
  base, run = train(), train(position=1.0)
  assert "disagreement/position" in run.logged
  # Mean over i != j of sum_s A_i[t,s] A_j[t,s]: 0.165 -> 0.123 / 0.146 -> 0.126.
  off = lambda r: float(regularizers.position_agreement(r.inter.pattern_LBHTS, r.valid_BT, off_diagonal=True))
  assert off(run) < off(base) - 0.01
  # The trained quantity (i = j included): 0.202 -> 0.129 / 0.154 -> 0.129.
  full = lambda r: float(regularizers.position_agreement(r.inter.pattern_LBHTS, r.valid_BT))
  assert full(run) < full(base) - 0.01


def test_subspace_disagreement_lowers_value_cosine(train):
  base, run = train(), train(subspace=1.0)
  assert "disagreement/subspace" in run.logged
  agree = lambda r: float(regularizers.cosine_agreement(r.inter.v_LBTHK, r.valid_BT, off_diagonal=True))
  # 0.14 -> -0.333: the floor -1/(H-1), heads' value vectors at the vertices of a simplex.
  assert agree(base) > -0.1 and agree(run) < -0.3


def test_output_disagreement_lowers_output_cosine(train):
  base, run = train(), train(output=1.0)
  assert "disagreement/output" in run.logged
  agree = lambda r: float(regularizers.cosine_agreement(r.inter.z_LBTHK, r.valid_BT, off_diagonal=True))
  assert agree(base) > -0.1 and agree(run) < -0.3  # 0.03 -> -0.333


def test_query_orthogonality_lowers_its_penalty(train):
  base, run = train(), train(query_orthogonality=0.1)
  assert "orthogonality/query" in run.logged
  penalty = lambda r: float(
    regularizers.orthogonality_penalty(jnp.stack([block.attention.w_q_DHK[...] for block in r.model.blocks]))
  )
  assert penalty(run) < 0.05 * penalty(base)  # 4.7 -> 0.005


def test_drophead_makes_the_model_robust_to_losing_heads(train):
  """DropHead trains with random heads removed (Zhou et al. 2020), so the model should rely less on any
  single head: both the worst single-head ablation and random DropHead masks cost less loss."""
  base, run = train(), train(drophead=0.3)
  # Max single-head ablation: 0.063 -> 0.011 / 0.086 -> 0.013; random p=0.3 masks: 0.078 -> 0.005 / 0.063 -> 0.009.
  assert run.max_single_head_ablation() < 0.5 * base.max_single_head_ablation()
  assert run.random_drop_increase() < 0.5 * base.random_drop_increase()
