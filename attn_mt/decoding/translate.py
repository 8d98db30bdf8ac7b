"""The batched translate calls: texts in, n-best translations out, in input order.

Texts become source ids (truncated to the model's limit), sorted by length into batches so little
padding is decoded; each batch goes to a decoder (`search`: greedy or beam search as the
DecodeConfig says; or CTranslate2's), and its hypotheses come back as texts with their scores.

Tested in tests/decoding/test_search.py.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from attn_mt.config import DecodeConfig
from attn_mt.data.batching import pad
from attn_mt.data.checks import clean
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decoding.beam import Hypothesis
from attn_mt.decoding.rules import Rule
from attn_mt.decoding.search import Interrupt, beam_search, greedy_search
from attn_mt.models import Seq2Seq

log = logging.getLogger(__name__)


def max_lengths(src_lens: Tensor, cfg: DecodeConfig, limit: int) -> Tensor:
    """Each sentence's output limit a * |src| + b tokens (eos included), capped at `limit`."""
    return (src_lens.float() * cfg.max_len_a + cfg.max_len_b).long().clamp(max=limit)


# The decode options that rule tokens out: DECODE_OPTIONS' key -> the rule (decoding/rules.py) a
# DecodeConfig asks for, given the target's eos id; None where it leaves the option off. Every
# search adds them (`search`, Model.stream's loop, a running batch), each at its `order`; a rule
# here is the same for every sentence of a call (in a running batch `step` is each row's, (N,)).
OPTION_RULES: dict[str, Callable[[DecodeConfig, int], Rule | None]] = {}


def option_rules(cfg: DecodeConfig, eos_id: int) -> list[Rule]:
    """The rules that `cfg`'s decode options ask for (OPTION_RULES)."""
    return [r for make in OPTION_RULES.values() if (r := make(cfg, eos_id)) is not None]


def search(model: Seq2Seq, tok: Tokenizer, src: Tensor, max_len: Tensor, cfg: DecodeConfig,
           use_cache: bool = True, interrupt: Interrupt | None = None,
           rules: Sequence[Rule] = ()) -> list[list[Hypothesis]]:
    """n-best lists for src (B, S): greedy for beam_size 1, else beam search; the caller's `rules`
    and those of cfg's options join the model's and the length limit (decoding/rules.py)."""
    how = dict(bos_id=tok.bos_id, eos_id=tok.eos_id, alpha=cfg.penalty, use_cache=use_cache,
               interrupt=interrupt, rules=[*rules, *option_rules(cfg, tok.eos_id)])
    if cfg.beam_size == 1:
        return [[h] for h in greedy_search(model, src, max_len, **how)]
    return beam_search(model, src, max_len, beam_size=cfg.beam_size, nbest=cfg.nbest, **how)


def prepare_sources(tok: Tokenizer, texts: list[str], limit: int) -> list[list[int]]:
    """Source ids with eos, truncated to the model's position limit (one warning if any were)."""
    # lone surrogates (undecodable bytes in argv) are not text SentencePiece accepts: U+FFFD
    ids = tok.encode_src([clean(t) for t in texts])
    long = sum(len(s) + 1 > limit for s in ids)
    if long:
        log.warning("%d input line(s) longer than the model's limit of %d tokens were truncated",
                    long, limit)
    return [s[: limit - 1] + [tok.eos_id] for s in ids]


@dataclass(frozen=True)
class Translation:
    """One output sentence with its log P(y | x) and length-normalised score."""

    text: str
    log_prob: float
    score: float


def translations(tok: Tokenizer, nbest: list[Hypothesis]) -> list[Translation]:
    """Hypotheses (target ids) as texts with their scores."""
    texts = tok.decode_tgt([h.tokens for h in nbest])
    return [Translation(t, h.log_prob, h.score) for t, h in zip(texts, nbest, strict=True)]


Decode = Callable[[list[list[int]], list[int]], list[list[Hypothesis]]]  # (source ids, indices)


def translate_batches(tok: Tokenizer, texts: list[str], limit: int, batch_size: int, decode: Decode,
                      interrupt: Interrupt | None = None) -> list[list[Translation]]:
    """The batched translate loop of every decoder (ours, CTranslate2's): n-best translations of
    each text, in input order.

    Texts are encoded (truncated to `limit` positions), sorted by length into batches of
    `batch_size`, and each batch's source ids go to `decode` with the texts' indices (for what a
    caller gives per text), which returns its n-best lists; an empty (or all-space) text gets one
    empty translation. `interrupt` is called before each batch.
    """
    out: list[list[Translation]] = [[Translation("", 0.0, 0.0)] for _ in texts]
    todo = [i for i, t in enumerate(texts) if t.strip()]
    srcs = prepare_sources(tok, [texts[i].strip() for i in todo], limit) if todo else []
    order = sorted(range(len(todo)), key=lambda j: len(srcs[j]))
    for start in range(0, len(order), batch_size):
        if interrupt is not None:
            interrupt()
        chunk = order[start : start + batch_size]
        nbests = decode([srcs[j] for j in chunk], [todo[j] for j in chunk])
        for j, nbest in zip(chunk, nbests, strict=True):
            out[todo[j]] = translations(tok, nbest)
    return out


def translate_nbest(model: Seq2Seq, tok: Tokenizer, texts: list[str], cfg: DecodeConfig,
                    device: torch.device | str = "cpu", use_cache: bool = True,
                    interrupt: Interrupt | None = None) -> list[list[Translation]]:
    """The `cfg.nbest` best translations of each text, best first, in input order; beam_size 1 is
    greedy decoding. `interrupt` is called before each decoder step."""
    model.eval()

    def decode(srcs: list[list[int]], _indices: list[int]) -> list[list[Hypothesis]]:
        src = pad(srcs, tok.pad_id).to(device)  # (B, S)
        max_len = max_lengths(torch.tensor([len(s) for s in srcs]), cfg, model.max_positions)
        return search(model, tok, src, max_len, cfg, use_cache, interrupt)

    return translate_batches(tok, texts, model.max_positions, cfg.batch_size, decode)


def translate(model: Seq2Seq, tok: Tokenizer, texts: list[str], cfg: DecodeConfig,
              device: torch.device | str = "cpu", use_cache: bool = True) -> list[str]:
    """The best translation of each text, in input order (beam search if beam_size > 1)."""
    return [n[0].text for n in translate_nbest(model, tok, texts, cfg, device, use_cache)]


def greedy(model: Seq2Seq, src: Tensor, max_len: Tensor, bos_id: int, eos_id: int,
           use_cache: bool = True) -> list[list[int]]:
    """Greedy token ids (without bos/eos) for a batch; see `greedy_search`."""
    hyps = greedy_search(model, src, max_len, bos_id=bos_id, eos_id=eos_id, use_cache=use_cache)
    return [h.tokens for h in hyps]
