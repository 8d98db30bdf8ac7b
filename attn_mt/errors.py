"""The errors attn-mt raises on purpose: one base class and four kinds, each with the thing at
fault.

    AttnMTError          the base: `except attn_mt.AttnMTError` catches every known failure
      ConfigError        a config key or value (the message names the key and what is allowed)
      InputError         an argument or an input file (`field` names the argument: "beam", "token",
                         "src")
      ModelError         a checkpoint or export folder that cannot be opened or used
      RunError           a run that could not go on: training, a device, a download
        TrainError       training cannot start or go on
        Interrupted      stopped by Ctrl-C or SIGTERM, after saving what could be saved

`field` is the name of the argument, config key or file at fault, as the Python API spells it
(`beam`, `train.lr`, `src`, `path`); `str(error)` puts it in front of the message unless the message
already starts with what it names (`named`: a config key, a file's path). A message names other
arguments in backticks (`overwrite`). Only the CLI turns both into its option names and errors into
one-line exits (cli.py).

May import nothing of attn_mt.

Tested in tests/test_cli.py (one line naming the flag) and tests/test_layout.py (imports nothing of
attn_mt).
"""

from __future__ import annotations

__all__ = ["AttnMTError", "ConfigError", "InputError", "Interrupted", "ModelError", "RunError",
           "TrainError"]


class AttnMTError(Exception):
    """A failure attn-mt expects and explains in one line; `field` names what is at fault. `named`:
    the message already starts with it (a key, a path), so `str()` does not repeat it."""

    def __init__(self, message: str = "", field: str | None = None, *, named: bool = False) -> None:
        super().__init__(message)
        self.message, self.field, self.named = message, field, named

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field and not self.named else self.message

    def naming(self, field: str) -> AttnMTError:
        """This error with `field` set where it was not (its message already names the thing); for a
        caller that knows which of its arguments was at fault: `raise e.naming("path")`."""
        if self.field is None:
            self.field, self.named = field, True
        return self


class ConfigError(AttnMTError, ValueError):
    """A config that cannot be used; the message names the key and what is allowed, and `field` is
    that key as the check knows it ("decode.beam_size"), or "config" (the file, or the whole
    config)."""

    def __init__(self, message: str = "", field: str = "config") -> None:
        super().__init__(message, field, named=True)


class InputError(AttnMTError, ValueError):
    """An argument or input that cannot be used; `field` names the argument (or the file) at
    fault."""


class ModelError(AttnMTError, ValueError):
    """A checkpoint or export that is missing, damaged, of an incompatible version, or of the wrong
    kind."""


class RunError(AttnMTError, RuntimeError):
    """Work that started and could not go on: training, a device, a download."""


class TrainError(RunError):
    """Training cannot start or go on (a run directory in the way, a resume that does not fit, a
    diverged run)."""


class Interrupted(RunError):
    """Stopped on request (Ctrl-C, SIGTERM) after saving what could be saved."""
