"""Tiny MarianMT models built like opus-mt ones (swish, scaled embeddings, Marian's static
sinusoids, a non-zero final_logits_bias, pad as decoder start and a banned output), with random
weights, and a MarianTokenizer over SentencePiece models trained on toy text with a vocab.json in
Marian's layout (</s> and <unk> first, <pad> last): folders the tests open as a hub download would
be."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import pytest
import sentencepiece as spm
import torch

from attn_mt.data.toy import make_toy_corpus

SPECIAL = ("<unk>", "<s>", "</s>")
STEPS, LR = 150, 2e-2


def _spm(texts: list[str], size: int) -> bytes:
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=model,
                                   vocab_size=size, model_type="unigram", minloglevel=2,
                                   hard_vocab_limit=False)
    return model.getvalue()


def _vocab(*protos: bytes, size: int = 0) -> dict[str, int]:
    """Marian's layout: </s> 0, <unk> 1, every piece of the models once, <pad> last (filled up to
    `size` pieces: separate vocabularies share the pad id)."""
    pieces = ["</s>", "<unk>"]
    for proto in protos:
        sp = spm.SentencePieceProcessor(model_proto=proto)
        pieces += [p for p in (sp.id_to_piece(i) for i in range(sp.get_piece_size()))
                   if p not in SPECIAL and p not in pieces]
    pieces += [f"<unused{i}>" for i in range(size - len(pieces) - 1)]
    return {p: i for i, p in enumerate([*pieces, "<pad>"])}


def _train(model, tok, pairs: list[tuple[str, str]], steps: int) -> None:
    """A few Adam steps on the toy pairs: random weights repeat one token, a little training writes
    sentences of many lengths that end with </s> (what greedy and beam search must agree on)."""
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    model.train()
    batches: dict[int, dict] = {}  # the batches come round again: each tokenized once
    for step in range(steps):
        start = (step * 32) % len(pairs)
        if start not in batches:
            chunk = pairs[start:][:32]
            batch = tok([s for s, _ in chunk], text_target=[t for _, t in chunk],
                        return_tensors="pt", padding=True)
            batch["labels"] = batch["labels"].masked_fill(batch["labels"] == tok.pad_token_id,
                                                          -100)
            batches[start] = batch
        opt.zero_grad()
        model(**batches[start]).loss.backward()
        opt.step()


def texts(n: int = 200) -> list[tuple[str, str]]:
    """`n` toy (English, German) pairs the tiny tokenizers were not trained on (a corpus's test
    split)."""
    return make_toy_corpus(max(600, n * 20))["test"][:n]


def build(folder: Path, *, shared: bool, multilingual: bool = False, seed: int = 0,
          steps: int = STEPS) -> Path:
    """A MarianMTModel folder (random weights trained `steps` steps) and its tokenizer; returns
    `folder`."""
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

    folder.mkdir(parents=True)
    pairs = make_toy_corpus(600)["train"]
    src, tgt = _spm([s for s, _ in pairs], 60), _spm([t for _, t in pairs], 70)
    (folder / "source.spm").write_bytes(src)
    (folder / "target.spm").write_bytes(tgt)
    vocab = _vocab(src, tgt) if shared else _vocab(src, size=80)
    if multilingual:
        vocab = {**{k: v for k, v in vocab.items() if k != "<pad>"}, ">>de<<": len(vocab) - 1,
                 ">>fr<<": len(vocab), "<pad>": len(vocab) + 1}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    target = vocab if shared else _vocab(tgt, size=80)
    extra = {}
    if not shared:
        (folder / "target_vocab.json").write_text(json.dumps(target))
        extra = {"target_vocab_file": str(folder / "target_vocab.json"), "separate_vocabs": True}
    pad = target["<pad>"]
    config = MarianConfig(vocab_size=len(vocab), decoder_vocab_size=len(target), d_model=16,
                          encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
                          decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32,
                          activation_function="swish", scale_embedding=True,
                          max_position_embeddings=64, pad_token_id=pad, eos_token_id=0,
                          decoder_start_token_id=pad, forced_eos_token_id=0,
                          share_encoder_decoder_embeddings=shared, tie_word_embeddings=True,
                          dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    torch.manual_seed(seed)
    model = MarianMTModel(config)
    tok = MarianTokenizer(str(folder / "source.spm"), str(folder / "target.spm"),
                          str(folder / "vocab.json"), source_lang="en", target_lang="de",
                          model_max_length=64, **extra)
    _train(model, tok, pairs, steps)
    with torch.no_grad():  # opus models' bias is not zero
        model.final_logits_bias.normal_(0.0, 0.5)
    model.generation_config = GenerationConfig(num_beams=4, max_length=64, bad_words_ids=[[pad]],
                                               pad_token_id=pad, eos_token_id=0,
                                               decoder_start_token_id=pad, forced_eos_token_id=0)
    model.eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def folders(tmp_path_factory: pytest.TempPathFactory):
    """kind ("shared", "separate", "multilingual") -> a tiny MarianMT folder, built on first use
    once per test session (the tests' `marian` fixture: `folders(tmp_path_factory)`).
    pytest-xdist's workers share the session's temporary folder: the first to ask builds under a
    lock, the others read. Tests never write into these folders (one that spoils a folder spoils a
    copy)."""
    pytest.importorskip("transformers")
    pytest.importorskip("safetensors")
    from filelock import FileLock

    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "marian_models"
    root.mkdir(exist_ok=True)
    seeds = {"shared": 0, "separate": 1, "multilingual": 2}

    def get(kind: str) -> Path:
        folder = root / f"opus-mt-en-{kind}"
        with FileLock(str(root / f"{kind}.lock")):
            if not folder.exists():
                try:
                    build(folder, shared=kind != "separate", multilingual=kind == "multilingual",
                          seed=seeds[kind], steps=0 if kind == "multilingual" else STEPS)
                except BaseException:  # never a half-built folder for the next to read
                    shutil.rmtree(folder, ignore_errors=True)
                    raise
        return folder

    return get
