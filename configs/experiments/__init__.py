"""Experiment configs: `experiment(arg)` beside `get_config(arg)` (headspec/launch/experiments.py)."""
