"""The CUDA path: bf16 and fp16 (with the gradient scaler) training steps, CPU and GPU agreeing on a
batch, cached and uncached decoding equal on the GPU, a GPU checkpoint loading on the CPU.

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
from attn_mt.decoding.beam import beam_search
from attn_mt.decoding.search import greedy_search
from attn_mt.models import build_model, loss_sum
from attn_mt.training.trainer import TrainStep

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
CUDA = torch.device("cuda")


def tiny_model(seed: int = 0):
    torch.manual_seed(seed)
    cfg = TransformerConfig(d_model=64, n_heads=4, n_layers=2, d_ff=128, dropout=0.0, max_positions=64)
    return build_model(cfg, src_vocab=V, tgt_vocab=V, pad_id=PAD, shared_vocab=True)


def a_batch(n: int = 16, seed: int = 3):
    xs = [s[:-1] for s in sources(n, seed)]
    return collate(xs, [x[::-1] for x in xs], PAD, BOS, EOS)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_training_steps_lower_the_loss(precision):
    if precision == "bf16" and not torch.cuda.is_bf16_supported():
        pytest.skip("no bf16 on this GPU")
    model = tiny_model().to(CUDA).train()
    step = TrainStep(model, TrainConfig(label_smoothing=0.0), CUDA, precision)
    assert step.scaler.is_enabled() == (precision == "fp16")
    batch = a_batch()
    losses = [step.apply(step.backward([batch], batch.n_tokens), 3e-3) for _ in range(30)]
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
        [[h.tokens for h in n] for n in beam_search(model, src, max_len, beam_size=4, use_cache=False, **kw)]


def test_a_checkpoint_saved_on_the_gpu_loads_on_the_cpu(tmp_path, tiny_run):
    model, cfg, tok = checkpoint.load_model(tiny_run / "checkpoint_best.pt", CUDA)
    state = checkpoint.load(tiny_run / "checkpoint_best.pt")
    checkpoint.save({**state, "model": model.state_dict()}, tmp_path / "gpu.pt")  # CUDA tensors inside
    loaded, _, _ = checkpoint.load_model(tmp_path / "gpu.pt", "cpu")
    assert all(p.device.type == "cpu" for p in loaded.parameters())
    src = torch.tensor([tok.encode_src(["a dog sees the cat."])[0] + [tok.eos_id]])
    tgt = torch.tensor([[tok.bos_id, 5, 6]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(src, tgt), model(src.to(CUDA), tgt.to(CUDA)).cpu(), atol=1e-4, rtol=1e-4)
