"""ModelConfig: everything that changes the Transformer's computation, checked when built.

The defaults are GPT-2's; the modern decoders' options (headspec/model/transformer.py's docstring lists them)
leave a config that sets none of them computing what it computed before they existed.
"""

from __future__ import annotations

import dataclasses

import jax
import ml_collections

from headspec.errors import UserError

ACTIVATIONS = {
  "gelu_exact": lambda x: jax.nn.gelu(x, approximate=False),  # BERT
  "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),  # GPT-2 "gelu_new"
  "relu": jax.nn.relu,
  "silu": jax.nn.silu,  # Llama's SwiGLU gate
}
NORMS = ("layernorm", "rmsnorm")
QK_NORMS = ("none", "head", "full")  # Qwen3: RMSNorm over each head's K features; OLMo-2: over all H*K
ROPE_SCALINGS = ("none", "linear", "llama3")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Everything that changes the computation; each field's meaning is its comment (`headspec train --help` prints
  them: a run config's `model` section is these fields, `config_section`)."""

  kind: str  # 'encoder' (masked LM) | 'decoder' (causal LM)
  vocab_size: int  # V; a run's comes from its tokenizer (data.vocab_size)
  num_layers: int  # transformer blocks (L)
  num_heads: int  # attention heads per block (H)
  d_model: int  # width of the residual stream (D)
  d_head: int  # width of each head (K); may differ from d_model / num_heads
  d_ff: int  # hidden width of each MLP (F)
  max_len: int  # the longest sequence; a run's is train.seq_len
  dropout: float = 0.0  # dropout on the embeddings and each sublayer's output while training; 0 = none
  attention_dropout: float = 0.0  # dropout on the attention probabilities while training; 0 = none
  pre_layernorm: bool = True  # norm before each sublayer (GPT-2); False: after the residual add (BERT)
  positions: str = "learned"  # 'learned' | 'sinusoidal' | 'rotary'
  tie_embeddings: bool = True  # the unembedding is the token embedding transposed; False: its own matrix
  activation: str = "gelu_tanh"  # 'gelu_exact' | 'gelu_tanh' | 'relu' | 'silu'
  layer_norm_eps: float = 1e-5  # the norms' epsilon
  type_vocab_size: int = 0  # BERT token types; 0 for none
  embedding_layernorm: bool = False  # BERT normalises the summed embeddings
  dtype: str = "float32"  # compute dtype: 'float32' | 'bfloat16'; parameters stay float32
  mlp: bool = True  # False: attention-only blocks (Elhage et al. 2021), no MLP sublayer, d_ff ignored
  # Modern decoders (Llama, Mistral, Qwen, Gemma, GPT-NeoX, OLMo; docs/pretrained.md, configs/base_llama.py);
  # the defaults leave GPT-2/BERT unchanged.
  norm: str = "layernorm"  # 'layernorm' | 'rmsnorm' (every norm of the model)
  num_kv_heads: int = 0  # grouped-query attention: K/V heads shared by H / num_kv_heads query heads; 0 = num_heads
  gated_mlp: bool = False  # act(x W_gate) * (x W_in) W_out: SwiGLU with 'silu', GeGLU with 'gelu_tanh'
  parallel_residual: bool = False  # x + attn(ln1(x)) + mlp(ln2(x)) (GPT-NeoX)
  sublayer_norm: bool = False  # a norm on each sublayer's output before the residual add (Gemma-2, OLMo-2)
  qk_norm: str = "none"  # 'none' | 'head' (Qwen3) | 'full' (OLMo-2): RMSNorm of queries and keys before rotary
  attention_bias: bool = True  # biases of W_Q, W_K, W_V
  attention_out_bias: bool = True  # bias of W_O
  mlp_bias: bool = True  # biases of the MLP's matrices
  rope_theta: float = 10000.0  # positions='rotary': base of the rotation frequencies
  rotary_fraction: float = 1.0  # the leading fraction of each head's K features that rotate (GPT-NeoX rotary_pct)
  rope_scaling: str = "none"  # 'none' | 'linear' | 'llama3' (Llama-3.1's frequency-dependent scaling)
  rope_factor: float = 1.0  # rope_scaling's factor: frequencies divided by it ('linear': all; 'llama3': the low ones)
  rope_low_freq_factor: float = 1.0  # 'llama3' only: wavelengths above rope_original_max_len / this are scaled
  rope_high_freq_factor: float = 4.0  # 'llama3' only: wavelengths below rope_original_max_len / this are kept
  rope_original_max_len: int = 0  # 'llama3' only: the context length the frequencies were trained for
  attention_scale: float = 0.0  # the logits' scale; 0 = d_head ** -0.5 (Gemma-2: query_pre_attn_scalar ** -0.5)
  attention_softcap: float = 0.0  # cap * tanh(logits / cap) on attention logits; 0 = none (Gemma-2)
  final_softcap: float = 0.0  # the same on the output logits; 0 = none (Gemma-2)
  scale_embeddings: bool = False  # token embeddings times sqrt(d_model) (Gemma)
  attention_windows: tuple[int, ...] = ()  # per layer: a token sees the last w tokens only (w > 0), 0 = all; () = all
  clip_qkv: float = 0.0  # clamp q, k, v to [-c, c]; 0 = none (OLMo)

  @property
  def kv_heads(self) -> int:
    """The number of distinct K/V heads (num_heads unless grouped-query attention)."""
    return self.num_kv_heads or self.num_heads

  @property
  def kv_group_of_head(self) -> tuple[int, ...]:
    """Each query head's K/V group (head h reads K/V head h // (H / num_kv_heads), as Hugging Face's repeat_kv)."""
    per_group = self.num_heads // self.kv_heads
    return tuple(h // per_group for h in range(self.num_heads))

  @property
  def final_norm(self) -> bool:
    """Whether a norm follows the last block (pre-LN models and those with sublayer-output norms)."""
    return self.pre_layernorm or self.sublayer_norm

  def __post_init__(self):
    checks = [
      (self.kind in ("encoder", "decoder"), f"model.kind must be 'encoder' or 'decoder', got {self.kind!r}"),
      (
        self.positions in ("learned", "sinusoidal", "rotary"),
        f"model.positions must be 'learned', 'sinusoidal' or 'rotary', got {self.positions!r}",
      ),
      (self.norm in NORMS, f"model.norm must be one of {NORMS}, got {self.norm!r}"),
      (self.qk_norm in QK_NORMS, f"model.qk_norm must be one of {QK_NORMS}, got {self.qk_norm!r}"),
      (
        self.rope_scaling in ROPE_SCALINGS,
        f"model.rope_scaling must be one of {ROPE_SCALINGS}, got {self.rope_scaling!r}",
      ),
      (
        self.num_kv_heads >= 0 and self.num_heads % self.kv_heads == 0,
        f"model.num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}",
      ),
      (
        self.positions != "rotary"
        or (0.0 < self.rotary_fraction <= 1.0 and int(self.d_head * self.rotary_fraction) % 2 == 0),
        f"model.rotary_fraction={self.rotary_fraction} must be in (0, 1] and rotate an even number of "
        f"the d_head={self.d_head} features",
      ),
      (
        self.rope_scaling != "llama3"
        or (self.rope_original_max_len > 0 and self.rope_high_freq_factor > self.rope_low_freq_factor),
        "model.rope_scaling='llama3' needs rope_original_max_len > 0 and rope_high_freq_factor > rope_low_freq_factor",
      ),
      (
        not self.attention_windows or len(self.attention_windows) == self.num_layers,
        f"model.attention_windows has {len(self.attention_windows)} entries for num_layers={self.num_layers}",
      ),
      (
        self.activation in ACTIVATIONS,
        f"model.activation must be one of {sorted(ACTIVATIONS)}, got {self.activation!r}",
      ),
      (self.dtype in ("float32", "bfloat16"), f"model.dtype must be 'float32' or 'bfloat16', got {self.dtype!r}"),
      (
        min(self.vocab_size, self.num_layers, self.num_heads, self.d_model, self.d_head, self.d_ff, self.max_len) > 0,
        "model sizes (vocab_size, num_layers, num_heads, d_model, d_head, d_ff, max_len) must be positive",
      ),
      (0.0 <= self.dropout < 1.0 and 0.0 <= self.attention_dropout < 1.0, "model dropout rates must be in [0, 1)"),
    ]
    for ok, message in checks:
      if not ok:
        raise UserError(message)


RUN_SIZES = ("vocab_size", "max_len")  # a run config's data and train sections give these, not its model section


def config_section(**given) -> ml_collections.ConfigDict:
  """A run config's `model` section: every ModelConfig field but RUN_SIZES, at ModelConfig's defaults unless
  `given` (which must also give the fields without one). One source: the keys, defaults and meanings (their
  comments above, read by headspec/cli/config_help.py through `fields_of`) are ModelConfig's own."""
  fields = [f for f in dataclasses.fields(ModelConfig) if f.name not in RUN_SIZES]
  unknown = set(given) - {f.name for f in fields}
  missing = [f.name for f in fields if f.default is dataclasses.MISSING and f.name not in given]
  if unknown or missing:
    raise ValueError(f"config_section: unknown fields {sorted(unknown)}, missing {missing}")
  c = ml_collections.ConfigDict()
  for f in fields:
    setattr(c, f.name, given.get(f.name, f.default))
  return c


config_section.fields_of = ModelConfig


def from_section(model: ml_collections.ConfigDict, vocab_size: int, max_len: int) -> ModelConfig:
  """The ModelConfig a run config's `model` section describes: every field it sets (JSON lists as tuples);
  keys absent from configs written before an option existed keep ModelConfig's defaults, so those describe
  the same model."""
  names = [f.name for f in dataclasses.fields(ModelConfig) if f.name not in RUN_SIZES]
  given = {name: model[name] for name in names if name in model}
  given = {name: tuple(v) if isinstance(v, list | tuple) else v for name, v in given.items()}
  return ModelConfig(vocab_size=vocab_size, max_len=max_len, **given)
