"""Every `headspec attention` config key with its default. configs/attention_ewt.py starts from
`attention_config()` and overrides what it changes, so each key is declared (and documented) once;
`synthetic_attention_config` is what `attention_quickstart` runs."""

from __future__ import annotations

import ml_collections

from headspec.attention.clark import ARC_SETS
from headspec.attention.roles import LABELS, check_labels
from headspec.data import data_dir_default
from headspec.errors import UserError
from headspec.runs.target_config import add_target_keys


def attention_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  add_target_keys(c)  # mesh, multihost, steps, model_name, model.pretrained, model.dtype
  c.seed = 0  # bootstrap resamples
  c.data_dir = data_dir_default()  # holds ud/<treebank>/; '' = the run's own data_dir, then HEADSPEC_DATA_DIR
  c.treebank = "en_ewt"  # data_dir/ud/<treebank>/ with the splits below; '' = no treebank analyses (Clark
  #                        tables, treebank roles, pictures): only the induction scores below
  c.select_split = "dev"  # best heads and baseline offsets are chosen here (also the split roles are scored on)
  c.report_split = "test"  # ... and reported here ('' = only the selection split)
  c.max_sentences = 0  # 0: every sentence of a split; else its first N (tests, quick looks)
  c.batch_tokens = 2048  # padded tokens per forward batch (memory: L·H·batch_tokens·T attention weights)

  c.clark = ml_collections.ConfigDict()
  c.clark.min_count = 100  # relations with at least this many non-root arcs in the selection split (Clark et al.)
  c.clark.relations = ()  # () = every relation reaching min_count; else only these (subtype-free names, 'all')
  c.clark.arcs = "auto"  # 'auto': decoders on reachable arcs, encoders on all | 'reachable': both | 'all' (encoders)
  c.clark.max_offset = 5  # baselines: fixed relative offsets k in -max_offset..max_offset, k != 0

  c.roles = ml_collections.ConfigDict()
  c.roles.labels = LABELS  # labels to assign, any of roles.LABELS
  c.roles.positional_min = 0.9  # Voita et al. 2019: argmax on one relative position (±1) for >= 90% of queries
  c.roles.delimiter_min = 0.5  # attention on special tokens + punctuation (Clark et al. 2019 §3)
  c.roles.broad_min = 0.8  # entropy / uniform-attention entropy at or above: `broad`
  c.roles.focused_max = 0.3  # ... at or below: `focused`
  c.roles.rare_word_min = 0.5  # argmax on the least frequent visible word for >= this share of queries
  c.roles.syntactic_margin_min = 0.1  # best relation's Clark accuracy minus its offset baseline
  c.roles.frequency_corpus = ""  # '' = the run's training corpus (pretrained: <treebank> train split);
  #                                'treebank' = <treebank> train; else a folder under data_dir/text/
  c.roles.bootstrap_resamples = 1000  # resamples of sentences for the 95% CIs

  c.pictures = ml_collections.ConfigDict()
  c.pictures.split = "dev"  # the example sentences come from this split of <treebank>
  c.pictures.sentences = (0, 1, 2)  # their indices in it ('()' = no pictures)
  c.pictures.line_layer = -1  # the layer of the line view; -1 = the middle layer (L // 2)
  c.pictures.max_words = 40  # words shown per sentence (longer ones are cut in the picture only)
  c.pictures.flow_max_tokens = 24  # rollout + flow for the first example sentence with at most this many tokens

  # Induction heads (Olsson et al. 2022) and their parts: headspec/attention/induction.py, docs/attention.md.
  c.induction = ml_collections.ConfigDict()
  c.induction.enabled = "auto"  # 'auto': decoders yes, encoders skipped | 'on' (an encoder is an error) | 'off'
  c.induction.n = 50  # repeat length of [BOS] r_1..r_n r_1..r_n (2n + 1 tokens must fit the context)
  c.induction.num_sequences = 200  # repeated random sequences (one seeded draw, the same at every step)
  c.induction.seed = 0  # their draw (the bootstrap uses `seed`)
  # Where r_1..r_n come from: 'vocabulary' (every non-special id, as Olsson et al.) or 'text' (the ids that
  # occur in the natural-text rows below; a small run's tokenizer holds pieces its text never uses, such
  # as SentencePiece's 256 byte pieces, whose untrained embeddings make the sequence unlike anything seen).
  c.induction.draw = "vocabulary"
  c.induction.batch_size = 50  # sequences per compiled forward
  c.induction.natural_text = True  # also score attention on natural text (the run's evaluation split)
  c.induction.num_tokens = 16384  # natural text: the first num_tokens tokens of that split (whole rows)
  c.induction.corpus = "wikitext_103"  # pretrained decoders: the valid split of data_dir/text/<corpus>
  c.induction.seq_len = 128  # pretrained decoders: tokens per natural-text row
  c.induction.icl = True  # ICL score and loss by position on natural text (needs a trained LM head)
  c.induction.label_min = 0.4  # label previous_token / duplicate_token / induction at score >= (repeated_random)
  c.induction.copying_min = 0.4  # label copying at copying score >= (weights)
  c.induction.formation_threshold = 0.4  # formation window: the best induction score crosses this
  c.induction.causal = induction_causal_config()  # top-k induction heads ablated (below)
  return c


def names(value) -> tuple[str, ...]:
  """A tuple of names from a config value: ('a', 'b'), 'a,b' or ('a,b',) (how a command-line override arrives)."""
  items = [value] if isinstance(value, str) else list(value)
  return tuple(x.strip() for item in items for x in str(item).split(",") if x.strip())


def check_config(config) -> None:
  """Every value `run.run` reads; UserError on the first bad one (before any model runs). Name
  lists given as 'a,b' on the command line are split into tuples here."""
  c = config
  c.roles.labels = names(c.roles.labels)
  c.clark.relations = names(c.clark.relations)
  check_labels(c.roles.labels)
  if c.clark.arcs not in ARC_SETS:
    raise UserError(f"clark.arcs={c.clark.arcs!r}: use one of {', '.join(ARC_SETS)}")
  if c.clark.min_count < 1 or c.clark.max_offset < 1:
    raise UserError("clark.min_count and clark.max_offset must be >= 1")
  if c.batch_tokens < 1 or c.roles.bootstrap_resamples < 1 or c.max_sentences < 0:
    raise UserError("batch_tokens and roles.bootstrap_resamples must be >= 1, max_sentences >= 0")
  if not c.select_split:
    raise UserError("select_split must name a split (dev)")
  if any(int(i) < 0 for i in c.pictures.sentences):
    raise UserError(f"pictures.sentences={tuple(c.pictures.sentences)}: indices must be >= 0")
  i = c.induction
  i.enabled = {"true": "on", "false": "off"}.get(str(i.enabled).lower(), str(i.enabled).lower())
  if i.enabled not in ("auto", "on", "off"):
    raise UserError(f"induction.enabled={i.enabled!r}: use 'auto', 'on' or 'off'")
  if i.draw not in ("vocabulary", "text"):
    raise UserError(f"induction.draw={i.draw!r}: use 'vocabulary' or 'text'")
  if i.n < 1 or i.num_sequences < 2 or i.batch_size < 1 or i.num_tokens < 1 or i.seq_len < 2:
    raise UserError("induction.n, batch_size, num_tokens must be >= 1, num_sequences >= 2, seq_len >= 2")
  if i.causal.steps not in ("all", "last"):
    raise UserError(f"induction.causal.steps={i.causal.steps!r}: use 'all' or 'last'")
  i.causal.methods = names(i.causal.methods)
  bad = [m for m in i.causal.methods if m not in ("zero", "mean")]
  if bad or any(int(k) < 1 for k in i.causal.ks) or i.causal.random_seeds < 1 or i.causal.num_sequences < 2:
    raise UserError(
      "induction.causal: methods from zero, mean; ks >= 1; random_seeds >= 1; num_sequences >= 2 "
      f"(got methods={tuple(i.causal.methods)}, ks={tuple(i.causal.ks)})"
    )


def synthetic_attention_config(data_dir: str) -> ml_collections.ConfigDict:
  """The quickstart's attention study: the synthetic treebank in `data_dir`, the last step, small bars."""
  c = attention_config()
  c.data_dir = data_dir
  c.treebank = "synthetic"
  c.clark.min_count = 20
  c.roles.bootstrap_resamples = 200
  c.pictures.sentences = (0, 1)
  return c


def induction_causal_config() -> ml_collections.ConfigDict:
  """The causal check of induction heads (kind=induction rows of ablation/causal.csv; headspec/ablation/causal.py
  `induction_rows`), which `headspec attention` runs for decoders as `induction.causal` (its scores pick
  the heads)."""
  c = ml_collections.ConfigDict()
  c.enabled = True  # ablate the top-k induction heads after scoring them (decoders with a trained LM head)
  c.ks = (1, 2, 4)  # how many of the best induction heads (repeated_random induction score) are ablated
  c.methods = ("zero", "mean")  # zero: Z_h = 0; mean: Z_h = its mean over the repeated sequences' tokens
  c.random_seeds = 5  # random head sets per k and control (layer-matched, and unlabelled: no role label)
  c.num_sequences = 100  # sequences measured: the first of the second half of induction.num_sequences (the first half chooses the heads)
  c.steps = "all"  # 'all': at every analysed step; 'last': at each model's last analysed step only
  return c
