"""`attn-mt bench`: training and translation speed, against torch.nn.Transformer and the matmul
peak.

Every figure comes from one run: the variants (model x precision, matmul, data loading,
translation) take turns, round after round, on the same batches; each figure is the median
over the rounds after a warm-up round. Training uses the trainer's own step (trainer.TrainStep).

Models:
    ours          our Transformer on its fast path (fused QKV projection, SDPA; in CPU training
                  the explicit formula and our cheaper dropout: see attention.py)
    ours_refattn  our Transformer on the reference attention path (explicit softmax(QK^T)V)
    torch         REFERENCE: torch.nn.Transformer with our embeddings, positions and tied output
                  layer (`TorchTransformer` below), so the parameter counts match
    ours_adamw    ours with AdamW, when the config's optimizer is another (train.optimizer=muon):
                  the ratio of the two step times (`optimizer_ratio`) is what the optimizer costs
After the rows, the parts of our model's step (forward, loss, backward, clip, ...;
measure/parts.py), timed apart on the config's precision, attention and optimizer, against the whole
step.

Model FLOPs (`train_flops`) are the matmul FLOPs of one sentence pair of source length S and
target length T (eos / bos included), D = d_model, F = d_ff, V = target vocabulary, per layer:
    encoder  2S(4D^2 + 2DF) + 4S^2 D                   QKV + out, FFN; scores QK^T and weights x V
    decoder  2T(6D^2 + 2DF) + 2S(2D^2) + 4T^2 D + 4TSD self QKV + out, cross Q + out, FFN;
                                                       cross K,V of the memory; both attentions
plus 2TDV for the output layer; training counts 3x the forward (backward = 2x forward).
Causal attention is counted in full (T^2), padding not at all. MFU = model FLOP/s / the
measured peak of a large square matmul at the same precision.

One job: bench's measurements and report; the timing loop is timing.py's.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import statistics
import warnings
from dataclasses import replace
from pathlib import Path

import torch
from torch import Tensor, nn

from attn_mt.checkpoint import load_model
from attn_mt.config import ConfigError, ExperimentConfig, TransformerConfig
from attn_mt.data.batching import token_batches
from attn_mt.decoding.translate import translate
from attn_mt.device import Stopwatch, autocast, describe, precisions_for
from attn_mt.files import write_atomic
from attn_mt.measure.parts import config_parts, parts_table
from attn_mt.measure.prelude import prelude
from attn_mt.measure.timing import alternate, timed
from attn_mt.models import build_model, count_params
from attn_mt.models.positions import Sinusoidal
from attn_mt.models.seq2seq import init_embeddings, make_embeddings
from attn_mt.training.trainer import TrainStep

log = logging.getLogger(__name__)
MODELS = ("ours", "ours_refattn", "torch")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class TorchTransformer(nn.Module):
    """REFERENCE for benchmarks only: `torch.nn.Transformer` inside our embeddings and output
    layer."""

    def __init__(self, cfg: TransformerConfig, *, src_vocab: int, tgt_vocab: int, pad_id: int,
                 shared_vocab: bool) -> None:
        super().__init__()
        self.pad_id, self.d_model = pad_id, cfg.d_model
        self.src_embed, self.tgt_embed = make_embeddings(src_vocab=src_vocab, tgt_vocab=tgt_vocab,
                                                         dim=cfg.d_model, pad_id=pad_id,
                                                         share=shared_vocab and cfg.tie_embeddings)
        self.pos = Sinusoidal(cfg.d_model, cfg.max_positions)
        self.dropout = nn.Dropout(cfg.dropout)
        # "enable_nested_tensor ... norm_first": an inference-only path
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.core = nn.Transformer(cfg.d_model, cfg.n_heads, cfg.n_layers, cfg.n_layers,
                                       cfg.d_ff, cfg.dropout, batch_first=True,
                                       norm_first=cfg.norm_first)
        self.out_proj = nn.Linear(cfg.d_model, tgt_vocab, bias=False)
        init_embeddings(self.src_embed, self.tgt_embed, pad_id=pad_id)
        if cfg.tie_embeddings:
            self.out_proj.weight = self.tgt_embed.weight

    def _embed(self, emb: nn.Embedding, ids: Tensor) -> Tensor:
        return self.dropout(self.pos(emb(ids) * math.sqrt(self.d_model)))

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Teacher-forced logits (B, T, V); nn.Transformer's masks say True = "ignore"."""
        pad = src == self.pad_id  # (B, S)
        causal = nn.Transformer.generate_square_subsequent_mask(tgt_in.size(1), device=src.device)
        y = self.core(self._embed(self.src_embed, src), self._embed(self.tgt_embed, tgt_in),
                      tgt_mask=causal, src_key_padding_mask=pad, memory_key_padding_mask=pad,
                      tgt_is_causal=True)  # (B, T, D)
        return self.out_proj(y)


def train_flops(cfg: TransformerConfig, vocab: int, src_len: Tensor, tgt_len: Tensor) -> float:
    """Model FLOPs of one training step (forward + backward) over pairs of these lengths; see
    above."""
    d, f, n = cfg.d_model, cfg.d_ff, cfg.n_layers
    s, t = src_len.double(), tgt_len.double()
    enc = 2 * s * (4 * d * d + 2 * d * f) + 4 * s * s * d
    dec = 2 * t * (6 * d * d + 2 * d * f) + 2 * s * 2 * d * d + 4 * t * t * d + 4 * t * s * d
    return float(3 * (n * (enc + dec) + 2 * t * d * vocab).sum())


# the square matmul size that reaches the peak: on a 2-core CPU 1024 gives 2048's GFLOP/s (96.5 vs
# 92.4 fp32, 215 vs 208 bf16, one thread) in a quarter of the time; an H200's bf16 peak needs
# products far beyond 2048
MATMUL_N = {"cpu": 1024, "cuda": 8192}


def matmul(device: torch.device, dtype: torch.dtype, iters: int = 8):
    """A timed (n x n) @ (n x n) matmul, run `iters` times, and its FLOPs: the practical ceiling of
    this machine for dense layers, measured beside the models (n: MATMUL_N of the device type)."""
    n = MATMUL_N.get(device.type, 2048)
    a, b = (torch.randn(n, n, device=device).to(dtype) for _ in range(2))
    return timed(lambda: [a @ b for _ in range(iters)], device), 2 * n**3 * iters


def build(kind: str, cfg: ExperimentConfig, tok, device: torch.device) -> nn.Module:
    """A fresh model of one benchmark kind, seeded so every kind starts from the same weights
    RNG."""
    torch.manual_seed(cfg.train.seed)
    if kind == "torch":
        return TorchTransformer(cfg.model, **tok.sizes()).to(device)
    impl = "reference" if kind == "ours_refattn" else "sdpa"  # the explicit softmax path, or SDPA
    return build_model(replace(cfg.model, attention=impl), **tok.sizes()).to(device)


class Variant:
    """One benchmark variant: a model and a precision, trained by the trainer's own step."""

    def __init__(self, name: str, model: nn.Module, precision: str, cfg: ExperimentConfig,
                 device: torch.device, compiled: bool = False) -> None:
        self.name, self.precision, self.device, self.optimizer = (
            name, precision, device, cfg.train.optimizer)
        self.params = count_params(model)
        model.train()
        self.step = TrainStep(model, cfg.train, device, precision, net=torch.compile(model)
                              if compiled else None)
        self.peak_mem = 0

    def run(self, batches: list) -> float:
        """Train on `batches` (one optimizer step each); returns the seconds taken."""
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        with Stopwatch(self.device) as watch:
            for batch in batches:
                self.step.update(self.step.backward([batch], batch.n_tokens), self.step.cfg.lr)
        if self.device.type == "cuda":
            self.peak_mem = max(self.peak_mem, torch.cuda.max_memory_allocated(self.device))
        return watch.seconds


def translate_fns(checkpoint: Path, texts: list[str], device: torch.device,
                  precisions: list[str]) -> dict:
    """Timed greedy and beam-5 translation of `texts` with a checkpoint, per precision."""
    model, ckcfg, tok = load_model(checkpoint, device)
    fns = {}
    for beam in (1, 5):
        dcfg = replace(ckcfg.decode, beam_size=beam, nbest=1)
        for p in precisions:
            def run(dcfg=dcfg, p=p):
                with autocast(device, p):
                    translate(model, tok, texts, dcfg, device)
            fns[f"translate/{'greedy' if beam == 1 else 'beam5'}/{p}"] = timed(run, device)
    return fns


def _train_row(v: Variant, rounds: list[float], median: float, tokens: int, flops: float,
               steps: int, peak: dict) -> dict:
    """Throughput, FLOP rate and MFU of one variant from its median round."""
    row = {"model": v.name, "precision": v.precision, "params": v.params, "optimizer": v.optimizer,
           "round_s": rounds,  # every round's seconds, the warm-up first
           "tokens_per_s": tokens / median, "step_s": median / steps,
           "gflops": flops / median / 1e9, "mfu": flops / median / 1e9 / peak[v.precision]}
    if v.name == "ours_compiled":
        row["compile_s"] = rounds[0] - median  # the warm-up round's extra time
    if v.device.type == "cuda":
        row["peak_mem_mb"] = v.peak_mem / 2**20
    return row


def _contestants(cfg: ExperimentConfig, corpus, device: torch.device, precisions: list[str],
                 index: list, batches: list,
                 compile: bool) -> tuple[dict, dict[str, Variant], dict[str, float]]:
    """(the timed functions, the training variants by name, each precision's matmul FLOPs per call):
    data loading (bucketing a whole epoch, amortised over its batches; collating and moving
    `batches`), a matmul per precision, and each model (x compiled, if asked) x precision training
    on `batches`."""
    tc, split = cfg.train, cfg.data.splits.train
    lens = corpus.lengths(split)
    fns = {"data/plan": timed(lambda: token_batches(*lens, tc.batch_tokens, tc.seed, 1), device),
           "data/collate": timed(lambda: [b.to(device)
                                          for b in corpus.batches(split, index[:len(batches)],
                                                                  pin=device.type
                                                                  == "cuda")],
                                 device)}
    trainers, peak_flops = {}, {}
    kinds = [*MODELS, *["ours_compiled"] * compile, *["ours_adamw"] * (tc.optimizer != "adamw")]
    adamw = replace(cfg, train=replace(tc, optimizer="adamw"))
    for p in precisions:
        fns[f"matmul/{p}"], peak_flops[p] = matmul(device, DTYPES[p])
        for kind in kinds:
            model = build("ours" if kind.startswith("ours_") and kind != "ours_refattn" else kind,
                          cfg, corpus.tok, device)
            tr = trainers[f"{kind}/{p}"] = Variant(kind, model, p, adamw if kind == "ours_adamw"
                                                   else cfg, device,
                                                   compiled=kind == "ours_compiled")
            fns[f"{kind}/{p}"] = functools.partial(tr.run, batches)
    return fns, trainers, peak_flops


def _timed_batches(cfg: ExperimentConfig, corpus, device,
                   steps: int) -> tuple[list, list, int, float]:
    """The training split's plan, its first `steps` batches on `device`, their target tokens and
    training FLOPs."""
    tok, split, tc = corpus.tok, cfg.data.splits.train, cfg.train
    index = token_batches(*corpus.lengths(split), tc.batch_tokens, tc.seed, 0)
    batches = [b.to(device) for b in corpus.batches(split, index[:steps])]
    flops = sum(train_flops(cfg.model, tok.tgt_vocab_size, (b.src != tok.pad_id).sum(1),
                            (b.tgt_in != tok.pad_id).sum(1)) for b in batches)
    return index, batches, sum(b.n_tokens for b in batches), flops


def run_bench(cfg: ExperimentConfig, *, checkpoint: Path | None = None, repeats: int = 5,
              steps: int = 2, compile: bool = False, sentences: int = 100,
              json_out: Path | None = None) -> dict:
    """Measure everything in one run (see the module docstring); returns JSON-ready figures, also
    written to `json_out` if given."""
    if cfg.model.kind != "transformer":
        raise ConfigError(f"model.kind={cfg.model.kind}: the benchmark compares Transformers",
                          "model.kind")
    load_before = os.getloadavg()
    start = prelude(cfg, cfg.model.max_positions, "the config configs/toy.yaml")
    device, corpus = start.device, start.corpus
    tc = cfg.train
    index, batches, tokens, flops = _timed_batches(cfg, corpus, device, steps)
    texts = corpus.text[cfg.data.splits.test][0][:sentences]
    precisions = precisions_for(device)

    fns, trainers, peak_flops = _contestants(cfg, corpus, device, precisions, index, batches,
                                             compile)
    if checkpoint is not None:
        fns.update(translate_fns(checkpoint, texts, device, precisions))
    times = alternate(fns, repeats, warmup=True, label="bench")
    med = {name: statistics.median(t[1:]) for name, t in times.items()}
    # steps on different batches: at least 10
    parts = config_parts(cfg, start, max(repeats * steps, 10))

    peak = {p: peak_flops[p] / med[f"matmul/{p}"] / 1e9 for p in precisions}
    train = [_train_row(tr, times[name], med[name], tokens, flops, steps, peak) for name,
             tr in trainers.items()]
    by = {(r["model"], r["precision"]): r for r in train}
    ours = {p: by["ours", p]["tokens_per_s"] for p in precisions}
    ref = {p: by["torch", p]["tokens_per_s"] for p in precisions}
    main, adamw = start.precision, "ours_adamw" in {m for m, _ in by}
    data_s = med["data/plan"] / len(index) + med["data/collate"] / steps
    result = {
        "config": cfg.name, "device": str(device), "machine": describe(device),
        "threads": torch.get_num_threads(), "torch": torch.__version__, "precision": main,
        "repeats": repeats, "steps": steps, "batch_tokens": tc.batch_tokens,
        "tokens_per_round": tokens, "flops_per_token": flops / tokens,
        "ours_tokens_per_s": ours, "reference_tokens_per_s": ref,
        "ratio": {p: ours[p] / ref[p] for p in precisions},
        "bf16_speedup": ours["bf16"] / ours["fp32"] if "bf16" in ours else None,
        "mfu": {m: {p: by[m, p]["mfu"] for p in precisions}
                for m in dict.fromkeys(m for m, _ in by)},
        "matmul_peak_gflops": peak,
        "data_s_per_batch": data_s, "data_share": data_s / by["ours", main]["step_s"],
        "train": train, "optimizer": tc.optimizer,
        "optimizer_ratio": {p: by["ours", p]["step_s"] / by["ours_adamw", p]["step_s"]
                            for p in precisions}
        if adamw else None,  # the config's optimizer's step time / AdamW's (ours)
        "step_parts": parts,
        "translate": [{"search": n.split("/")[1], "precision": n.split("/")[2],
                       "sentences": len(texts), "sentences_per_s": len(texts) / med[n]} for n in fns
                      if n.startswith("translate/")],
        "load_before": load_before, "load_after": os.getloadavg(),
    }
    if json_out:
        write_atomic(Path(json_out), json.dumps(result, indent=2) + "\n")
    return result


def format_report(r: dict) -> str:
    """The figures as a plain-text table (the README's Performance section uses the same layout)."""
    lines = [f"{r['machine']}; device {r['device']}, {r['threads']} threads, torch {r['torch']}; "
             f"median of {r['repeats']} rounds of {r['steps']} steps ({r['tokens_per_round']} "
             "target tokens)", f"{'model':<14}{'precision':<10}{'tokens/s':>10}{'step s':>8}"
             f"{'GFLOP/s':>9}{'MFU':>7}"]
    for row in r["train"]:
        lines.append(f"{row['model']:<14}{row['precision']:<10}{row['tokens_per_s']:>10.0f}"
                     f"{row['step_s']:>8.3f}{row['gflops']:>9.1f}{row['mfu']:>7.1%}"
                     + (f"  compile {row['compile_s']:.0f} s" if "compile_s" in row else ""))
    for p, gflops in r["matmul_peak_gflops"].items():
        lines.append(f"matmul peak {p}: {gflops:.0f} GFLOP/s; "
                     f"ours / torch.nn.Transformer: {r['ratio'][p]:.2f}x")
    if r["bf16_speedup"]:
        lines.append(f"ours bf16 / fp32: {r['bf16_speedup']:.2f}x")
    lines.append(f"data loading: {r['data_s_per_batch'] * 1e3:.1f} ms per batch, "
                 f"{r['data_share']:.1%} of a {r['precision']} step")
    for p, ratio in (r.get("optimizer_ratio") or {}).items():
        lines.append(f"ours {r['optimizer']} / adamw {p}: {ratio:.2f}x the step time")
    if "step_parts" in r:
        lines += parts_table(r["step_parts"])
    for t in r["translate"]:
        lines.append(f"translate {t['search']:<7}{t['precision']:<6}{t['sentences_per_s']:>8.1f} "
                     "sentences/s")
    lines.append("load average before / after: " + " / ".join(
        ", ".join(f"{x:.2f}" for x in r[k]) for k in ("load_before", "load_after")))
    return "\n".join(lines)
