"""Training: data -> tokenizer -> model -> AdamW with warmup -> evaluations and checkpoints.

`train(cfg, run_dir)` is the whole job; it writes into `run_dir`:
    config.yaml, spm*.model, checkpoint_last.pt, checkpoint_best.pt, metrics.jsonl, results.json
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from . import checkpoint
from .config import ExperimentConfig, TrainConfig, save_config, to_dict
from .data import Batch, DataError, collate, load_pairs, token_batches
from .decode import translate
from .evaluate import bleu, score
from .models import build_model, count_params
from .tokenizer import Tokenizer, train_or_load

log = logging.getLogger(__name__)


class TrainError(RuntimeError):
    """A run that cannot start or go on; the message says why."""


def pick_device(name: str) -> torch.device:
    if name == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise TrainError("train.device=cuda but no CUDA device is available")
    if name == "mps" and not torch.backends.mps.is_available():
        raise TrainError("train.device=mps but MPS is not available")
    return torch.device(name)


def cpu_has_bf16() -> bool:
    """True when this CPU runs bf16 matmuls natively (AVX-512 BF16 / AMX)."""
    return bool(torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def pick_precision(name: str, device: torch.device) -> str:
    """"fp32", "bf16" or "fp16" for this device; "auto" picks bf16 where the hardware has it."""
    if name == "auto":
        if device.type == "cuda":
            return "bf16" if torch.cuda.is_bf16_supported() else "fp16"
        return "bf16" if device.type == "cpu" and cpu_has_bf16() else "fp32"
    if name == "fp16" and device.type != "cuda":
        raise TrainError("train.precision=fp16 needs a CUDA device (use bf16 or fp32)")
    return name


def autocast(device: torch.device, precision: str):
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Linear warmup to cfg.lr over warmup_steps, then inverse-square-root decay (step >= 1)."""
    step = max(step, 1)
    if cfg.warmup_steps == 0:
        return cfg.lr
    return cfg.lr * min(step / cfg.warmup_steps, math.sqrt(cfg.warmup_steps / step))


@dataclass
class Corpus:
    """Tokenized splits: for each split, the raw texts and their token ids."""

    tok: Tokenizer
    text: dict[str, tuple[list[str], list[str]]]  # split -> (src texts, tgt texts)
    ids: dict[str, tuple[list[list[int]], list[list[int]]]]  # split -> (src ids, tgt ids)


def load_corpus(cfg: ExperimentConfig, run_dir: Path, max_positions: int) -> Corpus:
    """Read the three splits, train or reuse the tokenizer, encode, filter training pairs by length."""
    splits = cfg.data.splits
    text = {}
    for name in (splits.train, splits.valid, splits.test):
        cols = load_pairs(cfg.data, name).to_dict()
        text[name] = (cols["src"], cols["tgt"])
    tok = train_or_load(cfg.tokenizer, *text[splits.train], run_dir)
    ids = {name: (tok.encode_src(s), tok.encode_tgt(t)) for name, (s, t) in text.items()}
    limit = min(cfg.data.max_len, max_positions - 1)
    src, tgt = ids[splits.train]
    keep = [i for i in range(len(src)) if len(src[i]) <= limit and len(tgt[i]) <= limit]
    if not keep:
        raise DataError(f"split {splits.train!r}: no pair has at most {limit} tokens per side "
                        "(data.max_len / model.max_positions)")
    if len(keep) < len(src):
        log.info("dropped %d of %d training pairs longer than %d tokens", len(src) - len(keep), len(src), limit)
    ids[splits.train] = ([src[i] for i in keep], [tgt[i] for i in keep])
    return Corpus(tok, text, ids)


def batch_iter(corpus: Corpus, split: str, batches: list[list[int]]):
    src, tgt = corpus.ids[split]
    tok = corpus.tok
    for b in batches:
        yield collate([src[i] for i in b], [tgt[i] for i in b], tok.pad_id, tok.bos_id, tok.eos_id)


def loss_sum(model: nn.Module, batch: Batch, label_smoothing: float, pad_id: int) -> torch.Tensor:
    """Summed (label-smoothed) cross-entropy over the batch's target tokens."""
    logits = model(batch.src, batch.tgt_in)  # (B, T, V)
    return F.cross_entropy(logits.flatten(0, 1).float(), batch.tgt_out.flatten(),
                           ignore_index=pad_id, label_smoothing=label_smoothing, reduction="sum")


@torch.inference_mode()
def evaluate_loss(model: nn.Module, corpus: Corpus, split: str, cfg: ExperimentConfig,
                  device: torch.device, precision: str) -> float:
    """Mean per-token cross-entropy (no smoothing) on a split."""
    model.eval()
    src, tgt = corpus.ids[split]
    batches = token_batches([len(s) for s in src], [len(t) for t in tgt], cfg.train.batch_tokens,
                            0, 0, shuffle=False)
    total, n = torch.zeros((), device=device), 0
    for batch in batch_iter(corpus, split, batches):
        batch = batch.to(device)
        with autocast(device, precision):
            total += loss_sum(model, batch, 0.0, corpus.tok.pad_id)
        n += batch.n_tokens
    return total.item() / max(n, 1)


def check_writable(run_dir: Path) -> None:
    """Fail before training, not after an hour, when the run directory cannot take files."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write_test"
        probe.write_bytes(bytes(1 << 20))  # 1 MiB: catches a full disk, too
        probe.unlink()
    except OSError as e:
        raise TrainError(f"{run_dir}: run directory is not writable ({e.strerror})") from None


def train(cfg: ExperimentConfig, run_dir: Path, resume: bool = False) -> Path:
    """Train the configured model; returns the path of the best checkpoint."""
    tc = cfg.train
    check_writable(run_dir)
    last_path, best_path = run_dir / "checkpoint_last.pt", run_dir / "checkpoint_best.pt"
    resumed = checkpoint.load(last_path) if resume else None
    if tc.threads:
        torch.set_num_threads(tc.threads)
    device = pick_device(tc.device)
    precision = pick_precision(tc.precision, device)
    torch.manual_seed(tc.seed)
    save_config(cfg, run_dir / "config.yaml")

    corpus = load_corpus(cfg, run_dir, cfg.model.max_positions)
    tok, splits = corpus.tok, cfg.data.splits
    model = build_model(cfg.model, src_vocab=tok.src_vocab_size, tgt_vocab=tok.tgt_vocab_size,
                        pad_id=tok.pad_id, shared_vocab=tok.joint).to(device)
    n_params = count_params(model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr_at(1, tc), betas=tc.betas,
                            weight_decay=tc.weight_decay)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    pos = {"step": 0, "epoch": 0, "batch_in_epoch": 0, "best_bleu": -1.0, "bad_evals": 0, "elapsed_s": 0.0}
    if resumed is not None:
        model.load_state_dict(resumed["model"])
        opt.load_state_dict(resumed["optimizer"])
        pos = {k: resumed[k] for k in pos}
        torch.set_rng_state(resumed["rng"]["torch"])
        if device.type == "cuda" and resumed["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state_all(resumed["rng"]["cuda"])
        log.info("resumed from %s at step %d (epoch %d, batch %d)", last_path, pos["step"],
                 pos["epoch"], pos["batch_in_epoch"])
    elif (run_dir / "metrics.jsonl").exists():
        (run_dir / "metrics.jsonl").unlink()  # a fresh run starts a fresh log
    log.info("model %s: %.2fM parameters; device %s, precision %s", cfg.model.kind, n_params / 1e6,
             device, precision)

    src_lens = [len(s) for s in corpus.ids[splits.train][0]]
    tgt_lens = [len(t) for t in corpus.ids[splits.train][1]]
    valid_src, valid_ref = (x[: tc.bleu_sentences] for x in corpus.text[splits.valid])
    start = time.perf_counter() - pos["elapsed_s"]
    stop_reason = None
    window = {"loss": torch.zeros((), device=device), "tokens": 0, "t0": time.perf_counter()}
    train_loss = float("nan")

    def state() -> dict:
        rng = {"torch": torch.get_rng_state(),
               "cuda": torch.cuda.get_rng_state_all() if device.type == "cuda" else None}
        return {"model": model.state_dict(), "optimizer": opt.state_dict(), "config": to_dict(cfg),
                "tokenizer": tok.state(), "rng": rng, **pos}

    def run_eval() -> None:
        nonlocal stop_reason
        valid_loss = evaluate_loss(model, corpus, splits.valid, cfg, device, precision)
        with autocast(device, precision):
            hyps = translate(model, tok, valid_src, greedy_cfg, device)
        valid_bleu = bleu(hyps, valid_ref)
        model.train()
        pos["elapsed_s"] = time.perf_counter() - start
        record = {"step": pos["step"], "epoch": pos["epoch"], "train_loss": round(train_loss, 4),
                  "valid_loss": round(valid_loss, 4), "valid_bleu": valid_bleu,
                  "lr": lr_at(pos["step"], tc), "tokens_per_s": round(tokens_per_s, 1),
                  "elapsed_s": round(pos["elapsed_s"], 1)}
        with open(run_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(record) + "\n")
        tqdm.write(f"step {pos['step']} epoch {pos['epoch']}: valid loss {valid_loss:.3f}, "
                   f"valid BLEU {valid_bleu:.2f}")
        improved = valid_bleu > pos["best_bleu"]
        if improved:
            pos["best_bleu"], pos["bad_evals"] = valid_bleu, 0
        else:
            pos["bad_evals"] += 1
        checkpoint.save(state(), last_path)
        if improved:
            checkpoint.save(state(), best_path)
        if tc.patience and pos["bad_evals"] >= tc.patience:
            stop_reason = f"no BLEU improvement in {tc.patience} evaluations"

    tokens_per_s = 0.0
    greedy_cfg = replace(cfg.decode, beam_size=1, nbest=1)  # validation BLEU: fast greedy
    model.train()
    try:
        while stop_reason is None and pos["epoch"] < tc.max_epochs:
            batches = token_batches(src_lens, tgt_lens, tc.batch_tokens, tc.seed, pos["epoch"])
            groups = [batches[i : i + tc.accum_steps] for i in range(0, len(batches), tc.accum_steps)]
            first = pos["batch_in_epoch"] // tc.accum_steps
            bar = tqdm(total=len(groups), initial=first, desc=f"epoch {pos['epoch'] + 1}",
                       disable=None, dynamic_ncols=True, leave=False)
            for group in groups[first:]:
                step_tokens = sum(len(corpus.ids[splits.train][1][i]) + 1 for b in group for i in b)
                for batch in batch_iter(corpus, splits.train, group):
                    batch = batch.to(device)
                    with autocast(device, precision):
                        loss = loss_sum(model, batch, tc.label_smoothing, tok.pad_id)
                    scaler.scale(loss / step_tokens).backward()
                    window["loss"] += loss.detach()
                lr = lr_at(pos["step"] + 1, tc)
                for g in opt.param_groups:
                    g["lr"] = lr
                if tc.clip_norm:
                    scaler.unscale_(opt)
                    nn.utils.clip_grad_norm_(model.parameters(), tc.clip_norm)
                scaler.step(opt)
                scaler.update()
                opt.zero_grad(set_to_none=True)
                pos["step"] += 1
                pos["batch_in_epoch"] += len(group)
                window["tokens"] += step_tokens
                bar.update(1)
                if pos["step"] % tc.log_every == 0:  # the only host sync in the step loop
                    now = time.perf_counter()
                    train_loss = window["loss"].item() / max(window["tokens"], 1)
                    tokens_per_s = window["tokens"] / max(now - window["t0"], 1e-9)
                    bar.set_postfix(loss=f"{train_loss:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_s:,.0f}")
                    window.update(loss=torch.zeros((), device=device), tokens=0, t0=now)
                if tc.max_steps and pos["step"] >= tc.max_steps:
                    stop_reason = f"reached train.max_steps={tc.max_steps}"
                elif tc.max_minutes and time.perf_counter() - start >= tc.max_minutes * 60:
                    stop_reason = f"reached train.max_minutes={tc.max_minutes}"
                if stop_reason or (tc.eval_every and pos["step"] % tc.eval_every == 0):
                    run_eval()
                elif tc.checkpoint_every and pos["step"] % tc.checkpoint_every == 0:
                    pos["elapsed_s"] = time.perf_counter() - start
                    checkpoint.save(state(), last_path)
                if stop_reason:
                    break
            bar.close()
            if stop_reason is None:
                pos["epoch"], pos["batch_in_epoch"] = pos["epoch"] + 1, 0
                if not tc.eval_every or pos["epoch"] == tc.max_epochs:
                    run_eval()
    except KeyboardInterrupt:
        pos["elapsed_s"] = time.perf_counter() - start
        checkpoint.save(state(), last_path)
        raise TrainError(f"interrupted at step {pos['step']}; {last_path} saved, continue with --resume") from None
    log.info("stopped: %s", stop_reason or f"reached train.max_epochs={tc.max_epochs}")
    train_seconds = time.perf_counter() - start

    # final test with the best checkpoint and the configured decoding
    best = checkpoint.load(best_path, map_location=device)
    model.load_state_dict(best["model"])
    test_src, test_ref = corpus.text[splits.test]
    with autocast(device, precision):
        hyps = translate(model, tok, test_src, cfg.decode, device)
    (run_dir / "test_hyps.txt").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    scores = score(hyps, test_ref)
    results = {"test_split": splits.test, "test_bleu": scores["bleu"], "test_chrf": scores["chrf"],
               "sacrebleu_signature": scores["bleu_signature"], "chrf_signature": scores["chrf_signature"],
               "best_valid_bleu": pos["best_bleu"], "best_step": best["step"],
               "train_seconds": round(train_seconds, 1), "steps": pos["step"], "params": n_params,
               "device": str(device), "precision": precision, "threads": torch.get_num_threads(),
               "torch": torch.__version__}
    (run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    log.info("test BLEU %.2f, chrF %.2f (%s)", scores["bleu"], scores["chrf"], scores["bleu_signature"])
    return best_path
