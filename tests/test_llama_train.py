"""configs/base_llama.py's recipe (rotary, RMSNorm, SwiGLU, grouped-query attention, no biases, untied
embeddings) trains under jit and pmap alike, and its saved steps load for the analyses."""

import json
import pathlib

import jax
import numpy as np

from headspec.cli.quickstart import quickstart_config
from headspec.configs import base_llama
from headspec.runs import directory as runs
from headspec.runs import targets
from headspec.train.loop import train_and_evaluate


def _config(data_dir):
  c = quickstart_config("decoder")
  c.data_dir = str(data_dir)
  c.data.vocab_size = 512
  c.model.d_model, c.model.d_head, c.model.d_ff, c.model.num_heads = 32, 8, 64, 4
  base_llama.llama_options(c.model)
  c.train.steps, c.train.batch_size, c.train.seq_len = 4, 16, 32
  c.train.log_every, c.train.eval_every, c.train.diversity_every = 1, 0, 0
  c.train.checkpoint_every, c.train.keep_steps = 2, (0,)
  return c


def _losses(workdir):
  records = [json.loads(line) for line in (pathlib.Path(workdir) / "metrics.jsonl").read_text().splitlines()]
  return [r["loss"] for r in records if "loss" in r]


def test_llama_recipe_trains_under_jit_and_pmap_and_loads(synthetic_data_dir, tmp_path):
  config = _config(synthetic_data_dir)
  train_and_evaluate(config, tmp_path / "jit")
  config.parallelism = "pmap"
  train_and_evaluate(config, tmp_path / "pmap")
  jit, pmap = _losses(tmp_path / "jit"), _losses(tmp_path / "pmap")
  assert len(jit) == 4 and jit[-1] < jit[0]
  np.testing.assert_allclose(pmap, jit, rtol=2e-5)

  (target,) = targets.run_targets(tmp_path / "jit", "last")
  model, tokenizer = target.load()
  cfg = model.cfg
  assert (cfg.positions, cfg.norm, cfg.gated_mlp, cfg.num_kv_heads, cfg.tie_embeddings) == (
    "rotary",
    "rmsnorm",
    True,
    1,
    False,
  )
  assert cfg.kv_group_of_head == (0, 0, 0, 0) and model.blocks[0].attention.b_q_HK is None
  first, _ = runs.load_run_model(tmp_path / "jit", 0)
  moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()), model, first)
  assert max(jax.tree.leaves(moved)) > 0  # step 4 is not step 0
  ids = np.asarray([tokenizer.encode("the cat sat on the mat")])
  _, inter = model(ids, capture=("pattern", "z", "k"))
  assert inter.pattern_LBHTS.shape[:3] == (2, 1, 4) and inter.k_LBTHK.shape[3] == 4
  np.testing.assert_allclose(inter.pattern_LBHTS.sum(-1), 1.0, atol=1e-5)
