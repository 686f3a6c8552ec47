"""The sparse autoencoder: f = σ(W_enc (x − b_dec) + b_enc), x̂ = W_dec f + b_dec.

σ is ReLU (Bricken et al. 2023, "Towards Monosemanticity"; trained with an L1 penalty), TopK: keep the k
largest pre-activations, ReLU'd, zero the rest (Gao et al. 2024, "Scaling and evaluating sparse
autoencoders"), or JumpReLU: π·H(π − θ_f), a learned threshold θ_f per feature (Rajamanoharan et al. 2024,
"Jumping Ahead: Improving Reconstruction Fidelity with JumpReLU Sparse Autoencoders"; trained through
straight-through estimators, headspec/sae/train.py). Subtracting b_dec before encoding is both papers' pre-encoder bias. Decoder rows W_dec[f]
(one per feature, the "columns" of the papers' W_dec) are kept at unit norm by training, so a feature's
activation is its coefficient along a unit direction. Trained with `normalize='per_head'` (headspec/sae/train.py)
the rows are unit in the coordinates it trained in, each head's block of x at unit RMS; the returned SAE reads
raw x, so its W_dec rows are those times each coordinate's scale, and `trained_decoder_FK` gives them back.

Here K is the input width (for the concatenated z of a layer, H·K of the model) and F the features.
"""

from __future__ import annotations

import functools

import flax
import jax
import jax.numpy as jnp
import numpy as np

KINDS = ("topk", "relu", "jumprelu")


def topk_activation(pre_NF, k: int):
  """ReLU of the k largest entries of each row, zeros elsewhere (Gao et al. 2024, eq. 2)."""
  values_Nk, index_Nk = jax.lax.top_k(pre_NF, k)
  rows_N1 = jnp.arange(pre_NF.shape[0])[:, None]
  return jnp.zeros_like(pre_NF).at[rows_N1, index_Nk].set(jax.nn.relu(values_Nk))


def activate(pre_NF, kind: str, k: int, threshold_F=None):
  if kind == "topk":
    return topk_activation(pre_NF, k)
  if kind == "jumprelu":
    return pre_NF * (pre_NF > threshold_F)
  return jax.nn.relu(pre_NF)


def pre_activations(params: dict, x_NK):
  return (x_NK - params["b_dec_K"]) @ params["W_enc_KF"] + params["b_enc_F"]


def reconstruct(params: dict, f_NF):
  return f_NF @ params["W_dec_FK"] + params["b_dec_K"]


@flax.struct.dataclass
class SAE:
  """A trained SAE (arrays in float32). `encode(x_NK)` -> f_NF, `decode(f_NF)` -> x̂_NK, `__call__` both.

  kind: 'topk' | 'relu' | 'jumprelu'; k: active features per input for TopK (0 otherwise); threshold_F:
  JumpReLU's θ (None otherwise). head_scale_K: with per-head normalisation, each input coordinate's scale
  s_h / s (its head's RMS over the global one), folded into W_enc and W_dec; None: one global scale, folded
  into the biases only. `info`: how it was trained (steps, final loss, input scales), for the record.
  hook_name: the TransformerLens hook it reads ('blocks.3.attn.hook_z'; '' unknown), set by `headspec sae` and
  by `headspec.load_sae`; `layer` and `site` come from it. `save(dir)` writes SAELens's layout (layout.py).
  """

  W_enc_KF: jax.Array
  b_enc_F: jax.Array
  W_dec_FK: jax.Array
  b_dec_K: jax.Array
  threshold_F: jax.Array | None = None
  head_scale_K: jax.Array | None = None
  kind: str = flax.struct.field(pytree_node=False, default="topk")
  k: int = flax.struct.field(pytree_node=False, default=0)
  info: dict = flax.struct.field(pytree_node=False, default_factory=dict)
  hook_name: str = flax.struct.field(pytree_node=False, default="")

  @property
  def params(self) -> dict:
    return dict(W_enc_KF=self.W_enc_KF, b_enc_F=self.b_enc_F, W_dec_FK=self.W_dec_FK, b_dec_K=self.b_dec_K)

  @property
  def trained_decoder_FK(self):
    """W_dec in the coordinates it trained in (unit rows): W_dec_FK / head_scale_K."""
    return self.W_dec_FK if self.head_scale_K is None else self.W_dec_FK / self.head_scale_K

  @property
  def num_features(self) -> int:
    return int(self.W_dec_FK.shape[0])

  @property
  def width(self) -> int:
    return int(self.W_dec_FK.shape[1])

  def encode(self, x_NK):
    """Feature activations f_NF (≥ 0; at most k nonzero per row for TopK)."""
    return _encode(self.params, jnp.asarray(x_NK, jnp.float32), self.threshold_F, self.kind, self.k)

  def decode(self, f_NF):
    return reconstruct(self.params, jnp.asarray(f_NF, jnp.float32))

  def __call__(self, x_NK):
    return self.decode(self.encode(x_NK))

  def numpy(self) -> dict[str, np.ndarray]:
    return {name: np.asarray(value) for name, value in self.params.items()}

  @property
  def layer(self) -> int:
    """The block it reads, from `hook_name` (UserError when unknown)."""
    from headspec.sae import layout

    return layout.parse_hook(self.hook_name)[1]

  @property
  def site(self) -> str:
    """The site it reads ('z' for hook_z), from `hook_name`."""
    from headspec.sae import layout

    return layout.parse_hook(self.hook_name)[0]

  def save(self, directory, *, hook_name: str | None = None, layer: int | None = None, model_name: str = ""):
    """Writes SAELens's folder (cfg.json, sae_weights.safetensors; headspec/sae/saelens.py) at `directory` and
    returns it. The hook: `hook_name`, else blocks.<layer>.attn.hook_z for `layer`, else the SAE's own."""
    from headspec.sae import layout

    if hook_name is None and layer is not None:
      hook_name = layout.hook_name("z", layer)
    return layout.save(self, directory, hook_name=hook_name, model_name=model_name)


@functools.partial(jax.jit, static_argnames=("kind", "k"))
def _encode(params, x_NK, threshold_F, kind: str, k: int):
  return activate(pre_activations(params, x_NK), kind, k, threshold_F)
