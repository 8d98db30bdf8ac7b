"""What the model worker does: translate batches, draw attention maps and the run's history page,
align translations with their sources, and describe the model it serves.

One job: the model worker's work (what the queue runs). Tested in tests/serve/test_serve.py and
tests/serve/test_streaming.py.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

import torch
from pydantic import BaseModel
from pydantic_core import to_json

from attn_mt.analysis.explain import ExplainError, check, explain
from attn_mt.api.history_pages import history_page
from attn_mt.api.model import Model
from attn_mt.config import DECODE_OPTIONS, FIELDS, DecodeConfig
from attn_mt.config.yamlconf import OptionError
from attn_mt.decoding.attention_maps import attention_maps
from attn_mt.decoding.continuous import Event, RunningBatch, supports
from attn_mt.decoding.translate import Translation, prepare_sources, translations
from attn_mt.decoding.translator import decode_options, hypotheses_json, hypothesis_links
from attn_mt.errors import AttnMTError
from attn_mt.models import count_params

from .api import ApiError, ExplainRequest

KINDS = ("encoder_self", "decoder_self", "cross")
log = logging.getLogger(__name__)


class Engine:
    """A loaded model (`attn_mt.Model`: a checkpoint or an export folder); every method but
    `decode_config`, `work` and `info` runs in the worker thread.

    `interrupt` is called before each decoder step of a PyTorch model, in whole calls (`translate`
    passes it to the search) and in running batches (`Live.step`), and before each batch of a
    CTranslate2 export, which decodes a batch to its end; whole calls get the batcher's `check`,
    which raises to abandon a call nobody waits for (the scheduler drops a running batch's sentences
    between steps itself).
    """

    def __init__(self, model: Model) -> None:
        self.translator = model.translator
        self.tok = self.translator.tok
        self.interrupt: Callable[[], None] = lambda: None

    @property
    def decode(self) -> DecodeConfig:
        return self.translator.decode

    def decode_config(self, request: BaseModel) -> DecodeConfig:
        """The model's decode defaults with the request's value of every served option it has
        (DECODE_OPTIONS' rows with a `field`); one it leaves out is its row's `default`, if any
        (nbest: 1), else the model's."""
        given = {}
        for o in DECODE_OPTIONS:
            if o.field in type(request).model_fields:
                value = getattr(request, o.field)
                given[o.key] = o.type(o.default) if value is None and o.default else value
        try:  # the same rules as the CLI's flags, here naming the request's fields
            return decode_options(self.decode, FIELDS, **given)
        except OptionError as e:
            raise ApiError(422, e.option or "nbest", str(e)) from None

    def work(self, texts: list[str], beam: int) -> list[int]:
        """Work units of each text: its source subwords (with </s>) times the beam size; 0 for an
        empty one."""
        return [(len(ids) + 1) * beam if text.strip() else 0
                for text, ids in zip(texts, self.tok.encode_src(texts), strict=True)]

    @property
    def continuous(self) -> bool:
        """Whether requests can join and leave a running batch at every step (a Transformer
        checkpoint); else they are decoded in whole calls (`translate`: an RNN checkpoint, a
        CTranslate2 export)."""
        return self.translator.model is not None and supports(self.translator.model)

    def job(self, dcfg: DecodeConfig, texts: list[str]) -> tuple[DecodeConfig, list]:
        """(key, items) of a translation job. Continuous: the key holds only what shapes the decoder
        call (beam size, length limits), each item is (text, dcfg), so requests that differ in alpha
        or n-best decode in one running batch; in whole calls, the key is dcfg and the items the
        texts."""
        if not self.continuous:
            return dcfg, texts
        return replace(dcfg, alpha=self.decode.alpha, nbest=1), [(text, dcfg) for text in texts]

    def open_batch(self, dcfg: DecodeConfig) -> Live:
        """An empty running batch for the scheduler, decoding with `dcfg`."""
        return Live(self, dcfg)

    def progress(self, kind: str, value, detok: Detokenizer | None = None) -> tuple[str, dict]:
        """A streamed event from the worker's ("token", ids so far), ("hypothesis", a Hypothesis) or
        ("done", the result): ("token", {"text": the translation so far}), ("hypothesis",
        {"hypothesis": {text, score, log_prob}}) or ("result", {"result": the object of
        `translate`}). Runs outside the worker (the app's event loop); `detok`: the sentence's,
        which decodes only the tokens since its last word boundary."""
        if kind == "token":
            return kind, {"text": detok.text(value) if detok else self.tok.decode_tgt([value])[0]}
        if kind == "hypothesis":
            return kind, {"hypothesis": hypotheses_json(translations(self.tok, [value]))[0]}
        return "result", {"result": value}

    def translate(self, dcfg: DecodeConfig, texts: list[str]) -> list[dict]:
        """The objects of translate's jsonl output, one per text, in order."""
        nbests = self.translator.translate_nbest(texts, dcfg, self.interrupt)
        return [{"source": s, "hypotheses": hypotheses_json(n)} for s,
                n in zip(texts, nbests, strict=True)]

    def attention(self, item: tuple[str, DecodeConfig]) -> dict:
        """Translation, subword tokens and every attention map, weights as
        [layer][head][query][key]."""
        return json.loads(self.attention_json(item))

    def attention_json(self, item: tuple[str, DecodeConfig]) -> bytes:
        """`attention` as JSON, encoded here in the worker one head at a time: each piece holds
        Python's lock for milliseconds, so the event loop goes on answering meanwhile (pydantic's
        encoder)."""
        text, dcfg = item
        model, tok = self.translator.model, self.tok
        translation, maps = attention_maps(model, tok, text, dcfg, self.translator.device)
        layers: dict[str, list[bytes]] = {kind: [] for kind in KINDS}
        # in float64, 0.1234 prints as 0.1234, not 0.12340000271
        for m in sorted(maps, key=lambda m: m.layer):
            weights = torch.round(m.weights.double().cpu() * 1e4) / 1e4  # (H, Tq, Tk)
            layers[m.kind].append(b"[" + b",".join(to_json(head.tolist()) for head in weights)
                                  + b"]")
        cross = next(m for m in maps if m.kind == "cross")
        bos = tok.tgt_pieces([tok.bos_id])
        head = to_json({"translation": translation, "source_tokens": cross.keys,
                        "target_tokens": cross.queries,
                        "target_input_tokens": bos + cross.queries[:-1]})
        return head[:-1] + b"".join(b',"%s":[%s]' % (kind.encode(), b",".join(layers[kind]))
                                    for kind in KINDS) + b"}"

    def run_one(self, job: tuple[str, object]):
        """A job that runs alone: ("attention", (text, dcfg)) -> the encoded answer
        (`attention_json`), ("explain", (request, dcfg)) -> `explain`'s dict or ApiError,
        ("history", path) -> the page or None, or ("align", translate's results) -> them with word
        links."""
        name, item = job
        return {"attention": self.attention_json, "explain": self.explain, "history": self.history,
                "align": self.align}[name](item)

    def history(self, path: Path) -> str | None:
        """The page of the run's attention history at `path` (drawn once per version of the file);
        None, logged, where the file cannot be read (the path goes to the log only)."""
        try:
            return history_page(path)
        except (AttnMTError, OSError) as e:
            log.error("GET /history: %s", e)
            return None

    def align(self, results: list[dict]) -> list[dict]:
        """`translate`'s results with each hypothesis's word alignment (`alignment`, Pharaoh
        links)."""
        sources = [r["source"] for r in results]
        nbests = [[Translation(h["text"], h["log_prob"], h["score"]) for h in r["hypotheses"]]
                  for r in results]
        links = hypothesis_links(self.translator, sources, nbests, self.decode.batch_size)
        return [{"source": s, "hypotheses": hypotheses_json(n, k)} for s, n,
                k in zip(sources, nbests, links,
                         strict=True)]

    def require_weights(self, what: str) -> None:
        """Refuse (ApiError 404) `what` (attention maps, explain) on an export, which keeps no
        attention weights."""
        if self.translator.model is None:
            raise ApiError(404, "text", f"no {what}: this server runs a CTranslate2 export, which "
                           "keeps no attention weights; serve a PyTorch checkpoint "
                           "(RUN/checkpoint_best.pt)")

    def check_explain(self, body: ExplainRequest) -> None:
        """Refuse (ApiError) what can be refused before translating: an export, a kind, layer or
        head not there."""
        self.require_weights("explain")
        try:
            check(self.translator.model, body.text, body.kind, body.layer, body.head)
        except ExplainError as e:
            raise ApiError(422, e.field, e.message) from None

    def explain(self, item: tuple[ExplainRequest, DecodeConfig]) -> dict | ApiError:
        """What explain's JSON holds; a token that is not in the sentence: the ApiError to
        answer."""
        body, dcfg = item
        model, tok = self.translator.model, self.tok
        try:
            result = explain(model, tok, body.text, kind=body.kind, layer=body.layer,
                             head=body.head, token=body.token, dcfg=dcfg,
                             device=self.translator.device)
        # returned, not raised: the worker logs what it raises as a failure
        except ExplainError as e:
            return ApiError(422, e.field, e.message)
        return asdict(result)

    def info(self) -> dict:
        """Model facts for the page and /api/info; `model` says what was loaded: "checkpoint" or
        "export"."""
        t, tok = self.translator, self.tok
        state = t.state or {}
        bleu = state.get("best_bleu")
        cfg = t.cfg
        return {
            "model": t.kind,
            "checkpoint": t.path.name,
            "architecture": asdict(cfg.model) if cfg else {"kind": "transformer (CTranslate2)"},
            "parameters": count_params(t.model) if t.model is not None else None,
            "languages": {"source": cfg.data.src_lang if cfg else None, "target": cfg.data.tgt_lang
                          if cfg else None},
            "vocabulary": {"source": tok.src_vocab_size, "target": tok.tgt_vocab_size,
                           "joint": tok.joint},
            "step": state.get("step"),
            "epoch": state.get("epoch"),
            "valid_bleu": round(bleu, 2) if bleu is not None and bleu >= 0 else None,
            "decode": {"beam": t.decode.beam_size, "alpha": t.decode.alpha},
            "attention": [] if cfg is None else ["cross"] if cfg.model.kind == "rnn"
            else list(KINDS), "device": t.device,
        }


class Detokenizer:
    """The text of one sentence's growing token ids, decoding only what follows a committed word
    boundary: a piece that starts a word (▁x) does not depend on what precedes it, so text =
    head + " " + decode(tail). A boundary is committed, every `every` tokens, only where that
    equals the whole decode; a sequence that is not an extension of the last starts again."""

    def __init__(self, tok, every: int = 16) -> None:
        self.tok, self.every = tok, every
        self.ids: tuple = ()
        self.cut, self.head = 0, ""  # ids[:cut] decode to head
        self.tried = 0  # the length at the last try to commit

    def text(self, ids) -> str:
        ids = tuple(ids)
        if len(ids) <= self.cut or ids[: self.cut] != self.ids[: self.cut]:
            self.cut, self.head, self.tried = 0, "", 0
        self.ids = ids
        tail = self.tok.tgt.decode(list(ids[self.cut :]))
        text = self.head + " " + tail if self.cut else tail
        # try to commit the last word boundary
        if len(ids) - max(self.cut, self.tried) >= self.every:
            self.tried = len(ids)
            cut = next((c for c in range(len(ids) - 1, self.cut, -1)
                        if _starts_word(self.tok.tgt.id_to_piece(ids[c]))), None)
            whole = self.tok.tgt.decode(list(ids))
            if cut is not None:
                head = self.tok.tgt.decode(list(ids[:cut]))
                if head and head + " " + self.tok.tgt.decode(list(ids[cut:])) == whole:
                    self.cut, self.head = cut, head
            return whole
        return text


def _starts_word(piece: str) -> bool:
    """A piece that starts a word (▁x): its text does not depend on what precedes it. A bare ▁
    does (what follows decides whether it is a space of its own), so it is no boundary."""
    return piece.startswith("▁") and piece != "▁"


class Live:
    """One decoding setting's running batch, as the scheduler sees it: texts join, and each
    sentence's result is the object of `translate` (an empty text is answered at the next step,
    never decoded)."""

    def __init__(self, engine: Engine, dcfg: DecodeConfig) -> None:
        tok, self.engine = engine.tok, engine
        self.batch = RunningBatch(engine.translator.model, dcfg, bos_id=tok.bos_id,
                                  eos_id=tok.eos_id, pad_id=tok.pad_id)
        self.sources: dict = {}  # tag -> its text
        self.ready: list[Event] = []  # empty texts, answered at the next step

    def __len__(self) -> int:
        return len(self.batch) + len(self.ready)

    def add(self, items: list[tuple]) -> None:
        """Sentences (tag, (text, its DecodeConfig)) join."""
        for tag, (text, _) in items:
            if not text.strip():
                self.ready.append(Event(tag, "done", {"source": text, "hypotheses": hypotheses_json(
                    [Translation("", 0.0, 0.0)])}))
        todo = [(tag, text, dcfg) for tag, (text, dcfg) in items if text.strip()]
        if todo:
            model = self.engine.translator.model
            srcs = prepare_sources(self.engine.tok, [text.strip() for _, text, _ in todo],
                                   model.max_positions)
            self.sources.update((tag, text) for tag, text, _ in todo)
            self.batch.add([(tag, ids) for (tag, _, _), ids in zip(todo, srcs, strict=True)],
                           [c for *_, c in todo])

    def step(self) -> list[Event]:
        """One decoder step of the running batch (after the engine's `interrupt`), and what it
        finished."""
        self.engine.interrupt()
        events, self.ready = self.ready + self.batch.step(), []
        out = []
        for e in events:
            # the n-best list, as `translate`'s object
            if e.kind == "done" and e.tag in self.sources:
                source = self.sources.pop(e.tag)
                e = Event(e.tag, "done", {"source": source, "hypotheses": hypotheses_json(
                    translations(self.engine.tok, e.value))})
            out.append(e)
        return out

    def drop(self, tags: set) -> None:
        self.batch.drop(tags)
        self.ready = [e for e in self.ready if e.tag not in tags]
        for tag in tags:
            self.sources.pop(tag, None)
