"""Training: data -> tokenizer -> model -> AdamW with warmup -> evaluations and checkpoints.

`train(cfg, run_dir)` is the whole job; it writes into `run_dir`:
    config.yaml, spm*.model, checkpoint_last.pt, checkpoint_best.pt, metrics.jsonl, results.json

checkpoint_last.pt is saved at every evaluation, every `train.checkpoint_every` steps and on
Ctrl-C. `train(..., resume=True)` continues from it, also in the middle of an epoch: the batch
order is a function of (seed, epoch), the learning rate a function of the step, and the RNG,
optimizer and loss-window state travel in the checkpoint, so on CPU a resumed run ends with
the same parameters, bit for bit, as one that was never stopped.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import shutil
import signal
import threading
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from . import checkpoint, distributed
from .config import ExperimentConfig, TrainConfig, save_config, to_dict
from .data import Batch, DataError, collate, load_pairs, token_batches
from .decode import translate
from .evaluate import bleu, score
from .models import build_model, count_params
from .tokenizer import Tokenizer, train_or_load

log = logging.getLogger(__name__)


class TrainError(RuntimeError):
    """A run that cannot start or go on; the message says why."""


class TrainInterrupted(TrainError):
    """Ctrl-C: the run saved checkpoint_last.pt and stopped; `resume=True` continues it."""


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


def lr_at(step: int, cfg: TrainConfig, progress: float = 0.0) -> float:
    """Linear warmup to cfg.lr over warmup_steps (step >= 1), then cfg.schedule: inverse-square-root
    decay, or linear decay to 0 as `progress` (the spent fraction of the budget) goes from 0 to 1."""
    step = max(step, 1)
    warm = min(step / cfg.warmup_steps, 1.0) if cfg.warmup_steps else 1.0
    if cfg.schedule == "linear":
        return cfg.lr * warm * max(0.0, 1.0 - progress)
    decay = math.sqrt(cfg.warmup_steps / step) if cfg.warmup_steps and step > cfg.warmup_steps else 1.0
    return cfg.lr * warm * decay


def budget_spent(cfg: TrainConfig, step: int, seconds: float, epochs: float) -> float:
    """The fraction of the training budget used: the largest of steps, minutes and epochs."""
    parts = [epochs / cfg.max_epochs]
    if cfg.max_steps:
        parts.append(step / cfg.max_steps)
    if cfg.max_minutes:
        parts.append(seconds / (cfg.max_minutes * 60))
    return min(1.0, max(parts))


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
        log.info("dropped %d of %d training pairs longer than %d tokens", len(src) - len(keep), len(src),
                 limit)
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
    probe = run_dir / ".write_test"
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(bytes(1 << 20))  # 1 MiB: catches a full disk, too
    except OSError as e:
        raise TrainError(f"{run_dir}: run directory is not writable ({e.strerror or e})") from None
    finally:
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)


def check_space(run_dir: Path, model: nn.Module) -> None:
    """Fail before training when the disk cannot hold both checkpoints plus one being written."""
    size = 3 * sum(p.numel() * p.element_size() for p in model.parameters())  # weights, 2 AdamW moments
    need = 3 * size - sum(f.stat().st_size for f in run_dir.glob("checkpoint_*.pt"))
    free = shutil.disk_usage(run_dir).free
    if free < need:
        raise TrainError(f"{run_dir}: {free / 2**20:.1f} MiB free on disk, checkpoints need about "
                         f"{need / 2**20:.1f} MiB")


@dataclass
class TrainState:
    """Where a run stands; with model, optimizer and RNG state, all that a resumed run needs."""

    step: int = 0  # optimizer steps taken
    epoch: int = 0  # epochs completed
    batch_in_epoch: int = 0  # batches of the current epoch already used
    best_bleu: float = -1.0
    bad_evals: int = 0  # evaluations since BLEU last improved
    bad_steps: int = 0  # non-finite losses in a row
    skipped_steps: int = 0  # steps skipped for a non-finite loss, in all
    window_loss: float = 0.0  # summed loss and target tokens since the last progress update
    window_tokens: int = 0
    train_loss: float = math.nan  # mean loss per token over the last full window
    elapsed_s: float = 0.0  # training seconds, over all processes of the run


def rng_state(device: torch.device) -> dict:
    return {"torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if device.type == "cuda" else None}


def set_rng_state(rng: dict, device: torch.device) -> None:
    torch.set_rng_state(rng["torch"])
    if device.type == "cuda" and rng.get("cuda") is not None:
        torch.cuda.set_rng_state_all(rng["cuda"])


class StopOnInterrupt:
    """While training, Ctrl-C sets `requested`: the loop saves after the current step and stops.

    A second Ctrl-C interrupts at once (the last saved checkpoint stays as it was).
    """

    def __enter__(self) -> StopOnInterrupt:
        self.requested, self.previous = False, None
        main = threading.current_thread() is threading.main_thread()  # only it receives signals
        if main and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            self.previous = signal.signal(signal.SIGINT, self._handle) or signal.default_int_handler
        return self

    def _handle(self, signum, frame) -> None:
        self.requested = True
        signal.signal(signal.SIGINT, self.previous)
        log.warning("interrupted: saving after this step (Ctrl-C again to stop without saving)")

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def forward_backward(model: nn.Module, batches, n_tokens: int, scaler, cfg: TrainConfig,
                     device: torch.device, precision: str, pad_id: int, weights: list[float] | None = None,
                     world: distributed.World = distributed.World()) -> torch.Tensor:
    """Accumulate the gradient of the mean token loss over `batches`; returns their summed loss.

    Under DistributedDataParallel (`world.enabled`) `batches` are this rank's shards, `n_tokens`
    counts the whole global batch, and the gradients are all-reduced once, after the last batch
    (`no_sync` before it); DDP averages over ranks, hence the factor world.size.
    """
    batches = list(batches)
    weights = weights or [1.0] * len(batches)
    total = torch.zeros((), device=device)
    for i, (batch, weight) in enumerate(zip(batches, weights, strict=True)):
        batch = batch.to(device)
        last = i == len(batches) - 1
        with contextlib.nullcontext() if last or not world.enabled else model.no_sync():
            with autocast(device, precision):
                loss = loss_sum(model, batch, cfg.label_smoothing, pad_id) * weight
            scaler.scale(loss * world.size / n_tokens).backward()
        total += loss.detach()
    return total


def optimizer_step(model: nn.Module, opt, scaler, loss: torch.Tensor, lr: float,
                   clip_norm: float) -> float | None:
    """Clip and apply the gradients; returns the summed loss, or None when the loss or the
    gradient norm is not finite and the step was skipped."""
    for g in opt.param_groups:
        g["lr"] = lr
    scaler.unscale_(opt)
    checks = [loss]
    if clip_norm:
        norm = nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
        if not scaler.is_enabled():  # with fp16 the scaler itself skips steps with inf gradients
            checks.append(norm)
    values = torch.stack(checks).tolist()  # the one host sync of a step
    finite = all(math.isfinite(v) for v in values)
    if finite:
        scaler.step(opt)
    scaler.update()
    opt.zero_grad(set_to_none=True)
    return values[0] if finite else None


def restore(resumed: dict, model: nn.Module, opt, tok: Tokenizer, cfg: ExperimentConfig,
            device: torch.device) -> TrainState:
    """Load a checkpoint_last.pt dict into model, optimizer and RNG; returns where the run stood."""
    if resumed["tokenizer"] != tok.state():
        raise TrainError("--resume: the tokenizer differs from the checkpoint's (the data or tokenizer "
                         "settings changed); start a new run instead")
    saved, now = resumed["config"]["model"], to_dict(cfg)["model"]
    for key in sorted(set(saved) | set(now)):
        if saved.get(key) != now.get(key):
            raise TrainError(f"--resume: model.{key} is {now.get(key)!r}, the checkpoint was trained "
                             f"with {saved.get(key)!r}")
    model.load_state_dict(resumed["model"])
    opt.load_state_dict(resumed["optimizer"])
    set_rng_state(resumed["rng"], device)
    return TrainState(**{f.name: resumed[f.name] for f in fields(TrainState) if f.name in resumed})


def trim_metrics(path: Path, st: TrainState) -> None:
    """Drop the records written after the checkpoint a run resumes from: they will be written again."""
    if not path.exists():
        return
    keep = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
            if (record["step"], record["epoch"]) <= (st.step, st.epoch):
                keep.append(line + "\n")
        except (ValueError, KeyError, TypeError):  # e.g. a line cut short by a kill
            continue
    path.write_text("".join(keep), encoding="utf-8")


def validate(model: nn.Module, corpus: Corpus, cfg: ExperimentConfig, device: torch.device,
             precision: str) -> tuple[float, float]:
    """(validation loss, greedy BLEU on train.bleu_sentences sentences); leaves the RNG as it was."""
    rng = rng_state(device)
    split = cfg.data.splits.valid
    valid_loss = evaluate_loss(model, corpus, split, cfg, device, precision)
    src, ref = (x[: cfg.train.bleu_sentences] for x in corpus.text[split])
    with autocast(device, precision):
        hyps = translate(model, corpus.tok, src, replace(cfg.decode, beam_size=1, nbest=1), device)
    set_rng_state(rng, device)
    model.train()
    return valid_loss, bleu(hyps, ref)


def snapshots(run_dir: Path) -> list[Path]:
    """The kept evaluation checkpoints, oldest first."""
    return sorted(run_dir.glob("checkpoint_step*.pt"))


def keep_weights(state: dict, run_dir: Path, n: int) -> None:
    """Save this evaluation's weights as checkpoint_step{step}.pt; delete all but the last n."""
    keys = ("model", "config", "tokenizer", "step", "epoch")
    checkpoint.save({k: state[k] for k in keys}, run_dir / f"checkpoint_step{state['step']:07d}.pt")
    for old in snapshots(run_dir)[:-n]:
        old.unlink(missing_ok=True)


def average_last(model: nn.Module, corpus: Corpus, cfg: ExperimentConfig, run_dir: Path,
                 device: torch.device, precision: str, best_bleu: float) -> tuple[Path, float]:
    """Average the kept checkpoints into checkpoint_avg.pt; (the better on valid BLEU, its BLEU)."""
    paths = snapshots(run_dir)
    averaged = checkpoint.average(paths)
    avg_path = run_dir / "checkpoint_avg.pt"
    checkpoint.save(averaged, avg_path)
    model.load_state_dict(averaged["model"])
    _, avg_bleu = validate(model, corpus, cfg, device, precision)
    better = avg_bleu > best_bleu
    log.info("average of the last %d checkpoints: valid BLEU %.2f (best single %.2f); testing %s", len(paths),
             avg_bleu, best_bleu, "the average" if better else "the best single checkpoint")
    return (avg_path if better else run_dir / "checkpoint_best.pt"), avg_bleu


def limit_reached(cfg: TrainConfig, step: int, seconds: float) -> str | None:
    if cfg.max_steps and step >= cfg.max_steps:
        return f"reached train.max_steps={cfg.max_steps}"
    if cfg.max_minutes and seconds >= cfg.max_minutes * 60:
        return f"reached train.max_minutes={cfg.max_minutes}"
    return None


def score_best(model: nn.Module, corpus: Corpus, cfg: ExperimentConfig, best_path: Path, run_dir: Path,
              device: torch.device, precision: str) -> dict:
    """Load the best checkpoint, translate the test split with the configured decoding, score it."""
    best = checkpoint.load(best_path, map_location=device)
    model.load_state_dict(best["model"])
    test_src, test_ref = corpus.text[cfg.data.splits.test]
    with autocast(device, precision):
        hyps = translate(model, corpus.tok, test_src, cfg.decode, device)
    (run_dir / "test_hyps.txt").write_text("\n".join(hyps) + "\n", encoding="utf-8")
    scores = score(hyps, test_ref)
    log.info("test BLEU %.2f, chrF %.2f (%s)", scores["bleu"], scores["chrf"], scores["bleu_signature"])
    return {"test_split": cfg.data.splits.test, "test_bleu": scores["bleu"], "test_chrf": scores["chrf"],
            "sacrebleu_signature": scores["bleu_signature"], "chrf_signature": scores["chrf_signature"],
            "best_step": best["step"]}


def train(cfg: ExperimentConfig, run_dir: Path, resume: bool = False) -> Path:
    """Train the configured model; returns the path of the best checkpoint."""
    tc = cfg.train
    world, device = distributed.init(pick_device(tc.device))
    if world.main:
        check_writable(run_dir)
    else:
        logging.getLogger("attn_mt").setLevel(logging.WARNING)  # rank 0 reports
    last_path, best_path = run_dir / "checkpoint_last.pt", run_dir / "checkpoint_best.pt"
    metrics_path = run_dir / "metrics.jsonl"
    resumed = checkpoint.load(last_path) if resume else None
    if tc.threads:
        torch.set_num_threads(tc.threads)
    precision = pick_precision(tc.precision, device)
    torch.manual_seed(tc.seed)
    if world.main:  # rank 0 trains the tokenizer; the others then reuse it
        save_config(cfg, run_dir / "config.yaml")
        corpus = load_corpus(cfg, run_dir, cfg.model.max_positions)
    distributed.barrier(world)
    if not world.main:
        corpus = load_corpus(cfg, run_dir, cfg.model.max_positions)
    tok, train_split = corpus.tok, cfg.data.splits.train
    model = build_model(cfg.model, src_vocab=tok.src_vocab_size, tgt_vocab=tok.tgt_vocab_size,
                        pad_id=tok.pad_id, shared_vocab=tok.joint).to(device)
    if world.main:
        check_space(run_dir, model)
    if world.enabled:
        torch.manual_seed(tc.seed + world.rank)  # same initial weights, different dropout per rank
    n_params = count_params(model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr_at(1, tc), betas=tc.betas,
                            weight_decay=tc.weight_decay)
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")
    st = TrainState()
    if resumed is not None:
        st = restore(resumed, model, opt, tok, cfg, device)
        if len(resumed.get("rng_ranks") or []) == world.size:
            set_rng_state(resumed["rng_ranks"][world.rank], device)
        if world.main:
            trim_metrics(metrics_path, st)
        log.info("resumed from %s at step %d (epoch %d, batch %d)", last_path, st.step, st.epoch,
                 st.batch_in_epoch)
    elif world.main:
        metrics_path.unlink(missing_ok=True)  # a fresh run starts a fresh log
    net = model
    if world.enabled:
        ids = [device.index] if device.type == "cuda" else None
        net = nn.parallel.DistributedDataParallel(model, device_ids=ids)
        log.info("%d processes (%s); train.batch_tokens=%d is the global batch, about %d tokens per rank",
                 world.size, "nccl" if device.type == "cuda" else "gloo", tc.batch_tokens,
                 tc.batch_tokens // world.size)
    if tc.compile:  # the training forward/backward only; evaluation and decoding stay eager
        net = torch.compile(net)
    log.info("model %s: %.2fM parameters; device %s, precision %s", cfg.model.kind, n_params / 1e6,
             device, precision)

    src_lens, tgt_lens = ([len(x) for x in side] for side in corpus.ids[train_split])
    start = time.perf_counter() - st.elapsed_s
    stop_reason = None
    tokens_per_s, window_t0 = 0.0, time.perf_counter()

    def state(rngs: list[dict]) -> dict:
        st.elapsed_s = time.perf_counter() - start
        return {"model": model.state_dict(), "optimizer": opt.state_dict(), "config": to_dict(cfg),
                "tokenizer": tok.state(), "rng": rngs[0], "rng_ranks": rngs if world.enabled else None,
                **asdict(st)}

    def save_last() -> None:  # every rank calls it: the RNG states are gathered
        rngs = distributed.gather(rng_state(device), world)
        if world.main:
            checkpoint.save(state(rngs), last_path)

    def run_eval() -> None:  # every rank calls it; rank 0 evaluates and writes
        nonlocal stop_reason
        rngs = distributed.gather(rng_state(device), world)
        if world.main:
            stop_reason = evaluate_and_save(rngs)
        stop_reason, st.best_bleu, st.bad_evals = distributed.broadcast(
            (stop_reason, st.best_bleu, st.bad_evals), world)

    def evaluate_and_save(rngs: list[dict]) -> str | None:
        valid_loss, valid_bleu = validate(model, corpus, cfg, device, precision)
        record = {"step": st.step, "epoch": st.epoch, "train_loss": round(st.train_loss, 4),
                  "valid_loss": round(valid_loss, 4), "valid_bleu": valid_bleu, "lr": opt.param_groups[0]["lr"],
                  "skipped_steps": st.skipped_steps, "tokens_per_s": round(tokens_per_s, 1),
                  "elapsed_s": round(time.perf_counter() - start, 1)}
        with open(metrics_path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        tqdm.write(f"step {st.step} epoch {st.epoch}: valid loss {valid_loss:.3f}, "
                   f"valid BLEU {valid_bleu:.2f}")
        if valid_bleu > st.best_bleu:
            st.best_bleu, st.bad_evals = valid_bleu, 0
            checkpoint.save(state(rngs), best_path)  # before last: a kill in between loses nothing
        else:
            st.bad_evals += 1
        checkpoint.save(state(rngs), last_path)
        if tc.keep_last:
            keep_weights(state(rngs), run_dir, tc.keep_last)
        if tc.patience and st.bad_evals >= tc.patience:
            return f"no BLEU improvement in {tc.patience} evaluations"
        return stop_reason

    model.train()
    with StopOnInterrupt() as interrupt:
        while stop_reason is None and st.epoch < tc.max_epochs:
            batches = token_batches(src_lens, tgt_lens, tc.batch_tokens, tc.seed, st.epoch)
            groups = [batches[i : i + tc.accum_steps] for i in range(0, len(batches), tc.accum_steps)]
            done = st.batch_in_epoch // tc.accum_steps
            bar = tqdm(total=len(groups), initial=done, desc=f"epoch {st.epoch + 1}",
                       disable=None if world.main else True,
                       dynamic_ncols=True, leave=False)
            for group in groups[done:]:
                n_tokens = sum(tgt_lens[i] + 1 for b in group for i in b)  # the global batch
                shards = [distributed.shard(b, world) for b in group]
                mine = batch_iter(corpus, train_split, [s for s, _ in shards])
                loss = forward_backward(net, mine, n_tokens, scaler, tc, device, precision, tok.pad_id,
                                        [w for _, w in shards], world)
                elapsed, interrupted = time.perf_counter() - start, interrupt.requested
                if world.enabled:  # one small all-reduce: global loss, any rank's Ctrl-C, rank 0's clock
                    flags = torch.tensor([float(interrupted), elapsed if world.main else 0.0], device=device)
                    sync = distributed.all_sum(torch.cat([loss.float().view(1), flags]), world)
                    loss, interrupted, elapsed = sync[0], bool(sync[1] > 0), float(sync[2])
                lr = lr_at(st.step + 1, tc, budget_spent(tc, st.step, elapsed,
                                                         st.epoch + st.batch_in_epoch / len(batches)))
                loss = optimizer_step(model, opt, scaler, loss, lr, tc.clip_norm)
                st.batch_in_epoch += len(group)
                bar.update(1)
                if loss is None:
                    st.bad_steps, st.skipped_steps = st.bad_steps + 1, st.skipped_steps + 1
                    log.warning("step %d: non-finite loss, step skipped (%d in a row)", st.step + 1,
                                st.bad_steps)
                    if st.bad_steps >= tc.max_bad_steps:
                        raise TrainError(f"stopped at step {st.step}: {st.bad_steps} non-finite losses in a "
                                         "row (train.max_bad_steps); try a lower train.lr or train.clip_norm")
                else:
                    st.step, st.bad_steps = st.step + 1, 0
                    st.window_loss, st.window_tokens = st.window_loss + loss, st.window_tokens + n_tokens
                    if st.step % tc.log_every == 0:
                        now = time.perf_counter()
                        st.train_loss = st.window_loss / st.window_tokens
                        tokens_per_s = st.window_tokens / max(now - window_t0, 1e-9)
                        bar.set_postfix(loss=f"{st.train_loss:.3f}", lr=f"{lr:.2e}",
                                        tok_s=f"{tokens_per_s:,.0f}")
                        st.window_loss, st.window_tokens, window_t0 = 0.0, 0, now
                    stop_reason = limit_reached(tc, st.step, elapsed)
                    if stop_reason or (tc.eval_every and st.step % tc.eval_every == 0):
                        run_eval()
                    elif tc.checkpoint_every and st.step % tc.checkpoint_every == 0:
                        save_last()
                if interrupted:
                    save_last()
                    raise TrainInterrupted(f"stopped at step {st.step}; {last_path} saved, "
                                           "continue with --resume")
                if stop_reason:
                    break
            bar.close()
            if stop_reason is None:
                st.epoch, st.batch_in_epoch = st.epoch + 1, 0
                if not tc.eval_every or st.epoch == tc.max_epochs:
                    run_eval()
    log.info("stopped: %s", stop_reason or f"reached train.max_epochs={tc.max_epochs}")
    train_seconds = time.perf_counter() - start
    if not world.main:
        distributed.close(world)
        return best_path

    test_path = best_path
    if tc.keep_last >= 2 and len(snapshots(run_dir)) >= 2:
        test_path, avg_bleu = average_last(model, corpus, cfg, run_dir, device, precision, st.best_bleu)
        results_extra = {"averaged_valid_bleu": avg_bleu, "averaged_checkpoints": len(snapshots(run_dir))}
    else:
        results_extra = {}
    results = score_best(model, corpus, cfg, test_path, run_dir, device, precision)
    results.update(results_extra, tested=test_path.name)
    results.update(best_valid_bleu=st.best_bleu, train_seconds=round(train_seconds, 1), steps=st.step,
                   skipped_steps=st.skipped_steps, params=n_params, device=str(device), precision=precision,
                   threads=torch.get_num_threads(), torch=torch.__version__)
    (run_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    distributed.close(world)
    return test_path
