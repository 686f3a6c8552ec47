"""Every `headspec patch` config key with its default (configs/patch_*.py start from `patch_config()`)."""

from __future__ import annotations

import ml_collections

from headspec.runs.target_config import add_target_keys


def patch_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  add_target_keys(c)  # mesh, multihost, steps, model_name, model.pretrained, model.dtype
  c.task = "induction"  # 'induction' (repeated random sequences) | 'ioi' (name-mover templates): patching/tasks.py
  c.corruption = "abc"  # ioi: 'abc' (all three names replaced, Wang et al.'s ABC set; task column `ioi`) |
  #                       's2' (only the second B replaced; task column `ioi_s2`)
  c.metric = "logit_diff"  # of the logits at each prompt's last token, mean over pairs: 'logit_diff'
  #                          (correct − wrong) | 'prob' (p(correct)) | 'loss' (−log p(correct)): patching/core.py METRICS
  c.count = 32  # prompt pairs
  c.induction_n = 6  # induction: the repeated sequence's length n ([BOS] r_1..r_n r_1..r_{n-1})
  c.sites = "z,pattern,resid_pre,attn_out,mlp_out"  # sites patched (model/sites.py SITES), each by head and position
  c.by_position = True  # one patch per position (False: all positions at once, position -1)
  c.direction = "denoising"  # 'denoising' (corrupted run, clean activation; TransformerLens's) | 'noising'
  c.attribution = True  # also attribution patching of every site, with its agreement with exact patching
  c.path = True  # also path patching into the logits (method path_logits): every head's paths through no
  #                 other head (directly and through the downstream MLPs, which recompute; Wang et al.)
  c.seed = 0  # the prompt pairs' random tokens and names
  return c
