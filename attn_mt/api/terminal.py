"""The text forms of the API's results, as the CLI prints them (and a script may too), and the two errors the
CLI shows as a flag's fault.

Tested in tests/test_cli.py and tests/decoding/test_translate_stream.py (what each verb prints).
"""

from attn_mt.analysis.explain import ExplainError as RequestError  # a value only the model can check
from attn_mt.analysis.explanation import render as explanation_text
from attn_mt.analysis.heads import check_request as check_heads_request
from attn_mt.analysis.overview import save as save_heads_report
from attn_mt.analysis.overview import table as heads_table
from attn_mt.config.yamlconf import OptionError  # a flag's value
from attn_mt.data.sources import input_lines
from attn_mt.decoding.metrics import text as evaluation_text
from attn_mt.decoding.scoring import check_request as check_score_request
from attn_mt.decoding.scoring import format_scores, score_files
from attn_mt.decoding.scoring import write_json as write_scores
from attn_mt.decoding.translator import translate_lines
from attn_mt.errors import InputError
from attn_mt.files import OutputError, check_outputs  # an output path, checked before any work
from attn_mt.measure.bench import format_report as bench_text
from attn_mt.measure.report import summary as compare_text

from .history_pages import draw_history

__all__ = ["OptionError", "OutputError", "RequestError", "bench_text", "check_heads_command", "check_outputs",
           "check_score_request", "draw_history",
           "compare_text", "evaluation_text", "explanation_text", "format_scores", "heads_table", "input_lines",
           "save_heads_report", "score_files", "translate_lines", "write_scores"]


def check_heads_command(checkpoint, src, ref, contrastive, n: int, out, json_out, png, html) -> None:
    """What `attn-mt heads` with a model needs, checked before it loads: the model, the request
    (analysis.heads.check_request) and the outputs, none of them an input."""
    if checkpoint is None:
        raise InputError("give `path` (a model to measure) or `history` (a run whose attention to draw)", "path")
    check_heads_request(src, ref, contrastive, n, out)
    check_outputs([("out", out, (".pt",)), ("json_out", json_out, (".json",)), ("png", png, (".png",)),
                   ("html", html, (".html", ".htm"))], [checkpoint, src, ref, contrastive])
