"""Head diversity: the metrics (metrics.py), the `headspec diversity` command (run.py), its figures
(plots.py) and its config keys (defaults.py). docs/diversity.md."""
