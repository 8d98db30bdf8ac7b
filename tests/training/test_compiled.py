"""Static shapes and the compiled step: length buckets keep the loss and gradients of the batch
itself, an epoch takes a few shapes, a compiled step equals the eager one, and the compile options
follow the config."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from conftest import BOS, EOS, PAD, TINY, V, sources

from attn_mt.config import ConfigError, TrainConfig, TransformerConfig, load_config
from attn_mt.data.arrays import bucket_rows, to_bucket
from attn_mt.data.batching import collate, token_batches
from attn_mt.data.corpus import load_corpus
from attn_mt.models import build_model, loss_sum
from attn_mt.training.compiled import compile_options
from attn_mt.training.trainer import Trainer, TrainStep

CPU = torch.device("cpu")
BUCKETS = (8, 16, 24, 32)


def tiny_model(seed: int = 0):
    torch.manual_seed(seed)
    cfg = TransformerConfig(d_model=32, n_heads=2, n_layers=1, d_ff=64, dropout=0.0,
                            max_positions=64)
    return build_model(cfg, src_vocab=V, tgt_vocab=V, pad_id=PAD, shared_vocab=True)


def a_batch(n: int = 5, seed: int = 3):
    xs = [s[:-1] for s in sources(n, seed)]
    return collate(xs, [x[::-1] for x in xs], PAD, BOS, EOS)


def test_rows_round_up_to_powers_of_two_and_one_and_a_half_times_them():
    assert [bucket_rows(r) for r in (1, 2, 3, 4, 5, 7, 9, 13, 17,
                                     100)] == [1, 2, 3, 4, 6, 8, 12, 16, 24, 128]
    assert all(r <= bucket_rows(r) < r * 3 // 2 + 1 for r in range(1, 3000))


def test_a_bucketed_batch_has_the_loss_and_gradients_of_the_batch_itself():
    batch = a_batch()
    big = to_bucket(batch, BUCKETS, PAD, BOS, EOS)
    assert (big.src.shape == big.tgt_in.shape == (6, 16) != batch.src.shape
            and big.n_tokens == batch.n_tokens)
    assert torch.equal(big.src[:5, : batch.src.size(1)], batch.src)
    assert (big.tgt_out[5:] == PAD).all()  # the added row predicts nothing
    grads = []
    for b in (batch, big):
        model = tiny_model()
        loss = loss_sum(model, b, 0.1, PAD, z_loss=1e-4)
        loss.backward()
        grads.append((loss.detach(), [p.grad for p in model.parameters()]))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-5, atol=1e-5)
    for a, b in zip(grads[0][1], grads[1][1], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_an_epoch_of_bucketed_batches_takes_few_shapes_and_trains_as_unbucketed(tiny_cfg):
    """The plan's batches, padded to their buckets (each within batch_tokens), train as the same
    batches unpadded."""
    cfg = tiny_cfg("train.length_buckets=[24,40,64]")
    plain_cfg = replace(cfg, train=replace(cfg.train, length_buckets=()))
    corpus = load_corpus(cfg, cfg.model.max_positions)
    losses, shapes, plan = {}, {}, None
    for name, c in (("buckets", cfg), ("plain", plain_cfg)):
        torch.manual_seed(0)
        # dropout 0 (TINY)
        tr = Trainer(build_model(c.model, **corpus.tok.sizes()), c, corpus, CPU, "fp32")
        if plan is None:
            plan = tr.epoch_batches()
        tr._plan = (tr.state.epoch, plan)  # the plain run takes the bucketed plan's batches
        seen, out = set(), []
        while not tr.epoch_done:
            _, made, _ = tr.group(tr.epoch_batches(), tr.state.epoch, tr.state.batch_in_epoch)
            seen.update(tuple(b.src.shape) + tuple(b.tgt_in.shape) for b in made)
            assert all(b.src.numel() <= cfg.train.batch_tokens for b in made)
            out.append(tr.step(lambda: 0.0).loss)
        losses[name], shapes[name] = out, seen
    assert len(shapes["buckets"]) < len(shapes["plain"]) and len(shapes["buckets"]) <= 3
    assert {s[:2] for s in shapes["buckets"]} <= {(600 // w, w) for w in (24, 40, 64)}
    assert losses["buckets"] == pytest.approx(losses["plain"], rel=1e-4)


def test_one_shape_per_bucket_holds_every_batch_of_that_width():
    """Rows: as many as batch_tokens hold at the bucket's width, shared by the ranks."""
    for rows, width in ((3, 9), (5, 13), (7, 16), (4, 16), (2, 5)):
        xs = [[4] * (width - 1)] + [[5] * 3] * (rows - 1)
        big = to_bucket(collate(xs, xs, PAD, BOS, EOS), BUCKETS, PAD, BOS, EOS, batch_tokens=120)
        assert big.src.shape == ((120 // 16, 16) if width > 8 else (120 // 8, 8))
    half = to_bucket(collate([[4] * 12], [[4] * 12], PAD, BOS, EOS), BUCKETS, PAD, BOS, EOS,
                     batch_tokens=120, ranks=2)
    # each of 2 ranks holds at most half of a global batch (7), rounded up
    assert half.src.shape == (4, 16)
    # wider than the last bucket: its own width
    wide = collate([[4] * 40], [[4] * 3], PAD, BOS, EOS)
    assert to_bucket(wide, BUCKETS, PAD, BOS, EOS, batch_tokens=120).src.shape == (1, 41)


def test_a_bucket_never_pads_a_batch_beyond_batch_tokens():
    """100 pairs of 41 tokens (4,100 tokens) in buckets (2, 64) with batch_tokens 4,096 were padded
    to 1,365 x 64 (21 times the tokens): the most rows a pair wider than 2 allows. A batch that does
    not fit its bucket within batch_tokens stays as it is; the plan cut with the buckets makes
    batches that fit."""
    xs = [[4] * 40] * 100
    batch = collate(xs, xs, PAD, BOS, EOS)
    assert to_bucket(batch, (2, 64), PAD, BOS, EOS, batch_tokens=4096).src.shape == (100, 41)
    assert to_bucket(batch, (2, 100_000), PAD, BOS, EOS, batch_tokens=4096).src.shape == (100, 41)
    lens = [40] * 100 + [3] * 500 + [20] * 50
    index = token_batches(lens, lens, 4096, 0, 0, buckets=(2, 64))
    assert (max(len(b) for b in index) == 4096 // 64
            and sorted(sum(index, [])) == list(range(len(lens))))
    for b in index:
        padded = to_bucket(collate([[4] * lens[i] for i in b], [[4] * lens[i] for i in b], PAD, BOS,
                                   EOS), (2, 64),
                           PAD, BOS, EOS, batch_tokens=4096)
        assert padded.src.shape == (4096 // 64, 64)  # one shape, within batch_tokens


def test_length_buckets_must_increase_and_fit_the_model():
    for bad in ("[16,8]", "[1,8]", "[8,8]"):
        with pytest.raises(ConfigError, match="train.length_buckets"):
            load_config(None, [*TINY, f"train.length_buckets={bad}"])
    # a step's first batch wider than the model's positions; 3.3 GB
    for bad in ("[16,100]", "[2,100000]"):
        with pytest.raises(ConfigError,
                           match=r"^train.length_buckets=.*model.max_positions=64") as e:
            load_config(None, [*TINY, "model.max_positions=64", f"train.length_buckets={bad}"])
        assert "\n" not in str(e.value)
    assert load_config(None, [*TINY, "model.max_positions=64",
                              "train.length_buckets=[16,64]"]).train.length_buckets


def test_compile_options_follow_the_config_and_the_device():
    cuda = torch.device("cuda")
    assert compile_options(TrainConfig(), CPU) is None
    assert compile_options(TrainConfig(compile=True), CPU) == {}
    # graphs are CUDA's
    assert compile_options(TrainConfig(compile=True, cuda_graphs=True), CPU) == {}
    assert compile_options(TrainConfig(compile=True, cuda_graphs=True, length_buckets=(16, 32)),
                           cuda) == \
        {"mode": "reduce-overhead"}
    assert compile_options(TrainConfig(compile=True), cuda) == {}


def test_a_compiled_step_equals_the_eager_one():
    """torch.compile of a one-layer model's step, captured (TorchDynamo) and split into forward and
    backward graphs (AOTAutograd) as on a GPU, run by the "aot_eager" backend (inductor's C++
    compile takes minutes on this CPU; the GPU tests run inductor): the same losses and weights
    within rounding over a few steps of one bucketed shape, captured once."""
    from torch._dynamo.utils import counters

    eager_model = tiny_model()
    compiled_model = copy.deepcopy(eager_model)
    cfg = TrainConfig(label_smoothing=0.1, length_buckets=BUCKETS)
    eager = TrainStep(eager_model, cfg, CPU, "fp32")
    net = torch.compile(compiled_model, dynamic=False, backend="aot_eager")
    graph = TrainStep(compiled_model, cfg, CPU, "fp32", net=net)
    torch._dynamo.reset()
    counters.clear()
    batch = to_bucket(a_batch(6), BUCKETS, PAD, BOS, EOS)
    for _ in range(3):
        losses = [s.update(s.backward([batch], batch.n_tokens), 3e-3) for s in (eager, graph)]
        assert losses[1] == pytest.approx(losses[0], rel=1e-4)
    assert counters["stats"]["unique_graphs"] == 1
    for a, b in zip(eager_model.parameters(), compiled_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_the_gpu_config_trains_a_few_steps_on_the_cpu(tmp_path):
    """configs/multi30k_gpu.yaml with the toy corpus and a tiny model: its buckets, token budget,
    evaluation and checkpoint averaging settings work end to end (eager: inductor's CPU compile
    takes minutes here)."""
    from pathlib import Path

    from attn_mt.rundir import RunDir
    from attn_mt.training.run import train

    path = Path(__file__).resolve().parents[2] / "configs" / "multi30k_gpu.yaml"
    cfg = load_config(path, [])
    assert (cfg.train.compile and cfg.train.cuda_graphs
            and cfg.train.length_buckets[-1] == cfg.data.max_len + 1)
    # a budget in tokens, the same on every GPU
    assert cfg.train.max_tokens and not cfg.train.max_minutes
    small = [*TINY, "data.splits.test=test", "train.compile=false", "train.max_steps=4",
             "train.eval_every=2", "train.bleu_sentences=5", "train.batch_tokens=600",
             "decode.beam_size=2", "decode.max_len_b=5"]
    cfg = load_config(path, small)
    assert cfg.train.length_buckets and cfg.train.keep_last == 3
    train(cfg, tmp_path / "run")
    results = RunDir(tmp_path / "run").read_results()
    assert results["steps"] == 4 and results["averaged_checkpoints"] == 2
