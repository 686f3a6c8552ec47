"""What headspec reads and writes, without JAX: paths local or gs:// (remote), every results table's schema,
reader and atomic merge-by-key writer (tables), the one file lock (locks), file names (filenames), a run's
provenance (provenance), the metrics.jsonl format (metrics), user text files (textfiles) and the libraries'
log lines headspec drops (library_logs). Everything above (models, analyses, the atlas) uses these; nothing
here imports a model or an analysis (tests/test_layering.py).
"""
