"""The toy corpus's pronoun variant (`data.toy_variant: pronoun`): "it" resolved by meaning, as in
"the animal didn't cross the street because it was too tired" (Vaswani et al. 2017, Figure 4).

One job: make that corpus, its gold links and its contrastive test set.

Every sentence has two noun phrases, one animate (animal, dog, cat ...) and one inanimate (street,
river, wall ...), in either role: the animate noun is the subject of some verbs ("the dog didn't
cross the river") and the object of others ("the wall stopped the dog"). A "because it/they ..."
clause follows whose predicate fits only one of them: tired, hungry, afraid ... an animate noun;
wide, long, wet ... an inanimate one. So the antecedent is the subject in half the sentences and the
object in the other half, and only the predicate's meaning decides which. The German-like side
takes the antecedent's gender (er / sie / es; plural sie) and number ("war" / "waren"), verb last:
"das Tier überquerte die Straße nicht, weil es zu müde war." Adjectives, relative clauses and
adverbials between the antecedent and the pronoun move it from 2 to 20-odd words away.

`contrastive_records` writes the contrastive test set of a split (decoding/contrastive.py reads it):
for each sentence whose two nouns take different pronouns, the reference and its variants with the
other pronouns (er / sie / es, the verb kept, as ContraPro's), the word positions of the pronoun,
the antecedent and the other noun on both sides, the antecedent's role and its distance in words.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

from .toy import DEF, INDEF, MIXED, WEAK, Src, Tgt, attach

# noun: (singular, plural, gender, German singular, German plural)
# animals, not people: English "it" must not give the antecedent away as "he" or "she" would
ANIMATE = [
    ("animal", "animals", "n", "Tier", "Tiere"), ("dog", "dogs", "m", "Hund", "Hunde"),
    ("cat", "cats", "f", "Katze", "Katzen"), ("horse", "horses", "n", "Pferd", "Pferde"),
    ("bird", "birds", "m", "Vogel", "Vögel"), ("cow", "cows", "f", "Kuh", "Kühe"),
    ("pig", "pigs", "n", "Schwein", "Schweine"), ("fox", "foxes", "m", "Fuchs", "Füchse"),
    ("mouse", "mice", "f", "Maus", "Mäuse"),
]
INANIMATE = [
    ("street", "streets", "f", "Straße", "Straßen"), ("river", "rivers", "m", "Fluss", "Flüsse"),
    ("bridge", "bridges", "f", "Brücke", "Brücken"), ("field", "fields", "n", "Feld", "Felder"),
    ("wall", "walls", "f", "Mauer", "Mauern"), ("road", "roads", "m", "Weg", "Wege"),
    ("lake", "lakes", "m", "See", "Seen"), ("roof", "roofs", "n", "Dach", "Dächer"),
    ("fence", "fences", "m", "Zaun", "Zäune"),
]
# predicates that fit only an animate / only an inanimate noun
ANIMATE_PREDICATES = {"tired": "müde", "hungry": "hungrig", "afraid": "ängstlich",
                      "weak": "schwach", "lazy": "faul", "sick": "krank", "sleepy": "schläfrig",
                      "nervous": "nervös"}
INANIMATE_PREDICATES = {"wide": "breit", "long": "lang", "wet": "nass", "high": "hoch",
                        "deep": "tief", "narrow": "schmal", "steep": "steil", "slippery": "glatt"}
DEGREES = {"too": "zu", "very": "sehr", "so": "so"}
ADJECTIVES = {"big": "groß", "small": "klein", "old": "alt", "red": "rot", "brown": "braun",
              "white": "weiß", "black": "schwarz", "green": "grün"}
# verb: (English present, English past, German past singular, German past plural)
ANIMATE_SUBJECT = [("cross", "crossed", "überquerte", "überquerten"),
                   ("reach", "reached", "erreichte", "erreichten"),
                   ("climb", "climbed", "bestieg", "bestiegen"),
                   ("like", "liked", "mochte", "mochten"), ("see", "saw", "sah", "sahen"),
                   ("use", "used", "benutzte", "benutzten")]
INANIMATE_SUBJECT = [("stop", "stopped", "stoppte", "stoppten"),
                     ("block", "blocked", "blockierte", "blockierten"),
                     ("scare", "scared", "erschreckte", "erschreckten"),
                     ("impress", "impressed", "beeindruckte", "beeindruckten"),
                     ("hurt", "hurt", "verletzte", "verletzten"),
                     ("tire", "tired", "ermüdete", "ermüdeten")]
# relative clauses: (English, German with {rel} for the accusative relative pronoun, their word
# links)
RELATIVES = [("that we saw", "{rel} wir sahen", "0-0 1-1 2-2"),
             ("that everyone knew", "{rel} jeder kannte", "0-0 1-1 2-2"),
             ("that we had seen before", "{rel} wir vorher gesehen hatten", "0-0 1-1 2-4 3-3 4-2"),
             ("that nobody had noticed", "{rel} niemand bemerkt hatte", "0-0 1-1 2-3 3-2"),
             ("that my friends liked so much", "{rel} meine Freunde so sehr mochten",
              "0-0 1-1 2-2 3-5 4-3 5-4")]
ADVERBIALS = {"yesterday": "gestern", "this morning": "heute morgen", "again": "wieder",
              "in the end": "am Ende", "after a while": "nach einer Weile"}
ADVERBIAL_LINKS = {"in the end": "0-0 1-0 2-1"}  # the others word for word
PRONOUNS = {"m": "er", "f": "sie", "n": "es", "pl": "sie"}  # German pronoun by gender or plural
# a variant replaces the pronoun with each other one (ContraPro's errors)
SWAPS = ("er", "sie", "es")
Tokens = tuple[list[Src], list[Tgt]]  # a phrase's source and target tokens (toy.attach joins them)


@dataclass(frozen=True)
class Phrase:
    """A noun phrase: its words on each side (word k translates word k), and its pronoun."""

    en: list[str]
    de: list[str]
    pronoun: str  # er, sie or es; sie for a plural
    plural: bool


def _noun_phrase(rng: random.Random, nouns: list, case: str) -> Phrase:
    en_sg, en_pl, gender, de_sg, de_pl = rng.choice(nouns)
    plural = rng.random() < 0.3
    definite = plural or rng.random() < 0.7
    slot = (case, "pl" if plural else gender)
    en, de = ["the" if definite else "a"], [(DEF if definite else INDEF)[slot]]
    for adj in rng.sample(list(ADJECTIVES), rng.choice((0, 0, 1, 1, 2))):
        en.append(adj)
        de.append(ADJECTIVES[adj] + (WEAK if definite else MIXED)[slot])
    en.append(en_pl if plural else en_sg)
    if en[0] == "a" and en[1][0] in "aeiou":
        en[0] = "an"
    return Phrase(en, [*de, de_pl if plural else de_sg],
                  PRONOUNS["pl" if plural else gender], plural)


def _relative(rng: random.Random, np: Phrase) -> Tokens:
    """An optional relative clause after a noun phrase: (English, German tokens with commas)."""
    if rng.random() < 0.6:
        return [], []
    en, de, links = rng.choice(RELATIVES)
    rel = "die" if np.plural else {"er": "den", "sie": "die", "es": "das"}[np.pronoun]
    en_t, de_t = _linked(en.split(), de.format(rel=rel).split(), links)
    return en_t, [Tgt(","), *de_t, Tgt(",")]


def _linked(en: list[str], de: list[str], links: str = "") -> Tokens:
    """Tokens of a phrase and its translation, linked as Pharaoh `links` say (none: word k to k)."""
    src = [Src(w) for w in en]
    pairs = [tuple(map(int, link.split("-"))) for link in links.split()]
    pairs = pairs or [(k, k) for k in range(len(de))]
    return src, [Tgt(w, tuple(src[i] for i, j in pairs if j == k)) for k, w in enumerate(de)]


@dataclass(frozen=True)
class Example:
    """One sentence pair and where its pronoun, antecedent and other noun are (word indices,
    punctuation attached as in the text)."""

    en: str
    de: str
    pronoun: str  # the reference's German pronoun
    other_pronoun: str  # the other noun's
    src_pronoun: str  # it / they
    role: str  # the antecedent's: subject or object
    src_positions: dict[str, int]  # pronoun, antecedent, other
    tgt_positions: dict[str, int]
    links: str = ""  # the gold word alignment, a Pharaoh line (toy.Aligned.pharaoh)


def pronoun_example(rng: random.Random) -> Example:
    """One sentence pair of the pronoun task, drawn at random."""
    animate_subject = rng.random() < 0.5
    subj = _noun_phrase(rng, ANIMATE if animate_subject else INANIMATE, "nom")
    obj = _noun_phrase(rng, INANIMATE if animate_subject else ANIMATE, "acc")
    antecedent_animate = rng.random() < 0.5
    verb = rng.choice(ANIMATE_SUBJECT if animate_subject else INANIMATE_SUBJECT)
    negated = rng.random() < 0.5
    rel_s, rel_o = _relative(rng, subj), _relative(rng, obj)
    adverbial = rng.choice([None, None, *ADVERBIALS])
    pred = rng.choice(list(ANIMATE_PREDICATES if antecedent_animate else INANIMATE_PREDICATES))
    return compose(subj, obj, verb, negated, pred, rng.choice(list(DEGREES)), rel_s, rel_o,
                   adverbial)


def classic(predicate: str = "tired") -> Example:
    """"the animal didn't cross the street because it was too tired." (or too wide, ...), by the
    grammar."""
    animal = Phrase(["the", "animal"], ["das", "Tier"], "es", False)
    street = Phrase(["the", "street"], ["die", "Straße"], "sie", False)
    return compose(animal, street, ANIMATE_SUBJECT[0], True, predicate, "too")


def compose(subj: Phrase, obj: Phrase, verb: tuple[str, str, str, str], negated: bool, pred: str,
            degree: str, rel_s: Tokens = ([], []), rel_o: Tokens = ([], []),
            adverbial: str | None = None) -> Example:
    """The sentence pair of these choices and its word alignment; "it" refers to the noun phrase the
    predicate fits."""
    animate_subject = verb in ANIMATE_SUBJECT
    ante, role = ((subj, "subject") if (pred in ANIMATE_PREDICATES) == animate_subject
                  else (obj, "object"))
    other = obj if ante is subj else subj
    present, past, de_sg, de_pl = verb
    de_pred = (ANIMATE_PREDICATES | INANIMATE_PREDICATES)[pred]

    def phrase(np: Phrase) -> Tokens:  # the noun (last word) marked
        en, de = _linked(np.en, np.de)
        en[-1].mark = de[-1].mark = "antecedent" if np is ante else "other"
        return en, de

    (s_en, s_de), (o_en, o_de) = phrase(subj), phrase(obj)
    verbs = [Src("didn't"), Src(present)] if negated else [Src(past)]
    adverb = (adverbial.split(), ADVERBIALS[adverbial].split()) if adverbial else ([], [])
    adv_en, adv_de = _linked(*adverb, ADVERBIAL_LINKS.get(adverbial or "", ""))
    tail = [Src(w) for w in ("because", "they" if ante.plural else "it",
                             "were" if ante.plural else "was", degree, pred, ".")]
    tail[1].mark = "pronoun"
    en = [*s_en, *rel_s[0], *verbs, *o_en, *rel_o[0], *adv_en, *tail]
    de = [*s_de, *rel_s[1], Tgt(de_pl if subj.plural else de_sg, (verbs[-1],)), *o_de, *rel_o[1],
          *adv_de]
    de += [Tgt("nicht", (verbs[0],))] if negated else []
    de += [Tgt(","), Tgt("weil", (tail[0],)), Tgt(ante.pronoun, (tail[1],), "pronoun"),
           Tgt(DEGREES[degree], (tail[3],)), Tgt(de_pred, (tail[4],)),
           Tgt("waren" if ante.plural else "war", (tail[2],)), Tgt(".", (tail[5],))]
    pair = attach(en, de)
    return Example(pair.en, pair.de, ante.pronoun, other.pronoun, "they" if ante.plural else "it",
                   role, {m: i for m, (i, _) in pair.marks.items()},
                   {m: j for m, (_, j) in pair.marks.items()}, pair.pharaoh())


def make_pronoun_corpus(n_train: int, seed: int = 0) -> dict[str, list[Example]]:
    """Disjoint train/valid/test splits of examples (sizes as toy.make_toy_corpus: valid and test
    each max(100, n_train // 20)); the classic sentence and its "too wide" twin are never in
    train."""
    return {split: list(examples) for split, examples in _pronoun_corpus(n_train, seed).items()}


@functools.lru_cache(maxsize=4)
def _pronoun_corpus(n_train: int, seed: int) -> dict[str, tuple[Example, ...]]:
    """The splits, made once per process for each size and seed (a run reads each split, its
    contrastive set and its links)."""
    rng = random.Random(seed)
    n_eval = max(100, n_train // 20)
    seen = {classic("tired").en, classic("wide").en}
    out: dict[str, tuple[Example, ...]] = {}
    for split, size in {"valid": n_eval, "test": n_eval, "train": n_train}.items():
        examples: list[Example] = []
        while len(examples) < size:
            ex = pronoun_example(rng)
            if ex.en not in seen:
                seen.add(ex.en)
                examples.append(ex)
        out[split] = tuple(examples)
    return out


def pronoun_pairs(n_train: int, seed: int = 0) -> dict[str, list[tuple[str, str]]]:
    """The splits of make_pronoun_corpus as (English, German-like) pairs, as toy.make_toy_corpus
    gives them."""
    return {k: [(ex.en, ex.de) for ex in v] for k, v in make_pronoun_corpus(n_train, seed).items()}


def swap_pronoun(text: str, position: int, pronoun: str) -> str:
    """`text` with its word at `position` replaced by `pronoun`."""
    words = text.split(" ")
    words[position] = pronoun
    return " ".join(words)


def contrastive_records(examples: list[Example]) -> list[dict]:
    """The contrastive test set of a split, as JSON objects (decoding/contrastive.py's JSONL
    format): the examples whose two nouns take different pronouns, each with its variants."""
    out = []
    for ex in examples:
        if ex.pronoun == ex.other_pronoun:
            continue
        position = ex.tgt_positions["pronoun"]
        out.append({"src": ex.en, "ref": ex.de,
                    "variants": [swap_pronoun(ex.de, position, p) for p in SWAPS
                                 if p != ex.pronoun], "pronoun": ex.pronoun,
                    "src_pronoun": ex.src_pronoun, "other_pronoun": ex.other_pronoun,
                    "role": ex.role, "distance": ex.src_positions["pronoun"]
                    - ex.src_positions["antecedent"], "src_positions": ex.src_positions,
                    "tgt_positions": ex.tgt_positions})
    return out
