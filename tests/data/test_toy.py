from attn_mt.data.toy import make_toy_corpus


def test_splits_are_disjoint_seeded_and_sized():
    a, b = make_toy_corpus(500, seed=3), make_toy_corpus(500, seed=3)
    assert a == b
    assert len(a["train"]) == 500 and len(a["valid"]) == len(a["test"]) == 100
    srcs = [set(s for s, _ in a[k]) for k in ("train", "valid", "test")]
    assert not (srcs[0] & srcs[1]) and not (srcs[0] & srcs[2]) and not (srcs[1] & srcs[2])
    assert make_toy_corpus(500, seed=4)["train"] != a["train"]


def test_phenomena_are_present():
    pairs = make_toy_corpus(3000)["train"]
    de = " ".join(t for _, t in pairs)
    # agreement: the article and adjective ending depend on gender, case and article type
    assert "der große Hund" in de and "den großen Hund" in de and "ein großer Hund" in de
    # verb-final subordinate clause and verb-second after a fronted adverb
    assert any(", dass" in t
               and t.rstrip(".").split()[-1] in {"sieht", "sehen", "mag", "mögen", "findet",
               "finden", "hört", "hören", "zeichnet", "zeichnen", "trägt", "tragen", "kennt",
                                                 "kennen", "besucht", "besuchen"} for _, t in pairs)
    assert any(s.startswith("yesterday ") and t.split()[1] in {"sieht", "sehen"} for s, t in pairs)
    # one word becoming several
    assert any("tomorrow" in s and "am nächsten Tag" in t for s, t in pairs)
