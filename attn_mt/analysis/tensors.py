"""Inside one attention module, as tensors: what it reads, the weights it reads them with and what
it returns, for a batch of sentences, so that attention can be redone by hand (docs/tutorial.ipynb
does).

    >>> from attn_mt.analysis import inside
    >>> a = inside(model, "the old man sees a small dog.", kind="encoder", layer=1)
    >>> q = a.x @ a.w_q.T + a.b_q                  # (B, T, D): every head's queries, head h in
                                                   columns h*d_k...
    >>> a.attend(a.x)[1]                           # the module's own weights on any input: (B, H,
                                                   T, S)

The sentences run through the model teacher-forced, on their greedy translations or on given
`targets`, with a hook on the chosen module (recompute.recording). Sentences of different lengths
are padded, as in training: `mask` says which keys each query may see (padding, and in decoder
self-attention the future). Layers and heads count from 1, tokens from 0.
Tested in tests/analysis/test_tensors.py.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from torch import Tensor

from attn_mt.data import checks
from attn_mt.data.batching import collate
from attn_mt.decoding.translate import max_lengths, search
from attn_mt.errors import InputError
from attn_mt.models import AttentionWeights
from attn_mt.models.attention import MultiHeadAttention
from attn_mt.models.positions import Positions

from .recompute import gather, projections, recording

KINDS = ("encoder", "decoder", "cross")


@dataclass(frozen=True)
class Inside:
    """One attention module of one layer, for a batch of B sentences (B = 1 for one text)."""

    kind: str  # encoder (self-attention), decoder (self-attention) or cross
    layer: int  # from 1
    n_heads: int
    d_k: int  # each head's width: d_model / n_heads
    source_tokens: list[list[str]]  # per sentence, </s> last, before padding
    target_inputs: list[list[str]]  # per sentence, what the decoder reads: <s> and the target
    x: Tensor  # (B, T, D) the queries' inputs (after the sublayer's LayerNorm)
    # (B, S, D) the keys' and values' inputs: x for self-attention, the encoder's output for cross
    context: Tensor
    mask: Tensor  # (B, T, S) bool, True where the query may see the key
    w_q: Tensor  # (D, D) as nn.Linear keeps it, (out, in): q = x @ w_q.T + b_q
    b_q: Tensor  # (D,)
    w_k: Tensor
    b_k: Tensor
    w_v: Tensor
    b_v: Tensor
    w_o: Tensor  # (D, D): output = concat(heads) @ w_o.T + b_o
    b_o: Tensor
    weights: Tensor  # (B, H, T, S) the module's own attention weights
    output: Tensor  # (B, T, D) the module's own output
    # (B, S, D) the source tokens' embeddings (times sqrt(D)), before positions are added
    embeddings: Tensor
    # (S, D) what the positional encoding adds at positions 0..S-1 (zeros for rotary)
    positions: Tensor
    module: MultiHeadAttention = field(repr=False)
    # the positions of its side (rotary: turns q, k; a bias scheme: adds to the scores)
    scheme: Positions | None = field(default=None, repr=False)

    def attend(self, x: Tensor, context: Tensor | None = None,
               mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """The module itself run on other inputs: x (B, T, D), context (B, S, D) (self-attention:
        x), mask (B, T, S) bool or None (all keys) -> (output (B, T, D), weights (B, H, T, S))."""
        m = None if mask is None else mask[:, None]  # (B, 1, T, S): the same for every head
        with torch.inference_mode():
            if self.kind == "cross":
                out, w = self.module(x, x if context is None else context, m, need_weights=True)
            else:
                t = x.size(1)
                at = self.scheme.attending(0, t, t, x.device) if self.scheme is not None else None
                out, w = self.module(x, mask=m, positions=at, need_weights=True)
        return out, w


def _alone(model) -> AbstractContextManager:
    """The model's writer lock where it has one (api/sharing.py: a Model shared by threads), else
    nothing."""
    shared = getattr(model, "shared", None)
    return shared.writing() if shared is not None else nullcontext()


def _reading(model) -> AbstractContextManager:
    """The model's reader lock where it has one: `Model.to` waits while the module is read."""
    shared = getattr(model, "shared", None)
    return shared.reading() if shared is not None else nullcontext()


def _module(net, kind: str, layer: int) -> MultiHeadAttention:
    if kind not in KINDS:
        raise InputError(f"{kind!r} is not one of {', '.join(KINDS)}", "kind")
    n = len(net.encoder)
    if not isinstance(layer, int) or not 1 <= layer <= n:
        raise InputError(f"{layer!r} is out of range: the model has {n} layers (1-{n})", "layer")
    stack = net.encoder if kind == "encoder" else net.decoder
    return stack[layer - 1].cross_attn if kind == "cross" else stack[layer - 1].self_attn


def inside(model, texts: str | Sequence[str], *, kind: str = "encoder", layer: int = 1,
           targets: str | Sequence[str] | None = None) -> Inside:
    """The inputs, weights and outputs of `kind`'s attention in layer `layer` of `model` (an
    `attn_mt.Model` loaded from a Transformer checkpoint) for `texts`, teacher-forced on `targets`
    (None: the greedy translations)."""
    checks.model(model)
    texts = checks.texts(texts, "texts")[0]
    if not texts or not all(t.strip() for t in texts):
        raise InputError("expected a sentence or a list of non-empty sentences", "texts")
    checks.choice(kind, "kind", KINDS)
    checks.integer(layer, "layer")
    if targets is not None:
        targets = checks.texts(targets, "targets")[0]
        if len(targets) != len(texts):
            raise InputError(f"expected {len(texts)} target string(s), as many as the texts",
                             "targets")
    net, tok = model._transformer("look inside"), model.tokenizer
    attn = _module(net, kind, layer)
    src_ids = tok.encode_src([t.strip() for t in texts])
    limit = net.max_positions
    if max(len(s) for s in src_ids) + 1 > limit:
        raise InputError(f"a sentence is longer than the model's {limit} positions", "texts")
    tgt_ids = _target_ids(model, net, src_ids, targets, limit)
    batch = collate(src_ids, tgt_ids, tok.pad_id, tok.bos_id, tok.eos_id)
    maps, calls = AttentionWeights(), []
    # alone: the hook would record other threads' calls; the module's weights and place are read
    # once, here
    with _alone(model):
        with torch.inference_mode(), recording(attn, calls):
            net.eval()
            # `Model.to` may have moved the module since the search
            device = model.translator.device
            src, tgt_in = batch.src.to(device), batch.tgt_in.to(device)
            src_mask = net.src_mask(src)  # (B, 1, 1, S)
            net.decode(tgt_in, net.encode(src, src_mask, maps), src_mask, weights=maps)
            emb = net.src_embed(src) * math.sqrt(net.d_model)  # (B, S, D)
            # (S, D)
            pe = net.pos.pe[: src.size(1)] if net.pos.pe.size(1) else torch.zeros_like(emb[0])
        (w_q, b_q), (w_k, b_k), (w_v, b_v) = projections(attn)
        w_o, b_o = attn.out_proj.weight.detach(), attn.out_proj.bias.detach()
    call = gather(attn, calls)
    own = {"encoder": maps.encoder_self, "decoder": maps.decoder_self,
           "cross": maps.cross}[kind][layer - 1]
    mask = call.mask
    # target padding sits after the real tokens: hide it from every query as well
    if kind == "decoder":
        mask = mask & (tgt_in != tok.pad_id)[:, None, :]
    return Inside(
        kind=kind, layer=layer, n_heads=attn.n_heads, d_k=attn.d_k,
        source_tokens=[[tok.src.id_to_piece(i) for i in [*s, tok.eos_id]] for s in src_ids],
        target_inputs=[tok.tgt_pieces([tok.bos_id, *t]) for t in tgt_ids],
        x=call.x.detach().clone(), context=call.context.detach().clone(), mask=mask.clone(),
        w_q=w_q.detach(), b_q=b_q.detach(), w_k=w_k.detach(), b_k=b_k.detach(), w_v=w_v.detach(),
        b_v=b_v.detach(), w_o=w_o, b_o=b_o, weights=own.detach().float().clone(),
        output=call.output.detach().clone(), embeddings=emb.detach().clone(),
        positions=pe.detach().float().clone(), module=attn, scheme=net.tgt_pos if kind == "decoder"
        else net.pos)


@contextmanager
def without(model, *heads: str) -> Iterator[None]:
    """Within the block `model` (an `attn_mt.Model`) runs without the named heads, e.g. "cross 2.3"
    (kind, layer.head from 1): their outputs are multiplied by 0 before W_o (masking.masked);
    translate, score, attention and contrastive all see it.

    >>> with without(model, "cross 2.3", "cross 2.4"):
    ...     model.contrastive(items).accuracy
    """
    from .masking import Head, masked

    checks.model(model)
    net = model._transformer("mask heads")
    chosen = []
    for name in heads:
        # not a string: refused below
        kind, _, where = (name if isinstance(name, str) else "").partition(" ")
        layer, _, head = where.partition(".")
        # not "²" nor 5000 digits
        if kind not in KINDS or not re.fullmatch(r"[0-9]{1,9}\.[0-9]{1,9}", where):
            raise InputError(f"{checks.shown(name)}: expected a head as 'kind layer.head', e.g. "
                             "'cross 2.3'", "heads")
        n_layers, n_heads = len(net.encoder), net.cfg.n_heads
        if not 1 <= int(layer) <= n_layers or not 1 <= int(head) <= n_heads:
            raise InputError(f"{checks.shown(name)}: the model has {n_layers} layers of {n_heads} "
                             "heads", "heads")
        chosen.append(Head(kind, int(layer), int(head)))
    # other threads' translations wait: they would lose the heads too
    with _alone(model), masked(net, chosen):
        yield


def _target_ids(model, net, src_ids: list[list[int]], targets: list[str] | None,
                limit: int) -> list[list[int]]:
    """The target ids to teacher-force: the targets', or the greedy translations' (None)."""
    tok = model.tokenizer
    if targets is not None:
        return [ids[: limit - 1] for ids in tok.encode_tgt(targets)]
    dcfg = model.options(beam=1, nbest=1)
    tgt_ids = []
    with _reading(model), torch.inference_mode():  # as Model.translate: `Model.to` waits
        net.eval()
        for s in src_ids:
            src = torch.tensor([[*s, tok.eos_id]], device=model.translator.device)
            lengths = max_lengths(torch.tensor([src.size(1)]), dcfg, limit)
            tgt_ids.append(search(net, tok, src, lengths, dcfg)[0][0].tokens)
    return tgt_ids
