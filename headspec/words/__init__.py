"""The one way words go through a model, below every analysis: alignment (word <-> piece), batches (every
word-level batch, row and word-pooling matrix: the one bucket batcher, packed and windowed batches, the pooled
forward), packing, evalset (evaluation sentences), selectivity, resampling
(intervals), figures (figure conventions), jobloop (the (model, step) job loop and its progress bars).
"""
