"""A seeded synthetic English treebank (CoNLL-U, UD 2 conventions) and matching plain text.

A small probabilistic grammar over a few hundred real English words (headspec/data/lexicon.py), so
that quick runs and tests have a treebank with known structure and a text corpus from the same
language. It is written by hand because no library generates UD trees; `conllu` serializes them.

Constructions: determiners, possessives, numerals, adjectives (with `very`), noun compounds, proper
names (`New York` as compound), PPs attached to nouns (nmod) or verbs (obl), subject and object
relative clauses (acl:relcl), fronted and final adverbial clauses (mark + advcl), complement
clauses (ccomp), infinitival complements (xcomp), intransitive, transitive and ditransitive
(iobj) verbs, passives (nsubj:pass, aux:pass), modals, perfect and progressive auxiliaries,
negation, copular sentences with the predicate as head (cop), clause, verb-phrase and noun-phrase
coordination (cc, conj), yes/no and wh-questions, and punctuation (punct) on the clause it
delimits. Agreement (a/an, this/these, 3rd-person -s, am/is/are) is respected.
"""

import dataclasses
import pathlib
import random

import conllu

from headspec.data import lexicon
from headspec.errors import UserError
from headspec.io import remote

_MIN_WORDS, _MAX_WORDS = 3, 30


@dataclasses.dataclass(eq=False, slots=True)
class _Tok:
  """A word under construction; `head` is another _Tok (None for the root)."""

  form: str
  lemma: str
  upos: str
  xpos: str
  head: "_Tok | None" = None
  deprel: str = "root"


def _attach(dependent, governor, deprel):
  dependent.head = governor
  dependent.deprel = deprel
  return dependent


@dataclasses.dataclass
class _NP:
  toks: list
  head: _Tok
  person: int
  number: str  # 'sg' | 'pl'
  pronoun: str = ""  # subject form of a pronoun head, '' otherwise


class _Grammar:
  """Samples sentences (lists of _Tok in word order) from one random stream."""

  def __init__(self, rng: random.Random):
    self.random = rng.random

  def p(self, prob):
    return self.random() < prob

  def pick(self, seq):
    # One random() draw; about 3x faster than random.choice, which dominated the run time.
    return seq[int(self.random() * len(seq))]

  # --- noun phrases ---
  def noun_phrase(self, depth, role, nouns=lexicon.NOUNS, number=None, pronoun=False, names=()):
    """det/poss/num + adjectives + compound + noun + PP or relative clause; or a pronoun/name."""
    if pronoun and self.p(0.3 if role == "subj" else 0.15):
      form, person, num = self.pick(lexicon.SUBJECT_PRONOUNS)
      if number is None or number == num:
        lemma = form if form == "I" else form.lower()
        shown = lexicon.OBJECT_PRONOUNS[form] if role == "obj" else form
        tok = _Tok(shown, lemma, "PRON", "PRP")
        return _NP([tok], tok, person, num, pronoun=form)
    if names and number != "pl" and self.p(0.12):
      return self._name(names)
    number = number or ("pl" if self.p(0.3) else "sg")
    singular, plural = self.pick(nouns)
    noun = _Tok(singular if number == "sg" else plural, singular, "NOUN", "NN" if number == "sg" else "NNS")
    pre = []
    roll = self.random()
    if roll < 0.12:
      pre.append(_attach(_Tok(self.pick(lexicon.POSSESSIVES), "", "PRON", "PRP$"), noun, "nmod:poss"))
    elif roll < 0.2 and number == "pl":
      if self.p(0.4):
        pre.append(_attach(_Tok("the", "the", "DET", "DT"), noun, "det"))
      pre.append(_attach(_Tok(self.pick(lexicon.NUMBERS), "", "NUM", "CD"), noun, "nummod"))
    elif roll < 0.95 or number == "sg":
      choices = lexicon.SINGULAR_DETERMINERS if number == "sg" else lexicon.PLURAL_DETERMINERS
      pre.append(_attach(_Tok(self.pick(choices), "", "DET", "DT"), noun, "det"))
    used = set()
    for _ in range(self.pick((0, 0, 0, 1, 1, 2))):
      form = self.pick(lexicon.ADJECTIVES)
      if form in used:
        continue
      used.add(form)
      adj = _Tok(form, form, "ADJ", "JJ")
      if self.p(0.15):
        pre.append(_attach(_Tok("very", "very", "ADV", "RB"), adj, "advmod"))
      pre.append(_attach(adj, noun, "amod"))
    if self.p(0.12):
      modifier = self.pick(lexicon.COMPOUND_MODIFIERS)
      if modifier != singular:
        pre.append(_attach(_Tok(modifier, modifier, "NOUN", "NN"), noun, "compound"))
    toks = pre + [noun]
    if depth < 2 and self.p(0.2 if depth == 0 else 0.08):
      toks += self.prep_phrase(noun, "nmod", depth + 1, lexicon.PREPOSITIONS, names=lexicon.CITIES)
    elif depth < 1 and self.p(0.12):
      toks += self.relative_clause(noun, number, depth + 1)
    return _NP(toks, noun, 3, number)

  def _name(self, names):
    if names is lexicon.CITIES and self.p(0.25):
      first, second = self.pick(lexicon.TWO_PART_CITIES)
      head = _Tok(second, second, "PROPN", "NNP")
      return _NP([_attach(_Tok(first, first, "PROPN", "NNP"), head, "compound"), head], head, 3, "sg")
    name = self.pick(names)
    head = _Tok(name, name, "PROPN", "NNP")
    return _NP([head], head, 3, "sg")

  def prep_phrase(self, governor, deprel, depth, prepositions, nouns=lexicon.NOUNS, names=()):
    prep = self.pick(prepositions)
    np = self.noun_phrase(depth, role="pobj", nouns=nouns, names=names)
    _attach(np.head, governor, deprel)
    return [_attach(_Tok(prep, prep, "ADP", "IN"), np.head, "case")] + np.toks

  def relative_clause(self, noun, number, depth):
    """`that/who/which` + clause with a gap: subject or object relative (acl:relcl)."""
    human = noun.lemma in lexicon.HUMAN_SET
    if self.p(0.6):  # subject relative: the dog that chased the cat
      if human:
        form = "who" if self.p(0.7) else "that"
      else:
        form = "that" if self.p(0.7) else "which"
      rel = _Tok(form, "", "PRON", "WP" if form == "who" else "WDT")
      verb, toks = self.verb_group(_NP([rel], rel, 3, number), depth)
      _attach(rel, verb, "nsubj")
      _attach(verb, noun, "acl:relcl")
      return [rel] + toks
    rel = _Tok("that", "", "PRON", "WDT")
    subject = self.noun_phrase(depth + 1, "subj", lexicon.ANIMATE, pronoun=True, names=lexicon.PEOPLE)
    verb, vtoks = self.finite_verb(self.pick(lexicon.TRANSITIVE), subject)
    _attach(rel, verb, "obj")
    _attach(subject.head, verb, "nsubj")
    _attach(verb, noun, "acl:relcl")
    return [rel] + subject.toks + vtoks

  # --- verbs ---
  def finite_verb(self, entry, subject):
    """Tense/aspect/modality/negation on `entry`; returns (main verb, toks incl. auxiliaries)."""
    lemma, vbz, vbd, vbn, vbg = entry
    third_sg = subject.person == 3 and subject.number == "sg"
    roll = self.random()
    aux = []
    if roll < 0.35:
      verb = _Tok(vbz, lemma, "VERB", "VBZ") if third_sg else _Tok(lemma, lemma, "VERB", "VBP")
    elif roll < 0.7:
      verb = _Tok(vbd, lemma, "VERB", "VBD")
    elif roll < 0.8:
      modal = self.pick(lexicon.MODALS)
      aux.append(_Tok(modal, modal, "AUX", "MD"))
      if self.p(0.2):
        aux.append(_Tok("not", "not", "PART", "RB"))
      verb = _Tok(lemma, lemma, "VERB", "VB")
    elif roll < 0.88:
      if self.p(0.6):
        form, xpos = ("has", "VBZ") if third_sg else ("have", "VBP")
      else:
        form, xpos = "had", "VBD"
      aux.append(_Tok(form, "have", "AUX", xpos))
      verb = _Tok(vbn, lemma, "VERB", "VBN")
    elif roll < 0.95:
      form, xpos = self._be(subject, past=self.p(0.5))
      aux.append(_Tok(form, "be", "AUX", xpos))
      verb = _Tok(vbg, lemma, "VERB", "VBG")
    else:
      if self.p(0.5):
        form, xpos = ("does", "VBZ") if third_sg else ("do", "VBP")
      else:
        form, xpos = "did", "VBD"
      aux += [_Tok(form, "do", "AUX", xpos), _Tok("not", "not", "PART", "RB")]
      verb = _Tok(lemma, lemma, "VERB", "VB")
    if self.p(0.2) and not any(t.form == "not" for t in aux):  # he has often seen
      aux.append(_Tok(self.pick(lexicon.FREQUENCY_ADVERBS), "", "ADV", "RB"))
    for t in aux:
      _attach(t, verb, "aux" if t.upos == "AUX" else "advmod")
    return verb, aux + [verb]

  def _be(self, subject, past):
    if past:
      return ("was", "VBD") if subject.number == "sg" and subject.person != 2 else ("were", "VBD")
    if subject.pronoun == "I":
      return "am", "VBP"
    return ("is", "VBZ") if subject.number == "sg" and subject.person == 3 else ("are", "VBP")

  def verb_group(self, subj, depth):
    """A predicate agreeing with the subject _NP `subj`: (head word, toks in order)."""
    kind = self.random()
    if kind < 0.25:
      verb, toks = self.finite_verb(self.pick(lexicon.INTRANSITIVE), subj)
    elif kind < 0.65:
      verb, toks = self.finite_verb(self.pick(lexicon.TRANSITIVE), subj)
      obj = self.noun_phrase(depth + 1, "obj", pronoun=True, names=lexicon.PEOPLE)
      toks += obj.toks
      _attach(obj.head, verb, "obj")
    elif kind < 0.72:
      verb, toks = self.finite_verb(self.pick(lexicon.DITRANSITIVE), subj)
      iobj = self.noun_phrase(depth + 1, "obj", lexicon.ANIMATE, pronoun=True, names=lexicon.PEOPLE)
      obj = self.noun_phrase(depth + 1, "obj", lexicon.THING)
      toks += iobj.toks + obj.toks
      _attach(iobj.head, verb, "iobj")
      _attach(obj.head, verb, "obj")
    elif kind < 0.8 and depth < 2:
      verb, toks = self.finite_verb(self.pick(lexicon.CONTROL), subj)
      to = _Tok("to", "to", "PART", "TO")
      lemma = self.pick(lexicon.TRANSITIVE)[0]
      inf = _attach(_Tok(lemma, lemma, "VERB", "VB"), verb, "xcomp")
      toks += [_attach(to, inf, "mark"), inf]
      obj = self.noun_phrase(depth + 1, "obj", pronoun=True, names=lexicon.PEOPLE + lexicon.CITIES)
      toks += obj.toks
      _attach(obj.head, inf, "obj")
    elif kind < 0.86 and depth < 1:
      verb, toks = self.finite_verb(self.pick(lexicon.COGNITION), subj)
      clause_head, clause = self.clause(depth + 1)
      _attach(clause_head, verb, "ccomp")
      if self.p(0.6):
        clause = [_attach(_Tok("that", "that", "SCONJ", "IN"), clause_head, "mark")] + clause
      toks += clause
    else:
      verb, toks = self.finite_verb(self.pick(lexicon.TRANSITIVE), subj)
      obj = self.noun_phrase(depth + 1, "obj", names=lexicon.CITIES)
      toks += obj.toks
      _attach(obj.head, verb, "obj")
    if self.p(0.3):  # PP on the verb: obl (competes with the nmod PPs inside the object)
      toks += self.prep_phrase(
        verb,
        "obl",
        depth + 1,
        lexicon.VERB_PREPOSITIONS,
        nouns=lexicon.PLACE + lexicon.EVENT_NOUNS,
        names=lexicon.CITIES,
      )
    if self.p(0.15):
      toks.append(_attach(_Tok(self.pick(lexicon.MANNER_ADVERBS), "", "ADV", "RB"), verb, "advmod"))
    return verb, toks

  # --- clauses ---
  def clause(self, depth):
    """Subject + predicate, or a copular or passive clause; returns (head, toks)."""
    kind = self.random()
    if kind < 0.14:
      return self.copular(depth)
    if kind < 0.2:
      return self.passive(depth)
    if kind < 0.26 and depth == 0:  # noun-phrase coordination in the subject
      first = self.noun_phrase(depth + 1, "subj", lexicon.ANIMATE, names=lexicon.PEOPLE)
      second = self.noun_phrase(depth + 1, "subj", lexicon.ANIMATE, names=lexicon.PEOPLE)
      cc = _attach(_Tok("and", "and", "CCONJ", "CC"), second.head, "cc")
      _attach(second.head, first.head, "conj")
      subject = _NP(first.toks + [cc] + second.toks, first.head, 3, "pl")
    else:
      subject = self.noun_phrase(depth, "subj", lexicon.ANIMATE, pronoun=True, names=lexicon.PEOPLE)
    verb, toks = self.verb_group(subject, depth)
    _attach(subject.head, verb, "nsubj")
    if depth == 0 and self.p(0.12):  # verb-phrase coordination with a shared subject
      other, more = self.verb_group(subject, depth + 1)
      cc = _Tok(self.pick(lexicon.CONJUNCTIONS), "", "CCONJ", "CC")
      _attach(cc, other, "cc")
      _attach(other, verb, "conj")
      toks += [cc] + more
    return verb, subject.toks + toks

  def copular(self, depth):
    """Predicate is the head; the copula and subject attach to it (UD copula convention)."""
    subject = self.noun_phrase(depth, "subj", pronoun=True, names=lexicon.PEOPLE + lexicon.CITIES)
    form, xpos = self._be(subject, past=self.p(0.4))
    cop = _Tok(form, "be", "AUX", xpos)
    kind = self.random()
    if kind < 0.5:
      pred = _Tok(self.pick(lexicon.PRED_ADJECTIVES), "", "ADJ", "JJ")
      toks = [pred]
      if self.p(0.2):
        toks.insert(0, _attach(_Tok("very", "very", "ADV", "RB"), pred, "advmod"))
    elif kind < 0.75:
      np = self.noun_phrase(
        depth + 1, "pobj", lexicon.HUMAN if subject.pronoun else lexicon.NOUNS, number=subject.number
      )
      pred, toks = np.head, np.toks
    else:
      prep = self.pick(lexicon.PREPOSITIONS[:9])
      np = self.noun_phrase(depth + 1, "pobj", lexicon.PLACE, names=lexicon.CITIES)
      pred = np.head
      toks = [_attach(_Tok(prep, prep, "ADP", "IN"), pred, "case")] + np.toks
    before = [_attach(cop, pred, "cop")]
    if self.p(0.1):
      before.append(_attach(_Tok("not", "not", "PART", "RB"), pred, "advmod"))
    _attach(subject.head, pred, "nsubj")
    return pred, subject.toks + before + toks

  def passive(self, depth):
    subject = self.noun_phrase(depth, "subj", lexicon.THING + lexicon.ANIMAL + lexicon.PLACE, names=lexicon.CITIES)
    lemma, _, _, vbn, _ = self.pick(lexicon.TRANSITIVE)
    form, xpos = self._be(subject, past=self.p(0.7))
    verb = _Tok(vbn, lemma, "VERB", "VBN")
    _attach(subject.head, verb, "nsubj:pass")
    toks = subject.toks + [_attach(_Tok(form, "be", "AUX", xpos), verb, "aux:pass"), verb]
    if self.p(0.6):
      agent = self.noun_phrase(depth + 1, "pobj", lexicon.ANIMATE, names=lexicon.PEOPLE)
      _attach(agent.head, verb, "obl")
      toks += [_attach(_Tok("by", "by", "ADP", "IN"), agent.head, "case")] + agent.toks
    return verb, toks

  def question(self):
    """Yes/no (`Did the dog see ...?`, `Is the cat happy?`) or object wh-question."""
    subject = self.noun_phrase(1, "subj", lexicon.ANIMATE, pronoun=True, names=lexicon.PEOPLE)
    if self.p(0.3):
      form, xpos = self._be(subject, past=self.p(0.4))
      pred = _Tok(self.pick(lexicon.PRED_ADJECTIVES), "", "ADJ", "JJ")
      _attach(subject.head, pred, "nsubj")
      return pred, [_attach(_Tok(form, "be", "AUX", xpos), pred, "cop")] + subject.toks + [pred]
    third_sg = subject.person == 3 and subject.number == "sg"
    aux_form, aux_xpos = self.pick(
      [("did", "VBD"), ("does", "VBZ") if third_sg else ("do", "VBP"), (self.pick(lexicon.MODALS), "MD")]
    )
    aux = _Tok(aux_form, "do" if aux_xpos != "MD" else aux_form, "AUX", aux_xpos)
    lemma = self.pick(lexicon.TRANSITIVE)[0]
    verb = _Tok(lemma, lemma, "VERB", "VB")
    _attach(aux, verb, "aux")
    _attach(subject.head, verb, "nsubj")
    if self.p(0.4):
      wh = _attach(_Tok(self.pick(["what", "who"]), "", "PRON", "WP"), verb, "obj")
      return verb, [wh, aux] + subject.toks + [verb]
    obj = self.noun_phrase(1, "obj", pronoun=True, names=lexicon.PEOPLE + lexicon.CITIES)
    _attach(obj.head, verb, "obj")
    return verb, [aux] + subject.toks + [verb] + obj.toks

  def sentence(self):
    """One sentence: clause, coordination or subordination, or a question; ends in . or ?"""
    kind = self.random()
    mark = "."
    if kind < 0.08:
      head, toks = self.question()
      mark = "?"
    elif kind < 0.2:  # clause , and clause
      head, toks = self.clause(0)
      other, more = self.clause(1)
      cc = _attach(_Tok(self.pick(lexicon.CONJUNCTIONS), "", "CCONJ", "CC"), other, "cc")
      _attach(other, head, "conj")
      comma = [_attach(_Tok(",", ",", "PUNCT", ","), other, "punct")] if self.p(0.5) else []
      toks += comma + [cc] + more
    elif kind < 0.35:  # adverbial clause, fronted (with a comma) or final
      head, toks = self.clause(0)
      sub_head, sub = self.clause(1)
      sub = [_attach(_Tok(self.pick(lexicon.SUBORDINATORS), "", "SCONJ", "IN"), sub_head, "mark")] + sub
      _attach(sub_head, head, "advcl")
      if self.p(0.5):
        toks = sub + [_attach(_Tok(",", ",", "PUNCT", ","), sub_head, "punct")] + toks
      else:
        toks += sub
    else:
      head, toks = self.clause(0)
    toks.append(_attach(_Tok(mark, mark, "PUNCT", "."), head, "punct"))
    head.head, head.deprel = None, "root"
    return toks


def _finish(toks):
  """Lemmas, a/an, and the capital letter; returns the toks."""
  for i, t in enumerate(toks):
    if not t.lemma:
      t.lemma = t.form.lower()
    if t.form == "a" and i + 1 < len(toks) and toks[i + 1].form[0] in "aeiou":
      t.form = "an"
  first = toks[0]
  if first.upos != "PROPN" and first.form != "I":
    first.form = first.form[0].upper() + first.form[1:]
  return toks


def _text(toks):
  return "".join(
    t.form + ("" if i + 1 < len(toks) and toks[i + 1].upos == "PUNCT" else " ") for i, t in enumerate(toks)
  ).strip()


def _sample(rng, count):
  """`count` sentences of 3-30 words, each a list of _Tok in order."""
  grammar = _Grammar(rng)
  out = []
  while len(out) < count:
    toks = grammar.sentence()
    if _MIN_WORDS <= len(toks) <= _MAX_WORDS:
      out.append(_finish(toks))
  return out


def _conllu(toks, sent_id):
  index = {id(t): i for i, t in enumerate(toks, start=1)}
  rows = [
    {
      "id": i,
      "form": t.form,
      "lemma": t.lemma,
      "upos": t.upos,
      "xpos": t.xpos,
      "feats": None,
      "head": 0 if t.head is None else index[id(t.head)],
      "deprel": t.deprel,
      "deps": None,
      "misc": ({"SpaceAfter": "No"} if i < len(toks) and toks[i].upos == "PUNCT" else None),
    }
    for i, t in enumerate(toks, start=1)
  ]
  return conllu.TokenList(rows, {"sent_id": sent_id, "text": _text(toks)}).serialize()


def _rng(seed, stream):
  # A string seed is hashed with SHA-512 by `random`, so streams are stable across runs/platforms.
  return random.Random(f"headspec-synthetic/{seed}/{stream}")


def _documents(rng, sentences):
  """Groups sentence strings into documents of 5-20 lines separated by blank lines."""
  lines, i = [], 0
  while i < len(sentences):
    size = rng.randint(5, 20)
    lines.append("\n".join(sentences[i : i + size]))
    i += size
  return "\n\n".join(lines) + "\n"


def write_synthetic(
  out_dir, *, seed=0, num_train=4000, num_dev=500, num_test=500, num_text_sentences=40000
) -> pathlib.Path:
  """Writes out_dir/ud/synthetic/synthetic-ud-{train,dev,test}.conllu and
  out_dir/text/synthetic/{train,valid}.txt (valid gets 1/20 of the text sentences); returns out_dir.

  Each split and the text come from their own seeded stream: same seed, byte-identical files.
  """
  out_dir = pathlib.Path(out_dir)
  ud_dir = out_dir / "ud" / "synthetic"
  text_dir = out_dir / "text" / "synthetic"
  ud_dir.mkdir(parents=True, exist_ok=True)
  text_dir.mkdir(parents=True, exist_ok=True)
  for split, count in (("train", num_train), ("dev", num_dev), ("test", num_test)):
    sentences = _sample(_rng(seed, split), count)
    body = "".join(_conllu(toks, f"synthetic-{split}-{i:05d}") for i, toks in enumerate(sentences, start=1))
    remote.write_bytes_atomic(ud_dir / f"synthetic-ud-{split}.conllu", body.encode("utf-8"))
  rng = _rng(seed, "text")
  text = [_text(toks) for toks in _sample(rng, num_text_sentences)]
  num_valid = max(1, num_text_sentences // 20)
  remote.write_bytes_atomic(text_dir / "train.txt", _documents(rng, text[num_valid:]).encode("utf-8"))
  remote.write_bytes_atomic(text_dir / "valid.txt", _documents(rng, text[:num_valid]).encode("utf-8"))
  return out_dir


def parser():
  """`headspec data synthetic`'s options (experiments write their data with it: configs/experiments/grammar.py)."""
  from headspec.data.fetch import ArgumentParser

  parser = ArgumentParser(
    prog="headspec data synthetic",
    description="Write the synthetic treebank (OUT/ud/synthetic/) and its text (OUT/text/synthetic/).",
  )
  parser.add_argument("--out", required=True, help="the data folder to write (a run's or experiment's data_dir)")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--text-sentences", type=int, default=40000, help="sentences of text (1/20 go to valid)")
  parser.add_argument("--treebank-sentences", default="4000,500,500", help="train,dev,test sentences")
  parser.add_argument(
    "--repeats", type=float, default=0.0, help="> 0: also text/synthetic_repeats/ (headspec/data/repeats.py)"
  )
  return parser


def _check_out_folder(out) -> None:
  """--out is a folder or can be made one: neither it nor a folder above it is a file."""
  path = pathlib.Path(out)
  for where in (path, *path.parents):
    if where.exists():
      if not where.is_dir():
        what = "is a file" if where == path else f"is under {where}, a file"
        raise UserError(f"--out={out}: {what}, not a folder (give the data folder to write)")
      return


def main_synthetic(args: list[str]) -> pathlib.Path:
  """CLI entry: writes the treebank and text (and with --repeats the mixed corpus); returns OUT."""
  options = parser().parse_args(args)
  sizes = options.treebank_sentences.split(",")
  if len(sizes) != 3 or not all(s.strip().isascii() and s.strip().isdigit() and int(s) > 0 for s in sizes):
    raise UserError(f"--treebank-sentences={options.treebank_sentences}: use three positive counts, like 4000,500,500")
  if options.text_sentences < 20:
    raise UserError(f"--text-sentences={options.text_sentences}: at least 20 (1/20 of them are the valid split)")
  if not (options.repeats == 0 or 0 < options.repeats <= 1):  # NaN too: before anything is written
    raise UserError(f"--repeats={options.repeats:g}: a fraction in (0, 1], or 0 for no repeats corpus")
  _check_out_folder(options.out)
  num_train, num_dev, num_test = (int(s) for s in sizes)
  out = write_synthetic(
    options.out,
    seed=options.seed,
    num_train=num_train,
    num_dev=num_dev,
    num_test=num_test,
    num_text_sentences=options.text_sentences,
  )
  if options.repeats:
    from headspec.data.repeats import write_repeats

    write_repeats(out, "synthetic", seed=options.seed, fraction=options.repeats)
  return out
