"""How the Tokenizer calls SentencePiece: on a list of texts at once or one text at a time (`each`),
and pieces numbered by a vocabulary of their own (`MappedPieces`: a MarianMT model's vocab.json,
read by imports/marian.py), with that vocabulary's special ids (`mapped`).

Tested in tests/data/test_tokenizer.py and tests/marian/test_marian.py.
"""

from __future__ import annotations

from collections.abc import Callable

import sentencepiece as spm

# SentencePiece's list calls hand the work to a thread pool, which costs more than it saves on a few
# texts (a server encodes one sentence per request): under this many, one call per text
# (docs/performance.md).
SMALL_BATCH = 32


def each(fn: Callable, items: list) -> list:
    """fn over a list: one call per item for a few (SMALL_BATCH), else one batch call."""
    return [fn(x) for x in items] if len(items) < SMALL_BATCH else fn(items)


def language_code(text: str) -> tuple[list[str], str]:
    """A multilingual Marian model's target-language prefix apart:
    ">>fr<< Hi" -> ([">>fr<<"], " Hi")."""
    if text.startswith(">>") and (end := text.find("<<")) != -1:
        return [text[: end + 2]], text[end + 2 :]
    return [], text


class MappedPieces:
    """A SentencePiece model whose pieces are numbered by a vocabulary of its own (Marian's
    vocab.json), with the processor calls the rest of attn-mt makes: `encode`, `decode`,
    `id_to_piece`, `piece_to_id`.

    >>> MappedPieces(sp, ["</s>", "<unk>", "▁a", "<pad>"], unk_id=1).encode("a")  # [2]
    """

    def __init__(self, sp: spm.SentencePieceProcessor, pieces: list[str], unk_id: int,
                 skip: set[int]) -> None:
        self.sp, self.pieces, self.unk_id, self.skip = sp, pieces, unk_id, skip
        self.ids = {p: i for i, p in enumerate(pieces)}

    def get_piece_size(self) -> int:
        return len(self.pieces)

    def id_to_piece(self, i: int) -> str:
        return self.pieces[i]

    def piece_to_id(self, piece: str) -> int:
        return self.ids.get(piece, self.unk_id)

    def is_control(self, i: int) -> bool:
        return i in self.skip

    def is_unknown(self, i: int) -> bool:
        return i == self.unk_id

    def get_score(self, i: int) -> float:
        """The SentencePiece model's score of piece `i` (0 for a piece it does not hold)."""
        j = self.sp.piece_to_id(self.pieces[i])
        return self.sp.get_score(j) if j != self.sp.unk_id() else 0.0

    def encode(self, text: str | list[str], out_type: type = int, **sampling) -> list:
        """Pieces (a `>>xx<<` prefix kept whole, as MarianTokenizer does) -> ids; unknown pieces
        -> unk. `sampling`: SentencePiece's (enable_sampling, alpha, nbest_size)."""
        if isinstance(text, list):
            return [self.encode(t, out_type, **sampling) for t in text]
        code, rest = language_code(text)
        pieces = code + self.sp.encode(rest, out_type=str, **sampling)
        return pieces if out_type is str else [self.ids.get(p, self.unk_id) for p in pieces]

    def decode(self, ids: list) -> str | list[str]:
        """Ids -> text, the special ones (eos, pad) left out."""
        if ids and isinstance(ids[0], list):
            return [self.decode(x) for x in ids]
        return self.sp.decode_pieces([self.pieces[i] for i in ids if i not in self.skip])


def mapped(src: spm.SentencePieceProcessor, tgt: spm.SentencePieceProcessor,
           vocab: dict) -> tuple[MappedPieces, MappedPieces, tuple[int, int, int, int]]:
    """The source and target models numbered by `vocab` ({"src": pieces by id, "tgt": pieces by id
    or None when joint, "specials": {"pad", "unk", "bos", "eos": id}}), and (pad, unk, bos, eos)."""
    sp = vocab["specials"]
    ids = sp["pad"], sp["unk"], sp["bos"], sp["eos"]
    skip = {sp["pad"], sp["eos"], sp["bos"]}
    return (MappedPieces(src, vocab["src"], sp["unk"], skip),
            MappedPieces(tgt, vocab["tgt"] or vocab["src"], sp["unk"], skip), ids)
