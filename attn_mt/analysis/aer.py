"""Scoring word alignments against gold: alignment error rate, precision and recall (Och and Ney
2003), for one method or for every layer, head and method of a model (which attention aligns best).

With A the predicted links, S the sure and P the possible gold links (P holds S), summed over the
corpus: precision |A & P| / |A|, recall |A & S| / |S|, AER 1 - (|A & S| + |A & P|) / (|A| + |S|).
Lower AER is better.

Tested in tests/decoding/test_alignment.py.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from attn_mt.decoding.alignment import Attended, Method, align
from attn_mt.decoding.pharaoh import Gold, Link


@dataclass(frozen=True)
class AlignmentScore:
    """One method's scores on a gold set, in percent, and how many links it predicted."""

    aer: float
    precision: float
    recall: float
    links: int


def score(predicted: list[set[Link]], gold: list[Gold]) -> AlignmentScore:
    """AER, precision and recall of `predicted` against `gold`, line by line, summed over the
    corpus."""
    a = s = a_s = a_p = 0
    for found, g in zip(predicted, gold, strict=True):
        a, s = a + len(found), s + len(g.sure)
        a_s, a_p = a_s + len(found & g.sure), a_p + len(found & g.possible)
    aer = 1 - (a_s + a_p) / (a + s) if a + s else 0.0
    return AlignmentScore(round(100 * aer, 2), round(100 * a_p / a, 2) if a else 0.0,
                          round(100 * a_s / s, 2) if s else 0.0, a)


@dataclass(frozen=True)
class AlignmentReport:
    """Each method's scores on a gold set, in the order measured (`best`: the lowest AER)."""

    rows: dict[str, AlignmentScore]
    sentences: int

    @property
    def best(self) -> str:
        return min(self.rows, key=lambda m: (self.rows[m].aer, m))

    def table(self) -> str:
        """The report as a plain-text table, best method marked."""
        width = max(len("method"), *map(len, self.rows))
        lines = [f"{'method':<{width}}  {'AER':>6}  {'prec':>6}  {'recall':>6}  {'links':>6}"]
        for name, r in self.rows.items():
            mark = "  <- best" if name == self.best and len(self.rows) > 1 else ""
            lines.append(f"{name:<{width}}  {r.aer:6.2f}  {r.precision:6.2f}  {r.recall:6.2f}  "
                         f"{r.links:6d}{mark}")
        end = f"({self.sentences} sentence pairs; AER, precision and recall in %)"
        return "\n".join([*lines, end])

    def to_dict(self) -> dict:
        return {"sentences": self.sentences, "best": self.best,
                "methods": {name: asdict(r) for name, r in self.rows.items()}}


def report(pairs: list[Attended], gold: list[Gold], methods: list[Method],
           reverse: list[Attended] | None = None) -> AlignmentReport:
    """Every method scored on the same pairs (their attention computed once)."""
    rows = {m.name: score(align(pairs, m, reverse), gold) for m in methods}
    return AlignmentReport(rows, len(pairs))
