"""CoNLL-U reading: real EWT counts, multiword tokens and empty nodes, and file:line errors."""

import re

import pytest

from headspec.data import treebank
from headspec.errors import UserError

GOOD = """\
# sent_id = s1
# text = They don't sleep.
1\tThey\tthey\tPRON\tPRP\t_\t4\tnsubj\t_\t_
2-3\tdon't\t_\t_\t_\t_\t_\t_\t_\t_
2\tdo\tdo\tAUX\tVBP\t_\t4\taux\t_\t_
3\tn't\tnot\tPART\tRB\t_\t4\tadvmod\t_\t_
4\tsleep\tsleep\tVERB\tVB\t_\t0\troot\t_\t_
4.1\tsleep\tsleep\tVERB\tVB\t_\t_\t_\t4:conj\t_
5\t.\t.\tPUNCT\t.\t_\t4\tpunct\t_\t_

# sent_id = s2
1\tGo\tgo\tVERB\tVB\t_\t0\troot\t_\t_
2\thome\thome\tADV\tRB\t_\t1\tadvmod:lmod\t_\t_
"""


def _write(tmp_path, text, name="bad.conllu"):
  path = tmp_path / name
  path.write_text(text, encoding="utf-8")
  return path


def test_reads_words_not_tokens(tmp_path):
  first, second = treebank.read_conllu(_write(tmp_path, GOOD, "good.conllu"))
  assert first == treebank.Sentence(
    sent_id="s1",
    words=("They", "do", "n't", "sleep", "."),
    upos=("PRON", "AUX", "PART", "VERB", "PUNCT"),
    xpos=("PRP", "VBP", "RB", "VB", "."),
    heads=(4, 4, 4, 0, 4),
    deprels=("nsubj", "aux", "advmod", "root", "punct"),
  )
  assert second.sent_id == "s2" and second.deprels == ("root", "advmod:lmod")


def test_ewt_dev(data_dir):
  sentences = treebank.load_split(data_dir, "en_ewt", "dev")
  assert len(sentences) == 2001
  assert sum(len(s.words) for s in sentences) == 25147
  by_id = {s.sent_id: s for s in sentences}
  # "... but they didn't." : the token "didn't" (29-30) is two words, so 31 words for 30 tokens.
  s = by_id["weblog-blogspot.com_gettingpolitical_20030906235000_ENG_20030906_235000-0002"]
  assert len(s.words) == 31
  assert s.words[27:] == ("they", "did", "n't", ".")
  assert s.upos[28:30] == ("AUX", "PART") and s.heads[29] == 29
  raw = (data_dir / "ud/en_ewt/en_ewt-ud-dev.conllu").read_text(encoding="utf-8")
  block = raw[raw.index(f"# sent_id = {s.sent_id}\n") :].split("\n\n")[0]
  ids = [line.split("\t")[0] for line in block.splitlines() if not line.startswith("#")]
  ranges = [tuple(map(int, i.split("-"))) for i in ids if "-" in i]
  covered = {w for a, b in ranges for w in range(a, b + 1)}
  assert ranges == [(29, 30)]
  assert len(ranges) + sum(int(i) not in covered for i in ids if i.isdigit()) == 30  # tokens
  # Empty node 8.1 is not a word: 'like' (8) is followed by 'about' (9).
  s = by_id["weblog-blogspot.com_aggressivevoicedaily_20060814163400_ENG_20060814_163400-0007"]
  assert s.words[7:9] == ("like", "about") and s.heads[8] == 11
  assert all(x.heads.count(0) == 1 for x in sentences)


def test_splits(data_dir):
  assert treebank.available_splits(data_dir, "en_ewt") == ["train", "dev", "test"]
  assert treebank.available_splits(data_dir, "en_gum") == ["dev", "test"]
  with pytest.raises(
    UserError,
    match=r"en_gum-ud-train.conllu not found \(splits present for "
    r"en_gum: dev, test\)",
  ):
    treebank.load_split(data_dir, "en_gum", "train")
  with pytest.raises(UserError, match="unknown split 'validation'"):
    treebank.load_split(data_dir, "en_ewt", "validation")
  with pytest.raises(UserError, match=r"no treebank folder .*ud/xx_none"):
    treebank.load_split(data_dir, "xx_none", "dev")


@pytest.mark.slow
def test_ewt_train_is_fast(data_dir):
  import time

  start = time.process_time()
  sentences = treebank.load_split(data_dir, "en_ewt", "train")
  assert len(sentences) == 12544
  assert time.process_time() - start < 15  # about 3.5 s of CPU on a 2-core CPU


def _bad(line_no, *edits):
  """GOOD with edits (old, new, old, new, ...); returns (text, expected line number)."""
  text = GOOD
  for old, new in zip(edits[::2], edits[1::2]):
    assert old in text
    text = text.replace(old, new, 1)
  return text, line_no


@pytest.mark.parametrize(
  "text, line, message",
  [
    (*_bad(3, "\t4\tnsubj\t_\t_", "\t4\tnsubj\t_"), "expected 10 tab-separated columns, found 9"),
    (*_bad(7, "\t0\troot\t_\t_\n4.1", "\t0\troot\t_\t_\textra\n4.1"), "expected 10 tab-separated columns, found 11"),
    (*_bad(3, "\t4\tnsubj", "\t7x\tnsubj"), "HEAD '7x' is not an integer"),
    (*_bad(3, "\t4\tnsubj", "\t_\tnsubj"), "HEAD '_' is not an integer"),
    (*_bad(9, "\t4\tpunct", "\t9\tpunct"), r"HEAD 9 is out of range \(sentence has 5 words\)"),
    (*_bad(3, "\t4\tnsubj", "\t-1\tnsubj"), r"HEAD -1 is out of range"),
    (*_bad(9, "\t4\tpunct", "\t0\tpunct"), r"several roots \(words 4 and 5 have HEAD 0\)"),
    (*_bad(1, "\t0\troot\t_\t_\n4.1", "\t1\troot\t_\t_\n4.1"), r"sentence has no root"),
    (
      *_bad(
        3,
        "1\tThey\tthey\tPRON\tPRP\t_\t4",
        "1\tThey\tthey\tPRON\tPRP\t_\t3",
        "3\tn't\tnot\tPART\tRB\t_\t4",
        "3\tn't\tnot\tPART\tRB\t_\t1",
      ),
      r"HEAD cycle 1 -> 3 -> 1",
    ),
    (*_bad(5, "\t4\taux", "\t2\taux"), r"HEAD cycle 2 -> 2"),
    (
      *_bad(7, "4\tsleep\tsleep\tVERB\tVB\t_\t0", "6\tsleep\tsleep\tVERB\tVB\t_\t0"),
      r"word ID 6 out of order \(expected 4\)",
    ),
    (*_bad(4, "2-3\tdon't", "2-x\tdon't"), r"Failed parsing field 'id': '2-x' is not a valid ID"),
  ],
)
def test_malformed(tmp_path, text, line, message):
  path = _write(tmp_path, text)
  with pytest.raises(UserError) as error:
    treebank.read_conllu(path)
  assert re.fullmatch(re.escape(f"{path}:{line}: ") + message + ".*", str(error.value)), error.value
  assert "\n" not in str(error.value)


def test_cycle_in_second_sentence_names_its_line(tmp_path):
  text = GOOD.replace("2\thome\thome\tADV\tRB\t_\t1", "2\thome\thome\tADV\tRB\t_\t2")
  path = _write(tmp_path, text)
  with pytest.raises(UserError, match=re.escape(f"{path}:13: HEAD cycle 2 -> 2")):
    treebank.read_conllu(path)


@pytest.mark.parametrize(
  "text, message",
  [
    ("", "no sentences"),
    ("\n\n# just a comment\n\n", "no sentences"),
  ],
)
def test_empty_file(tmp_path, text, message):
  path = _write(tmp_path, text)
  with pytest.raises(UserError, match=re.escape(f"{path}: {message}")):
    treebank.read_conllu(path)


def test_missing_and_undecodable_file(tmp_path):
  with pytest.raises(UserError, match="no such CoNLL-U file"):
    treebank.read_conllu(tmp_path / "absent.conllu")
  path = tmp_path / "latin1.conllu"
  path.write_bytes(GOOD.replace("They", "Th\xe9y").encode("latin-1"))
  with pytest.raises(UserError, match="not UTF-8"):
    treebank.read_conllu(path)
