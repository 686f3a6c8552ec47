"""Experiment configs: `experiment(arg)` beside `get_config(arg)` (headspec/experiments.py)."""
