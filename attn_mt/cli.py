"""The `attn-mt` command line: each verb parses, loads, calls one library function and prints."""

from __future__ import annotations

import functools
import json
import logging
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Train, run and measure Transformer translation models.")
_debug = False


@app.callback()
def main(debug: Annotated[bool, typer.Option(help="Show tracebacks on errors.")] = False,
         quiet: Annotated[bool, typer.Option(help="Only warnings and errors on stderr.")] = False) -> None:
    global _debug
    _debug = debug
    logging.basicConfig(level=logging.WARNING if quiet else logging.INFO, format="%(message)s",
                        stream=sys.stderr, force=True)


def _user_errors(fn):
    """Known failures end in one line on stderr and exit status 2 (config) or 1 (anything else)."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        from .checkpoint import CheckpointError
        from .config import ConfigError
        from .data import DataError
        from .download import DownloadError
        from .train import TrainError

        try:
            return fn(*args, **kwargs)
        except (ConfigError, DataError, CheckpointError, TrainError, DownloadError) as e:
            if _debug:
                raise
            kind = "config error" if isinstance(e, ConfigError) else "error"
            typer.echo(f"{kind}: {e}", err=True)
            raise typer.Exit(2 if isinstance(e, ConfigError) else 1) from None

    return wrapper


ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="YAML experiment config.")]
SetOpt = Annotated[Optional[list[str]], typer.Option("--set", help="Override a key: section.key=value.")]
CkptOpt = Annotated[Path, typer.Option("--checkpoint", help="A checkpoint written by `attn-mt train`.")]
DeviceOpt = Annotated[str, typer.Option(help="cpu, cuda, mps or auto.")]


@app.command()
@_user_errors
def train(config: ConfigOpt, overrides: SetOpt = None,
          out: Annotated[Optional[Path], typer.Option(help="Run directory [default: runs/<config name>].")] = None,
          resume: Annotated[bool, typer.Option(help="Continue from OUT/checkpoint_last.pt.")] = False) -> None:
    """Train a model from a YAML config; writes checkpoints, metrics and results into the run directory."""
    from .config import load_config
    from .train import train as run_training

    cfg = load_config(config, overrides or [])
    run_dir = out or Path("runs") / cfg.name
    best = run_training(cfg, run_dir, resume=resume)
    results = json.loads((run_dir / "results.json").read_text())
    typer.echo(f"best checkpoint: {best}")
    typer.echo(f"test BLEU {results['test_bleu']:.2f}  chrF {results['test_chrf']:.2f}  "
               f"({results['test_split']}, {results['sacrebleu_signature']})")


def _lines(texts: list[str] | None, input: Path | None):
    """Input lines from arguments, a file, or stdin, without their newlines."""
    if texts:
        yield from texts
    elif input is not None:
        from .data import _read_lines

        yield from _read_lines(input)
    else:
        for line in sys.stdin:
            yield line.rstrip("\n")


@app.command()
@_user_errors
def translate(checkpoint: CkptOpt,
              texts: Annotated[Optional[list[str]], typer.Argument(help="Sentences to translate.")] = None,
              input: Annotated[Optional[Path], typer.Option("--input", "-i", help="File, one sentence a line.")] = None,
              batch_size: Annotated[int, typer.Option(help="Sentences per batch.")] = 64,
              device: DeviceOpt = "auto") -> None:
    """Translate text from arguments, --input FILE or stdin; one output line per input line."""
    from dataclasses import replace

    from .checkpoint import load_model
    from .decode import translate as run_translate
    from .train import pick_device

    dev = pick_device(device)
    model, cfg, tok = load_model(checkpoint, dev)
    dcfg = replace(cfg.decode, batch_size=batch_size)
    chunk: list[str] = []
    for line in _lines(texts, input):
        chunk.append(line)
        if len(chunk) == 1000:  # stream: a large input is translated and written piece by piece
            typer.echo("\n".join(run_translate(model, tok, chunk, dcfg, dev)))
            chunk = []
    if chunk:
        typer.echo("\n".join(run_translate(model, tok, chunk, dcfg, dev)))


@app.command()
@_user_errors
def evaluate(checkpoint: CkptOpt,
             src: Annotated[Path, typer.Option(help="Source file, one sentence a line.")],
             ref: Annotated[Path, typer.Option(help="Reference translations, line-aligned with --src.")],
             as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
             device: DeviceOpt = "auto") -> None:
    """Translate --src and score it against --ref with sacrebleu BLEU and chrF."""
    from .checkpoint import load_model
    from .data import DataError, _read_lines
    from .decode import translate as run_translate
    from .evaluate import score
    from .train import pick_device

    sources, refs = _read_lines(src), _read_lines(ref)
    if len(sources) != len(refs):
        raise DataError(f"line counts differ: {src} has {len(sources)} lines, {ref} has {len(refs)}")
    dev = pick_device(device)
    model, cfg, tok = load_model(checkpoint, dev)
    result = score(run_translate(model, tok, sources, cfg.decode, dev), refs)
    if as_json:
        typer.echo(json.dumps(result, indent=2))
    else:
        typer.echo(f"BLEU {result['bleu']:.2f}  ({result['bleu_signature']})")
        typer.echo(f"chrF {result['chrf']:.2f}  ({result['chrf_signature']})")


@app.command()
@_user_errors
def download(dataset: Annotated[str, typer.Argument(help="Dataset name: multi30k.")] = "multi30k",
             out: Annotated[Path, typer.Option(help="Directory for {split}.{lang} files.")] = Path("data/multi30k")) -> None:
    """Fetch a corpus (Hugging Face hub, else its original URL) into line-aligned text files."""
    from .download import download as run_download

    for path in run_download(dataset, out):
        typer.echo(str(path))
