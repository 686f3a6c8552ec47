"""The Python API for notebooks (docs/api.md): load a model, run text through it, probe, ablate and patch its heads.

Each function is a thin, typed face over what the commands themselves call, so that a notebook and
`headspec probe` / `headspec ablate` / `headspec attention` give the same numbers. One module per verb:

  load.py     load(source, step=None): targets.pretrained_target / targets.run_targets (the commands' planner);
              the argument rules every function starts from (as_loaded, check_heads, head_mask_array)
  run.py      run(model, sentences, ...): Transformer.__call__ with capture; words ↔ pieces by words/alignment.py
              (word lists) or tokens.text_words (a text, tokenized as written); inputs and word vectors by
              words/batches.py (the probes' own pooling); word-level attention by attention/words.pool_words
              (Clark et al. 2019)
  tokens.py   to_tokens / to_str_tokens / to_single_token (model/tokens.py: the tokenizer on the text as written);
              capture(model, tokens_or_text, sites=...): one jitted forward, a Cache (model/capture.py)
  probe.py    probe(model, task, ...): probing's labels.load_data, then suite.probe_job (the command's job for one
              model step), keeping the rows asked for (as in probes/results.csv)
  ablate.py   ablate(model, heads, texts): ablation's run.evaluation_set (or your texts), core.run_one,
              core.head_statistics, metrics
  patch.py    patch, attribution_patch, path_patch (patching/patch.py); circuit (patching/edges.py: EAP, EAP-IG,
              exact edge scores and faithfulness curves)
  views.py    plot_attention, attention_view: attention figures and the offline HTML view
  store.py    activations: the activation store (many texts' activations at fixed shapes)

`import headspec` reaches these lazily (headspec/__init__.py). Shape letters are headspec/model/transformer.py's
glossary: L layers, H heads, K head width, D model width, T/S tokens (pieces, special tokens included), N words,
V vocabulary.
"""
