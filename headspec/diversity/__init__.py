"""Head diversity: the metrics (metrics.py), the `headspec diversity` command (run.py), its figures
(plots.py) and its config keys (config.py). docs/diversity.md."""
