"""Every `headspec sae` config key with its default (configs/sae.py starts from `sae_config()`)."""

from __future__ import annotations

import dataclasses

import ml_collections
from ml_collections import config_dict

from headspec.bounds import Bound
from headspec.data import data_dir_default
from headspec.runs.target_config import add_target_keys

MILLION, BILLION = 10**6, 10**9
BOUNDS = (  # every numeric option's kind and range (headspec/bounds.py), checked first by `headspec sae`
  Bound("seed", "int", 0, 2**63 - 1),
  Bound("train_tokens", "int", 1, BILLION),
  Bound("eval_tokens", "int", 1, 100 * MILLION),
  Bound("batch_size", "int", 1, 65536),
  Bound("seq_len", "int", 2, MILLION),
  Bound("sae.expansion", "float", 0, 1024, above=True),
  Bound("sae.features", "int", 1, 2**24, optional=True),
  Bound("sae.k", "int", 1, 2**24),
  Bound("sae.l1", "float", 0, MILLION),
  Bound("sae.l0", "float", 0, MILLION),
  Bound("sae.bandwidth", "float", 0, 1000, above=True),
  Bound("sae.threshold_init", "float", 0, MILLION, above=True),
  Bound("sae.aux_k", "int", 0, 2**24),
  Bound("sae.aux_coefficient", "float", 0, MILLION),
  Bound("sae.dead_after_tokens", "int", 1, 10**15),
  Bound("sae.train_steps", "int", 1, BILLION),
  Bound("sae.batch_size", "int", 1, 2**20),
  Bound("sae.lr", "float", 0, 10, above=True),
  Bound("sae.warmup_steps", "int", 0, BILLION),
  Bound("sae.decay_fraction", "float", 0, 1),
  Bound("sae.checkpoint_every", "int", 1, BILLION),
  *(Bound(f"analysis.{key}", "float", 0, 1) for key in ("carry_min", "exclusive_min", "dense_min", "selective_min")),
  Bound("analysis.max_sentences", "int", 0, BILLION),
  Bound("analysis.batch_tokens", "int", 1, 2**20),
  Bound("analysis.top", "int", 1, 1000),
  Bound("analysis.context_words", "int", 0, 1000),
  Bound("analysis.min_fires", "int", 1, 10**15),
)
_FIT_NAMES = {"sae.train_steps": "steps"}  # fit_sae's argument where it is not the key without 'sae.'
FIT_BOUNDS = (  # fit_sae's options (headspec/sae/train.py `Options`): the same ranges
  *(
    dataclasses.replace(b, key=_FIT_NAMES.get(b.key, b.key.removeprefix("sae.")), optional=False)
    for b in BOUNDS
    if b.key.startswith("sae.") and b.key not in ("sae.expansion", "sae.checkpoint_every")
  ),
  Bound("seed", "int", 0, 2**63 - 1),
  Bound("chunk", "int", 1, 100000),
)


def sae_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  add_target_keys(c)  # mesh, multihost, steps, model_name, model.pretrained, model.dtype
  c.site = "z"  # the activations the SAE reads (headspec.model.sites.SITES, per token): z = the concatenated Z_h, [tokens, H·K]
  c.layer = -1  # 0-based block; -1 = the middle one (L // 2)
  c.layers = ""  # '' = `layer` alone; 'all' or comma-separated blocks ('0,2'): one SAE per layer
  # The token rows (headspec/runs/evaltext.py): the first train_tokens train the SAE, the next eval_tokens measure it
  # (a shorter text is cut in that proportion). Too few training tokens for the features overfit: eval FVU ≫ train FVU.
  c.train_tokens = 100000
  c.eval_tokens = 8192  # the tokens after the training ones, held out: they measure the SAE (FVU, L0) and its splice
  c.sample = "first"  # 'first' rows of the validation text, or 'random' rows drawn with `seed`
  c.seed = 0  # the row sample, the SAE's initialisation and batches
  c.batch_size = 8  # rows per forward pass
  c.data_dir = (
    data_dir_default()
  )  # holds ud/<treebank>/ (and text/<corpus>/); '' = the run's own, then HEADSPEC_DATA_DIR
  c.corpus = "wikitext_103"  # pretrained models only: data_dir/text/<corpus>, valid split
  c.seq_len = 128  # pretrained models only: tokens per row, special tokens included

  c.sae = ml_collections.ConfigDict()  # headspec/sae/train.py (docs/sae.md)
  c.sae.kind = "topk"  # 'topk' (Gao et al. 2024) | 'relu' (ReLU + L1, Bricken et al. 2023) | 'jumprelu' (Rajamanoharan et al. 2024)
  c.sae.expansion = 8.0  # features = expansion × the input width, unless `features` is set
  c.sae.features = config_dict.placeholder(int)  # None = expansion × width; else the number of features (> 0)
  c.sae.k = 16  # topk: active features per token (1 ≤ k ≤ features)
  c.sae.l1 = 5.0  # relu: the L1 coefficient λ (inputs scaled to E‖x‖² = width)
  c.sae.l0 = 1.0  # jumprelu: the L0 coefficient λ₀ (same scale)
  c.sae.bandwidth = 0.2  # jumprelu: ε of the straight-through estimators' rectangle kernel
  c.sae.threshold_init = 0.5  # jumprelu: every θ_f at the start
  c.sae.aux_k = 0  # topk: dead latents in the AuxK term; 0 = width // 2
  c.sae.aux_coefficient = 1 / 32  # topk: α of the AuxK term (Gao et al. 2024)
  c.sae.dead_after_tokens = 100000  # a latent is dead (for AuxK) after this many training tokens without firing
  c.sae.train_steps = 3000  # Adam steps, each on sae.batch_size tokens drawn with replacement from the training tokens
  c.sae.batch_size = 1024  # tokens per step
  c.sae.lr = 1e-3  # Adam's peak learning rate
  c.sae.lr_schedule = "linear_decay"  # 'constant' | 'linear_decay' (to 0 over the last decay_fraction) | 'cosine'
  c.sae.warmup_steps = 100  # the learning rate rises linearly from 0 to lr over these first steps
  c.sae.decay_fraction = 0.2  # lr_schedule 'linear_decay': the last fraction of train_steps over which lr falls to 0
  c.sae.b_dec_init = "geometric_median"  # 'geometric_median' (Bricken et al. 2023) | 'mean'
  c.sae.normalize = "global"  # 'global': one input scale (RMS) | 'per_head': each head's z at unit RMS (docs/sae.md)
  c.sae.checkpoint_every = 1000  # Orbax checkpoints in RUN/sae/checkpoints/<model>-step<step>-<site><layer>-<hash>/
  c.sae.load = ""  # an SAELens folder (cfg.json + sae_weights.safetensors, or Kissane et al.'s .pt): analysed, not trained; its hook names the layer

  c.analysis = ml_collections.ConfigDict()  # headspec/sae/metrics.py, labels.py
  c.analysis.carry_min = 0.2  # head h carries feature f when its decoder-norm share a_fh ≥ this
  c.analysis.exclusive_min = 0.9  # ... and f is h's exclusive feature when a_fh ≥ this
  c.analysis.dense_min = 0.1  # a feature firing on more than this fraction of evaluation tokens is dense
  c.analysis.treebank = "en_ewt"  # data_dir/ud/<treebank>/ for contexts and label profiles; '' = none
  c.analysis.split = "dev"  # its split read
  c.analysis.max_sentences = 0  # 0: every sentence of the split; else its first N
  c.analysis.pooling = (
    "auto"  # a word's activation from its pieces: 'auto' (decoders last, encoders first) | first | last | mean
  )
  c.analysis.batch_tokens = 2048  # padded tokens per forward batch over the treebank
  c.analysis.top = 10  # top-activating contexts kept per feature
  c.analysis.context_words = 4  # words either side of the word in a context
  c.analysis.min_fires = 10  # a feature's selectivity needs it to fire on at least this many words
  c.analysis.selective_min = 0.3  # heads.csv counts a head's carried features with selectivity ≥ this

  return c
