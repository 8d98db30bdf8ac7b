"""SentencePiece subwords: trained on (a sample of) the training split, joint or one per language.

The data cache trains them once per entry and keeps the model file(s) in it (`Tokenizer.files`);
checkpoints carry the same bytes (`Tokenizer.state`). A model read from another toolkit brings a
vocabulary that numbers the pieces its own way, with its own special ids (data/pieces.py).
"""

from __future__ import annotations

import io
import itertools
import json
import logging
from collections.abc import Iterable

import sentencepiece as spm

from attn_mt.config import ConfigError, TokenizerConfig
from attn_mt.data.pieces import each

log = logging.getLogger(__name__)

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
JOINT, SEPARATE = "spm.model", ("spm.src.model", "spm.tgt.model")  # SentencePiece model file names
VOCAB = "vocab.json"  # a numbering vocabulary's file (beside spm.src.model and spm.tgt.model)


class Tokenizer:
    """Source and target SentencePiece models (the same one when the vocabulary is joint); with
    `vocab` the models' pieces are numbered by it (data/pieces.py's `mapped`)."""

    pad_id, unk_id, bos_id, eos_id = PAD_ID, UNK_ID, BOS_ID, EOS_ID

    def __init__(self, src_proto: bytes, tgt_proto: bytes | None = None,
                 vocab: dict | None = None) -> None:
        self.src_proto, self.tgt_proto, self.vocab = src_proto, tgt_proto, vocab
        self.src = spm.SentencePieceProcessor(model_proto=src_proto)
        self.tgt = self.src if tgt_proto is None else \
            spm.SentencePieceProcessor(model_proto=tgt_proto)
        if vocab is not None:
            from attn_mt.data.pieces import mapped

            self.src, self.tgt, specials = mapped(self.src, self.tgt, vocab)
            self.pad_id, self.unk_id, self.bos_id, self.eos_id = specials

    @property
    def joint(self) -> bool:
        """One vocabulary for both sides (the embeddings can be shared)."""
        return self.tgt_proto is None if self.vocab is None else self.vocab["tgt"] is None

    @property
    def src_vocab_size(self) -> int:
        return self.src.get_piece_size()

    @property
    def tgt_vocab_size(self) -> int:
        return self.tgt.get_piece_size()

    def sizes(self) -> dict:
        """What a model needs to know of the vocabulary: `build_model(cfg.model, **tok.sizes())`."""
        return {"src_vocab": self.src_vocab_size, "tgt_vocab": self.tgt_vocab_size,
                "pad_id": self.pad_id, "shared_vocab": self.joint}

    def encode_src(self, texts: list[str]) -> list[list[int]]:
        return each(self.src.encode, texts)

    def encode_tgt(self, texts: list[str]) -> list[list[int]]:
        return each(self.tgt.encode, texts)

    def decode_tgt(self, ids: list[list[int]]) -> list[str]:
        return each(self.tgt.decode, ids)

    def src_pieces(self, text: str) -> list[str]:
        return self.src.encode(text, out_type=str)

    def tgt_pieces(self, ids: list[int]) -> list[str]:
        return [self.tgt.id_to_piece(i) for i in ids]

    def state(self) -> dict:
        """Plain data for checkpoints (loads with torch.load(weights_only=True))."""
        vocab = {} if self.vocab is None else {"vocab": self.vocab}
        return {"src_proto": self.src_proto, "tgt_proto": self.tgt_proto, **vocab}

    @classmethod
    def from_state(cls, state: dict) -> Tokenizer:
        return cls(state["src_proto"], state["tgt_proto"], state.get("vocab"))

    def files(self) -> dict[str, bytes]:
        """The SentencePiece model file(s) by name: spm.model (joint), else spm.src.model and
        spm.tgt.model; with a vocabulary, spm.src.model (spm.tgt.model) and vocab.json."""
        if self.vocab is not None:
            tgt = {} if self.tgt_proto is None else {SEPARATE[1]: self.tgt_proto}
            return {SEPARATE[0]: self.src_proto, **tgt, VOCAB: json.dumps(self.vocab).encode()}
        if self.joint:
            return {JOINT: self.src_proto}
        return {SEPARATE[0]: self.src_proto, SEPARATE[1]: self.tgt_proto}

    @classmethod
    def from_files(cls, files: dict[str, bytes]) -> Tokenizer:
        """The tokenizer `files()` gave; KeyError without its model file(s)."""
        if VOCAB in files:
            return cls(files[SEPARATE[0]], files.get(SEPARATE[1]), json.loads(files[VOCAB]))
        return cls(files[JOINT]) if JOINT in files else cls(files[SEPARATE[0]], files[SEPARATE[1]])


def _train_one(texts: Iterable[str], cfg: TokenizerConfig) -> bytes:
    model = io.BytesIO()
    try:
        _spm_train(texts, cfg, model)
    except RuntimeError as e:  # e.g. "Vocabulary size is smaller than required_chars. 16 vs 38."
        reason = str(e).split("]")[-1].strip().split(". Increase")[0]
        raise ConfigError(f"tokenizer.vocab_size={cfg.vocab_size}: SentencePiece cannot train on "
                          f"this corpus ({reason[:200]}); raise tokenizer.vocab_size or lower "
                          "tokenizer.character_coverage", "tokenizer.vocab_size") from None
    return model.getvalue()


def _spm_train(texts: Iterable[str], cfg: TokenizerConfig, model: io.BytesIO) -> None:
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=model,
        model_type=cfg.type, vocab_size=cfg.vocab_size,
        character_coverage=cfg.character_coverage,
        pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
        hard_vocab_limit=False,  # small corpora may not support the requested size
        # recorded in the model: 2M as it always was; the data cache passes at most sample_sentences
        input_sentence_size=max(2_000_000, cfg.sample_sentences), shuffle_input_sentence=True,
        num_threads=2, minloglevel=2,
    )


def train_tokenizer(cfg: TokenizerConfig, src: Iterable[str], tgt: Iterable[str]) -> Tokenizer:
    """Train SentencePiece on the source and target sentences (streams: each is read once)."""
    log.info("training %s tokenizer (%s, vocab %d)", "joint" if cfg.joint else "separate", cfg.type,
             cfg.vocab_size)
    if cfg.joint:
        return Tokenizer(_train_one(itertools.chain(src, tgt), cfg))
    return Tokenizer(_train_one(src, cfg), _train_one(tgt, cfg))
