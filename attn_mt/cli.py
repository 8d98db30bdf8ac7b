"""The `attn-mt` command line.
One job: each verb parses its options, calls the public API (attn_mt/api/) and prints; an error's
argument (`field`) is shown as its flag (api/terminal.py's `error_line`), with an exit status."""

import functools
import logging
import os
from pathlib import Path
from typing import Annotated, Literal

import typer
from typer import Argument, Option
from typer.core import TyperCommand, TyperGroup

import attn_mt
from attn_mt.api.arguments import with_decode_options  # a verb's decode flags, from the table
from attn_mt.api.limits import Limits  # the served limits' defaults (no web extra needed)
from attn_mt.errors import AttnMTError

FLAGS = {"text": "TEXT", "texts": "TEXT", "path": "--checkpoint", "n": "--prune", "src": "--src",
         "sources": "--src", "refs": "--ref", "ref": "--ref", "format": "--format",
         "json": "--json", "overrides": "--set", "json_out": "--json", "out_dir": "--out"}


def flag(field: str) -> str:
    """The CLI's name of an API argument (FLAGS where they differ): "n" -> "--prune"."""
    return field if field.startswith("-") else FLAGS.get(field, "--" + field.replace("_", "-"))


class _GlobalOptionsAnywhere(TyperGroup):
    """--debug and --quiet work after the subcommand too: `attn-mt train ... --quiet`."""

    GLOBAL = ("--debug", "--no-debug", "--quiet", "--no-quiet")

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        end = args.index("--") if "--" in args else len(args)
        head = sorted(args[:end], key=lambda a: a not in self.GLOBAL)  # stable: global ones first
        return super().parse_args(ctx, head + args[end:])


app = typer.Typer(cls=_GlobalOptionsAnywhere, add_completion=False, no_args_is_help=True,
                  pretty_exceptions_enable=False,
                  help="Train, run and measure Transformer translation models.")


def _opt(kind, *names: str, help: str):  # an option's type, help (and flags, where not its name)
    return Annotated[kind, Option(*names, help=help)]


def _limit(help: str, kind=int):  # a positive number's option
    return Annotated[kind, Option(min=0.1 if kind is float else 1, help=help)]


@app.callback()
def main(debug: _opt(bool, help="Show tracebacks on errors.") = False,  # read by _Verb
         quiet: _opt(bool, help="Only warnings and errors on stderr.") = False) -> None:
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(message)s",
                        force=True)  # stderr


class _Verb(TyperCommand):
    """A verb: a known failure is one line and an exit status, or with --debug a traceback."""

    def invoke(self, ctx):
        from attn_mt.api.terminal import OptionError, RequestError, error_line, flags

        try:
            return super().invoke(ctx)
        except OptionError as e:  # a flag's value: usage, one line naming the flag, status 2
            hint = e.field and flag(e.field)
            raise typer.BadParameter(flags(e.message, flag), ctx=ctx, param_hint=hint) from None
        except (AttnMTError, KeyboardInterrupt, OSError) as e:
            if ctx.find_root().params["debug"] and not isinstance(e, RequestError):
                raise
            line, status = error_line(e, flag, RequestError)
            typer.echo(line, err=True)
            raise typer.Exit(status) from None


_verb = functools.partial(app.command, cls=_Verb)  # @_verb(): a subcommand of `attn-mt`
DECODE_FLAGS = {o.key: flag(o.arg) for o in attn_mt.DECODE_OPTIONS}  # the decode options' flags


def _decode_opt(o):  # a decode option's flag (DECODE_OPTIONS' row), with its help
    default = f"default {o.default}" if o.default else "default: the checkpoint's decode section"
    return _opt(o.type | None, DECODE_FLAGS[o.key], help=f"{o.help} ({default}).")

ConfigOpt = _opt(Path, "--config", "-c", help="YAML experiment config.")
SetOpt = _opt(list[str] | None, "--set", help="Override a key: section.key=value.")
CkptOpt = _opt(Path, "--checkpoint", help="A checkpoint written by `attn-mt train`.")
ModelOpt = _opt(Path, "--checkpoint", help="A checkpoint, or a folder of `attn-mt export`.")
DeviceOpt = _opt(str, help="cpu, cuda, mps or auto.")
BeamOpt = _decode_opt({o.key: o for o in attn_mt.DECODE_OPTIONS}["beam_size"])
SrcOpt = _opt(Path, help="Source sentences, one a line.")
RefOpt = _opt(Path, help="Their reference translations, line-aligned with --src.")
TextArg = Annotated[str, Argument(help="A source sentence.")]
JsonOpt = _opt(Path | None, "--json", help="Write every number to this file.")


@_verb()
def train(config: ConfigOpt, overrides: SetOpt = None,
          out: _opt(Path | None, help="Run directory [default: runs/<name>].") = None,
          resume: _opt(bool, help="Continue from OUT/checkpoint_last.pt.") = False,
          overwrite: _opt(bool, help="Delete OUT's earlier run, start afresh.") = False) -> None:
    """Train from a YAML config into a run directory (under `torchrun -m attn_mt train`: DDP)."""
    run = attn_mt.train(config, out, overrides=overrides or [], resume=resume, overwrite=overwrite)
    if os.environ.get("RANK", "0") == "0":  # torchrun: rank 0 reports
        typer.echo(run.summary())


@_verb()
@with_decode_options("translate_nbest", _decode_opt)
def translate(checkpoint: ModelOpt,
              texts: Annotated[list[str] | None, Argument(help="Sentences to translate.")] = None,
              input: _opt(Path | None, "--input", "-i", help="Input file.") = None,
              device: DeviceOpt = "auto",
              fmt: _opt(Literal["text", "jsonl"], "--format", help="text or jsonl.") = "text",
              stream: _opt(bool, help="Each line as soon as it is done (else in 1000s).") = False,
              align: _opt(bool, help="Add ' ||| ' and the word links.") = False,
              options: dict | None = None) -> None:
    """Translate arguments, --input FILE or stdin (a prompt on a terminal), a line per result."""
    from attn_mt.api.terminal import translate_command

    for out in translate_command(checkpoint, texts, input, fmt=fmt, stream=stream, align=align,
                                 device=device, names=DECODE_FLAGS, **options):
        typer.echo(out)  # click.echo flushes


@_verb()
def align(checkpoint: CkptOpt, src: SrcOpt,
          tgt: _opt(Path, help="Translations of --src, one a line."),
          gold: _opt(Path | None, help="Gold links (i-j sure, ipj possible): print AER.") = None,
          method: _opt(str | None, help="layerL, headL.H, shift-..., union:, gdf:...") = None,
          by_head: _opt(bool, help="With --gold: score every layer, head and method.") = False,
          reverse: _opt(Path | None, help="A target -> source checkpoint (union:, gdf:).") = None,
          one_indexed: _opt(bool, help="--gold counts words from 1.") = False,
          batch_size: _opt(int, help="Pairs per batch.") = 64, device: DeviceOpt = "auto") -> None:
    """Word links of given translations from cross-attention (Pharaoh i-j), or with --gold AER."""
    from attn_mt.api.aligning import align_command

    model = attn_mt.load(checkpoint, device=device)
    typer.echo(align_command(model, src, tgt, gold, method=method, by_head=by_head,
                             reverse=reverse, one_indexed=one_indexed, batch_size=batch_size))


@_verb()
@with_decode_options("translate", _decode_opt)
def evaluate(checkpoint: ModelOpt, src: SrcOpt, ref: RefOpt, device: DeviceOpt = "auto",
             as_json: _opt(bool, "--json", help="Print JSON.") = False,
             options: dict | None = None) -> None:
    """Translate --src and score it against --ref with sacrebleu BLEU and chrF."""
    from attn_mt.api.terminal import evaluate_command

    typer.echo(evaluate_command(checkpoint, src, ref, as_json=as_json, device=device,
                                names=DECODE_FLAGS, **options))


@_verb()
def average(checkpoints: Annotated[list[Path], Argument(help="e.g. RUN/checkpoint_step*.pt.")],
            out: _opt(Path, help="Where to write the averaged checkpoint."),
            force: _opt(bool, help="Also average checkpoints of different runs.") = False) -> None:
    """Average the weights of several checkpoints of one run into one checkpoint."""
    attn_mt.average(checkpoints, out, force=force)
    typer.echo(f"averaged {len(checkpoints)} checkpoints into {out}")


@_verb()
def download(dataset: Annotated[str, Argument(help="Dataset name: multi30k.")] = "multi30k",
             out: _opt(Path, help="For {split}.{lang} files.") = Path("data/multi30k")) -> None:
    """Fetch a corpus (its original URL, else the Hugging Face hub) into line-aligned text files."""
    typer.echo("\n".join(map(str, attn_mt.download(dataset, out))))


@_verb()
def attention(checkpoint: CkptOpt, text: TextArg,
              out: _opt(Path, help="Directory for the PNG figures."),
              html: _opt(Path | None, help="Also the interactive head view, an HTML page.") = None,
              beam: BeamOpt = None, device: DeviceOpt = "auto") -> None:
    """Translate one sentence and draw every attention head of every layer as PNGs in --out."""
    from attn_mt.api.terminal import attention_command

    typer.echo("\n".join(attention_command(checkpoint, text, out, html, beam, device)))


@_verb()
def explain(checkpoint: CkptOpt, text: TextArg,
            kind: _opt(str, help="encoder, decoder or cross (attention).") = "cross",
            layer: _opt(int, help="Layer, from 1.") = 1, head: _opt(int, help="Head, from 1.") = 1,
            token: _opt(str, help="The query: position (from 0) or text (a target's: predicted).")
            = "0",
            beam: _opt(int, help="Beam size of the translation; 1 is greedy.") = 1,
            json_out: JsonOpt = None, device: DeviceOpt = "auto") -> None:
    """One head's attention for one query, step by step, recomputed from the model's weights."""
    from attn_mt.api.terminal import explain_command

    typer.echo(explain_command(checkpoint, text, json_out, device, kind=kind, layer=layer,
                               head=head, token=token, beam=beam))


@_verb()
def serve(checkpoint: ModelOpt,
          host: _opt(str, help="Interface to bind; any other is public.") = "127.0.0.1",
          port: Annotated[int, Option(min=1, max=65535)] = 8000, device: DeviceOpt = "auto",
          allow_host: _opt(list[str] | None, help="Also answer this Host header.") = None,
          max_texts: _limit("Most sentences per request.") = Limits.max_texts,
          max_chars: _limit("Most characters per request.") = Limits.max_chars,
          max_work: _limit("Most source subwords x beam per request.") = Limits.max_work,
          max_queue: _limit("Most requests waiting; more get 503.") = Limits.max_queue,
          read_timeout: _limit("Seconds to send the headers, then the body.",
                               float) = Limits.header_timeout_s) -> None:
    """Serve a checkpoint: a web page (translations, every head's attention), a JSON API (/docs)."""
    from attn_mt.serve import serve

    limits = Limits(max_texts=max_texts, max_chars=max_chars, max_work=max_work,
                    max_queue=max_queue, header_timeout_s=read_timeout, body_timeout_s=read_timeout)
    serve(checkpoint, host, port, device=device, limits=limits, allow_host=allow_host,
          ready=lambda url: typer.echo(f"attn-mt serve: {url}  (API docs /docs; Ctrl-C stops)"))


@_verb()
def export(checkpoint: CkptOpt,
           out: _opt(Path, help="Directory for the model (an earlier export is replaced)."),
           quantization: _opt(str, help="float32, int8, int8_float32 or bfloat16.") = "float32",
           fmt: _opt(str, "--format", help="ctranslate2 or transformers.") = "ctranslate2") -> None:
    """A checkpoint as a CTranslate2 model, or (--format transformers) a Hugging Face folder."""
    written = attn_mt.export_model(checkpoint, out, format=fmt, quantization=quantization)
    typer.echo("\n".join(map(str, written)))


@_verb()
def prepare(config: ConfigOpt, overrides: SetOpt = None,
            list_: _opt(bool, "--list", help="Only list the cache: entries, leftovers.") = False,
            clean: _opt(bool, "--clean", help="Only remove damaged entries, leftovers.") = False,
            ) -> None:
    """Tokenize the training split into the data cache (data.cache_dir) ahead of `train`."""
    from attn_mt.api.commands import cache_survey

    if list_ or clean:
        return typer.echo("\n".join(cache_survey(config, overrides or [], clean=clean)))
    typer.echo(attn_mt.prepare(config, overrides or []).describe())


@_verb("compare-rnn")
def compare_rnn(config: ConfigOpt, overrides: SetOpt = None,
                out: _opt(Path | None, help="Report directory (runs/compare).") = None,
                quick: _opt(bool, help="Toy corpus, small models.") = False) -> None:
    """Train the Transformer and the RNN on the same data and clock: speed, BLEU, length scaling."""
    from attn_mt.api.terminal import compare_text

    out = out or Path("runs") / ("compare_quick" if quick else "compare")
    report = attn_mt.compare_rnn(config, overrides or [], out=out, quick=quick)
    typer.echo(f"{compare_text(report)}\nreport: {out / 'report.md'}")


@_verb()
def bench(config: ConfigOpt, overrides: SetOpt = None, json_out: JsonOpt = None,
          checkpoint: _opt(Path | None, help="Also time greedy and beam-5 translation.") = None,
          repeats: _limit("Timed rounds after the warm-up; medians.") = 5,
          steps: _limit("Training batches per round.") = 2,
          sentences: _limit("Test sentences to translate.") = 100,
          compiled: _opt(bool, "--compile", help="Also time ours compiled.") = False) -> None:
    """Training tokens/s against torch.nn.Transformer, MFU, translation speed."""
    from attn_mt.api.terminal import bench_text

    report = attn_mt.bench(config, overrides or [], checkpoint=checkpoint, repeats=repeats,
                           steps=steps, compile=compiled, sentences=sentences, json_out=json_out)
    typer.echo(bench_text(report))


@_verb()
def heads(checkpoint: CkptOpt = None, src: _opt(Path | None, help="Source sentences.") = None,
          history: _opt(Path | None, help="A run: how its heads learned (--html, --png).") = None,
          ref: _opt(Path | None, help="Their references, line-aligned with --src.") = None,
          contrastive: _opt(Path | None, help="RUN/test.contrastive.jsonl: pronoun heads.") = None,
          json_out: JsonOpt = None, device: DeviceOpt = "auto",
          sentences: _limit("Use the first N lines.") = 200,
          png: _opt(Path | None, help="Every head's importance and role in one PNG.") = None,
          html: _opt(Path | None, help="The table and the picture as an HTML page.") = None,
          prune: Annotated[int, Option(min=0, help="Remove the N least important heads.")] = 0,
          out: _opt(Path | None, help="Where --prune writes its checkpoint.") = None) -> None:
    """What masking each head costs, where it attends; with --history RUN: how the heads learned."""
    from attn_mt.api.terminal import heads_command

    lines = heads_command(checkpoint, src, ref, contrastive, history=history, prune=prune, out=out,
                          json_out=json_out, png=png, html=html, sentences=sentences, device=device)
    typer.echo("\n".join(lines))


@_verb()
def score(checkpoint: ModelOpt, src: _opt(Path | None, help="Source sentences.") = None,
          ref: _opt(Path | None, help="Translations to score, line-aligned with --src.") = None,
          contrastive: _opt(Path | None, help="A contrastive set (ours, or ContraPro's).") = None,
          json_out: JsonOpt = None, batch_size: _limit("Sentences per batch.") = 64,
          device: DeviceOpt = "auto") -> None:
    """log P of given translations (forced decoding), or a contrastive set's accuracy."""
    from attn_mt.api.terminal import score_command

    lines = score_command(checkpoint, src, ref, contrastive, json_out, batch_size, device)
    typer.echo("\n".join(lines))
