"""Synthetic treebank: determinism, valid trees, and known answers for the grammar's UD rules."""

import collections
import time

import conllu
import pytest

from headspec.data import synthetic, treebank

SIZES = dict(num_train=1000, num_dev=60, num_test=60, num_text_sentences=500)


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
  return synthetic.write_synthetic(tmp_path_factory.mktemp("synth"), seed=3, **SIZES)


@pytest.fixture(scope="module")
def train(synth_dir):
  return treebank.load_split(synth_dir, "synthetic", "train")


def _files(root):
  return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_layout_and_determinism(synth_dir, tmp_path):
  files = _files(synth_dir)
  assert sorted(files) == [
    "text/synthetic/train.txt",
    "text/synthetic/valid.txt",
    "ud/synthetic/synthetic-ud-dev.conllu",
    "ud/synthetic/synthetic-ud-test.conllu",
    "ud/synthetic/synthetic-ud-train.conllu",
  ]
  assert _files(synthetic.write_synthetic(tmp_path / "again", seed=3, **SIZES)) == files
  other = _files(synthetic.write_synthetic(tmp_path / "other", seed=4, **SIZES))
  assert all(other[name] != files[name] for name in files)


def test_splits_are_valid_trees(synth_dir):
  assert treebank.available_splits(synth_dir, "synthetic") == ["train", "dev", "test"]
  for split, count in (("train", 1000), ("dev", 60), ("test", 60)):
    sentences = treebank.load_split(synth_dir, "synthetic", split)  # validates every tree
    assert len(sentences) == count
    assert all(3 <= len(s.words) <= 30 for s in sentences)
    assert len({s.sent_id for s in sentences}) == count


def test_conllu_columns_and_text_comment(synth_dir):
  path = synth_dir / "ud/synthetic/synthetic-ud-dev.conllu"
  for tokens in conllu.parse(path.read_text(encoding="utf-8")):
    text = ""
    for token in tokens:
      assert token["feats"] is None and token["deps"] is None and token["lemma"]
      assert token["xpos"] in _PENN_TAGS
      space = "" if token["misc"] == {"SpaceAfter": "No"} else " "
      text += token["form"] + space
    assert tokens.metadata["text"] == text.strip()
    assert tokens.metadata["sent_id"].startswith("synthetic-dev-")


_PENN_TAGS = {
  "DT",
  "JJ",
  "NN",
  "NNS",
  "NNP",
  "PRP",
  "PRP$",
  "VB",
  "VBZ",
  "VBP",
  "VBD",
  "VBN",
  "VBG",
  "MD",
  "IN",
  "TO",
  "RB",
  "CC",
  "CD",
  "WDT",
  "WP",
  ".",
  ",",
}
# deprel -> (allowed UPOS of the dependent, allowed UPOS of its head, dependent before head?)
_RULES = {
  "det": ({"DET"}, {"NOUN", "PROPN"}, True),
  "amod": ({"ADJ"}, {"NOUN"}, True),
  "nummod": ({"NUM"}, {"NOUN"}, True),
  "nmod:poss": ({"PRON"}, {"NOUN"}, True),
  "compound": ({"NOUN", "PROPN"}, {"NOUN", "PROPN"}, True),
  "case": ({"ADP"}, {"NOUN", "PROPN", "PRON"}, True),
  "cop": ({"AUX"}, {"ADJ", "NOUN", "PROPN"}, True),
  "aux": ({"AUX"}, {"VERB"}, True),
  "aux:pass": ({"AUX"}, {"VERB"}, True),
  "nsubj:pass": ({"NOUN", "PROPN"}, {"VERB"}, True),
  "nmod": ({"NOUN", "PROPN"}, {"NOUN"}, False),
  "obl": ({"NOUN", "PROPN"}, {"VERB"}, False),
  "iobj": ({"NOUN", "PROPN", "PRON"}, {"VERB"}, False),
  "cc": ({"CCONJ"}, {"VERB", "ADJ", "NOUN", "PROPN"}, True),
  "mark": ({"SCONJ", "PART"}, {"VERB", "ADJ", "NOUN", "PROPN"}, True),
  "acl:relcl": ({"VERB", "ADJ", "NOUN"}, {"NOUN"}, False),
  "xcomp": ({"VERB"}, {"VERB"}, False),
  "punct": ({"PUNCT"}, {"VERB", "ADJ", "NOUN", "PROPN"}, None),
}


def test_grammar_rules(train):
  seen = collections.Counter()
  for s in train:
    for i, (upos, head, rel) in enumerate(zip(s.upos, s.heads, s.deprels), start=1):
      seen[rel] += 1
      if rel == "root":
        assert head == 0 and s.deprels[-1] == "punct" and s.heads[-1] == i
        continue
      if rel in _RULES:
        dep_upos, head_upos, before = _RULES[rel]
        assert upos in dep_upos and s.upos[head - 1] in head_upos, (s, i)
        if before is not None:
          assert (i < head) == before, (s, i)
      if rel == "cop":
        assert s.words[i - 1] in {"is", "are", "am", "was", "were", "Is", "Are", "Am", "Was", "Were"}
      if rel == "cc":  # the conjunction hangs on the second conjunct
        assert s.deprels[head - 1] == "conj"
    assert s.words[-1] in {".", "?"}
  required = {
    "det",
    "amod",
    "nsubj",
    "obj",
    "obl",
    "case",
    "nmod",
    "advmod",
    "aux",
    "cop",
    "mark",
    "advcl",
    "cc",
    "conj",
    "punct",
    "compound",
    "root",
    "acl:relcl",
    "xcomp",
    "ccomp",
    "iobj",
    "nsubj:pass",
    "aux:pass",
    "nummod",
    "nmod:poss",
  }
  assert required <= set(seen), required - set(seen)


def test_agreement(train):
  for s in train:
    for i, (word, xpos, rel) in enumerate(zip(s.words, s.xpos, s.deprels), start=1):
      head = s.heads[i - 1]
      if rel == "nsubj" and s.xpos[head - 1] == "VBZ" and xpos in {"NN", "NNS", "NNP"}:
        assert xpos != "NNS", s  # 3rd-person -s takes a singular subject
      if rel == "det" and word.lower() in {"these", "those"}:
        assert s.xpos[head - 1] == "NNS", s
      if word.lower() in {"a", "an"} and xpos == "DT":
        assert (word.lower() == "an") == (s.words[i][0].lower() in "aeiou"), s
      if rel in {"nsubj", "nsubj:pass"} and word in {"I", "he", "she", "He", "She"}:
        verb_forms = {
          s.words[j].lower() for j, h in enumerate(s.heads) if h == head and s.deprels[j] in {"aux", "cop", "aux:pass"}
        } | {s.words[head - 1].lower()}
        wrong = {"are", "were", "have", "do"} if word.lower() != "i" else {"is", "are", "has", "does", "were"}
        assert not verb_forms & wrong, s
        if word == "I":
          assert s.xpos[head - 1] != "VBZ", s
  first_words = [s.words[0] for s in train]
  assert all(w[0].isupper() for w in first_words)


def test_text_corpus(synth_dir):
  train_text = (synth_dir / "text/synthetic/train.txt").read_text(encoding="utf-8")
  valid_text = (synth_dir / "text/synthetic/valid.txt").read_text(encoding="utf-8")
  assert train_text.endswith("\n") and not train_text.endswith("\n\n\n")
  documents = [d.split("\n") for d in train_text.strip("\n").split("\n\n")]
  assert all(5 <= len(d) <= 20 for d in documents[:-1]) and 1 <= len(documents[-1]) <= 20
  lines = [line for d in documents for line in d]
  valid_lines = [line for line in valid_text.split("\n") if line]
  assert len(lines) + len(valid_lines) == 500 and len(valid_lines) == 25
  assert all(line[-1] in ".?" and line[0].isupper() and "  " not in line for line in lines)
  # A separate sample from the treebank's: only short, common sentences can coincide.
  conllu_text = (synth_dir / "ud/synthetic/synthetic-ud-train.conllu").read_text(encoding="utf-8")
  treebank_text = {t.metadata["text"] for t in conllu.parse(conllu_text)}
  assert len(set(lines) & treebank_text) < 0.05 * len(lines)


@pytest.mark.slow
def test_default_sizes_are_fast(tmp_path):
  start = time.process_time()
  out = synthetic.write_synthetic(tmp_path)
  assert time.process_time() - start < 20  # about 4 s of CPU on a 2-core CPU
  assert len(treebank.load_split(out, "synthetic", "train")) == 4000
  text = (out / "text/synthetic/train.txt").read_text(encoding="utf-8")
  assert sum(1 for line in text.split("\n") if line) == 38000
