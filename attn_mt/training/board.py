"""TensorBoard logging of a run (`train.tensorboard: true`): scalars while training, and at every
evaluation the cross-attention of one fixed validation sentence as an image.

Events go to `<run_dir>/tensorboard/`; `tensorboard --logdir runs` shows every run side by side.
TensorBoard is an optional extra (`pip install 'attn-mt[tb]'`); without `train.tensorboard` this
module writes nothing and needs nothing.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import torch

from attn_mt.config import ConfigError, DecodeConfig
from attn_mt.data.tokenizer import Tokenizer
from attn_mt.decoding.attention_maps import attention_maps
from attn_mt.models import Seq2Seq

log = logging.getLogger(__name__)


class Board:
    """A SummaryWriter under the run directory, or a no-op when TensorBoard logging is off."""

    def __init__(self, folder: Path, enabled: bool, start_step: int = 0) -> None:
        self.writer = None
        if not enabled:
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise ConfigError("train.tensorboard: true needs TensorBoard: pip install "
                              "'attn-mt[tb]'", "train.tensorboard") from None
        # purge_step: a resumed run drops the events written after the checkpoint it resumes from
        self.writer = SummaryWriter(str(folder), purge_step=start_step or None)
        log.info("TensorBoard events in %s; point TensorBoard's log folder at %s", folder,
                 folder.parent)

    def scalars(self, step: int, prefix: str, values: dict[str, float | None]) -> None:
        if self.writer is not None:
            for name, value in values.items():
                if value is not None:
                    self.writer.add_scalar(f"{prefix}/{name}", value, step)

    def attention(self, step: int, model: Seq2Seq, tok: Tokenizer, text: str, cfg: DecodeConfig,
                  device: torch.device) -> None:
        """The last layer's cross-attention of `text` (greedy translation), every head, as one
        image."""
        if self.writer is None or not text.strip():
            return
        was_training = model.training
        _, maps = attention_maps(model, tok, text, replace(cfg, beam_size=1, nbest=1), device)
        model.train(was_training)
        cross = [m for m in maps if m.kind == "cross"][-1]
        self.writer.add_figure(f"attention/cross_layer{cross.layer}", _figure(cross), step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def _figure(m):
    """Heads side by side: predicted tokens down, source tokens along."""
    # matplotlib loads when drawing (0.75 s)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    h, tq, tk = m.weights.shape
    fig = Figure(figsize=(2.0 + 0.25 * tk * h, 1.5 + 0.25 * tq), layout="constrained")
    FigureCanvasAgg(fig)
    for head, ax in enumerate(fig.subplots(1, h, squeeze=False)[0]):
        ax.imshow(m.weights[head].float().cpu().numpy(), cmap="viridis", vmin=0.0, vmax=1.0,
                  aspect="auto")
        ax.set_xticks(range(tk), m.keys, rotation=90, fontsize=6)
        ax.set_yticks(range(tq), m.queries if head == 0 else [""] * tq, fontsize=6)
        ax.set_title(f"head {head + 1}", fontsize=8)
    return fig
