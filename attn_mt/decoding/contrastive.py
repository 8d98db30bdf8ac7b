"""Contrastive evaluation (ContraPro, Müller et al. 2018): an item is a source, its reference and
variants of the reference with the pronoun swapped; the model gets it right when it scores the
reference higher than every variant. Accuracy overall, by reference pronoun, by antecedent distance
and by antecedent role.

Two formats are read. Ours, JSONL (data/pronoun.py writes it with the toy corpus's pronoun variant),
one object a line: "src", "ref", "variants" (a list), "pronoun" (the reference's), "distance" (words
from the antecedent to the pronoun), optional "src_pronoun", "role" (subject / object),
"src_positions" and "tgt_positions" (word indices of "pronoun", "antecedent", "other": what `attn-mt
heads` needs). And ContraPro's JSON, a list of objects with "src segment", "ref segment", "ref
pronoun", "src pronoun", "ante distance" (in sentences) and "errors" (each {"contrastive": ...});
sentences are scored without their context, so only intrasegmental items (distance 0) see their
antecedent.

Here in decoding, beside metrics.py, because both `attn-mt heads` (analysis) and compare-rnn
(measure) score with it, and decoding is the one package both may import.

Tested in tests/decoding/test_scoring.py, tests/analysis/test_coref.py and
tests/export/test_ct2_score.py.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from attn_mt.data.lines import DataError


@dataclass(frozen=True)
class Item:
    src: str
    ref: str
    variants: tuple[str, ...]
    pronoun: str  # the reference's target pronoun
    distance: int  # antecedent to pronoun, in `unit`
    unit: str = "words"  # ours: words; ContraPro: sentences
    src_pronoun: str = ""
    role: str = ""  # the antecedent's role: subject or object ("" when unknown)
    other_pronoun: str = ""  # the other noun's pronoun
    src_positions: dict | None = None  # word indices: pronoun, antecedent, other
    tgt_positions: dict | None = None


def _item(obj: object, where: str) -> Item:
    if not isinstance(obj, dict):
        raise DataError(f"{where}: a JSON {type(obj).__name__}, not an object")
    if "src segment" in obj:  # ContraPro
        keys = {"src": "src segment", "ref": "ref segment", "pronoun": "ref pronoun",
                "distance": "ante distance", "errors": "errors"}
    else:
        keys = {"src": "src", "ref": "ref", "pronoun": "pronoun", "distance": "distance",
                "errors": "variants"}
    for key in keys.values():
        if key not in obj:
            raise DataError(f"{where}: no {key!r} field")
    for key in ("src", "ref", "pronoun"):
        if not isinstance(obj[keys[key]], str):
            raise DataError(f"{where}: {keys[key]!r} must be a string")
    distance, errors = obj[keys["distance"]], obj[keys["errors"]]
    if type(distance) is not int or distance < 0:
        raise DataError(f"{where}: {keys['distance']!r} must be an integer >= 0, not "
                        f"{str(distance)[:40]}")
    if "src segment" in obj:
        variants = [e.get("contrastive") if isinstance(e, dict) else None for e in errors or []] \
            if isinstance(errors, list) else [None]
    else:
        variants = errors if isinstance(errors, list) else [None]
    if not variants or not all(isinstance(v, str) for v in variants):
        items = "objects with a contrastive string" if "src segment" in obj else "strings"
        raise DataError(f"{where}: {keys['errors']!r} must be a non-empty list of {items}")
    if "src segment" in obj:
        return Item(obj["src segment"], obj["ref segment"], tuple(variants),
                    obj["ref pronoun"].lower(), distance, "sentences",
                    str(obj.get("src pronoun", "")).lower())
    positions = {k: obj.get(k) for k in ("src_positions", "tgt_positions")}
    for k, v in positions.items():
        if v is not None and not (isinstance(v, dict)
                                  and all(type(i) is int and i >= 0 for i in v.values())):
            raise DataError(f"{where}: {k!r} must map names to word indices")
    return Item(obj["src"], obj["ref"], tuple(variants), obj["pronoun"], distance, "words",
                str(obj.get("src_pronoun", "")), str(obj.get("role", "")),
                str(obj.get("other_pronoun", "")), **positions)


def read_items(path: Path | str) -> list[Item]:
    """A contrastive set: our JSONL, or ContraPro's JSON (a list); DataError names the file and line
    or entry."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DataError(f"{path}: contrastive set not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"{path}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    if text.lstrip().startswith("["):  # ContraPro: one JSON list
        try:
            entries = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: not valid JSON ({e.msg}, line {e.lineno})") from None
        except RecursionError:
            raise DataError(f"{path}: not valid JSON (nested too deep)") from None
        items = [_item(obj, f"{path}: entry {i}") for i, obj in enumerate(entries)]
    else:
        items = []
        for n, line in enumerate(text.splitlines(), 1):
            if line.strip():
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise DataError(f"{path}:{n}: not valid JSON ({e.msg})") from None
                except RecursionError:
                    raise DataError(f"{path}:{n}: not valid JSON (nested too deep)") from None
                items.append(_item(obj, f"{path}:{n}"))
    if not items:
        raise DataError(f"{path}: no contrastive items")
    return items


def items_from_records(records: Sequence[dict]) -> list[Item]:
    """Items from JSON objects as read from our JSONL (data.pronoun.contrastive_records)."""
    return [_item(r, f"record {i}") for i, r in enumerate(records)]


def distance_bin(distance: int, unit: str) -> str:
    """ContraPro's bins for sentences (0, 1, 2, 3, >3); 5-word bins for words (1-5, ..., 16-20,
    >20)."""
    if unit == "sentences":
        return str(distance) if distance <= 3 else ">3"
    if distance > 20:
        return ">20"
    lo = (max(distance, 1) - 1) // 5 * 5 + 1
    return f"{lo}-{lo + 4}"


@dataclass
class Tally:
    items: int = 0
    correct: int = 0

    @property
    def accuracy(self) -> float:
        return round(self.correct / self.items, 4) if self.items else 0.0

    def json(self) -> dict:
        return {"items": self.items, "correct": self.correct, "accuracy": self.accuracy}


@dataclass
class ContrastiveReport:
    """Accuracy (the reference beats every variant) overall and broken down."""

    items: int
    correct: int
    accuracy: float
    by_pronoun: dict[str, dict] = field(default_factory=dict)
    by_distance: dict[str, dict] = field(default_factory=dict)  # bins of distance_bin, in order
    by_role: dict[str, dict] = field(default_factory=dict)
    unit: str = "words"
    results: list[bool] = field(default_factory=list, repr=False)  # per item, in order

    def json(self, per_item: bool = False) -> dict:
        out = asdict(self)
        if not per_item:
            out.pop("results")
        return out


def judge(items: Sequence[Item], log_probs: Sequence[float]) -> list[bool]:
    """Per item, whether its reference scored higher than each of its variants; `log_probs` holds,
    item after item, the reference's score and then its variants' (the order of `pairs`)."""
    out, k = [], 0
    for item in items:
        ref, variants = log_probs[k], log_probs[k + 1 : k + 1 + len(item.variants)]
        out.append(all(ref > v for v in variants))
        k += 1 + len(item.variants)
    return out


def pairs(items: Sequence[Item]) -> tuple[list[str], list[str]]:
    """(sources, targets) to score: each item's reference, then its variants."""
    src, tgt = [], []
    for item in items:
        for target in (item.ref, *item.variants):
            src.append(item.src)
            tgt.append(target)
    return src, tgt


def report(items: Sequence[Item], correct: Sequence[bool]) -> ContrastiveReport:
    """Tally per-item results overall, by pronoun, by distance bin and by role."""
    groups: dict[str, dict[str, Tally]] = {"by_pronoun": {}, "by_distance": {}, "by_role": {}}
    for item, ok in zip(items, correct, strict=True):
        keys = {"by_pronoun": item.pronoun, "by_distance": distance_bin(item.distance, item.unit),
                "by_role": item.role}
        for group, key in keys.items():
            if key:
                tally = groups[group].setdefault(key, Tally())
                tally.items += 1
                tally.correct += ok
    order = {"by_distance": lambda k: (k.startswith(">"), int(k.strip(">").split("-")[0]))}
    out = {g: {k: t.json() for k, t in sorted(d.items(), key=lambda kv: order.get(g, str)(kv[0]))}
           for g, d in groups.items()}
    n, k = len(correct), sum(correct)
    units = {item.unit for item in items}
    return ContrastiveReport(n, k, round(k / n, 4) if n else 0.0, **out,
                             unit="/".join(sorted(units)), results=list(correct))


def evaluate_contrastive(score_fn: Callable[[list[str], list[str]], Sequence],
                         items: Sequence[Item],
                         ) -> ContrastiveReport:
    """Score every item's reference and variants with `score_fn(sources, targets)` (Scores, or log
    probabilities: higher is better) and report the accuracy."""
    src, tgt = pairs(items)
    scores = score_fn(src, tgt)
    return report(items, judge(items, [float(getattr(s, "log_prob", s)) for s in scores]))


def rule_scores(items: Sequence[Item], pronoun_of: Callable[[Item], str]) -> list[float]:
    """Scores of a rule that picks a pronoun per item (`pronoun_of`): 0 for targets whose pronoun
    (at the reference's position) is the rule's, -1 for the rest; in the order of `pairs`."""
    out = []
    for item in items:
        position = item.tgt_positions["pronoun"] if item.tgt_positions else None
        for target in (item.ref, *item.variants):
            word = target.split(" ")[position] if position is not None else ""
            out.append(0.0 if word == pronoun_of(item) else -1.0)
    return out


def subject_rule(items: Sequence[Item]) -> ContrastiveReport:
    """The rule "it is always the subject" on our items (their role and the other noun's pronoun say
    what it picks): about 50% on the pronoun task, by construction."""
    return report(items, judge(items, rule_scores(
        items, lambda item: item.pronoun if item.role == "subject" else item.other_pronoun)))
