"""Which config changes keep a run the same run: what resuming may change, and what averaging
checks.

Tested in tests/training/test_resume.py (a change refused on resume, a RESUMABLE one allowed) and
tests/test_checkpoint.py (averaging checkpoints of different runs).
"""

from __future__ import annotations

from attn_mt.config.loader import from_dict, to_dict

# settings that may change within one run (on resuming): the budget, how often to report and save,
# where the data lives, and decoding; any other change alters the data order or the optimisation
RESUMABLE = {"name", "data.dir", "data.name", "train.max_steps", "train.max_tokens",
             "train.max_minutes", "train.max_epochs", "train.patience", "train.eval_every",
             "train.bleu_sentences", "train.checkpoint_every", "train.keep_last",
             "train.max_bad_steps", "train.log_every", "train.threads", "train.device",
             "train.compile", "train.cuda_graphs", "train.tensorboard", "train.record_attention",
             # as train.device: it differs from host checks only after a skipped step
             "train.skip_check"}


def config_changes(before: dict, after: dict) -> list[tuple[str, object, object]]:
    """(dotted key, before, after) for each setting that differs between two configs (checkpoint
    dicts, defaults filled in), apart from RESUMABLE ones and decoding. Raises ConfigError for an
    invalid one."""
    a, b = (_flat(to_dict(from_dict(c))) for c in (before, after))
    return [(k, a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys())
            if a.get(k) != b.get(k) and k not in RESUMABLE and not k.startswith("decode.")]


def _flat(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out
