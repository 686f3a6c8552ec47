"""A run on disk: directory (what a run folder holds and its config), checkpoints (Orbax, restored onto any
mesh), targets (what an analysis reads: the one planner of (model, step) jobs and the data-directory
resolver), evaltext (the evaluation rows cut from a corpus).
"""
