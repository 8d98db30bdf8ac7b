"""The text forms of the API's results, as the CLI prints them (and a script may too), the two errors the
CLI shows as a flag's fault, and how a failure reads as one line (`error_line`), given the CLI's name for
each argument (`flag`).

Tested in tests/test_cli.py and tests/decoding/test_translate_stream.py (what each verb prints).
"""

from collections.abc import Callable

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
from attn_mt.errors import AttnMTError, ConfigError, InputError, Interrupted
from attn_mt.files import OutputError, check_outputs  # an output path, checked before any work
from attn_mt.measure.bench import format_report as bench_text
from attn_mt.measure.report import summary as compare_text

from .history_pages import draw_history

__all__ = ["OptionError", "OutputError", "RequestError", "bench_text", "check_heads_command",
           "check_outputs", "check_score_request", "draw_history", "error_line", "flags",
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


def flags(message: str, flag: Callable[[str], str]) -> str:
    """A library message as the CLI says it: each argument name the message marks in backticks (written
    where the check is) becomes the CLI's name for it, `flag(name)`."""
    parts = message.split("`")
    out = [parts[0]]
    for i in range(1, len(parts) - 1, 2):  # parts[i] is between two backticks
        name = parts[i]
        out += [flag(name) if name.replace("_", "a").isalnum() else f"`{name}`", parts[i + 1]]
    if len(parts) % 2 == 0:  # an unpaired backtick
        out.append("`" + parts[-1])
    return "".join(out)


Failure = AttnMTError | KeyboardInterrupt | OSError


def error_line(e: Failure, flag: Callable[[str], str], request: type | tuple = ()) -> tuple[str, int]:
    """A failure as one line on stderr and its exit status: 2 for a config, an output path or a `request`
    error (a value only the model can check: its layers, heads, tokens), 130 for an interruption, 1 for
    the rest (an OSError: a full disk or a vanished directory while writing, anywhere)."""
    if isinstance(e, request):
        return f"error: {flag(e.field)}: {e.message}", 2
    if isinstance(e, KeyboardInterrupt):
        return "interrupted", 130
    if isinstance(e, OSError):
        return flags(f"error: {f'{e.filename}: ' if e.filename else ''}{e.strerror or e}", flag), 1
    if isinstance(e, ConfigError | Interrupted):
        kind, status = ("config error", 2) if isinstance(e, ConfigError) else ("interrupted", 130)
    else:
        kind, status = "error", 2 if isinstance(e, OutputError) else 1
    named = e.field and not e.named and not isinstance(e, ConfigError)
    what = f"{flag(e.field)}: {e.message}" if named else str(e)
    if isinstance(e, OutputError) and what.startswith(f"{e.option} "):  # "out x.pt: ..." -> its flag
        what = flag(e.option) + what[len(e.option):]
    return flags(f"{kind}: {what}", flag), status  # `resume` -> its flag
