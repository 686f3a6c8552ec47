"""The model: one Flax NNX Transformer (encoder or decoder, attention written per head) and what runs through it.

config (ModelConfig), sites (the sites SITES and the Edit/Apply/Intermediates protocol every intervention uses),
layers (positions, norms, the KV cache, per-head attention, the MLP, the block), transformer (the Transformer:
embeddings, the blocks as one scan, the unembedding; the shape glossary), edits (ready-made edits: head masks, mean
ablation, SAE splices), capture (the TransformerLens-style Cache of `headspec.capture`), generation (KV-cache
sampling), objectives (the one token loss), draws (seeded draws), heads (head lists). Stands on parallel/ and io/.
"""
