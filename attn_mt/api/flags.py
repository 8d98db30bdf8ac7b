"""The command line's words for the API's: an argument as its flag, a message with its arguments as flags, and a
failure as one line with an exit status. Nothing here loads torch: the CLI imports it as it starts.

Tested in tests/test_cli.py (one line naming the flag, and each exit status).
"""

from __future__ import annotations

from attn_mt.errors import AttnMTError, ConfigError, Interrupted
from attn_mt.files import OutputError

__all__ = ["FLAGS", "AttnMTError", "error_line", "flag", "flags"]  # AttnMTError: what error_line takes

# an API argument -> the CLI's flag, where they differ
FLAGS = {"text": "TEXT", "texts": "TEXT", "path": "--checkpoint", "n": "--prune", "sources": "--src", "refs": "--ref",
         "ref": "--ref", "src": "--src", "format": "--format", "json": "--json", "overrides": "--set",
         "json_out": "--json", "out_dir": "--out"}


def flag(field: str) -> str:
    """The CLI's name of an API argument: "beam" -> "--beam", "batch_size" -> "--batch-size"."""
    return field if field.startswith("-") else FLAGS.get(field, "--" + field.replace("_", "-"))


def flags(message: str) -> str:
    """A library message as the CLI says it: "`src` and `ref` go together" -> "--src and --ref go together" (each
    name the message marks in backticks, written where the check is, becomes its flag)."""
    parts = message.split("`")
    out = [parts[0]]
    for i in range(1, len(parts) - 1, 2):  # parts[i] is between two backticks
        name = parts[i]
        out += [flag(name) if name.replace("_", "a").isalnum() else f"`{name}`", parts[i + 1]]
    if len(parts) % 2 == 0:  # an unpaired backtick
        out.append("`" + parts[-1])
    return "".join(out)


def error_line(e: AttnMTError | KeyboardInterrupt | OSError, request: type | tuple = ()) -> tuple[str, int]:
    """A failure as the CLI's one line on stderr and its exit status: 2 for a config, an output path or a
    `request` error (a value only the model can check: its layers, heads, tokens), 130 for an interruption, 1 for
    the rest (an OSError: a full disk or a vanished directory while writing, anywhere)."""
    if isinstance(e, request):
        return f"error: {flag(e.field)}: {e.message}", 2
    if isinstance(e, KeyboardInterrupt):
        return "interrupted", 130
    if isinstance(e, OSError):
        return flags(f"error: {f'{e.filename}: ' if e.filename else ''}{e.strerror or e}"), 1
    kind, status = ("config error", 2) if isinstance(e, ConfigError) else ("interrupted", 130) if isinstance(
        e, Interrupted) else ("error", 2 if isinstance(e, OutputError) else 1)
    what = f"{flag(e.field)}: {e.message}" if e.field and not e.named and not isinstance(e, ConfigError) else str(e)
    if isinstance(e, OutputError) and what.startswith(f"{e.option} "):  # "out x.pt: ..." -> "--out x.pt: ..."
        what = flag(e.option) + what[len(e.option):]
    return flags(f"{kind}: {what}"), status  # `resume` -> --resume
