"""A run's end: the writers and processes closed, then rank 0 tests the better checkpoint (the
best single one, or the average of the last ones where it wins on validation BLEU) and writes
results.json, last of all: a run directory that has it is finished.

Tested in tests/training/test_run.py, tests/test_average.py and test_kill_points.py.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from attn_mt import checkpoint
from attn_mt.data.sources import source
from attn_mt.models import count_params
from attn_mt.training.validation import score_test_split, validate

if TYPE_CHECKING:
    from attn_mt.training.start import Training


def wind_up(run: Training, tested: bool) -> Path:
    """After the loop: the writers and processes closed, then rank 0 tests (unless a finished run
    was tested); returns the path of the tested checkpoint."""
    if run.board is not None:
        run.board.close()
    if run.trainer.net is not run.trainer.model:
        # a wrapper for several processes goes before their group, its reference cycles too
        # (distributed.py's `close` says why); only then, as a full collection is slow
        run.trainer.net = run.trainer.model
        gc.collect()
    run.world.close()  # every rank is past its last collective; rank 0 tests alone
    if tested:
        if run.world.main:
            write_test_texts(run, missing=True)
        return run.files.tested(run.files.read_results())
    return finish(run) if run.world.main else run.files.best


def finish(run: Training) -> Path:
    """Rank 0: average the kept snapshots (if any), score the better checkpoint on test, write
    results.json."""
    st, tc, tr, files = run.state, run.cfg.train, run.trainer, run.files
    train_seconds = run.elapsed()
    test_path, extra = files.best, {}
    if tc.keep_last >= 2 and len(files.snapshots()) >= 2:  # the average of the last ones
        from attn_mt.training import averaging  # an extra: loaded only where a run averages

        def valid_bleu() -> float:
            return validate(tr.model, run.corpus, run.cfg, tr.device, tr.precision)["valid_bleu"]

        test_path, extra = averaging.average_snapshots(files, tr.model, st.best_bleu, valid_bleu)
    best = checkpoint.load(test_path, map_location=tr.device)
    tr.model.load_state_dict(best["model"])
    hyps, scores = score_test_split(tr.model, run.corpus, run.cfg, tr.device, tr.precision)
    results = {"test_split": run.cfg.data.splits.test, "test_bleu": scores["bleu"],
               "test_chrf": scores["chrf"], "sacrebleu_signature": scores["bleu_signature"],
               "chrf_signature": scores["chrf_signature"], "best_step": best["step"], **extra,
               "tested": test_path.name, "best_valid_bleu": st.best_bleu,
               "train_seconds": round(train_seconds, 1), "steps": st.step, "tokens": st.tokens,
               "skipped_steps": st.skipped_steps, "params": count_params(tr.model),
               "device": str(tr.device), "precision": tr.precision,
               "threads": torch.get_num_threads(), "torch": torch.__version__}
    if tc.init_from:
        results["init_from"] = tc.init_from
    if (size := files.read_size()) is not None:
        results["size"] = size
    write_test_texts(run)
    files.write_results(results, hyps)  # results.json last of all
    return test_path


def write_test_texts(run: Training, missing: bool = False) -> None:
    """The test split's sources and references as `{split}.{lang}` in the run directory,
    line-aligned with test_hyps.txt: the evaluate command works on these files for any data
    source. `missing`: only where one is missing (a run finished by an attn-mt that wrote them
    after results.json)."""
    data = run.cfg.data
    langs = (data.src_lang, data.tgt_lang)
    if missing and all(run.files.test_text(data.splits.test, lang).exists() for lang in langs):
        return
    texts = dict(zip(langs, run.corpus.text[data.splits.test], strict=True))
    run.files.write_test_texts(data.splits.test, texts)
    # the score command's contrastive mode reads these
    if (records := source(data).contrastive(data.splits.test)) is not None:
        run.files.write_contrastive(data.splits.test, records)
    for split in dict.fromkeys((data.splits.test, data.splits.train)):  # the align command's gold,
        if (links := source(data).gold_links(split)) is not None:  # guided training's links
            run.files.write_gold_links(split, links)
