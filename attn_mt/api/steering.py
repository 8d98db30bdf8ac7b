"""Decoding as a caller steers it: a forced target prefix, sampling with a temperature and a seed, a
token stream; and where the weights live (device, dtype).

`Steer` is checked once per call; its `rules` rule tokens out at each decoder step
(decoding/rules.py): a row still inside its prefix keeps only the prefix's next token (`Prefix`),
and a sampled row only the token drawn from softmax(log P / temperature) (`Sample`). Search then
takes the best remaining token, so log P stays the model's. Each text draws from its own generator,
seeded from (the call's seed, the text, how often the same text came before it in the call): a
sample depends on neither the batch, the length sort nor the other texts, repeats of a text draw
differently, and the process's global RNG is never touched (no seed: a fresh one from `secrets`).

One job: steered decoding and placement. Tested in tests/api/test_steering.py.
"""

from __future__ import annotations

import hashlib
import secrets
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from attn_mt.config import DecodeConfig
from attn_mt.data import checks
from attn_mt.data.batching import pad
from attn_mt.decoding.beam import Hypothesis
from attn_mt.decoding.rules import DRAW, FORCE, Rule, only
from attn_mt.decoding.search import Greedy, steps
from attn_mt.decoding.translate import (
    Translation,
    max_lengths,
    option_rules,
    prepare_sources,
    search,
    translate_batches,
)
from attn_mt.decoding.translator import Translator, model_translator
from attn_mt.errors import InputError, ModelError

from .sharing import Shared

DTYPES = ("float32", "bfloat16", "float16")
MAX_TEMPERATURE = 1e6  # above it every token is as likely already; a float32 inf made softmax NaN


class Prefix:
    """A target prefix per sentence (each of its k hypotheses): inside it, its next token only."""

    order = FORCE

    def __init__(self, prefixes: list[list[int]], device: torch.device | str) -> None:
        self.width = max((len(p) for p in prefixes), default=0)
        padded = [p + [-1] * (self.width - len(p)) for p in prefixes]  # -1 past each prefix
        self.table = torch.tensor(padded, dtype=torch.long, device=device)
        self.table = self.table.view(len(prefixes), self.width)  # (B, P), also for P = 0

    def apply(self, step: int, logp: Tensor, predicted: Tensor) -> Tensor:
        if step >= self.width:
            return logp
        k = logp.size(0) // self.table.size(0)
        return only(logp, self.table[:, step].repeat_interleave(k))


class Sample:
    """Sampling: only a token drawn from softmax(log P / temperature), each sentence from its own
    generator (one hypothesis per sentence). Where another rule left one token, it is drawn."""

    order = DRAW

    def __init__(self, temperature: float, seeds: list[int], device: torch.device | str) -> None:
        self.temperature = max(temperature, 1e-30)  # a float32 divisor (below: greedy all the same)
        self.draw = [torch.Generator(device=device).manual_seed(s) for s in seeds]  # (B,)

    def apply(self, step: int, logp: Tensor, predicted: Tensor) -> Tensor:
        top = logp.max(-1, keepdim=True).values  # the best token at 0: no overflow
        probs = ((logp - top) / self.temperature).softmax(-1)  # (B, V)
        drawn = [torch.multinomial(p, 1, generator=g)
                 for p, g in zip(probs, self.draw, strict=True)]
        return only(logp, torch.cat(drawn))


def dtype_name(module: torch.nn.Module) -> str:
    return str(next(module.parameters()).dtype).removeprefix("torch.")


def moved(translator: Translator, device: str | None, dtype: str | None) -> Translator:
    """The translator of the same module moved to `device` and/or cast to `dtype` (in place)."""
    from attn_mt.device import pick_device

    dev = pick_device(device) if device is not None else torch.device(translator.device)
    module = translator.model.to(device=dev, dtype=getattr(torch, dtype) if dtype else None)
    return model_translator(module, translator.cfg, translator.tok, dev, translator.path,
                            translator.state)


@dataclass(frozen=True)
class Steer:
    """What a call asks of decoding beyond its DecodeConfig: each text's target prefix (ids, None:
    none) and sampling's temperature and seed (None: search; a call that samples without one gets a
    fresh one), with each text's own generator seed (`draw_seeds`)."""

    prefixes: list[list[int]] | None = None
    temperature: float | None = None
    seed: int | None = None
    seeds: tuple[int, ...] | None = None

    @property
    def active(self) -> bool:
        return self.prefixes is not None or self.temperature is not None

    @classmethod
    def of(cls, translator: Translator, items: list[str], target_prefix: str | Iterable[str] | None,
           temperature: float | None, seed: int | None) -> Steer:
        """The call's arguments checked (InputError naming one); ModelError for an export."""
        if temperature is not None:
            checks.number(temperature, "temperature")
            if not 0 < temperature <= MAX_TEMPERATURE:
                raise InputError(f"must be > 0 and at most {MAX_TEMPERATURE:g}, not "
                                 f"{temperature!r} (0: leave it out to search)", "temperature")
        if seed is not None:
            seed = checks.seed(seed, "seed")
            if temperature is None:
                raise InputError("seeds sampling: give `temperature` too", "seed")
        prefixes = None
        if target_prefix is not None:
            given, one = checks.texts(target_prefix, "target_prefix")
            given = given * len(items) if one else given
            if len(given) != len(items):
                raise InputError(f"{len(given)} prefixes for {len(items)} texts: give one, or one "
                                 "per text", "target_prefix")
            limit = translator.model.max_positions - 2 if translator.model is not None else 0
            prefixes = [ids[:limit]
                        for ids in translator.tok.encode_tgt([p.strip() for p in given])]
            _refuse_banned(translator, given, prefixes)
        if temperature is not None and seed is None:
            # fresh entropy, not torch.seed(): that reseeds the global RNG
            seed = secrets.randbits(64)
        steer = cls(prefixes, None if temperature is None else float(temperature), seed,
                    None if seed is None else draw_seeds(seed, items))
        if steer.active and translator.model is None:
            what = "target_prefix" if target_prefix is not None else "temperature"
            raise ModelError(f"{translator.path}: `{what}` needs a PyTorch checkpoint; a "
                             "CTranslate2 export decodes as exported", what)
        return steer

    def rules(self, prefixes: list[list[int]], device: torch.device | str,
              rows: list[int] | None = None,
              ) -> list[Rule]:
        """The decoding rules (decoding/rules.py) for a batch whose sentences have these prefixes
        and these indices in the call (default 0, 1, ...): the prefixes first, then sampling."""
        indices = range(len(prefixes)) if rows is None else rows
        out: list[Rule] = [Prefix(prefixes, device)] if any(prefixes) else []
        if self.seeds is not None and self.temperature is not None:
            out.append(Sample(self.temperature, [self.seeds[r] for r in indices], device))
        return out


def _refuse_banned(translator: Translator, given: list[str], prefixes: list[list[int]]) -> None:
    """InputError naming the first prefix piece the model never generates (model.banned_ids: a
    MarianMT model's pad): no search could go on from it."""
    banned = set(getattr(translator.model, "banned", None) or ())
    for text, ids in zip(given, prefixes, strict=True):
        found = next((i for i in ids if i in banned), None)
        if found is not None:
            piece = translator.tok.tgt_pieces([found])[0]
            raise InputError(f"{checks.shown(text)}: its piece {checks.shown(piece)} (id {found}) "
                             "is one this model never generates (its model.banned_ids)",
                             "target_prefix")


def draw_seeds(seed: int, items: list[str]) -> tuple[int, ...]:
    """Each text's generator seed (0 .. 2**64 - 1): a hash of (seed, the text stripped, how many
    times the same text came before it), so a sample is the same alone, in any batch and beside any
    other texts."""
    seen: Counter[str] = Counter()
    out = []
    for text in items:
        key = text.strip()
        h = hashlib.blake2b(f"{seed}\0{seen[key]}\0".encode(), digest_size=8)
        # lone surrogates (from argv) hash as they are
        h.update(key.encode("utf-8", "surrogatepass"))
        out.append(int.from_bytes(h.digest(), "little"))
        seen[key] += 1
    return tuple(out)


def translate_nbest(translator: Translator, items: list[str], dcfg: DecodeConfig, steer: Steer,
                    ids: dict[int, list[int]] | None = None) -> list[list[Translation]]:
    """The n-best lists of `items` (in input order; translate.translate_batches' batches of
    dcfg.batch_size, by length) decoded with `steer`; `ids` (if given) gets each text's best token
    ids by its index."""
    if steer.temperature is not None and dcfg.beam_size > 1:
        raise InputError(f"sampling draws one token a step: give beam=1, not {dcfg.beam_size}",
                         "beam")
    module, tok, device = translator.model, translator.tok, translator.device
    limit = module.max_positions

    def decode(srcs: list[list[int]], rows: list[int]) -> list[list[Hypothesis]]:
        prefixes = [steer.prefixes[i] if steer.prefixes else [] for i in rows]
        src = pad(srcs, tok.pad_id).to(device)  # (B, S)
        max_len = max_lengths(torch.tensor([len(s) for s in srcs]), dcfg, limit)
        max_len = torch.maximum(max_len, torch.tensor([len(p) + 1
                                                       for p in prefixes])).clamp(max=limit)
        nbest = search(module, tok, src, max_len, dcfg, rules=steer.rules(prefixes, device, rows))
        if ids is not None:
            ids.update((i, n[0].tokens) for i, n in zip(rows, nbest, strict=True))
        return nbest

    return translate_batches(tok, items, limit, dcfg.batch_size, decode)


def stream(translator: Translator, shared: Shared, text: str, dcfg: DecodeConfig,
           steer: Steer) -> Iterator[str]:
    """`Model.stream`: greedy decoding of `text`, a token a step with the cache, giving each step's
    new text (checked now, decoded as the generator is read; `shared` held while a step runs). Where
    `Model.to` moved or cast the module between two steps, the next one encodes the source again and
    feeds the tokens so far."""
    if translator.model is None:
        raise ModelError(f"{translator.path}: a CTranslate2 export decodes whole sentences; stream "
                         "needs a PyTorch checkpoint", "path")
    return _pieces(translator, shared, text, dcfg, steer) if text.strip() else iter(())


def _pieces(translator: Translator, shared: Shared, text: str, dcfg: DecodeConfig,
            steer: Steer) -> Iterator[str]:
    module, tok = translator.model, translator.tok
    limit = module.max_positions
    prefix = steer.prefixes[0] if steer.prefixes else []
    src_ids = prepare_sources(tok, [text.strip()], limit)  # (1, S) as lists
    max_len = max(int(max_lengths(torch.tensor([len(src_ids[0])]), dcfg, limit)[0]),
                  min(len(prefix) + 1, limit))
    ids: list[int] = []  # the tokens so far (no bos)
    shown, place, loop = "", None, iter(())
    for _ in range(max_len):
        with shared.reading(), torch.inference_mode():
            if place != _place(module):  # the first step, or Model.to moved or cast it since
                place = _place(module)
                loop = _search(module, tok, src_ids, ids, prefix, max_len, dcfg, steer,
                               place[0])
            nxt = int(next(loop)[0, -1])  # eos at the limit
        if nxt == tok.eos_id:
            break
        ids.append(nxt)
        text_now = tok.decode_tgt([ids])[0]
        if text_now.startswith(shown) and len(text_now) > len(shown):
            yield text_now[len(shown):]
            shown = text_now
    final = tok.decode_tgt([ids])[0]
    if final.startswith(shown) and len(final) > len(shown):
        yield final[len(shown):]


def _search(module: Any, tok: Any, src_ids: list[list[int]], ids: list[int], prefix: list[int],
            max_len: int, dcfg: DecodeConfig, steer: Steer,
            device: torch.device) -> Iterator[Tensor]:
    """The search loop (search.steps, greedy) of a stream on the module as placed, past the tokens
    decoded so far (`ids`): they are forced as the start of the target prefix, so the next step goes
    on as if the module had always been placed so. `max_len` is the output limit, eos included;
    dcfg's options add their rules (translate.option_rules), as in every search."""
    module.eval()
    src = torch.tensor(src_ids, device=device)  # (1, S)
    chooser = Greedy(torch.tensor([max_len], device=device), tok.eos_id)
    loop = steps(module, src, chooser, bos_id=tok.bos_id,
                 rules=[*steer.rules([ids + prefix[len(ids):]], device),
                        *option_rules(dcfg, tok.eos_id)])
    for _ in ids:
        next(loop)
    return loop


def _place(module: torch.nn.Module) -> tuple[torch.device, torch.dtype]:
    """Where the module's weights are and their type: what Model.to changes between two steps of a
    stream."""
    weight = next(module.parameters())
    return weight.device, weight.dtype
