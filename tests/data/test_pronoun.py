"""The toy corpus's pronoun variant: "it" decided by the predicate's meaning, and its contrastive
set."""

from attn_mt.data import pronoun
from attn_mt.data.pronoun import classic, contrastive_records, make_pronoun_corpus, pronoun_pairs
from attn_mt.data.toy import make_toy_corpus


def test_the_classic_sentence_and_its_twin_are_in_the_language_and_held_out():
    tired, wide = classic("tired"), classic("wide")
    assert tired.en == "the animal didn't cross the street because it was too tired."
    assert tired.de == "das Tier überquerte die Straße nicht, weil es zu müde war."
    assert wide.de == "das Tier überquerte die Straße nicht, weil sie zu breit war."
    assert (tired.role, wide.role) == ("subject", "object")
    assert tired.src_positions == {"antecedent": 1, "other": 5, "pronoun": 7}
    corpus = pronoun_pairs(2000, seed=1)
    assert not {tired.en, wide.en} & {s for split in corpus.values() for s, _ in split}


def test_splits_are_disjoint_seeded_and_sized():
    a = pronoun_pairs(400, seed=3)
    assert a == pronoun_pairs(400, seed=3) != pronoun_pairs(400, seed=4)
    assert len(a["train"]) == 400 and len(a["valid"]) == len(a["test"]) == 100
    srcs = [{s for s, _ in a[k]} for k in ("train", "valid", "test")]
    assert not (srcs[0] & srcs[1] or srcs[0] & srcs[2] or srcs[1] & srcs[2])
    assert make_toy_corpus(400, seed=3) != a  # the default corpus is another


def test_the_predicate_decides_the_antecedent_in_either_role():
    examples = make_pronoun_corpus(3000, seed=0)["train"]
    animate = {n[0] for n in pronoun.ANIMATE} | {n[1] for n in pronoun.ANIMATE}
    inanimate = {n[0] for n in pronoun.INANIMATE} | {n[1] for n in pronoun.INANIMATE}
    for ex in examples:
        words, de = ex.en.split(), ex.de.split()
        predicate = words[-1].rstrip(".")
        antecedent = words[ex.src_positions["antecedent"]]
        assert antecedent in (animate if predicate in pronoun.ANIMATE_PREDICATES else inanimate), ex
        assert predicate in pronoun.ANIMATE_PREDICATES or predicate in pronoun.INANIMATE_PREDICATES
        assert words[ex.src_positions["pronoun"]] == ex.src_pronoun
        assert de[ex.tgt_positions["pronoun"]] == ex.pronoun
        assert de[-1] == ("waren." if ex.src_pronoun == "they" else "war.")  # the verb agrees, last
    roles = [ex.role for ex in examples]
    assert 0.45 < roles.count("subject") / len(roles) < 0.55  # position alone cannot decide
    distances = [ex.src_positions["pronoun"] - ex.src_positions["antecedent"] for ex in examples]
    assert min(distances) == 2 and max(distances) >= 20


def test_contrastive_records_swap_only_the_pronoun():
    examples = make_pronoun_corpus(2000, seed=0)["test"]
    records = contrastive_records(examples)
    # the nouns' pronouns differ in these only
    assert 0.4 * len(examples) < len(records) < len(examples)
    for r in records:
        assert r["pronoun"] != r["other_pronoun"] and len(r["variants"]) == 2
        position = r["tgt_positions"]["pronoun"]
        for variant in r["variants"]:
            ref, var = r["ref"].split(), variant.split()
            assert ([i for i, (a, b) in enumerate(zip(ref, var, strict=True)) if a != b]
                    == [position])
        assert {v.split()[position] for v in r["variants"]} | {r["pronoun"]} == {"er", "sie", "es"}
