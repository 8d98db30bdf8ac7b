"""The CUDA path: bf16 and fp16 (with the gradient scaler) training steps, CPU and GPU agreeing on a
batch, cached and uncached decoding equal on the GPU, a GPU checkpoint loading on the CPU; the
compiled and graphed step equal to the eager one, bucketed shapes compiled at most once each, a
whole run on the GPU (compiled, graphed, bucketed) whose checkpoint decodes on the CPU.

Every test needs a CUDA device and skips without one (`pytest -m gpu` selects them).
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from conftest import BOS, EOS, PAD, V, sources, train_reverser

from attn_mt import checkpoint
from attn_mt.config import TrainConfig, TransformerConfig
from attn_mt.data.batching import collate, pad
from attn_mt.decoding.search import beam_search, greedy_search
from attn_mt.models import build_model, loss_sum
from attn_mt.training.trainer import TrainStep

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
CUDA = torch.device("cuda")


def tiny_model(seed: int = 0):
    torch.manual_seed(seed)
    cfg = TransformerConfig(d_model=64, n_heads=4, n_layers=2, d_ff=128, dropout=0.0,
                            max_positions=64)
    return build_model(cfg, src_vocab=V, tgt_vocab=V, pad_id=PAD, shared_vocab=True)


def a_batch(n: int = 16, seed: int = 3):
    xs = [s[:-1] for s in sources(n, seed)]
    return collate(xs, [x[::-1] for x in xs], PAD, BOS, EOS)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_training_steps_lower_the_loss(precision):
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("no bf16 on this GPU")
    model = tiny_model().to(CUDA).train()
    step = TrainStep(model, TrainConfig(label_smoothing=0.0, skip_check="host"), CUDA, precision)
    assert step.scaler.is_enabled() == (precision == "fp16")
    batch = a_batch()
    losses = [step.update(step.backward([batch], batch.n_tokens), 3e-3) for _ in range(30)]
    assert all(x is not None and math.isfinite(x) for x in losses)
    assert losses[-1] < 0.7 * losses[0]


def test_cpu_and_gpu_losses_agree():
    model = tiny_model().eval()
    batch = a_batch()
    with torch.no_grad():
        cpu = loss_sum(model, batch, 0.1, PAD).item()
        gpu = loss_sum(copy.deepcopy(model).to(CUDA), batch.to(CUDA), 0.1, PAD).item()
    assert gpu == pytest.approx(cpu, rel=1e-4)


def test_cached_and_uncached_decoding_agree_on_the_gpu():
    model = copy.deepcopy(train_reverser()).to(CUDA)
    srcs = sources(24, seed=21)
    src = pad(srcs, PAD).to(CUDA)
    max_len = (torch.tensor([len(s) for s in srcs]) * 1.5 + 3).long()
    kw = dict(bos_id=BOS, eos_id=EOS)
    assert [h.tokens for h in greedy_search(model, src, max_len, **kw)] == \
        [h.tokens for h in greedy_search(model, src, max_len, use_cache=False, **kw)]
    beam = beam_search(model, src, max_len, beam_size=4, **kw)
    assert [[h.tokens for h in n] for n in beam] == \
        [[h.tokens for h in n] for n in beam_search(model, src, max_len, beam_size=4,
                                                    use_cache=False, **kw)]


def test_a_checkpoint_saved_on_the_gpu_loads_on_the_cpu(tmp_path, tiny_run):
    model, cfg, tok = checkpoint.load_model(tiny_run / "checkpoint_best.pt", CUDA)
    state = checkpoint.load(tiny_run / "checkpoint_best.pt")
    # CUDA tensors inside
    checkpoint.save({**state, "model": model.state_dict()}, tmp_path / "gpu.pt")
    loaded, _, _ = checkpoint.load_model(tmp_path / "gpu.pt", "cpu")
    assert all(p.device.type == "cpu" for p in loaded.parameters())
    src = torch.tensor([tok.encode_src(["a dog sees the cat."])[0] + [tok.eos_id]])
    tgt = torch.tensor([[tok.bos_id, 5, 6]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(src, tgt), model(src.to(CUDA), tgt.to(CUDA)).cpu(),
                                   atol=1e-4, rtol=1e-4)


def test_a_graphed_compiled_step_equals_the_eager_one():
    """torch.compile in the reduce-overhead mode (CUDA graphs) on bucketed batches: the same losses
    and weights as the eager step within rounding, over steps on two shapes."""
    from attn_mt.data.arrays import to_bucket
    from attn_mt.training.compiled import StepMarked, compiled

    cfg = TrainConfig(label_smoothing=0.1, compile=True, cuda_graphs=True,
                      length_buckets=(8, 16, 32), skip_check="host")  # the losses read
    eager_model = tiny_model().to(CUDA).train()
    graph_model = copy.deepcopy(eager_model)
    eager = TrainStep(eager_model, cfg, CUDA, "fp32")
    graph = TrainStep(graph_model, cfg, CUDA, "fp32", net=compiled(graph_model, cfg, CUDA))
    assert isinstance(graph.net, StepMarked) and eager.net is eager_model  # steps marked for replay
    batches = [to_bucket(a_batch(n, seed), cfg.length_buckets, PAD, BOS, EOS, batch_tokens=256)
               for n, seed in ((16, 3), (9, 4), (16, 5), (9, 6))]
    for batch in batches:
        losses = [s.update(s.backward([batch], batch.n_tokens), 3e-3) for s in (eager, graph)]
        assert losses[1] == pytest.approx(losses[0], rel=1e-3)
    for a, b in zip(eager_model.parameters(), graph_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def test_bucketed_shapes_compile_at_most_once_each():
    from torch._dynamo.utils import counters

    from attn_mt.data.arrays import to_bucket
    from attn_mt.training.compiled import compiled

    buckets = (8, 16, 24, 32)
    cfg = TrainConfig(compile=True, cuda_graphs=True, length_buckets=buckets)
    model = tiny_model().to(CUDA).train()
    torch._dynamo.reset()
    counters.clear()
    step = TrainStep(model, cfg, CUDA, "bf16" if torch.cuda.is_bf16_supported() else "fp32",
                     net=compiled(model, cfg, CUDA))
    shapes = set()
    for i in range(24):
        xs = [s[: 3 + i % 20] for s in sources(8 + i % 5, seed=i)]
        batch = to_bucket(collate(xs, [x[::-1] for x in xs], PAD, BOS, EOS), buckets, PAD, BOS, EOS,
                          batch_tokens=512)
        shapes.add(tuple(batch.src.shape))
        step.update(step.backward([batch], batch.n_tokens), 1e-3)
    assert 2 <= len(shapes) <= len(buckets)
    assert counters["stats"]["unique_graphs"] <= len(shapes)


def test_a_model_trained_on_the_gpu_translates_on_the_cpu(tmp_path, tiny_cfg):
    """The whole run on CUDA (bf16 where supported, compiled and graphed on buckets); its checkpoint
    loads and decodes on a CPU, with the GPU's scores."""
    from attn_mt.decoding.translate import translate
    from attn_mt.training.run import train

    cfg = tiny_cfg("train.device=cuda", "train.precision=auto", "train.compile=true",
                   "train.cuda_graphs=true", "train.length_buckets=[24,40,64]",
                   "train.max_epochs=1", "train.bleu_sentences=5")
    best = train(cfg, tmp_path / "run")
    model, ckcfg, tok = checkpoint.load_model(best, "cpu")
    assert all(p.device.type == "cpu" for p in model.parameters())
    hyps = translate(model, tok, ["a dog sees the cat.", "the cat runs."], ckcfg.decode,
                     torch.device("cpu"))
    assert len(hyps) == 2 and all(isinstance(h, str) for h in hyps)
    on_gpu = checkpoint.load_model(best, CUDA)[0]
    src = torch.tensor([tok.encode_src(["a dog sees the cat."])[0] + [tok.eos_id]])
    tgt = torch.tensor([[tok.bos_id, 5, 6]])
    with torch.no_grad():
        torch.testing.assert_close(model(src, tgt), on_gpu(src.to(CUDA), tgt.to(CUDA)).cpu(),
                                   atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_a_deferred_step_reads_nothing_from_the_device(optimizer):
    """train.skip_check=device: backward, clip, the non-finite check, optimizer and counters without
    one host sync (torch's sync debug mode raises on any), after a first step that makes the
    optimizer's state; a poisoned step is undone, and the counters read afterwards say so."""
    from attn_mt.training.schedule import TrainState

    model = tiny_model().to(CUDA).train()
    step = TrainStep(model, TrainConfig(optimizer=optimizer, ema_decay=0.9), CUDA, "fp32")
    batch, state = a_batch().to(CUDA), TrainState()
    for i in range(4):
        torch.cuda.synchronize()
        before = [p.detach().clone() for p in model.parameters()]
        torch.cuda.set_sync_debug_mode("error" if i else 0)
        try:
            loss = step.backward([batch], batch.n_tokens) * (float("nan") if i == 2 else 1.0)
            step.update(loss, 1e-3)
            step.checks.count(state, batch.n_tokens)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        if i == 2:
            assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    step.checks.read(state)
    assert (state.step, state.skipped_steps, state.tokens) == (3, 1, 3 * batch.n_tokens)


def test_a_deferred_trainer_step_reads_nothing_from_the_device():
    """The Trainer's whole step on CUDA (deferred by default there: batches prefetched into pinned
    memory, copied without waiting, counters on the device) makes no host sync; `read` then brings
    exact counts."""
    from conftest import TINY

    from attn_mt.config import load_config
    from attn_mt.data.corpus import load_corpus
    from attn_mt.training.trainer import Trainer

    cfg = load_config(None, [*TINY, "train.device=cuda"])
    corpus = load_corpus(cfg, cfg.model.max_positions)
    torch.manual_seed(0)
    tr = Trainer(build_model(cfg.model, **corpus.tok.sizes()).to(CUDA), cfg, corpus, CUDA, "fp32")
    assert type(tr.checks).__name__ == "DeviceChecks"
    tr.step(lambda: 0.0)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(4):
            tr.step(lambda: 0.0)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    tr.feed.close()
    tr.read()
    assert tr.state.step == 5 and tr.state.skipped_steps == 0 and tr.state.tokens > 0
