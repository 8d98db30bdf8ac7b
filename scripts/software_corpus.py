"""Build a parallel corpus of another language pair and domain than Multi30k: the translated
messages of Debian packages (English -> French by default), for choosing defaults that are not tuned
to Multi30k.

Each package's compiled message catalogues (`.mo` files under `<lang>/LC_MESSAGES`) pair an English
message with its translation. Kept: translated messages of 3 to 80 English words, their context,
keyboard accelerators (`_`, `~`) and line breaks removed, each English message once. The pairs are
shuffled with a fixed seed and split into valid (1000), test (1000) and train (the rest), written as
{split}.en / {split}.{lang}, line-aligned, with a README.md listing the packages and versions.

    python scripts/software_corpus.py --out /path/to/software-en-fr             # apt-get download
    python scripts/software_corpus.py --debs /path/to/debs --out /path/to/software-en-fr
    attn-mt train --config configs/new_pair.yaml --set data.dir=/path/to/software-en-fr \
        --set data.src_lang=en --set data.tgt_lang=fr --out runs/software

The messages carry each package's licence (GPL, LGPL or MPL); the corpus is for experiments, not
redistribution.
"""

from __future__ import annotations

import argparse
import random
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import polib

PACKAGES = ["gcc-12-locales", "libreoffice-l10n-{lang}", "coreutils", "git", "gnupg-l10n", "apt",
            "dpkg", "tar", "gettext", "util-linux-locales", "grub-common", "wget", "findutils",
            "diffutils", "e2fsprogs-l10n", "libc-l10n", "evolution-data-server-common",
            "glib2.0-data"]
HELD_OUT = 1000  # sentences each in valid and test
ACCELERATOR = re.compile(r"[_~](?=\w)")


def clean(text: str) -> str:
    """One line: accelerators removed, whitespace collapsed."""
    return " ".join(ACCELERATOR.sub("", text).split())


def catalogue_pairs(mo: Path) -> list[tuple[str, str]]:
    """(English, translation) for every translated singular message of a .mo file."""
    pairs = []
    for entry in polib.mofile(str(mo)):
        if entry.msgid_plural or not entry.msgstr:
            continue
        src, tgt = clean(entry.msgid), clean(entry.msgstr)
        if src != tgt and 3 <= len(src.split()) <= 80 and re.search(r"[^\W\d_]{3}", src):
            pairs.append((src, tgt))
    return pairs


def download(packages: list[str], into: Path) -> None:
    subprocess.run(["apt-get", "download", *packages], cwd=into, check=True)


def build(debs: Path, lang: str, out: Path, seed: int = 1,
          held_out: int = HELD_OUT) -> dict[str, int]:
    """Extract the catalogues of every .deb in `debs` and write the splits to `out`; their sizes."""
    with tempfile.TemporaryDirectory() as tmp:
        versions = []
        for deb in sorted(debs.glob("*.deb")):
            subprocess.run(["dpkg-deb", "-x", str(deb), tmp], check=True)
            versions.append(deb.name)
        seen, pairs = set(), []
        for mo in sorted(Path(tmp).rglob(f"{lang}/LC_MESSAGES/*.mo")):
            for src, tgt in catalogue_pairs(mo):
                if src not in seen:
                    seen.add(src)
                    pairs.append((src, tgt))
    random.Random(seed).shuffle(pairs)
    splits = {"valid": pairs[:held_out], "test": pairs[held_out:2 * held_out],
              "train": pairs[2 * held_out:]}
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in splits.items():
        for side, suffix in ((0, "en"), (1, lang)):
            (out / f"{name}.{suffix}").write_text("".join(row[side] + "\n" for row in rows),
                                                  encoding="utf-8")
    counts = {name: len(rows) for name, rows in splits.items()}
    (out / "README.md").write_text(
        f"# Debian software messages, en-{lang}\n\nBuilt by scripts/software_corpus.py (seed "
        f"{seed}) from:\n\n" + "".join(f"- {v}\n" for v in versions)
        + f"\nPairs: {counts}. Each message keeps its package's licence.\n", encoding="utf-8")
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--lang", default="fr", help="target language code of the catalogues")
    parser.add_argument("--debs", type=Path, help="a folder of .deb files (default: apt-get "
                        "download them)")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    if args.debs is not None:
        counts = build(args.debs, args.lang, args.out, args.seed)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            download([p.format(lang=args.lang) for p in PACKAGES], Path(tmp))
            counts = build(Path(tmp), args.lang, args.out, args.seed)
    print(f"{args.out}: {counts}", file=sys.stderr)


if __name__ == "__main__":
    main()
