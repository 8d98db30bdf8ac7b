"""A built-in, offline English -> German-like corpus with real translation phenomena.

Every source sentence has exactly one correct translation, which the rules below produce:
- agreement: articles and adjective endings follow gender, number, case and article type
  ("the big dog" -> "der große Hund", "a big dog" -> "ein großer Hund", object "den großen Hund");
  verbs agree with their subject in number ("sieht" / "sehen");
- word order: subordinate clauses put the verb last ("weil der Hund die Katze sieht"), and a
  fronted adverb moves the verb before the subject (verb second: "gestern sieht der Hund ...");
- one word becoming several: some adverbs are phrases ("tomorrow" -> "am nächsten Tag").
Train, valid and test sets are disjoint: sentences are deduplicated across splits.
"""

from __future__ import annotations

import random

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


def _noun_phrase(rng: random.Random, case: str) -> tuple[str, str, bool]:
    """(English, German, plural?) for a random noun phrase in the given German case."""
    en_sg, en_pl, gender, de_sg, de_pl = rng.choice(NOUNS)
    plural = rng.random() < 0.4
    definite = rng.random() < 0.6
    slot = (case, "pl" if plural else gender)
    en = [("the" if definite else ("some" if plural else "a"))]
    de = [(DEF if definite else INDEF)[slot]]
    if rng.random() < 0.5:
        adj = rng.choice(list(ADJECTIVES))
        en.append(adj)
        stem, ending = ADJECTIVES[adj], (WEAK if definite else MIXED)[slot]
        de.append(stem + (ending[1:] if stem.endswith("e") else ending))  # leise + e = leise
    en.append(en_pl if plural else en_sg)
    if en[0] == "a" and en[1][0] in "aeiou":
        en[0] = "an"
    de.append(de_pl if plural else de_sg)
    return " ".join(en), " ".join(de), plural


def _clause(rng: random.Random, verbs=VERBS) -> tuple[str, str, str, str]:
    """Subject, verb and object of one clause: (en subject+verb+object, de subject, de verb, de object)."""
    subj_en, subj_de, plural = _noun_phrase(rng, "nom")
    obj_en, obj_de, _ = _noun_phrase(rng, "acc")
    v_sg, v_pl, dv_sg, dv_pl = rng.choice(verbs)
    en = f"{subj_en} {v_pl if plural else v_sg} {obj_en}"
    return en, subj_de, (dv_pl if plural else dv_sg), obj_de


def sentence_pair(rng: random.Random) -> tuple[str, str]:
    """One (English, German-like) sentence pair, punctuation attached as in real text."""
    en, de = _sentence_pair(rng)
    return (en.replace(" .", ".").replace(" ,", ","), de.replace(" .", ".").replace(" ,", ","))


def _sentence_pair(rng: random.Random) -> tuple[str, str]:
    kind = rng.random()
    if kind < 0.35:  # say-verb with a "that" clause: verb-final subordinate clause
        subj_en, subj_de, plural = _noun_phrase(rng, "nom")
        v_sg, v_pl, dv_sg, dv_pl = rng.choice(SAY_VERBS)
        en_c, s, v, o = _clause(rng)
        return (f"{subj_en} {v_pl if plural else v_sg} that {en_c} .",
                f"{subj_de} {dv_pl if plural else dv_sg} , dass {s} {o} {v} .")
    en_main, s, v, o = _clause(rng)
    en, de = en_main, f"{s} {v} {o}"
    if kind < 0.6:  # fronted adverb: verb second
        adv = rng.choice(list(ADVERBS))
        en, de = f"{adv} {en_main}", f"{ADVERBS[adv]} {v} {s} {o}"
    if rng.random() < 0.4:  # adverbial subordinate clause
        conj = rng.choice(list(CONJUNCTIONS))
        en_c, s2, v2, o2 = _clause(rng)
        en, de = f"{en} {conj} {en_c}", f"{de} , {CONJUNCTIONS[conj]} {s2} {o2} {v2}"
    return f"{en} .", f"{de} ."


def make_toy_corpus(n_train: int, seed: int = 0) -> dict[str, list[tuple[str, str]]]:
    """Disjoint train/valid/test splits of (English, German-like) pairs; valid and test
    each hold max(100, n_train // 20) pairs (the pronoun variant: pronoun.pronoun_pairs)."""
    rng = random.Random(seed)
    n_eval = max(100, n_train // 20)
    sizes = {"valid": n_eval, "test": n_eval, "train": n_train}
    seen: set[str] = set()
    out: dict[str, list[tuple[str, str]]] = {}
    for split, size in sizes.items():
        pairs: list[tuple[str, str]] = []
        while len(pairs) < size:
            src, tgt = sentence_pair(rng)
            if src not in seen:
                seen.add(src)
                pairs.append((src, tgt))
        out[split] = pairs
    return out
