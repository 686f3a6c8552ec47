"""Every training config key with its default. Config files in configs/ start from `train_config()` and
override what they change, so each key is declared (and documented) once."""

from __future__ import annotations

import ml_collections

from headspec.data import data_dir_default
from headspec.model.config import config_section


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

  # Every ModelConfig field (headspec/model/config.py: their defaults and meanings) but vocab_size and max_len
  # (data.vocab_size, train.seq_len); a config file overrides what it changes (configs/base_llama.py).
  c.model = config_section(
    kind="decoder", num_layers=6, num_heads=8, d_model=256, d_head=32, d_ff=1024, dropout=0.1, attention_dropout=0.1
  )
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
