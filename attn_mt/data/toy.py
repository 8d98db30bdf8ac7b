"""A built-in, offline English -> German-like corpus with real translation phenomena.

Every source sentence has exactly one correct translation, which the rules below produce:
- agreement: articles and adjective endings follow gender, number, case and article type
  ("the big dog" -> "der große Hund", "a big dog" -> "ein großer Hund", object "den großen Hund");
  verbs agree with their subject in number ("sieht" / "sehen");
- word order: subordinate clauses put the verb last ("weil der Hund die Katze sieht"), and a
  fronted adverb moves the verb before the subject (verb second: "gestern sieht der Hund ...");
- one word becoming several: some adverbs are phrases ("tomorrow" -> "am nächsten Tag").
Train, valid and test sets are disjoint: sentences are deduplicated across splits.

The rules know which source word gives each target word: `make_aligned_corpus` gives every pair with
its gold word alignment (`Aligned`; the run writes the test split's as `test.align`, Pharaoh lines).
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

# noun: (singular, plural, gender, German singular, German plural)
NOUNS = [
    ("dog", "dogs", "m", "Hund", "Hunde"),
    ("man", "men", "m", "Mann", "Männer"),
    ("bird", "birds", "m", "Vogel", "Vögel"),
    ("ball", "balls", "m", "Ball", "Bälle"),
    ("teacher", "teachers", "m", "Lehrer", "Lehrer"),
    ("cat", "cats", "f", "Katze", "Katzen"),
    ("woman", "women", "f", "Frau", "Frauen"),
    ("flower", "flowers", "f", "Blume", "Blumen"),
    ("street", "streets", "f", "Straße", "Straßen"),
    ("child", "children", "n", "Kind", "Kinder"),
    ("horse", "horses", "n", "Pferd", "Pferde"),
    ("house", "houses", "n", "Haus", "Häuser"),
    ("book", "books", "n", "Buch", "Bücher"),
]
ADJECTIVES = {"big": "groß", "small": "klein", "red": "rot", "old": "alt", "young": "jung",
              "fast": "schnell", "quiet": "leise", "green": "grün"}
# verb: (3rd singular, 3rd plural, German singular, German plural)
VERBS = [
    ("sees", "see", "sieht", "sehen"), ("likes", "like", "mag", "mögen"),
    ("finds", "find", "findet", "finden"), ("hears", "hear", "hört", "hören"),
    ("draws", "draw", "zeichnet", "zeichnen"), ("carries", "carry", "trägt", "tragen"),
    ("knows", "know", "kennt", "kennen"), ("visits", "visit", "besucht", "besuchen"),
]
SAY_VERBS = [("says", "say", "sagt", "sagen"), ("thinks", "think", "denkt", "denken"),
             ("believes", "believe", "glaubt", "glauben")]
CONJUNCTIONS = {"because": "weil", "while": "während", "although": "obwohl"}
ADVERBS = {"today": "heute", "yesterday": "gestern", "tomorrow": "am nächsten Tag",
           "suddenly": "ganz plötzlich", "often": "sehr oft", "now": "jetzt",
           "later": "etwas später"}

# German definite / indefinite articles and adjective endings by (case, gender or "pl")
DEF = {("nom", "m"): "der", ("nom", "f"): "die", ("nom", "n"): "das", ("nom", "pl"): "die",
       ("acc", "m"): "den", ("acc", "f"): "die", ("acc", "n"): "das", ("acc", "pl"): "die"}
INDEF = {("nom", "m"): "ein", ("nom", "f"): "eine", ("nom", "n"): "ein", ("nom", "pl"): "einige",
         ("acc", "m"): "einen", ("acc", "f"): "eine", ("acc", "n"): "ein", ("acc", "pl"): "einige"}
WEAK = {("nom", "m"): "e", ("nom", "f"): "e", ("nom", "n"): "e", ("nom", "pl"): "en",
        ("acc", "m"): "en", ("acc", "f"): "e", ("acc", "n"): "e", ("acc", "pl"): "en"}
MIXED = {("nom", "m"): "er", ("nom", "f"): "e", ("nom", "n"): "es", ("nom", "pl"): "e",
         ("acc", "m"): "en", ("acc", "f"): "e", ("acc", "n"): "es", ("acc", "pl"): "e"}


@dataclass(eq=False)
class Src:
    """A source token: links point at it by identity, so two equal words stay two."""

    text: str
    mark: str = ""  # a word the pronoun variant locates (pronoun.py)


@dataclass(eq=False)
class Tgt:
    """A target token and the source tokens it translates (none: a word with no counterpart)."""

    text: str
    of: tuple[Src, ...] = ()
    mark: str = ""


@dataclass(frozen=True)
class Aligned:
    """A sentence pair, punctuation attached to the word before as in real text, with its word
    alignment: (source word, target word, sure) links; a link of punctuation alone is possible."""

    en: str
    de: str
    links: tuple[tuple[int, int, bool], ...]
    marks: dict[str, tuple[int, int]]  # mark -> (source word, target word); -1: a side has none

    def pharaoh(self) -> str:
        """The links as one Pharaoh line: `i-j` sure, `ipj` possible, 0-indexed."""
        return " ".join(f"{i}{'-' if sure else 'p'}{j}" for i, j, sure in self.links)


PUNCT = (",", ".")


def _words(tokens: list) -> tuple[list[str], list[int]]:
    """Tokens -> words ("," and "." attached to the word before) and each token's word index."""
    out: list[str] = []
    at = []
    for t in tokens:
        if t.text in PUNCT and out:
            out[-1] += t.text
        else:
            out.append(t.text)
        at.append(len(out) - 1)
    return out, at


def attach(en: list[Src], de: list[Tgt]) -> Aligned:
    """The pair as text and word links, from tokens that know their sources."""
    en_words, en_at = _words(en)
    de_words, de_at = _words(de)
    where = {id(s): en_at[k] for k, s in enumerate(en)}
    links: dict[tuple[int, int], bool] = {}
    for k, t in enumerate(de):
        for s in t.of:
            pair = (where[id(s)], de_at[k])
            links[pair] = links.get(pair, False) or t.text not in PUNCT
    marks: dict[str, list[int]] = {}
    for side, tokens, at in ((0, en, en_at), (1, de, de_at)):
        for k, t in enumerate(tokens):
            if t.mark:
                marks.setdefault(t.mark, [-1, -1])[side] = at[k]
    found = tuple((i, j, sure) for (i, j), sure in sorted(links.items()))
    return Aligned(" ".join(en_words), " ".join(de_words), found,
                   {m: (i, j) for m, (i, j) in marks.items()})


def _noun_phrase(rng: random.Random, case: str) -> tuple[list[Src], list[Tgt], bool]:
    """(English, German, plural?) tokens of a random noun phrase in the given German case."""
    en_sg, en_pl, gender, de_sg, de_pl = rng.choice(NOUNS)
    plural = rng.random() < 0.4
    definite = rng.random() < 0.6
    slot = (case, "pl" if plural else gender)
    det = Src("the" if definite else ("some" if plural else "a"))
    en, de = [det], [Tgt((DEF if definite else INDEF)[slot], (det,))]
    if rng.random() < 0.5:
        adj = Src(rng.choice(list(ADJECTIVES)))
        en.append(adj)
        stem, ending = ADJECTIVES[adj.text], (WEAK if definite else MIXED)[slot]
        word = stem + (ending[1:] if stem.endswith("e") else ending)  # leise + e = leise
        de.append(Tgt(word, (adj,)))
    noun = Src(en_pl if plural else en_sg)
    en.append(noun)
    if det.text == "a" and en[1].text[0] in "aeiou":
        det.text = "an"
    de.append(Tgt(de_pl if plural else de_sg, (noun,)))
    return en, de, plural


def _clause(rng: random.Random, verbs=VERBS) -> tuple[list[Src], list[Tgt], list[Tgt], list[Tgt]]:
    """Subject, verb and object of one clause: (en subject+verb+object, de subject, de verb, de
    object)."""
    subj_en, subj_de, plural = _noun_phrase(rng, "nom")
    obj_en, obj_de, _ = _noun_phrase(rng, "acc")
    v_sg, v_pl, dv_sg, dv_pl = rng.choice(verbs)
    verb = Src(v_pl if plural else v_sg)
    return [*subj_en, verb, *obj_en], subj_de, [Tgt(dv_pl if plural else dv_sg, (verb,))], obj_de


def sentence_pair(rng: random.Random) -> tuple[str, str]:
    """One (English, German-like) sentence pair, punctuation attached as in real text."""
    pair = aligned_pair(rng)
    return pair.en, pair.de


def aligned_pair(rng: random.Random) -> Aligned:
    """One sentence pair with the word alignment its rules make."""
    kind = rng.random()
    if kind < 0.35:  # say-verb with a "that" clause: verb-final subordinate clause
        subj_en, subj_de, plural = _noun_phrase(rng, "nom")
        v_sg, v_pl, dv_sg, dv_pl = rng.choice(SAY_VERBS)
        en_c, s, v, o = _clause(rng)
        say, that, stop = Src(v_pl if plural else v_sg), Src("that"), Src(".")
        return attach([*subj_en, say, that, *en_c, stop],
                      [*subj_de, Tgt(dv_pl if plural else dv_sg, (say,)), Tgt(","),
                       Tgt("dass", (that,)), *s, *o, *v, Tgt(".", (stop,))])
    en_main, s, v, o = _clause(rng)
    en, de = en_main, [*s, *v, *o]
    if kind < 0.6:  # fronted adverb: verb second
        adv = Src(rng.choice(list(ADVERBS)))
        en, de = [adv, *en_main], [*(Tgt(w, (adv,)) for w in ADVERBS[adv.text].split()), *v, *s, *o]
    if rng.random() < 0.4:  # adverbial subordinate clause
        conj = Src(rng.choice(list(CONJUNCTIONS)))
        en_c, s2, v2, o2 = _clause(rng)
        en = [*en, conj, *en_c]
        de = [*de, Tgt(","), Tgt(CONJUNCTIONS[conj.text], (conj,)), *s2, *o2, *v2]
    stop = Src(".")
    return attach([*en, stop], [*de, Tgt(".", (stop,))])


def make_toy_corpus(n_train: int, seed: int = 0) -> dict[str, list[tuple[str, str]]]:
    """Disjoint train/valid/test splits of (English, German-like) pairs; valid and test
    each hold max(100, n_train // 20) pairs (the pronoun variant: pronoun.pronoun_pairs)."""
    return {k: [(p.en, p.de) for p in v] for k, v in make_aligned_corpus(n_train, seed).items()}


def make_aligned_corpus(n_train: int, seed: int = 0) -> dict[str, list[Aligned]]:
    """make_toy_corpus's splits with each pair's gold word alignment."""
    return {split: list(pairs) for split, pairs in _aligned_corpus(n_train, seed).items()}


@functools.lru_cache(maxsize=4)
def _aligned_corpus(n_train: int, seed: int) -> dict[str, tuple[Aligned, ...]]:
    """The splits, made once per process for each size and seed (a run reads each split and its
    links: several calls, each as long as the generator)."""
    rng = random.Random(seed)
    n_eval = max(100, n_train // 20)
    sizes = {"valid": n_eval, "test": n_eval, "train": n_train}
    seen: set[str] = set()
    out: dict[str, tuple[Aligned, ...]] = {}
    for split, size in sizes.items():
        pairs: list[Aligned] = []
        while len(pairs) < size:
            pair = aligned_pair(rng)
            if pair.en not in seen:
                seen.add(pair.en)
                pairs.append(pair)
        out[split] = tuple(pairs)
    return out
