"""`attn-mt compare-rnn`: the Transformer against the RNN on the same data, tokenizer, batches and
clock.

Both models train in lockstep in one process: the next step always goes to the model whose own
clock (seconds spent in its training steps) is behind, so background load hits both alike and
each gets the same training-time budget. Evaluations pause the clock. Then, alternated and
repeated: cost against sentence length, and decoding speed. Writes report.json, report.md and
two plots into the output directory. The clock (compare.clock) is the wall clock, or this
process's CPU time, which other processes cannot starve; the report says whether the machine's
load leaves the measurement to be trusted (`trust`), and a warning is logged as soon as it does not.

One job: compare-rnn's race and its figures; report.py writes them up.
"""

from __future__ import annotations

import copy
import logging
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from attn_mt import checkpoint
from attn_mt.config import ConfigError, ExperimentConfig
from attn_mt.config.compare_rnn import CompareConfig, CompareSetup
from attn_mt.data.batching import token_batches
from attn_mt.data.corpus import Corpus
from attn_mt.data.sources import source
from attn_mt.decoding.contrastive import evaluate_contrastive, items_from_records
from attn_mt.decoding.scoring import score_texts
from attn_mt.device import Stopwatch, autocast, machine
from attn_mt.measure import timing
from attn_mt.measure.prelude import prelude
from attn_mt.measure.report import write_report
from attn_mt.models import build_model, count_params
from attn_mt.training.compiled import compiled
from attn_mt.training.trainer import Trainer
from attn_mt.training.validation import Observer, score_test_split, valid_bleu

log = logging.getLogger(__name__)


@dataclass
class Contestant:
    """One model in the race: its Trainer (optimizer, place in the shared batches, counters) and its
    clock."""

    name: str
    cfg: ExperimentConfig
    trainer: Trainer
    clock: float = 0.0  # seconds in training steps
    eval_s: float = 0.0
    next_eval: float = 0.0
    curve: list[dict] = field(default_factory=list)
    best_bleu: float = -1.0
    best_state: dict | None = None
    done: bool = False
    observer: Observer | None = None  # at every evaluation (the API's attention recorder)

    @property
    def model(self) -> torch.nn.Module:
        return self.trainer.model


def _train_step(c: Contestant, budget: float, clock: str = "wall") -> float:
    """One step of the contestant's Trainer, the learning rate following its clock; returns its
    seconds on `clock` (timing.CLOCKS)."""
    tr = c.trainer
    if tr.epoch_done:
        tr.next_epoch()
    with timing.watch(clock, tr.device) as watch:
        tr.step(lambda: c.clock, spent=c.clock / budget)
    return watch.seconds


def _validate(c: Contestant, corpus: Corpus, epoch_tokens: int) -> None:
    """Greedy BLEU on the validation subset; the time goes to eval_s, not to the training clock."""
    tr = c.trainer
    tr.read()  # deferred checks: the step and token counts, exact
    with Stopwatch(tr.device) as watch:
        value = valid_bleu(c.model, corpus, c.cfg, tr.device, tr.precision)
    c.model.train()
    c.curve.append({"elapsed_s": round(c.clock, 1), "step": tr.state.step,
                    "epochs": round(tr.state.tokens / epoch_tokens, 2), "valid_bleu": value})
    if value > c.best_bleu:
        c.best_bleu, c.best_state = value, copy.deepcopy(c.model.state_dict())
    c.eval_s += watch.seconds
    if c.observer is not None:
        c.observer.on_evaluation(tr.state.step, c.model, corpus.tok, c.curve[-1])
    log.info("%s: %.0f s, step %d, epoch %.2f: valid BLEU %.2f", c.name, c.clock, tr.state.step,
             c.curve[-1]["epochs"], value)


def race(contestants: list[Contestant], corpus: Corpus, cmp: CompareConfig) -> None:
    """Train all models in lockstep, always stepping the one whose clock is behind."""
    budget, every = cmp.budget_minutes * 60, cmp.eval_every_minutes * 60
    epoch_tokens = _epoch_tokens(corpus, contestants[0].cfg.data.splits.train)
    for c in contestants:
        c.next_eval = every
        c.model.train()
    unit = "CPU s" if cmp.clock == "cpu" else "s"
    bar = tqdm(total=round(budget * len(contestants)), unit=unit, desc="training both (own clocks)",
               disable=None, dynamic_ncols=True, bar_format="{l_bar}{bar}| {n:.0f}/{total:.0f} "
               f"{unit} {{postfix}}")
    while live := [c for c in contestants if not c.done]:
        c = min(live, key=lambda c: c.clock)
        dt = _train_step(c, budget, cmp.clock)
        c.clock += dt
        bar.update(min(dt, max(0.0, budget - c.clock + dt)))
        c.done = c.clock >= budget or c.trainer.state.epoch >= c.cfg.train.max_epochs
        if c.done or c.clock >= c.next_eval:
            _validate(c, corpus, epoch_tokens)
            c.next_eval += every
            bar.set_postfix_str("  ".join(f"{x.name} BLEU {x.curve[-1]['valid_bleu']:.1f}"
                                          for x in contestants if x.curve))
    bar.close()
    for c in contestants:
        c.trainer.feed.close()  # no step follows: each trainer's batch thread ends


def _check_sizes(params: dict[str, int], gap: float) -> None:
    lo, hi = min(params.values()), max(params.values())
    if (hi - lo) / hi > gap:
        sizes = ", ".join(f"{k} {v / 1e6:.2f}M" for k, v in params.items())
        raise ConfigError(f"parameter counts differ by {(hi - lo) / hi:.0%} ({sizes}), more than "
                          f"compare.max_param_gap={gap}; resize one of the models",
                          "compare.max_param_gap")


def compare_rnn(setup: CompareSetup, out_dir: Path,
                observers: dict[str, Observer] | None = None) -> dict:
    """Train and measure both models; returns the report (also written to out_dir). `observers`:
    model name -> what watches its evaluations."""
    threads, created = torch.get_num_threads(), not out_dir.exists()
    try:
        return _compare(setup, out_dir, observers or {})
    except BaseException:
        if created and out_dir.is_dir() and not any(out_dir.iterdir()):
            out_dir.rmdir()  # a failed command leaves no empty folder behind
        raise
    finally:
        torch.set_num_threads(threads)  # train.threads applies to this run only


def _compare(setup: CompareSetup, out_dir: Path, observers: dict[str, Observer]) -> dict:
    cfgs, cmp = setup.configs, setup.compare
    base = cfgs["transformer"]
    out_dir.mkdir(parents=True, exist_ok=True)
    start = prelude(base, min(c.model.max_positions for c in cfgs.values()),
                    "configs/compare.yaml with `quick`")
    device, precision, corpus = start.device, start.precision, start.corpus
    cmp = replace(cmp, clock=resolve_clock(cmp.clock, device))
    contestants = []
    for name, cfg in cfgs.items():
        torch.manual_seed(cfg.train.seed)
        model = build_model(cfg.model, **corpus.tok.sizes()).to(device)
        # each model may be compiled (train.compile in its section)
        net = compiled(model, cfg.train, device)
        contestants.append(Contestant(name, cfg, Trainer(model, cfg, corpus, device, precision,
                                                         net=net),
                                      observer=observers.get(name)))
        if name in observers:
            observers[name].rewind(0, corpus, cfg, model)
    params = {c.name: count_params(c.model) for c in contestants}
    _check_sizes(params, cmp.max_param_gap)
    where = machine(device, precision)
    log.info("comparing %s on %s (%s, %d threads, %s)",
             ", ".join(f"{k} {v / 1e6:.2f}M" for k, v in params.items()), where["device_name"],
             device, where["threads"], precision)
    load: dict = {}
    # cost against length first, on the fresh models: the timings do not depend on the weights,
    # and a process that has trained for half an hour gave noisier ones (a fragmented heap)
    with _phase(load, "length_scaling", cmp.clock):
        scaling = _length_scaling(contestants, corpus, cmp)
    activations, memory_method = _activations(contestants, corpus, base)
    with _phase(load, "training", cmp.clock):
        race(contestants, corpus, cmp)
    tok = corpus.tok
    report: dict = {"machine": where, "budget_minutes": cmp.budget_minutes, "compare": asdict(cmp),
                    "data": asdict(base.data), "tokenizer": {**asdict(base.tokenizer),
                    "src_vocab": tok.src_vocab_size, "tgt_vocab": tok.tgt_vocab_size},
                    "batch_tokens": base.train.batch_tokens, "length_scaling": scaling,
                    "models": {c.name: _training_row(c, activations[c.name], corpus)
                               for c in contestants},
                    "memory_method": memory_method}
    for c in contestants:  # the rest uses each model's best checkpoint
        c.model.load_state_dict(c.best_state)
        c.model.eval()
    with _phase(load, "decoding", cmp.clock):
        _decoding(report, contestants, corpus, cmp)
    _test_and_save(report, contestants, corpus, out_dir)
    report["background_load"], report["trust"] = load, trust(load, scaling, cmp.clock, where)
    write_report(report, out_dir)
    return report


def resolve_clock(clock: str, device: torch.device) -> str:
    """compare.clock for this device: "auto" is the CPU clock on a CPU and the wall clock elsewhere;
    the CPU clock cannot see a GPU's work, so it is refused there."""
    if clock == "auto":
        return "cpu" if device.type == "cpu" else "wall"
    if clock == "cpu" and device.type != "cpu":
        raise ConfigError("compare.clock=cpu counts this process's CPU time, not the work of "
                          f"{device}: use compare.clock=wall (or auto) there", "compare.clock")
    return clock


@contextmanager
def _phase(load: dict, name: str, clock: str):
    """timing.metered, and a warning at once when the phase's load leaves its timings untrusted."""
    with timing.metered(load, name):
        yield
    for reason in timing.untrusted({name: load[name]}, clock, torch.get_num_threads(), _cpus()):
        log.warning("this measurement cannot be trusted: %s", reason)


def _cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def trust(load: dict, scaling: list[dict], clock: str, where: dict) -> dict:
    """Whether the report may draw conclusions: the reasons it may not (timing.untrusted, for the
    load of each phase), and the length-scaling timings too noisy to read (timing.noisy_rows)."""
    names = [k.removesuffix("_ms") for k in scaling[0] if k.endswith("_ms")] if scaling else []
    reasons = timing.untrusted(load, clock, where["threads"], _cpus())
    return {"clock": clock, "threads": where["threads"], "trusted": not reasons, "reasons": reasons,
            "noisy": timing.noisy_rows(scaling, names)}


def _amp(c: Contestant):
    return lambda: autocast(c.trainer.device, c.trainer.precision)


def _length_scaling(contestants: list[Contestant], corpus: Corpus,
                    cmp: CompareConfig) -> list[dict]:
    """Forward + backward time per batch against sentence length, the models alternated."""
    log.info("timing forward + backward at lengths %s, alternated", list(cmp.lengths))
    vocab = min(corpus.tok.src_vocab_size, corpus.tok.tgt_vocab_size)
    first = contestants[0]
    with tqdm(total=len(cmp.lengths) * cmp.repeats * 2, desc="length scaling (alternated)",
              disable=None, dynamic_ncols=True) as bar:
        return timing.length_scaling({c.name: c.model for c in contestants}, list(cmp.lengths),
                                     cmp.length_batch_tokens, vocab, cmp.repeats,
                                     first.trainer.device, _amp(first), bar, clock=cmp.clock)


def _activations(contestants: list[Contestant], corpus: Corpus,
                 base: ExperimentConfig) -> tuple[dict, str]:
    """Bytes saved for backward by each model on the largest training batch, and how that was
    measured."""
    split = base.data.splits.train
    src_lens, tgt_lens = corpus.lengths(split)
    first_epoch = token_batches(src_lens, tgt_lens, base.train.batch_tokens, base.train.seed, 0)
    biggest = max(first_epoch, key=lambda b: len(b) * max(max(src_lens[i], tgt_lens[i]) for i in b))
    big = next(corpus.batches(split, [biggest])).to(contestants[0].trainer.device)
    sizes = {c.name: timing.saved_activation_bytes(c.model, big.src, big.tgt_in, _amp(c))
             for c in contestants}
    return sizes, ("16 bytes per parameter (fp32 weights, gradients, Adam moments) plus the "
                   f"tensors saved for backward on the largest training batch ({len(biggest)} "
                   f"sentences x {big.src.size(1)} source tokens)")


def _epoch_tokens(corpus: Corpus, split: str) -> int:
    """Target tokens (with eos) in one epoch of a split."""
    tgt_lens = corpus.lengths(split)[1]
    return int(np.asarray(tgt_lens).sum()) + len(tgt_lens)


def _training_row(c: Contestant, activation: int, corpus: Corpus) -> dict:
    """What the race measured of one model."""
    st, params = c.trainer.state, count_params(c.model)
    epoch_tokens = _epoch_tokens(corpus, c.cfg.data.splits.train)
    tokens_per_s = st.tokens / max(c.clock, 1e-9)
    return {"kind": c.name, "params": params, "model_config": asdict(c.cfg.model),
            "lr": c.cfg.train.lr, "steps": st.step, "epochs": round(st.tokens / epoch_tokens, 2),
            "train_seconds": round(c.clock, 1), "eval_seconds": round(c.eval_s, 1),
            "train_tokens_per_s": round(tokens_per_s, 1),
            "seconds_per_epoch": round(epoch_tokens / max(tokens_per_s, 1e-9), 1),
            "activation_mb": round(activation / 2**20, 1),
            "peak_memory_mb": round((16 * params + activation) / 2**20, 1),
            "best_valid_bleu": c.best_bleu, "curve": c.curve,
            "encoder_sequential_steps_per_layer": "1" if c.name == "transformer"
            else "source length"}


def _decoding(report: dict, contestants: list[Contestant], corpus: Corpus,
              cmp: CompareConfig) -> None:
    """Greedy and beam decoding speed of the best checkpoints, alternated, into the report."""
    base, first = contestants[0].cfg, contestants[0]
    texts = corpus.text[base.data.splits.test][0][: cmp.decode_sentences]
    log.info("timing greedy and beam-%d decoding of %d sentences, alternated", cmp.beam_size,
             len(texts))
    with tqdm(total=4 * cmp.decode_repeats, desc="decoding (alternated)", disable=None,
              dynamic_ncols=True) as bar:
        speed = timing.decode_speed({c.name: c.model for c in contestants}, corpus.tok, texts,
                                    base.decode, cmp.beam_size, cmp.decode_repeats,
                                    first.trainer.device, _amp(first), bar, clock=cmp.clock)
    for c in contestants:
        report["models"][c.name].update(speed[c.name],
                                        decode_sentences_per_s=speed[c.name]["greedy_sentences_per_s"])
    report["decode"] = {"sentences": len(texts), "batch_size": base.decode.batch_size,
                        "beam_size": cmp.beam_size}


def _test_and_save(report: dict, contestants: list[Contestant], corpus: Corpus,
                   out_dir: Path) -> None:
    """Test BLEU of each best checkpoint with its decode settings (and where the data has a
    contrastive set, the accuracy on it, by antecedent distance: attention against recurrence on
    long-range links); the checkpoints into out_dir."""
    data = contestants[0].cfg.data
    items = (items_from_records(records) if (records := source(data).contrastive(data.splits.test))
             else [])
    for c in contestants:
        tr = c.trainer
        _, s = score_test_split(c.model, corpus, c.cfg, tr.device, tr.precision)
        report["models"][c.name].update(test_bleu=s["bleu"], test_chrf=s["chrf"],
                                        test_beam_size=c.cfg.decode.beam_size)
        report["sacrebleu_signature"] = s["bleu_signature"]
        if items:
            accuracy = evaluate_contrastive(
                lambda src, tgt, m=c.model,
                d=tr.device: score_texts(m, corpus.tok, src, tgt, device=d), items)
            report["models"][c.name]["contrastive"] = accuracy.json()
        checkpoint.save({**checkpoint.model_state(c.best_state, c.cfg, corpus.tok),
                         "step": tr.state.step, "best_bleu": c.best_bleu}, out_dir / f"{c.name}.pt")
