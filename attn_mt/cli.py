"""The `attn-mt` command line: each verb parses, loads, calls one library function and prints."""

import functools
import json
import logging
import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from typer import Argument, Option
from typer.core import TyperCommand, TyperGroup

from attn_mt.training.memory import reuse_freed_memory  # torch-free, like everything imported up here


class _GlobalOptionsAnywhere(TyperGroup):
    """--debug and --quiet work after the subcommand too: `attn-mt train ... --quiet`."""

    GLOBAL = ("--debug", "--no-debug", "--quiet", "--no-quiet")

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        end = args.index("--") if "--" in args else len(args)
        options = [a for a in args[:end] if a in self.GLOBAL]
        return super().parse_args(ctx, options + [a for a in args[:end] if a not in self.GLOBAL] + args[end:])


app = typer.Typer(cls=_GlobalOptionsAnywhere, add_completion=False, no_args_is_help=True,
                  pretty_exceptions_enable=False, help="Train, run and measure Transformer translation models.")


@app.callback()
def main(debug: Annotated[bool, Option(help="Show tracebacks on errors.")] = False,  # read by _Verb.invoke
         quiet: Annotated[bool, Option(help="Only warnings and errors on stderr.")] = False) -> None:
    reuse_freed_memory()  # ~20-30% faster CPU training steps (attn_mt/training/memory.py)
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(message)s",
                        stream=sys.stderr, force=True)


class _Verb(TyperCommand):
    """A subcommand whose known failures end in one line on stderr and exit status 2 (config), 130 (Ctrl-C)
    or 1 (the rest); with --debug they end in their traceback."""

    def invoke(self, ctx):
        from attn_mt.analysis.explain import ExplainError
        from attn_mt.checkpoint import CheckpointError
        from attn_mt.config.files import OutputError
        from attn_mt.config.yamlconf import ConfigError, OptionError
        from attn_mt.data.download import DownloadError
        from attn_mt.data.sources import DataError
        from attn_mt.device import DeviceError
        from attn_mt.training.trainer import TrainError, TrainInterrupted

        known = (ConfigError, DataError, CheckpointError, TrainError, DownloadError, DeviceError, OutputError)
        try:
            return super().invoke(ctx)
        except OptionError as e:  # a flag's value: usage, one line naming the flag, status 2
            raise typer.BadParameter(str(e), ctx=ctx, param_hint=e.option) from None
        except ExplainError as e:  # a value only the model can check (its layers, heads, tokens): status 2
            typer.echo(f"error: {'TEXT' if e.field == 'text' else '--' + e.field}: {e.message}", err=True)
            raise typer.Exit(2) from None
        except (*known, KeyboardInterrupt, OSError) as e:
            if ctx.find_root().params["debug"]:
                raise
            if isinstance(e, known):
                kind = {ConfigError: "config error", TrainInterrupted: "interrupted"}.get(type(e), "error")
                line, status = f"{kind}: {e}", {ConfigError: 2, OutputError: 2, TrainInterrupted: 130}.get(type(e), 1)
            elif isinstance(e, KeyboardInterrupt):
                line, status = "interrupted", 130
            else:  # OSError: a full disk or a vanished directory while writing, anywhere
                line, status = f"error: {f'{e.filename}: ' if e.filename else ''}{e.strerror or e}", 1
            typer.echo(line, err=True)
            raise typer.Exit(status) from None


_verb = functools.partial(app.command, cls=_Verb)  # @_verb(): a subcommand of `attn-mt`


ConfigOpt = Annotated[Path, Option("--config", "-c", help="YAML experiment config.")]
SetOpt = Annotated[list[str] | None, Option("--set", help="Override a key: section.key=value.")]
CkptOpt = Annotated[Path, Option("--checkpoint", help="A checkpoint written by `attn-mt train`.")]
ModelOpt = Annotated[Path, Option("--checkpoint", help="A checkpoint, or a folder written by `attn-mt export`.")]
DeviceOpt = Annotated[str, Option(help="cpu, cuda, mps or auto.")]
_CKPT = "(default: the checkpoint's decode section)"
BeamOpt = Annotated[int | None, Option("--beam", help=f"Beam size; 1 is greedy {_CKPT}.")]
AlphaOpt = Annotated[float | None, Option("--alpha", help=f"GNMT length penalty exponent {_CKPT}.")]
BatchOpt = Annotated[int | None, Option(help=f"Sentences per batch {_CKPT}.")]
SrcOpt = Annotated[Path, Option(help="Source sentences, one a line.")]
RefOpt = Annotated[Path, Option(help="Their reference translations, line-aligned with --src.")]
TextArg = Annotated[str, Argument(help="A source sentence.")]
JsonOpt = Annotated[Path | None, Option("--json", help="Write every number to this file.")]


@_verb()
def train(config: ConfigOpt, overrides: SetOpt = None,
          out: Annotated[Path | None, Option(help="Run directory [default: runs/<name>].")] = None,
          resume: Annotated[bool, Option(help="Continue from OUT/checkpoint_last.pt.")] = False,
          overwrite: Annotated[bool, Option(help="Delete the earlier run in OUT and start afresh.")] = False) -> None:
    """Train a model from a YAML config; writes checkpoints, metrics and results into the run directory.

    Under `torchrun --nproc-per-node N -m attn_mt train ...` it trains with DistributedDataParallel."""
    from attn_mt.config import load_config
    from attn_mt.training.progress import summary
    from attn_mt.training.run import train as run_training

    cfg = load_config(config, overrides or [])
    run_dir = out or Path("runs") / cfg.name
    run_training(cfg, run_dir, resume=resume, overwrite=overwrite)
    if os.environ.get("RANK", "0") == "0":  # torchrun: rank 0 reports
        typer.echo(summary(run_dir))


@_verb()
def translate(checkpoint: ModelOpt,
              texts: Annotated[list[str] | None, Argument(help="Sentences to translate.")] = None,
              input: Annotated[Path | None, Option("--input", "-i", help="Input file.")] = None,
              beam: BeamOpt = None, alpha: AlphaOpt = None, batch_size: BatchOpt = None, device: DeviceOpt = "auto",
              nbest: Annotated[int | None, Option(help="Hypotheses per sentence (<= beam).")] = None,
              fmt: Annotated[str, Option("--format", help="text, or jsonl with scores.")] = "text",
              stream: Annotated[bool, Option(help="Write each line's translation as soon as it is done (else large "
                                                  "inputs go in pieces of 1000).")] = False) -> None:
    """Translate text from arguments, --input FILE or stdin, in input order, one result per line.

    A terminal on stdin gets a prompt, and each line is translated as it is entered. An export folder
    (--checkpoint) decodes with CTranslate2."""
    if fmt not in ("text", "jsonl"):
        raise typer.BadParameter(f"{fmt!r} is not one of 'text', 'jsonl'", param_hint="--format")
    from attn_mt.data.sources import input_lines
    from attn_mt.decoding.translator import decode_options, translate_lines
    from attn_mt.export.ct2_translator import open_translator

    translator = open_translator(checkpoint, device)
    dcfg = decode_options(translator.decode, beam_size=beam, alpha=alpha, nbest=nbest, batch_size=batch_size)
    interactive = not texts and input is None and sys.stdin.isatty()
    lines = input_lines(texts, input, "> " if interactive else "")
    for out in translate_lines(translator, lines, dcfg, fmt, stream=stream or interactive):
        typer.echo(out)  # click.echo flushes


@_verb()
def evaluate(checkpoint: ModelOpt, src: SrcOpt, ref: RefOpt,
             beam: BeamOpt = None, alpha: AlphaOpt = None, batch_size: BatchOpt = None, device: DeviceOpt = "auto",
             as_json: Annotated[bool, Option("--json", help="Print JSON.")] = False) -> None:
    """Translate --src and score it against --ref with sacrebleu BLEU and chrF (--checkpoint: file or export)."""
    from attn_mt.data.sources import read_aligned
    from attn_mt.decoding.translator import decode_options, evaluate_texts
    from attn_mt.export.ct2_translator import open_translator

    sources, refs = read_aligned(src, ref)
    translator = open_translator(checkpoint, device)
    dcfg = decode_options(translator.decode, beam_size=beam, alpha=alpha, batch_size=batch_size, nbest=1)
    result = evaluate_texts(translator, sources, refs, dcfg)
    typer.echo(json.dumps(result, indent=2) if as_json else
               f"beam {dcfg.beam_size}, alpha {dcfg.alpha}\nBLEU {result['bleu']:.2f}  ({result['bleu_signature']})\n"
               f"chrF {result['chrf']:.2f}  ({result['chrf_signature']})")


@_verb()
def average(checkpoints: Annotated[list[Path], Argument(help="Checkpoints of one run, e.g. RUN/checkpoint_step*.pt.")],
            out: Annotated[Path, Option(help="Where to write the averaged checkpoint.")],
            force: Annotated[bool, Option(help="Also average checkpoints of different runs.")] = False) -> None:
    """Average the weights of several checkpoints of one run into one checkpoint for translate/evaluate."""
    from attn_mt.training.rundir import average_files

    average_files(checkpoints, out, force=force)
    typer.echo(f"averaged {len(checkpoints)} checkpoints into {out}")


@_verb()
def download(dataset: Annotated[str, Argument(help="Dataset name: multi30k.")] = "multi30k",
             out: Annotated[Path, Option(help="Directory for {split}.{lang} files.")] = Path("data/multi30k")) -> None:
    """Fetch a corpus (Hugging Face hub, else its original URL) into line-aligned text files."""
    from attn_mt.data.download import download as run_download

    typer.echo("\n".join(map(str, run_download(dataset, out))))


@_verb()
def attention(checkpoint: CkptOpt, text: TextArg, out: Annotated[Path, Option(help="Directory for the PNG figures.")],
              beam: BeamOpt = None, device: DeviceOpt = "auto") -> None:
    """Translate one sentence and draw every attention head of every layer as PNGs in --out."""
    from attn_mt.decoding.attention_maps import attention_figures

    translation, paths = attention_figures(checkpoint, text, out, beam=beam, device=device)
    typer.echo("\n".join([translation, *map(str, paths)]))


@_verb()
def explain(checkpoint: CkptOpt, text: TextArg,
            kind: Annotated[str, Option(help="encoder, decoder or cross (attention).")] = "cross",
            layer: Annotated[int, Option(help="Layer, from 1.")] = 1,
            head: Annotated[int, Option(help="Head, from 1.")] = 1,
            token: Annotated[str, Option(help="The query: its position (from 0) or its text; decoder queries are "
                                              "named by the token they predict.")] = "0",
            beam: Annotated[int, Option(help="Beam size of the translation; 1 is greedy.")] = 1,
            json_out: JsonOpt = None, device: DeviceOpt = "auto") -> None:
    """One head's attention for one query token, step by step (Q, K, V; scores; scaled; mask and softmax;
    values; W_o), recomputed from the model's weights and checked against its own output."""
    from attn_mt.analysis.explain import explain_checkpoint, render

    typer.echo(render(explain_checkpoint(checkpoint, text, kind=kind, layer=layer, head=head, token=token,
                                         beam=beam, device=device, json_out=json_out)))


@_verb()
def serve(checkpoint: ModelOpt,
          host: Annotated[str, Option(help="Interface to bind; any other than 127.0.0.1 exposes the server to the "
                                           "network.")] = "127.0.0.1",
          port: Annotated[int, Option(min=1, max=65535)] = 8000, device: DeviceOpt = "auto",
          allow_host: Annotated[list[str] | None, Option(help="Also answer this Host header (repeatable); loopback "
                                                              "names and --host always are answered.")] = None,
          max_texts: Annotated[int, Option(min=1, help="Most sentences per request.")] = 64,
          max_chars: Annotated[int, Option(min=1, help="Most characters per request.")] = 10_000,
          max_work: Annotated[int, Option(min=1, help="Most source subwords x beam per request.")] = 20_000,
          max_queue: Annotated[int, Option(min=1, help="Most requests waiting; more get 503.")] = 64,
          read_timeout: Annotated[float, Option(min=0.1, help="Seconds a client has to send its headers, and then "
                                                              "its body.")] = 10.0) -> None:
    """Serve a checkpoint: a web page (translations, attention of every head) and a JSON API (docs at /docs)."""
    from attn_mt.serve import Limits, allowed_hosts, create_app, listen, run

    sock = listen(host, port)  # before the model loads and the banner: a busy port is one error line
    limits = Limits(max_texts=max_texts, max_chars=max_chars, max_work=max_work, max_queue=max_queue,
                    header_timeout_s=read_timeout, body_timeout_s=read_timeout)
    server = create_app(checkpoint, limits, device=device, allowed_hosts=allowed_hosts(host, allow_host))
    typer.echo(f"attn-mt serve: http://{host}:{port}/  (API docs /docs; Ctrl-C stops)")
    run(server, sock, limits)


@_verb()
def export(checkpoint: CkptOpt,
           out: Annotated[Path, Option(help="Directory for the exported model (replaced if an export).")],
           quantization: Annotated[str, Option(help="float32, int8, int8_float32 or bfloat16.")] = "float32",
           fmt: Annotated[str, Option("--format", help="ctranslate2 or transformers.")] = "ctranslate2") -> None:
    """Write a Transformer checkpoint as a CTranslate2 model (`translate` and `evaluate` take the directory as
    --checkpoint; the export extra) or, with --format transformers, as a Hugging Face model folder with a model
    card, ready to push to the hub (the hf extra)."""
    from attn_mt.export import export_model

    typer.echo("\n".join(map(str, export_model(checkpoint, out, fmt, quantization))))


@_verb()
def prepare(config: ConfigOpt, overrides: SetOpt = None,
            list_: Annotated[bool, Option("--list", help="Only list the cache: entries, leftovers.")] = False,
            clean: Annotated[bool, Option("--clean", help="Only remove damaged entries, leftovers of stopped builds "
                                                          "and lock files no process holds.")] = False) -> None:
    """Train the tokenizer and tokenize the training split into the data cache (data.cache_dir), ahead of
    `train`: a cluster job, its ranks and later runs of the same data then start from it."""
    from attn_mt.config import load_config
    from attn_mt.data import cache, tidy

    cfg = load_config(config, overrides or [])
    if list_ or clean:
        typer.echo("\n".join((tidy.clean if clean else tidy.survey)(cache.cache_root(cfg.data))))
    else:
        typer.echo(cache.prepare(cfg).describe())


@_verb("compare-rnn")
def compare_rnn(config: ConfigOpt, overrides: SetOpt = None,
                out: Annotated[Path | None, Option(help="Report directory (runs/compare).")] = None,
                quick: Annotated[bool, Option(help="Toy corpus, small models.")] = False) -> None:
    """Train the Transformer and the RNN on the same data and clock; report speed, BLEU, length scaling."""
    from attn_mt.config.compare_rnn import load_compare_config
    from attn_mt.measure.compare import compare_rnn as run_compare
    from attn_mt.measure.report import summary

    setup = load_compare_config(config, overrides or [], quick=quick)
    out = out or Path("runs") / ("compare_quick" if quick else "compare")
    typer.echo(f"{summary(run_compare(setup, out))}\nreport: {out / 'report.md'}")


@_verb()
def bench(config: ConfigOpt, overrides: SetOpt = None, json_out: JsonOpt = None,
          checkpoint: Annotated[Path | None, Option(help="Also time greedy and beam-5 translation.")] = None,
          repeats: Annotated[int, Option(min=1, help="Timed rounds after the warm-up; medians.")] = 5,
          steps: Annotated[int, Option(min=1, help="Training batches per round.")] = 2,
          sentences: Annotated[int, Option(min=1, help="Test sentences to translate.")] = 100,
          compiled: Annotated[bool, Option("--compile", help="Also time ours under torch.compile.")] = False) -> None:
    """Training tokens/s against torch.nn.Transformer, MFU against the matmul peak, translation speed."""
    from attn_mt.config import load_config
    from attn_mt.measure.bench import format_report, run_bench

    result = run_bench(load_config(config, overrides or []), checkpoint=checkpoint, repeats=repeats,
                       steps=steps, compile=compiled, sentences=sentences, json_out=json_out)
    typer.echo(format_report(result))


@_verb()
def heads(checkpoint: CkptOpt, src: SrcOpt, ref: RefOpt, json_out: JsonOpt = None, device: DeviceOpt = "auto",
          sentences: Annotated[int, Option(min=1, help="Use the first N lines.")] = 200,
          png: Annotated[Path | None, Option(help="Draw every head's importance and role in one PNG.")] = None,
          prune: Annotated[int, Option(min=0, help="Remove the N least important heads (with --out).")] = 0,
          out: Annotated[Path | None, Option(help="Where --prune writes the pruned checkpoint.")] = None) -> None:
    """Mask each attention head in turn: the BLEU and loss it costs, and where its attention goes."""
    from attn_mt.analysis import overview
    from attn_mt.analysis.heads import analyse_heads

    report = analyse_heads(checkpoint, src, ref, n_sentences=sentences, prune_n=prune, out=out, device=device,
                           json_out=json_out, png=png)
    typer.echo("\n".join([overview.table(report), *(str(p) for p in (json_out, png) if p)]))
