"""The text forms of the API's results, as the CLI prints them (and a script may too), the two
errors the CLI shows as a flag's fault, and how a failure reads as one line (`error_line`), given
the CLI's name for each argument (`flag`).

Tested in tests/test_cli.py and tests/decoding/test_translate_stream.py (what each verb prints).
"""

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

# a value only the model can check
from attn_mt.analysis.explain import ExplainError as RequestError
from attn_mt.analysis.explanation import render as explanation_text
from attn_mt.analysis.heads import check_request as check_heads_request
from attn_mt.analysis.overview import save as save_heads_report
from attn_mt.analysis.overview import table as heads_table
from attn_mt.config.yamlconf import OptionError  # a flag's value
from attn_mt.data.lines import input_lines
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
from .model import load

__all__ = ["OptionError", "OutputError", "RequestError", "bench_text", "check_heads_command",
           "check_outputs", "check_score_request", "draw_history", "error_line", "flags",
           "attention_command", "evaluate_command", "explain_command", "heads_command",
           "score_command", "translate_command", "compare_text", "evaluation_text",
           "explanation_text", "format_scores", "heads_table", "input_lines",
           "save_heads_report", "score_files", "translate_lines", "write_scores"]


def check_heads_command(checkpoint, src, ref, contrastive, n: int, out, json_out, png,
                        html) -> None:
    """What `attn-mt heads` with a model needs, checked before it loads: the model, the request
    (analysis.heads.check_request) and the outputs, none of them an input."""
    if checkpoint is None:
        raise InputError("give `path` (a model to measure) or `history` (a run whose attention to "
                         "draw)", "path")
    check_heads_request(src, ref, contrastive, n, out)
    check_outputs([("out", out, (".pt",)), ("json_out", json_out, (".json",)),
                   ("png", png, (".png",)), ("html", html, (".html", ".htm"))],
                  [checkpoint, src, ref, contrastive])


def flags(message: str, flag: Callable[[str], str]) -> str:
    """A library message as the CLI says it: each argument name the message marks in backticks
    (written where the check is) becomes the CLI's name for it, `flag(name)`."""
    parts = message.split("`")
    out = [parts[0]]
    for i in range(1, len(parts) - 1, 2):  # parts[i] is between two backticks
        name = parts[i]
        out += [flag(name) if name.replace("_", "a").isalnum() else f"`{name}`", parts[i + 1]]
    if len(parts) % 2 == 0:  # an unpaired backtick
        out.append("`" + parts[-1])
    return "".join(out)


Failure = AttnMTError | KeyboardInterrupt | OSError


def error_line(e: Failure, flag: Callable[[str], str],
               request: type | tuple = ()) -> tuple[str, int]:
    """A failure as one line on stderr and its exit status: 2 for a config, an output path or a
    `request` error (a value only the model can check: its layers, heads, tokens), 130 for an
    interruption, 1 for the rest (an OSError: a full disk or a vanished directory while writing,
    anywhere)."""
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
    # "out x.pt: ..." -> its flag
    if isinstance(e, OutputError) and what.startswith(f"{e.option} "):
        what = flag(e.option) + what[len(e.option):]
    return flags(f"{kind}: {what}", flag), status  # `resume` -> its flag


# The verbs whose work is more than one call of the API: each returns the lines the CLI prints.

def attention_command(path: Path, text: str, out: Path, html: Path | None, beam: int | None,
                      device: str) -> list[str]:
    """`attn-mt attention`: every head of every layer drawn (PNGs in `out`, the page to `html`);
    the translation and the files written."""
    if not text.strip():
        raise OptionError("the sentence is empty", "text")
    check_outputs([("out", out, None), ("html", html, (".html", ".htm"))], [path])  # before work
    att = load(path, device=device).attention(text, beam=beam)
    return [att.translation, *map(str, att.save_png(out) + ([att.save_html(html)] if html else []))]


def explain_command(path: Path, text: str, json_out: Path | None, device: str, **request) -> str:
    """`attn-mt explain`: one head's steps for one query as text (and to `json_out`)."""
    if not text.strip():  # before loading the model
        raise RequestError("text", "the sentence is empty")
    check_outputs([("json_out", json_out, (".json",))], [path])
    result = load(path, device=device).explain(text, **request)
    if json_out:
        result.save_json(json_out)
    return explanation_text(result)


def heads_command(path: Path | None, src: Path | None, ref: Path | None, contrastive: Path | None,
                  *, history: Path | None, prune: int, out: Path | None, json_out: Path | None,
                  png: Path | None, html: Path | None, sentences: int, device: str) -> list[str]:
    """`attn-mt heads`: with `history`, the run's recorded attention drawn (no model); else each
    head's cost measured (or the `prune` least important removed): the table and files written."""
    if history is not None:
        return list(map(str, draw_history(history, html=html, png=png)))
    check_heads_command(path, src, ref, contrastive, prune, out, json_out, png, html)  # first
    model = load(path, device=device)
    if prune:
        report = model.prune(prune, src, ref, sentences=sentences, out=out).report
    else:
        report = model.heads(src, ref, sentences=sentences, contrastive=contrastive)
    written = save_heads_report(report, json_out, png) + ([report.save_html(html)] if html else [])
    return [heads_table(report), *map(str, written)]


def score_command(path: Path, src: Path | None, ref: Path | None, contrastive: Path | None,
                  json_out: Path | None, batch_size: int, device: str) -> list[str]:
    """`attn-mt score`: log P of each translation, the contrastive accuracy; the JSON written."""
    check_score_request(src, ref, contrastive)  # before the model loads
    check_outputs([("json_out", json_out, (".json",))], [path, src, ref, contrastive])
    result = score_files(load(path, device=device), src, ref, contrastive, batch_size=batch_size)
    return [format_scores(result), *([str(write_scores(result, json_out))] if json_out else [])]


def translate_command(path: Path, texts: list[str] | None, input: Path | None, *, fmt: str,
                      stream: bool, device: str, names: dict[str, str], align: bool = False,
                      **options) -> Iterator[str]:
    """`attn-mt translate`: arguments, the `input` file or stdin, one result a line in input order
    (a terminal gets a prompt and each line as it is entered); `names`: the options' flags; `align`:
    each hypothesis with its word links."""
    model = load(path, device=device)
    dcfg = model.options(names=names, **options)
    interactive = not texts and input is None and sys.stdin.isatty()
    lines = input_lines(texts, input, "> " if interactive else "")
    yield from translate_lines(model.translator, lines, dcfg, fmt, stream=stream or interactive,
                               align=align)


def evaluate_command(path: Path, src: Path, ref: Path, *, as_json: bool, device: str,
                     names: dict[str, str], **options) -> str:
    """`attn-mt evaluate`: BLEU and chrF of the translation of `src` against `ref`."""
    model = load(path, device=device)
    model.options(names=names, **options)  # the options' errors before any work
    result = model.evaluate(src, ref, **options)
    return json.dumps(result, indent=2) if as_json else evaluation_text(result)
