"""The figures the docs quote, each registered once in docs/facts.json with the run that measured
it, and checked against every quote of it in README.md, docs/*.md and the tutorial.

    python scripts/doc_facts.py          # exit 1, one line per problem, when a doc disagrees

A fact's value is a literal (`value`) or read from a measurement JSON file of docs/ (`file` +
dotted `key`, as docs/readme_results.json's rows read theirs). Its `quotes` are phrases with `{}`
(or `{:.1f}`, a format) where the figure stands; a space in one matches any whitespace, so a quote
may wrap. Every quote must be found in the doc it names, and wherever one is found, in any doc, the
figure there must be the recorded one: a doc that quotes another figure for the same measurement
fails the check. The results tables' rows read a fact by its name (scripts/results_table.py).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

from results_table import StaleError, lookup

ROOT = Path(__file__).resolve().parents[1]
FACTS = "docs/facts.json"
NUMBER = r"([-+]?\d[\d,]*(?:\.\d+)?)"  # a quoted figure: 98.02, 4,106, -11.3
FIELD = re.compile(r"\{(:[^{}]*)?\}")


def docs(root: Path = ROOT) -> dict[str, str]:
    """The texts the facts are checked in: README.md, docs/*.md and the tutorial's cells, each
    with its printed outputs."""
    texts = {"README.md": (root / "README.md").read_text(encoding="utf-8")}
    texts |= {f"docs/{p.name}": p.read_text(encoding="utf-8")
              for p in sorted((root / "docs").glob("*.md"))}
    notebook = json.loads((root / "docs/tutorial.ipynb").read_text(encoding="utf-8"))
    texts["docs/tutorial.ipynb"] = "\n".join(
        "".join(cell["source"]) + "".join("".join(out.get("text", ""))
                                          for out in cell.get("outputs", []))
        for cell in notebook["cells"])
    return texts


def pattern(quote: str) -> tuple[re.Pattern, str]:
    """The regex of a quote (its figure captured) and the figure's format spec."""
    spec = FIELD.search(quote)
    if spec is None or len(FIELD.findall(quote)) != 1:
        raise StaleError(f"{FACTS}: quote {quote!r} needs exactly one {{}} where the figure stands")
    before, after = quote[:spec.start()], quote[spec.end():]

    def words(part: str) -> str:
        return r"\s+".join(map(re.escape, part.split()))

    text = words(before) + (r"\s+" if before[-1:].isspace() else "") + NUMBER
    text += (r"\s+" if after[:1].isspace() else "") + words(after)
    return re.compile(text), (spec.group(1) or ":")[1:]


def recorded(fact: dict, root: Path = ROOT):
    """The fact's value: its literal, or the number at `key` of its JSON file; of a list there,
    item `at`, or `ratio: [i, j]` (item i over item j); with `over` (a second key), the one over
    the other."""
    if "value" in fact:
        return fact["value"]
    data = json.loads((root / fact["file"]).read_text(encoding="utf-8"))
    x = lookup(data, fact["key"])
    if "over" in fact:
        y = lookup(data, fact["over"])
        x = [a / b for a, b in zip(x, y, strict=True)] if isinstance(x, list) else x / y
    if "ratio" in fact:
        return x[fact["ratio"][0]] / x[fact["ratio"][1]]
    return x[fact["at"]] if "at" in fact else x


def problems(facts: dict, texts: dict[str, str], root: Path = ROOT) -> list[str]:
    """One line per quote missing from its doc and per figure that is not the recorded one."""
    found = []
    for name, fact in facts.items():
        if not fact.get("measured") or not fact.get("quotes"):
            found.append(f"{FACTS}: {name} names no run (`measured`) or no quote")
            continue
        value = recorded(fact, root)
        for doc, quotes in fact["quotes"].items():
            for quote in quotes:
                regex, spec = pattern(quote)
                spec = spec or fact.get("format", "")
                want = value if isinstance(value, str) else format(value, spec)
                if doc not in texts or not regex.search(texts[doc]):
                    found.append(f"{doc} no longer quotes {name} as {quote!r}")
                found += [f"{where} quotes {m.group(1)} for {name} ({quote!r}); recorded: {want}"
                          for where, text in texts.items() for m in regex.finditer(text)
                          if m.group(1) != want]
    return found


def load(root: Path = ROOT) -> dict:
    return json.loads((root / FACTS).read_text(encoding="utf-8"))["facts"]


def main(argv: list[str] | None = None) -> int:
    try:
        found = problems(load(), docs())
    except (StaleError, KeyError, OSError) as e:
        found = [f"error: {e}"]
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
