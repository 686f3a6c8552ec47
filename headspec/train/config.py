"""Every training config key with its default. Config files in configs/ start from `train_config()` and
override what they change, so each key is declared (and documented) once."""

from __future__ import annotations

import ml_collections

from headspec.data import data_dir_default


def train_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.mesh = ""  # data=N,fsdp=N,tensor=N (docs/scale.md); '': training data-parallel, analyses on one device
  c.seed = 0  # the initial parameters, the tokenizer sample, the batches' order, dropout and masking
  c.data_dir = data_dir_default()  # holds text/<corpus>/ and ud/<treebank>/
  c.parallelism = "jit"  # 'jit' (NamedSharding mesh over all devices) | 'pmap'
  c.multihost = False  # call jax.distributed.initialize() (TPU pods, SLURM)

  c.data = ml_collections.ConfigDict()
  # A folder under data_dir/text/ ('wikitext_103', 'wikitext_2': `headspec data download text NAME`;
  # any other: train.txt + valid.txt you write, docs/data.md), or 'tfds:<catalog name>'.
  c.data.corpus = "wikitext_103"
  c.data.vocab_size = 8000  # SentencePiece vocabulary trained on the corpus
  c.data.tfds_dir = ""  # where TFDS builders write; '' = data_dir/tfds
  # Induction heads (headspec/data/repeats.py RepeatRows): this fraction of each training batch's rows are
  # repeated random sequences of the corpus' own ids, each row seq_len / repeat_chunk of them (0: one).
  # Evaluation rows stay the corpus' text.
  c.data.repeat_rows = 0.0
  c.data.repeat_chunk = 0  # a repeat row's chunk length (BOS, a sequence twice): divides seq_len, >= 11; 0 = seq_len

  c.model = ml_collections.ConfigDict()
  c.model.kind = "decoder"  # 'encoder' (masked LM) | 'decoder' (causal LM)
  c.model.num_layers = 6  # transformer blocks (L)
  c.model.num_heads = 8  # attention heads per block (H)
  c.model.d_model = 256  # width of the residual stream (D)
  c.model.d_head = 32  # may differ from d_model / num_heads
  c.model.d_ff = 1024  # hidden width of each MLP (F)
  c.model.mlp = True  # False: attention-only decoder/encoder (no MLP sublayers; d_ff is then ignored)
  c.model.dropout = 0.1  # dropout on the embeddings and each sublayer's output while training; 0 = none
  c.model.attention_dropout = 0.1  # dropout on the attention probabilities while training; 0 = none
  c.model.pre_layernorm = True  # norm before each sublayer (GPT-2); False: after the residual add (BERT)
  c.model.positions = "learned"  # 'learned' | 'sinusoidal'
  c.model.tie_embeddings = True  # the unembedding is the token embedding transposed; False: its own matrix
  c.model.activation = "gelu_tanh"  # 'gelu_exact' | 'gelu_tanh' | 'relu' | 'silu'
  c.model.dtype = "float32"  # compute dtype: 'float32' | 'bfloat16'
  # Modern-decoder options (docs/pretrained.md, configs/base_llama.py), each a ModelConfig field; these
  # defaults are GPT-2/BERT's model, so configs that leave them alone train the same model as before.
  c.model.norm = "layernorm"  # 'layernorm' | 'rmsnorm' (every norm of the model)
  c.model.num_kv_heads = 0  # grouped-query attention: K/V heads shared by num_heads / num_kv_heads each; 0 = none
  c.model.gated_mlp = False  # act(x W_gate) * (x W_in) W_out: SwiGLU with activation 'silu', GeGLU with 'gelu_tanh'
  c.model.parallel_residual = False  # x + attn(ln1(x)) + mlp(ln2(x)) (GPT-NeoX)
  c.model.sublayer_norm = False  # a norm on each sublayer's output before the residual add (Gemma-2, OLMo-2)
  c.model.qk_norm = "none"  # 'none' | 'head' (Qwen3) | 'full' (OLMo-2): RMSNorm of queries and keys
  c.model.attention_bias = True  # biases of W_Q, W_K, W_V
  c.model.attention_out_bias = True  # bias of W_O
  c.model.mlp_bias = True  # biases of the MLP's matrices
  c.model.rope_theta = 10000.0  # positions='rotary': base of the rotation frequencies
  c.model.rotary_fraction = 1.0  # the leading fraction of each head's features that rotate (GPT-NeoX rotary_pct)
  c.model.rope_scaling = "none"  # 'none' | 'linear' | 'llama3' (Llama-3.1's frequency-dependent scaling)
  c.model.rope_factor = 1.0  # rope_scaling's factor: frequencies divided by it ('linear': all; 'llama3': the low ones)
  c.model.rope_low_freq_factor = 1.0  # 'llama3' only: wavelengths above rope_original_max_len / this are scaled
  c.model.rope_high_freq_factor = 4.0  # 'llama3' only: wavelengths below rope_original_max_len / this are kept
  c.model.rope_original_max_len = 0  # rope_scaling='llama3' only: the context the frequencies were trained for
  c.model.attention_scale = 0.0  # the attention logits' scale; 0 = d_head ** -0.5
  c.model.attention_softcap = 0.0  # cap * tanh(logits / cap) on attention logits; 0 = none (Gemma-2)
  c.model.final_softcap = 0.0  # the same on the output logits; 0 = none (Gemma-2)
  c.model.scale_embeddings = False  # token embeddings times sqrt(d_model) (Gemma)
  c.model.attention_windows = ()  # per layer: a token sees the last w tokens only (w > 0), 0 = all; () = all
  c.model.clip_qkv = 0.0  # clamp q, k, v to [-c, c]; 0 = none (OLMo)
  c.model.pretrained = ""  # 'minilm' or a Hugging Face-format directory; '' trains from scratch

  c.train = ml_collections.ConfigDict()
  c.train.steps = 10000  # optimizer steps in all (a resumed run continues up to it)
  c.train.batch_size = 64  # global, over all devices and hosts
  c.train.seq_len = 128  # tokens per training row
  c.train.learning_rate = 5e-4  # AdamW's peak rate, after warmup; cosine decay to 10% of it at train.steps
  c.train.warmup_steps = 500  # linear warmup from 0 to learning_rate over these first steps
  c.train.weight_decay = 0.01  # AdamW's decoupled weight decay, on matrices only (not biases or norms)
  c.train.grad_clip = 1.0  # gradients clipped to this global L2 norm (> 0)
  c.train.mlm_probability = 0.15  # encoder only: the fraction of tokens masked for the masked-LM loss (BERT's 15%)
  c.train.log_every = 50  # a metrics.jsonl record (loss, perplexity, learning rate, ...) every N steps
  c.train.eval_every = 500  # validation loss and perplexity every N steps (and at the last); 0: never
  c.train.eval_batches = 20  # validation batches (of batch_size rows) per evaluation
  c.train.diversity_every = 0  # 0: off; else head-diversity metrics on a held-out batch every N steps
  c.train.checkpoint_every = 1000  # an Orbax checkpoint every N steps (and at the last step)
  c.train.keep_last = 3  # the newest checkpoints kept (>= 1); older ones are deleted unless in keep_steps
  c.train.keep_steps = ()  # steps always kept, for studies over training
  c.train.regularizers = ml_collections.ConfigDict()
  c.train.regularizers.subspace = 0.0  # disagreement on value vectors (Li et al. 2018)
  c.train.regularizers.position = 0.0  # disagreement on attention maps (Li et al. 2018)
  c.train.regularizers.output = 0.0  # disagreement on head outputs Z_h (Li et al. 2018)
  c.train.regularizers.query_orthogonality = 0.0  # inter-head orthogonality of W_Q
  c.train.regularizers.drophead = 0.0  # DropHead p (Zhou et al. 2020)
  c.train.regularizers.drophead_schedule = "constant"  # 'constant' | 'v' (scheduled DropHead)
  c.train.regularizers.drophead_turn = 0.5  # 'v': the turning point, a fraction of train.steps (Zhou et al. §3.2)
  return c
