"""Cost of `headspec attention` on all-MiniLM-L6-v2 over UD English EWT (prints JSON).

  HEADSPEC_DATA_DIR=... python -m benchmarks.bench_attention [--report_split test] [--max_sentences 0]

First the whole command as a user runs it (`run.run`, cold: imports done, nothing compiled):
every EWT dev sentence (2,001) and, with --report_split test (the default config), every test sentence
(2,077); Clark tables, roles with 1,000 bootstrap resamples, pictures of three dev sentences (72 per-head
PNGs, 3 line views, rollout + flow). Then the same stages again, warm (compiled), timed one by one.
Target: under 2 minutes on a 2-core CPU for the dev split.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import tempfile
import time

import numpy as np


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--report_split", default="", help="'' (dev only, the benchmark's target) or 'test'")
  parser.add_argument("--max_sentences", type=int, default=0, help="0: every sentence")
  args = parser.parse_args()

  from headspec.attention import clark, roles, run
  from headspec.attention import words as words_lib
  from headspec.attention.config import attention_config, check_config
  from headspec.runs import targets

  config = attention_config()
  config.model.pretrained = "minilm"
  config.report_split = args.report_split
  config.max_sentences = args.max_sentences
  check_config(config)
  result = {
    "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores (shared with other jobs while measured)",
    "model": "all-MiniLM-L6-v2 (6 layers x 12 heads)",
    "splits": "en_ewt/dev" + (f" + en_ewt/{args.report_split}" if args.report_split else ""),
  }
  with tempfile.TemporaryDirectory() as workdir:
    t0 = time.perf_counter()
    run.run(config, workdir)
    result["end_to_end_cold_s"] = round(time.perf_counter() - t0, 1)

    stages = {}
    t = time.perf_counter()
    data_dir = targets.data_dir(config)
    data = run.load_data(config, data_dir, None)
    stages["read_treebank_and_frequencies"] = time.perf_counter() - t
    t = time.perf_counter()
    model, tokenizer = targets.plan(config, workdir, steps="last")[0].load()
    stages["load_model"] = time.perf_counter() - t
    t = time.perf_counter()
    split = data.select
    ws = words_lib.word_stats(
      model, tokenizer, [s.words for s in split.sentences], split.punct_N, batch_tokens=config.batch_tokens
    )
    stages["forward_and_word_reduction_dev_warm"] = time.perf_counter() - t
    t = time.perf_counter()
    scores = clark.score_split(
      ws.argmax_other_LHN, split.arcs, data.relations, causal=False, arc_set="auto", max_offset=5
    )
    stages["clark_scores_dev"] = time.perf_counter() - t
    t = time.perf_counter()
    freq_N = np.array([data.frequencies.get(w.lower(), 0) for s in split.sentences for w in s.words], float)
    roles.role_scores(ws, freq_N, scores, split.arcs, min_count=100, num_resamples=1000, seed=0)
    stages["roles_with_bootstrap_cis"] = time.perf_counter() - t
    t = time.perf_counter()
    run.draw_pictures(model, tokenizer, data.examples, pathlib.Path(workdir) / "pics", config)
    stages["pictures"] = time.perf_counter() - t
    result["stages_warm_s"] = {k: round(v, 2) for k, v in stages.items()}
    result["words_dev"] = int(ws.num_words)
    result["sentences_split_into_windows_dev"] = int(ws.num_split_sentences)
  print(json.dumps(result, indent=1))


if __name__ == "__main__":
  main()
