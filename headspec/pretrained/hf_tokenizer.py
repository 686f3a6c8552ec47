"""Tokenizers of imported Hugging Face checkpoints (BERT WordPiece, GPT-2 byte-level BPE, and the
tokenizer.json of RoBERTa and the decoders: Llama, Mistral, Qwen, Gemma, GPT-NeoX, OLMo) via `tokenizers`.

`load_hf_tokenizer(model_dir, family)` reads `tokenizer.json` when the checkpoint has one, else builds the
tokenizer the way transformers' fast-tokenizer converter does: BERT WordPiece from `vocab.txt` (lowercasing,
accent stripping and Chinese-character splitting from `tokenizer_config.json`), GPT-2 byte-level BPE from
`vocab.json` + `merges.txt`. The result implements headspec's `Tokenizer` protocol
(headspec/data/tokenizer.py); `save` writes it into a run's `tokenizer/` folder as kind `huggingface`,
and `load_saved` reads it back, both through etils.epath (a run's folder may be a URL, gs://bucket/run).
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Sequence

import tokenizers
from etils import epath
from tokenizers import decoders, models, normalizers, pre_tokenizers

from headspec.data.tokenizer import INFO_FILE, register_tokenizer_kind
from headspec.errors import UserError
from headspec.io import remote
from headspec.pretrained.config_checks import HFConfig, read_json_object

FAMILIES = ("bert", "gpt2", "roberta", "decoder")  # tokenizer styles; `style_of` maps a model_type to one
TOKENIZER_JSON = "tokenizer.json"
# Special-token roles and their defaults, as in transformers' BertTokenizer and GPT2Tokenizer.
_BERT_SPECIALS = {
  "pad_token": "[PAD]",
  "unk_token": "[UNK]",
  "sep_token": "[SEP]",
  "cls_token": "[CLS]",
  "mask_token": "[MASK]",
}
_GPT2_SPECIALS = {"eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>", "pad_token": None}
_ROBERTA_SPECIALS = {
  "bos_token": "<s>",
  "eos_token": "</s>",
  "unk_token": "<unk>",
  "pad_token": "<pad>",
  "mask_token": "<mask>",
}
# Decoders name their own (Llama-3 '<|begin_of_text|>', Gemma '<bos>', Qwen none): from tokenizer_config.json,
# else config.json's ids. add_bos_token / add_eos_token: None follows tokenizer.json's post-processor.
_DECODER_SPECIALS = {
  "bos_token": None,
  "eos_token": None,
  "unk_token": None,
  "pad_token": None,
  "add_bos_token": None,
  "add_eos_token": None,
}
_SPECIALS = {"bert": _BERT_SPECIALS, "gpt2": _GPT2_SPECIALS, "roberta": _ROBERTA_SPECIALS, "decoder": _DECODER_SPECIALS}


def style_of(model_type: str) -> str:
  """The tokenizer style of a checkpoint's `model_type`: BERT's for BERT and DistilBERT, RoBERTa's, GPT-2's,
  and 'decoder' for the other decoders (BOS/EOS as their tokenizer files say)."""
  return {"bert": "bert", "distilbert": "bert", "roberta": "roberta", "gpt2": "gpt2"}.get(model_type, "decoder")


class HFTokenizer:
  """A `tokenizers.Tokenizer` with headspec's `Tokenizer` interface.

  BERT: prefix [CLS], suffix [SEP], eos [SEP], mask [MASK]. GPT-2: no prefix/suffix, eos = unk =
  <|endoftext|>, pad = eos when the checkpoint names no pad token (as transformers users do), no mask.
  """

  def __init__(self, backend: tokenizers.Tokenizer, family: str, specials: dict[str, str | None], source: str):
    if family not in FAMILIES:
      raise UserError(f"{source}: tokenizer family {family!r} is not one of {FAMILIES}")
    backend.no_truncation()  # tokenizer.json files may carry training-time truncation/padding (MiniLM: 128)
    backend.no_padding()
    self.backend, self.family, self.specials, self.source = backend, family, dict(specials), source
    self.vocab_size: int = backend.get_vocab_size(with_added_tokens=True)

    def token_id(role: str) -> int:
      token = self.specials.get(role)
      token_id = None if token is None else backend.token_to_id(token)
      if token_id is None:
        raise UserError(f"{source}: the tokenizer has no {role} {token!r} in its vocabulary")
      return token_id

    if family == "bert":
      self.pad_id, self.unk_id, self.eos_id = token_id("pad_token"), token_id("unk_token"), token_id("sep_token")
      self.mask_id: int | None = token_id("mask_token")
      self.prefix_ids: tuple[int, ...] = (token_id("cls_token"),)
      self.suffix_ids: tuple[int, ...] = (self.eos_id,)
    elif family == "roberta":
      self.pad_id, self.unk_id, self.eos_id = token_id("pad_token"), token_id("unk_token"), token_id("eos_token")
      self.mask_id = token_id("mask_token")
      self.prefix_ids, self.suffix_ids = (token_id("bos_token"),), (self.eos_id,)
    elif family == "decoder":
      if self.specials.get("eos_token") is None:
        raise UserError(
          f"{source}: no end-of-text token (tokenizer_config.json names no eos_token, and config.json's "
          "eos_token_id is absent or outside the vocabulary); name it in tokenizer_config.json"
        )
      self.eos_id = token_id("eos_token")
      known = lambda role: self.specials.get(role) is not None and backend.token_to_id(self.specials[role]) is not None
      self.unk_id = token_id("unk_token") if known("unk_token") else self.eos_id
      self.pad_id = token_id("pad_token") if known("pad_token") else self.eos_id
      self.mask_id = None
      self.prefix_ids, self.suffix_ids = self._added_specials(token_id)
    else:
      self.eos_id, self.unk_id = token_id("eos_token"), token_id("unk_token")
      self.pad_id = self.eos_id if self.specials.get("pad_token") is None else token_id("pad_token")
      self.mask_id, self.prefix_ids, self.suffix_ids = None, (), ()

  def _added_specials(self, token_id) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """A decoder's (prefix, suffix) ids: what tokenizer.json's post-processor adds around a text, with BOS
    and EOS added or removed where tokenizer_config.json's add_bos_token / add_eos_token say so."""
    plain = self.backend.encode("a", add_special_tokens=False).ids
    full = self.backend.encode("a", add_special_tokens=True).ids
    at = next((i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain), 0)
    prefix, suffix = list(full[:at]), list(full[at + len(plain) :])
    for role, ids, add in (("bos_token", prefix, "add_bos_token"), ("eos_token", suffix, "add_eos_token")):
      wanted = self.specials.get(add)
      if wanted is None:
        continue
      special = token_id(role) if wanted or self.specials.get(role) is not None else None
      if wanted and special not in ids:
        ids.insert(0 if role == "bos_token" else len(ids), special)
      elif not wanted and special in ids:
        ids.remove(special)
    return tuple(prefix), tuple(suffix)

  def encode(self, text: str) -> list[int]:
    return self.backend.encode(text, add_special_tokens=False).ids

  def word_pieces(self, words: Sequence[str]) -> list[list[int]]:
    # GPT-2's pre-tokenizer regex attaches the preceding space to a word (` ?\p{L}+`) and never joins pieces
    # across a space, so " word" encodes exactly as the word does inside running text. BERT splits on
    # whitespace first, so a word alone encodes as in text. Words that normalise to nothing get [unk].
    if self.family == "decoder":
      return self._pieces_by_offsets(words)
    texts = [word if i == 0 or self.family == "bert" else " " + word for i, word in enumerate(words)]
    encodings = self.backend.encode_batch(texts, add_special_tokens=False) if texts else []
    return [encoding.ids or [self.unk_id] for encoding in encodings]

  def _pieces_by_offsets(self, words: Sequence[str]) -> list[list[int]]:
    """Each word's pieces in `encode(" ".join(words))`, by the pieces' character offsets: decoders'
    tokenizers differ in where a space goes (byte-level BPE joins it to the next word, SentencePiece marks
    it with '▁'), so the joined text is encoded once and cut; a piece of spaces only goes to the next word."""
    if not words:
      return []
    ends, position = [], -1
    for word in words:
      position += 1 + len(word)
      ends.append(position)
    encoding = self.backend.encode(" ".join(words), add_special_tokens=False)
    pieces: list[list[int]] = [[] for _ in words]
    word = 0
    for piece, (start, _) in zip(encoding.ids, encoding.offsets, strict=True):
      while word < len(words) - 1 and start >= ends[word]:
        word += 1
      pieces[word].append(piece)
    return [p or [self.unk_id] for p in pieces]

  def decode(self, ids: Sequence[int]) -> str:
    return self.backend.decode([int(i) for i in ids], skip_special_tokens=True)

  def save(self, out_dir: str | os.PathLike) -> None:
    """Writes tokenizer.json and headspec_tokenizer.json (kind `huggingface`) for `load_tokenizer`; each
    file whole (`out_dir` may be a URL)."""
    out_dir = epath.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    remote.write_bytes_atomic(out_dir / TOKENIZER_JSON, self.backend.to_str(pretty=True).encode())  # as backend.save
    info = dict(
      kind="huggingface", family=self.family, specials=self.specials, vocab_size=self.vocab_size, source=self.source
    )
    remote.write_bytes_atomic(out_dir / INFO_FILE, (json.dumps(info, indent=1) + "\n").encode())  # last: the marker

  def __repr__(self) -> str:
    return f"HFTokenizer({self.source}, family={self.family}, vocab_size={self.vocab_size})"


def load_saved(tokenizer_dir, info: dict) -> HFTokenizer:
  """Loader for `headspec.data.tokenizer.load_tokenizer` (kind `huggingface`, written by `HFTokenizer.save`);
  `tokenizer_dir` may be a URL."""
  path = epath.Path(tokenizer_dir) / TOKENIZER_JSON
  missing = [key for key in ("family", "specials") if key not in info]
  if missing:
    raise UserError(f"{epath.Path(tokenizer_dir) / INFO_FILE}: no {missing[0]!r} key; the file is damaged")
  return HFTokenizer(_from_file(path), info["family"], info["specials"], str(path))


register_tokenizer_kind("huggingface", "headspec.pretrained.hf_tokenizer:load_saved")


def _read_json(path) -> dict:
  """A tokenizer settings file or config.json: a UTF-8 JSON object, else one line naming the file."""
  return read_json_object(path)


_FLAGS = ("do_lower_case", "tokenize_chinese_chars", "do_basic_tokenize")
_OPTIONAL_FLAGS = ("strip_accents", "add_bos_token", "add_eos_token", "add_prefix_space")  # null: the default
_ROLES = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


def _checked_settings(path) -> dict:
  """tokenizer_config.json / special_tokens_map.json with the keys read here checked (types), one line
  naming the file and the key: a flag of "yes" or a special token given as a list is refused."""
  settings = _read_json(path)
  keys = HFConfig(settings, path)
  for key in _FLAGS + _OPTIONAL_FLAGS:
    if key in settings and not (settings[key] is None and key in _OPTIONAL_FLAGS):
      keys.flag(key, False)
  for role in _ROLES:
    if settings.get(role) is not None and not isinstance(_token_text(settings[role]), str):
      keys.fail(role, 'must be a token (a string, or {"content": a string})')
  return settings


def _token_text(value) -> str | None:
  """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
  return value.get("content") if isinstance(value, dict) else value


def _from_file(path) -> tokenizers.Tokenizer:
  """A tokenizer.json, read through etils.epath (local or a URL)."""
  try:
    text = epath.Path(path).read_bytes().decode("utf-8")
  except (OSError, UnicodeDecodeError) as e:
    raise UserError(f"{path}: not a readable tokenizers JSON file ({e})") from None
  try:
    return tokenizers.Tokenizer.from_str(text)
  except Exception as e:  # tokenizers raises a bare Exception on malformed files
    raise UserError(f"{path}: not a readable tokenizers JSON file ({str(e).splitlines()[0]})") from None


def _fill_from_config(model_dir: pathlib.Path, backend: tokenizers.Tokenizer, specials: dict) -> None:
  """BOS/EOS tokens that tokenizer_config.json does not name, from config.json's bos_token_id / eos_token_id."""
  config = model_dir / "config.json"
  hf = _read_json(config) if config.is_file() else {}
  vocab_size = hf.get("vocab_size")
  for role, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id")):
    token_id = hf.get(key)
    token_id = token_id[0] if isinstance(token_id, list) and token_id else token_id
    if isinstance(token_id, int) and isinstance(vocab_size, int) and not 0 <= token_id < vocab_size:
      continue  # outside the model's vocabulary: absent (checkpoint.read_config warned once)
    if specials.get(role) is None and isinstance(token_id, int) and not isinstance(token_id, bool):
      specials[role] = backend.id_to_token(token_id)
      if specials[role] is None:  # an id in the rows a decoder pads its embeddings with, or past them
        raise UserError(
          f"{config}: {key}={token_id} is outside the tokenizer's vocabulary "
          f"({backend.get_vocab_size(with_added_tokens=True)} tokens)"
        )


def _bert_wordpiece(model_dir: pathlib.Path, settings: dict, specials: dict) -> tokenizers.Tokenizer:
  """BertTokenizer as transformers' BertConverter builds it (BasicTokenizer normaliser + WordPiece)."""
  if settings.get("do_basic_tokenize", True) is False:
    raise UserError(f"{model_dir / 'tokenizer_config.json'}: do_basic_tokenize=false is not supported")
  vocab_file = model_dir / "vocab.txt"
  try:
    wordpiece = models.WordPiece.from_file(
      os.fspath(vocab_file), unk_token=specials["unk_token"], max_input_chars_per_word=100
    )
  except Exception as e:
    raise UserError(f"{vocab_file}: not a readable WordPiece vocabulary ({str(e).splitlines()[0]})") from None
  backend = tokenizers.Tokenizer(wordpiece)
  lowercase = settings.get("do_lower_case", True)
  backend.normalizer = normalizers.BertNormalizer(
    clean_text=True,
    handle_chinese_chars=settings.get("tokenize_chinese_chars", True),
    strip_accents=settings.get("strip_accents"),
    lowercase=lowercase,
  )  # strip_accents None follows lowercase
  backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
  backend.decoder = decoders.WordPiece(prefix="##")
  return backend


def _gpt2_bpe(model_dir: pathlib.Path, settings: dict) -> tokenizers.Tokenizer:
  """GPT2Tokenizer as transformers' GPT2Converter builds it (byte-level pre-tokenizer + BPE)."""
  vocab_file, merges_file = model_dir / "vocab.json", model_dir / "merges.txt"
  try:
    bpe = models.BPE.from_file(os.fspath(vocab_file), os.fspath(merges_file))
  except Exception as e:
    raise UserError(f"{vocab_file}, {merges_file}: not a readable BPE vocabulary ({str(e).splitlines()[0]})") from None
  backend = tokenizers.Tokenizer(bpe)
  backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=settings.get("add_prefix_space") or False)
  backend.decoder = decoders.ByteLevel()
  return backend


def load_hf_tokenizer(model_dir: str | os.PathLike, family: str) -> HFTokenizer:
  """The checkpoint's tokenizer: tokenizer.json if present, else vocab.txt (BERT) / vocab.json+merges.txt (GPT-2).

  `family`: a tokenizer style (FAMILIES) or a model_type (`style_of`). RoBERTa and the decoders need
  tokenizer.json; a decoder's BOS/EOS come from tokenizer_config.json, else config.json's token ids."""
  model_dir = pathlib.Path(model_dir)
  family = family if family in FAMILIES else style_of(family)
  if family not in FAMILIES:
    raise UserError(f"{model_dir}: tokenizer family {family!r} is not one of {FAMILIES}")
  settings = {}
  for name in ("special_tokens_map.json", "tokenizer_config.json"):  # the latter wins, as in transformers
    if (model_dir / name).is_file():
      settings.update(_checked_settings(model_dir / name))
  specials = dict(_SPECIALS[family])
  specials.update({role: _token_text(settings[role]) for role in specials if role in settings})

  if (model_dir / TOKENIZER_JSON).is_file():
    backend = _from_file(model_dir / TOKENIZER_JSON)
    if family == "decoder":
      _fill_from_config(model_dir, backend, specials)
    return HFTokenizer(backend, family, specials, str(model_dir / TOKENIZER_JSON))
  if family in ("roberta", "decoder"):
    raise UserError(f"{model_dir}: no {TOKENIZER_JSON} (needed for this model's tokenizer)")
  needed = ("vocab.txt",) if family == "bert" else ("vocab.json", "merges.txt")
  missing = [name for name in needed if not (model_dir / name).is_file()]
  if missing:
    raise UserError(
      f"{model_dir}: no tokenizer files (need {TOKENIZER_JSON} or {' + '.join(needed)}; missing {', '.join(missing)})"
    )
  backend = _bert_wordpiece(model_dir, settings, specials) if family == "bert" else _gpt2_bpe(model_dir, settings)
  # Special tokens written in text map to their ids and are never split, as in transformers.
  present = [token for token in dict.fromkeys(specials.values()) if token and backend.token_to_id(token) is not None]
  backend.add_special_tokens([tokenizers.AddedToken(token, special=True, normalized=False) for token in present])
  return HFTokenizer(backend, family, specials, str(model_dir / needed[0]))
