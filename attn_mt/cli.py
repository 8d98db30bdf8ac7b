"""The `attn-mt` command line: each verb parses, loads, calls one library function and prints."""

from __future__ import annotations

import functools
import io
import itertools
import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from typer.core import TyperGroup


class _GlobalOptionsAnywhere(TyperGroup):
    """--debug and --quiet work after the subcommand too: `attn-mt train ... --quiet`."""

    GLOBAL = ("--debug", "--no-debug", "--quiet", "--no-quiet")

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        end = args.index("--") if "--" in args else len(args)
        options = [a for a in args[:end] if a in self.GLOBAL]
        return super().parse_args(ctx, options + [a for a in args[:end] if a not in self.GLOBAL] + args[end:])


app = typer.Typer(cls=_GlobalOptionsAnywhere, add_completion=False, no_args_is_help=True,
                  pretty_exceptions_enable=False, help="Train, run and measure Transformer translation models.")
_debug = False


@app.callback()
def main(debug: Annotated[bool, typer.Option(help="Show tracebacks on errors.")] = False,
         quiet: Annotated[bool, typer.Option(help="Only warnings and errors on stderr.")] = False) -> None:
    global _debug
    _debug = debug
    from attn_mt.training.memory import reuse_freed_memory

    reuse_freed_memory()  # ~20-30% faster CPU training steps (attn_mt/training/memory.py)
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(message)s",
                        stream=sys.stderr, force=True)


def _user_errors(fn):
    """Known failures end in one line on stderr and exit status 2 (config), 130 (Ctrl-C) or 1 (the rest)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from attn_mt.checkpoint import CheckpointError
        from attn_mt.config import ConfigError
        from attn_mt.data.download import DownloadError
        from attn_mt.data.sources import DataError
        from attn_mt.device import DeviceError
        from attn_mt.training.trainer import TrainError, TrainInterrupted

        try:
            return fn(*args, **kwargs)
        except (ConfigError, DataError, CheckpointError, TrainError, DownloadError, DeviceError) as e:
            if _debug:
                raise
            kind = {ConfigError: "config error", TrainInterrupted: "interrupted"}.get(type(e), "error")
            typer.echo(f"{kind}: {e}", err=True)
            raise typer.Exit({ConfigError: 2, TrainInterrupted: 130}.get(type(e), 1)) from None
        except KeyboardInterrupt:
            if _debug:
                raise
            typer.echo("interrupted", err=True)
            raise typer.Exit(130) from None
        except OSError as e:  # a full disk or a vanished directory while writing, anywhere
            if _debug:
                raise
            where = f"{e.filename}: " if e.filename else ""
            typer.echo(f"error: {where}{e.strerror or e}", err=True)
            raise typer.Exit(1) from None

    return wrapper


ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="YAML experiment config.")]
SetOpt = Annotated[list[str] | None, typer.Option("--set", help="Override a key: section.key=value.")]
CkptOpt = Annotated[Path, typer.Option("--checkpoint", help="A checkpoint written by `attn-mt train`.")]
DeviceOpt = Annotated[str, typer.Option(help="cpu, cuda, mps or auto.")]


@app.command()
@_user_errors
def train(config: ConfigOpt, overrides: SetOpt = None,
          out: Annotated[Path | None, typer.Option(help="Run directory [default: runs/<name>].")] = None,
          resume: Annotated[bool, typer.Option(help="Continue from OUT/checkpoint_last.pt.")] = False,
          overwrite: Annotated[bool, typer.Option(help="Delete the earlier run in OUT and start afresh.")] = False,
          ) -> None:
    """Train a model from a YAML config; writes checkpoints, metrics and results into the run directory.

    Under `torchrun --nproc-per-node N -m attn_mt train ...` it trains with DistributedDataParallel.
    """
    from attn_mt.config import load_config
    from attn_mt.training.progress import summary
    from attn_mt.training.run import train as run_training

    cfg = load_config(config, overrides or [])
    run_dir = out or Path("runs") / cfg.name
    if resume and overwrite:
        raise typer.BadParameter("give one of --resume and --overwrite", param_hint="--overwrite")
    run_training(cfg, run_dir, resume=resume, overwrite=overwrite)
    if os.environ.get("RANK", "0") == "0":  # torchrun: rank 0 reports
        typer.echo(summary(run_dir))


def _lines(texts: list[str] | None, input: Path | None, prompt: str = ""):
    """Input lines from arguments, a file, or stdin, without their newlines; `prompt` goes to stderr
    before each stdin line is read (interactive use)."""
    if texts:
        yield from texts
    elif input is not None:
        from attn_mt.data.sources import read_lines

        yield from read_lines(input)
    else:  # bytes that are not UTF-8 become U+FFFD instead of ending the run
        # lines end at "\n" only (a lone "\r" inside a line is text, as with --input); "\r\n" is stripped
        stdin = io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", errors="replace", newline="\n")
        while True:  # readline, not iteration: each line is handed on as soon as it arrives
            typer.echo(prompt, nl=False, err=True)
            line = stdin.readline()
            if not line:
                break
            yield line.removesuffix("\n").removesuffix("\r")
        if prompt:
            typer.echo(err=True)  # end the prompt line at EOF


def _translator(checkpoint: Path, device: str):
    """(holder of the decode defaults in `.decode`, fn(texts, dcfg) -> n-best lists) for a checkpoint
    file (PyTorch) or a directory written by `attn-mt export` (CTranslate2)."""
    from attn_mt.decoding.translator import open_translator

    translator = open_translator(checkpoint, device)
    return translator, translator.translate_nbest


_CKPT = "(default: the checkpoint's decode section)"
BeamOpt = Annotated[int | None, typer.Option("--beam", help=f"Beam size; 1 is greedy {_CKPT}.")]
AlphaOpt = Annotated[float | None, typer.Option("--alpha", help=f"GNMT length penalty exponent {_CKPT}.")]
BatchOpt = Annotated[int | None, typer.Option(help=f"Sentences per batch {_CKPT}.")]


_FLAGS = {"beam_size": "--beam", "alpha": "--alpha", "nbest": "--nbest", "batch_size": "--batch-size"}


def _decode_cfg(cfg, **flags):
    """The checkpoint's `decode` section with the flags that were given; errors name the flags."""
    from dataclasses import replace

    from attn_mt.config import ConfigError

    given = {k: v for k, v in flags.items() if v is not None and not (k == "nbest" and v == 1)}
    beam = given.get("beam_size", cfg.decode.beam_size)
    if "nbest" in given and given["nbest"] > beam >= 1:
        where = f"--beam {beam}" if "beam_size" in given else f"the checkpoint's beam size ({beam})"
        raise typer.BadParameter(f"{given['nbest']} hypotheses need a beam at least as wide, not {where}: "
                                 f"add --beam {given['nbest']}", param_hint="--nbest")
    try:
        return replace(cfg.decode, **{k: v for k, v in flags.items() if v is not None})
    except ConfigError as e:  # e.g. "decode.beam_size=0: must be >= 1" -> "--beam 0: must be >= 1"
        message = str(e)
        for key in given:
            message = message.replace(f"decode.{key}=", f"{_FLAGS[key]} ")
        raise typer.BadParameter(message) from None


def _format(sources: list[str], nbests: list, fmt: str, first: int) -> str:
    """Output lines: best translations, Moses-style n-best lines (`i ||| text ||| score`) or JSONL."""
    if fmt == "jsonl":
        from attn_mt.decoding.translator import hypotheses_json

        return "\n".join(json.dumps({"source": s, "hypotheses": hypotheses_json(n)}, ensure_ascii=False)
                         for s, n in zip(sources, nbests, strict=True))
    if max(map(len, nbests)) == 1:
        return "\n".join(n[0].text for n in nbests)
    return "\n".join(f"{first + i} ||| {h.text} ||| {h.score:.4f}" for i, n in enumerate(nbests) for h in n)


@app.command()
@_user_errors
def translate(checkpoint: CkptOpt,
              texts: Annotated[list[str] | None, typer.Argument(help="Sentences to translate.")] = None,
              input: Annotated[Path | None, typer.Option("--input", "-i", help="Input file.")] = None,
              beam: BeamOpt = None, alpha: AlphaOpt = None, batch_size: BatchOpt = None,
              nbest: Annotated[int | None, typer.Option(help="Hypotheses per sentence (<= beam).")] = None,
              fmt: Annotated[str, typer.Option("--format", help="text, or jsonl with scores.")] = "text",
              stream: Annotated[bool, typer.Option(help="Write each line's translation as soon as it is "
                                                        "done (else large inputs go in pieces of 1000).")] = False,
              device: DeviceOpt = "auto") -> None:
    """Translate text from arguments, --input FILE or stdin, in input order, one result per line.

    A terminal on stdin gets a prompt, and each line is translated as it is entered. --checkpoint may
    also be a directory written by `attn-mt export`, which decodes with CTranslate2.
    """
    if fmt not in ("text", "jsonl"):
        raise typer.BadParameter(f"{fmt!r} is not one of 'text', 'jsonl'", param_hint="--format")
    defaults, run = _translator(checkpoint, device)
    dcfg = _decode_cfg(defaults, beam_size=beam, alpha=alpha, nbest=nbest, batch_size=batch_size)
    interactive = not texts and input is None and sys.stdin.isatty()
    size = 1 if stream or interactive else max(1000, dcfg.batch_size)  # batches of dcfg.batch_size inside
    lines, done = _lines(texts, input, prompt="> " if interactive else ""), 0
    while chunk := list(itertools.islice(lines, size)):
        typer.echo(_format(chunk, run(chunk, dcfg), fmt, done))  # click.echo flushes
        done += len(chunk)


@app.command()
@_user_errors
def evaluate(checkpoint: CkptOpt,
             src: Annotated[Path, typer.Option(help="Source file, one sentence a line.")],
             ref: Annotated[Path, typer.Option(help="Reference translations, line-aligned with --src.")],
             beam: BeamOpt = None, alpha: AlphaOpt = None, batch_size: BatchOpt = None,
             as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
             device: DeviceOpt = "auto") -> None:
    """Translate --src and score it against --ref with sacrebleu BLEU and chrF (--checkpoint: file or export)."""
    from attn_mt.data.sources import DataError, read_lines
    from attn_mt.decoding.metrics import score

    sources, refs = read_lines(src), read_lines(ref)
    if len(sources) != len(refs):
        raise DataError(f"line counts differ: {src} has {len(sources)} lines, {ref} has {len(refs)}")
    defaults, run = _translator(checkpoint, device)
    dcfg = _decode_cfg(defaults, beam_size=beam, alpha=alpha, batch_size=batch_size, nbest=1)
    result = score([n[0].text for n in run(sources, dcfg)], refs)
    result["decode"] = {"beam_size": dcfg.beam_size, "alpha": dcfg.alpha}
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        typer.echo(f"beam {dcfg.beam_size}, alpha {dcfg.alpha}")
        typer.echo(f"BLEU {result['bleu']:.2f}  ({result['bleu_signature']})")
        typer.echo(f"chrF {result['chrf']:.2f}  ({result['chrf_signature']})")


@app.command()
@_user_errors
def average(checkpoints: Annotated[list[Path], typer.Argument(help="Checkpoints of one run, e.g. "
                                                               "RUN/checkpoint_step*.pt.")],
            out: Annotated[Path, typer.Option(help="Where to write the averaged checkpoint.")],
            force: Annotated[bool, typer.Option(help="Average checkpoints of different runs (other config "
                                                     "or seed) too.")] = False) -> None:
    """Average the weights of several checkpoints of one run into one checkpoint for translate/evaluate."""
    from attn_mt import checkpoint

    missing = next((p for p in checkpoints if not p.exists()), None)
    if missing is not None and "checkpoint_step" in missing.name:  # the shell left an unmatched glob as it was
        raise checkpoint.CheckpointError(f"{missing}: checkpoint not found (a run keeps checkpoint_step*.pt only "
                                         "with train.keep_last: N)")
    checkpoint.save(checkpoint.average(checkpoints, force=force), out)
    typer.echo(f"averaged {len(checkpoints)} checkpoints into {out}")


@app.command()
@_user_errors
def download(dataset: Annotated[str, typer.Argument(help="Dataset name: multi30k.")] = "multi30k",
             out: Annotated[Path, typer.Option(help="Directory for {split}.{lang} files.")] = Path("data/multi30k"),
             ) -> None:
    """Fetch a corpus (Hugging Face hub, else its original URL) into line-aligned text files."""
    from attn_mt.data.download import download as run_download

    for path in run_download(dataset, out):
        typer.echo(str(path))


@app.command()
@_user_errors
def attention(checkpoint: CkptOpt, text: Annotated[str, typer.Argument(help="A source sentence.")],
              out: Annotated[Path, typer.Option(help="Directory for the PNG figures.")],
              beam: BeamOpt = None, device: DeviceOpt = "auto") -> None:
    """Translate one sentence and draw every attention head of every layer as PNGs in --out."""
    from attn_mt.checkpoint import CheckpointError, load_model
    from attn_mt.decoding.attention_maps import write_attention_maps
    from attn_mt.device import pick_device

    if not text.strip():
        raise typer.BadParameter("the sentence is empty", param_hint="TEXT")
    if checkpoint.is_dir():
        raise CheckpointError(f"{checkpoint}: a folder (an export?); attention figures need a PyTorch checkpoint "
                              "file written by `attn-mt train`, e.g. RUN/checkpoint_best.pt")
    dev = pick_device(device)
    model, cfg, tok = load_model(checkpoint, dev)
    if cfg.model.kind != "transformer":
        raise CheckpointError(f"{checkpoint}: attention figures need a Transformer, not {cfg.model.kind}")
    dcfg = _decode_cfg(cfg, beam_size=beam, nbest=1)
    translation, paths = write_attention_maps(model, tok, text, dcfg, out, dev)
    typer.echo(translation)
    for path in paths:
        typer.echo(str(path))


@app.command()
@_user_errors
def explain(checkpoint: CkptOpt, text: Annotated[str, typer.Argument(help="A source sentence.")],
            kind: Annotated[str, typer.Option(help="encoder, decoder or cross (attention).")] = "cross",
            layer: Annotated[int, typer.Option(help="Layer, from 1.")] = 1,
            head: Annotated[int, typer.Option(help="Head, from 1.")] = 1,
            token: Annotated[str, typer.Option(help="The query: its position (from 0) or its text; decoder "
                                                    "queries are named by the token they predict.")] = "0",
            beam: Annotated[int, typer.Option(help="Beam size of the translation; 1 is greedy.")] = 1,
            json_out: Annotated[Path | None, typer.Option("--json", help="Write every number to this file.")] = None,
            device: DeviceOpt = "auto") -> None:
    """One head's attention for one query token, step by step (Q, K, V; scores; scaled; mask and softmax;
    values; W_o), recomputed from the model's weights and checked against its own output."""
    from attn_mt.analysis.explain import ExplainError, explain_checkpoint, render

    try:
        result = explain_checkpoint(checkpoint, text, kind=kind, layer=layer, head=head, token=token, beam=beam,
                                    device=device)
    except ExplainError as e:
        typer.echo(f"error: {'TEXT' if e.field == 'text' else '--' + e.field}: {e.message}", err=True)
        raise typer.Exit(2) from None
    if json_out:
        json_out.write_text(result.to_json() + "\n", encoding="utf-8")
    typer.echo(render(result))


@app.command()
@_user_errors
def serve(checkpoint: Annotated[Path, typer.Option("--checkpoint", help="A checkpoint written by `attn-mt train`, "
                                                                       "or a folder written by `attn-mt export`.")],
          host: Annotated[str, typer.Option(help="Interface to bind; any other than 127.0.0.1 exposes the "
                                                 "server to the network.")] = "127.0.0.1",
          port: Annotated[int, typer.Option(min=1, max=65535)] = 8000,
          allow_host: Annotated[list[str] | None, typer.Option(help="Also answer requests whose Host header "
                                                                   "names this (repeatable); loopback names "
                                                                   "and --host always are.")] = None,
          max_texts: Annotated[int, typer.Option(min=1, help="Most sentences per request.")] = 64,
          max_chars: Annotated[int, typer.Option(min=1, help="Most characters per request.")] = 10_000,
          max_work: Annotated[int, typer.Option(min=1, help="Most source subwords x beam per request.")] = 20_000,
          max_queue: Annotated[int, typer.Option(min=1, help="Most requests waiting; more get 503.")] = 64,
          read_timeout: Annotated[float, typer.Option(min=0.1, help="Seconds a client has to send its headers, "
                                                                    "and then its body.")] = 10.0,
          device: DeviceOpt = "auto") -> None:
    """Serve a checkpoint: a web page (translations, attention of every head) and a JSON API (docs at /docs)."""
    from attn_mt.serve import LOOPBACK, Limits, create_app, listen, run

    sock = listen(host, port)  # before the model loads and the banner: a busy port is one error line
    limits = Limits(max_texts=max_texts, max_chars=max_chars, max_work=max_work, max_queue=max_queue,
                    header_timeout_s=read_timeout, body_timeout_s=read_timeout)
    hosts = (*LOOPBACK, *([host] if host not in ("0.0.0.0", "::") else []), *(allow_host or []))
    server = create_app(checkpoint, limits, device=device, allowed_hosts=hosts)
    typer.echo(f"attn-mt serve: http://{host}:{port}/  (API docs /docs; Ctrl-C stops)")
    run(server, sock, limits)


@app.command()
@_user_errors
def export(checkpoint: CkptOpt,
           out: Annotated[Path, typer.Option(help="Directory for the exported model (replaced if an export).")],
           quantization: Annotated[str, typer.Option(help="float32, int8, int8_float32 or bfloat16.")] = "float32",
           fmt: Annotated[str, typer.Option("--format", help="ctranslate2 or transformers.")] = "ctranslate2",
           ) -> None:
    """Write a Transformer checkpoint as a CTranslate2 model (`translate` and `evaluate` take the directory as
    --checkpoint; the export extra) or, with --format transformers, as a Hugging Face model folder with a model
    card, ready to push to the hub (the hf extra)."""
    from attn_mt.export.ctranslate2 import QUANTIZATIONS, export_ct2

    if fmt not in ("ctranslate2", "transformers"):
        raise typer.BadParameter(f"{fmt!r} is not one of 'ctranslate2', 'transformers'", param_hint="--format")
    if quantization not in QUANTIZATIONS:
        raise typer.BadParameter(f"{quantization!r} is not one of {', '.join(QUANTIZATIONS)}",
                                 param_hint="--quantization")
    if fmt == "ctranslate2":
        paths = export_ct2(checkpoint, out, quantization)
    elif quantization != "float32":
        raise typer.BadParameter("a transformers export keeps float32 weights", param_hint="--quantization")
    else:
        from attn_mt.export.transformers import export_hf

        paths = export_hf(checkpoint, out)
    for path in paths:
        typer.echo(str(path))


@app.command()
@_user_errors
def prepare(config: ConfigOpt, overrides: SetOpt = None,
            list_: Annotated[bool, typer.Option("--list", help="Only list the cache: entries, leftovers.")] = False,
            clean: Annotated[bool, typer.Option("--clean", help="Only remove damaged entries, leftovers of stopped "
                                                "builds and lock files no process holds.")] = False) -> None:
    """Train the tokenizer and tokenize the training split into the data cache (data.cache_dir), ahead of
    `train`: a cluster job, its ranks and later runs of the same data then start from it."""
    from attn_mt.config import load_config
    from attn_mt.data import tidy
    from attn_mt.data.cache import cache_root
    from attn_mt.data.cache import prepare as run_prepare

    cfg = load_config(config, overrides or [])
    if list_ or clean:
        typer.echo("\n".join((tidy.clean if clean else tidy.survey)(cache_root(cfg.data))))
        return
    entry = run_prepare(cfg)
    typer.echo(f"data cache: {entry.path}")
    typer.echo(f"{entry.pairs} training pairs, {entry.tokens['src']} + {entry.tokens['tgt']} tokens")


@app.command("compare-rnn")
@_user_errors
def compare_rnn(config: ConfigOpt, overrides: SetOpt = None,
                out: Annotated[Path | None, typer.Option(help="Report directory (runs/compare).")] = None,
                quick: Annotated[bool, typer.Option(help="Toy corpus, small models.")] = False) -> None:
    """Train the Transformer and the RNN on the same data and clock; report speed, BLEU, length scaling."""
    from attn_mt.config.compare_rnn import load_compare_config
    from attn_mt.measure.compare import compare_rnn as run_compare
    from attn_mt.measure.report import summary

    setup = load_compare_config(config, overrides or [], quick=quick)
    out = out or Path("runs") / ("compare_quick" if quick else "compare")
    typer.echo(summary(run_compare(setup, out)))
    typer.echo(f"report: {out / 'report.md'}")


@app.command()
@_user_errors
def bench(config: ConfigOpt, overrides: SetOpt = None,
          checkpoint: Annotated[Path | None, typer.Option(help="Also time greedy and beam-5 translation.")] = None,
          repeats: Annotated[int, typer.Option(min=1, help="Timed rounds after the warm-up; medians.")] = 5,
          steps: Annotated[int, typer.Option(min=1, help="Training batches per round.")] = 2,
          sentences: Annotated[int, typer.Option(min=1, help="Test sentences to translate.")] = 100,
          compiled: Annotated[bool, typer.Option("--compile", help="Also time ours under torch.compile.")] = False,
          json_out: Annotated[Path | None, typer.Option("--json", help="Write every figure to this file.")] = None,
          ) -> None:
    """Training tokens/s against torch.nn.Transformer, MFU against the matmul peak, translation speed."""
    from attn_mt.config import load_config
    from attn_mt.measure.bench import format_report, run_bench

    result = run_bench(load_config(config, overrides or []), checkpoint=checkpoint, repeats=repeats,
                       steps=steps, compile=compiled, sentences=sentences)
    if json_out:
        json_out.write_text(json.dumps(result, indent=2) + "\n")
    typer.echo(format_report(result))


@app.command()
@_user_errors
def heads(checkpoint: CkptOpt, src: Annotated[Path, typer.Option(help="Source sentences, one a line.")],
          ref: Annotated[Path, typer.Option(help="Their references, line-aligned with --src.")],
          sentences: Annotated[int, typer.Option(min=1, help="Use the first N lines.")] = 200,
          json_out: Annotated[Path | None, typer.Option("--json", help="Write every number to this file.")] = None,
          png: Annotated[Path | None, typer.Option(help="Draw every head's importance and role in one PNG.")] = None,
          prune: Annotated[int, typer.Option(min=0, help="Remove the N least important heads (with --out).")] = 0,
          out: Annotated[Path | None, typer.Option(help="Where --prune writes the pruned checkpoint.")] = None,
          device: DeviceOpt = "auto") -> None:
    """Mask each attention head in turn: the BLEU and loss it costs, and where its attention goes."""
    from attn_mt.analysis import overview
    from attn_mt.analysis.heads import analyse_heads

    report = analyse_heads(checkpoint, src, ref, n_sentences=sentences, prune_n=prune, out=out, device=device)
    typer.echo(overview.table(report))
    for path in (json_out and overview.write_json(report, json_out), png and overview.plot(report, png)):
        if path:
            typer.echo(str(path))
