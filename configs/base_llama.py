"""A Llama-style decoder (6 layers, 8 query heads sharing 2 K/V heads, d_model 256) on WikiText-103 (raw).

  headspec train --config=base_llama --workdir=runs/llama

The modern recipe as ModelConfig options of the one Transformer (docs/pretrained.md): rotary positions
(theta 10,000, every feature), RMSNorm before each sublayer and after the last block, a SwiGLU MLP
(d_ff 688, about 8/3 of d_model as Llama's), grouped-query attention (model.num_kv_heads=2: query heads
0-3 read K/V group 0, heads 4-7 group 1), no biases, untied embeddings, no dropout. Every analysis reads
its checkpoints as it reads base_decoder's; a head is a query head (ModelConfig.kv_group_of_head gives its
group). Same data, steps and kept steps as base_decoder (time per 1k steps: see that file, an estimate).
"""

from headspec.train.config import train_config


def llama_options(model) -> None:
  """Sets a config's `model` section to the Llama recipe, keeping its sizes (layers, heads, widths)."""
  model.positions = "rotary"
  model.rope_theta = 10000.0
  model.norm = "rmsnorm"
  model.gated_mlp = True
  model.activation = "silu"  # SwiGLU
  model.num_kv_heads = max(1, model.num_heads // 4)  # grouped-query attention: 4 query heads per K/V head
  model.attention_bias = False
  model.attention_out_bias = False
  model.mlp_bias = False
  model.tie_embeddings = False
  model.dropout = 0.0
  model.attention_dropout = 0.0


def get_config(arg: str | None = None):
  c = train_config()
  c.data.corpus = "wikitext_103"
  c.model.d_ff = 688
  llama_options(c.model)
  c.train.keep_steps = (0, 100, 300, 1000, 3000)
  return c
