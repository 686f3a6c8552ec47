"""Training: loop (train_and_evaluate; one cached jitted step shared by jit, mesh and pmap), regularizers
(head-diversity penalties), config (every training key with its default and help line).
"""
