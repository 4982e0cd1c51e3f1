"""The scripts' stdout and stderr, as a shell hands them over: under any locale, and into a
reader that may leave before the script ends.

- **A path as it was typed.** Python decodes a command line with the locale's encoding, and a
  byte that encoding cannot read becomes a surrogate escape (PEP 383): under `LC_ALL=C`
  with `PYTHONUTF8=0`, `é` in `--out runs/é` is held as `\\udcc3\\udca9`. stdout writes such
  an escape back as its byte, but stderr, where a script's one-line errors go, wrote the
  escape itself. Both streams here write it back as the byte it stands for, and any other
  character their encoding cannot hold as a backslash escape, never an error.
- **A stdout that closes.** A reader that has what it wanted leaves (`| head -1`), and a
  disk fills (`> /dev/full`): every later write to stdout fails. The first failure is said
  in one line on stderr; stdout then goes quiet (whatever is written to it, a log line, a
  bar's row or a print, goes nowhere) and the script goes on, ending as it would have: its
  rows are in metrics.jsonl, its outputs in --out.

`set_up()` does both, once per process; the scripts call it first thing. The module needs
only the standard library.
"""

from __future__ import annotations

import codecs
import errno
import os
import sys
from typing import Any

AS_TYPED = "minibert.as_typed"  # the codecs error handler's name


def _as_typed(error: UnicodeError) -> tuple[Any, int]:
    """A codecs error handler: a surrogate escape is written as the byte it stands for (as
    "surrogateescape" does), any other character that cannot be encoded as a backslash
    escape (as "backslashreplace" does). It handles the run of one kind that starts the
    error and says where to go on; the codec calls it again for the rest."""
    if not isinstance(error, UnicodeEncodeError):
        raise error
    text = error.object[error.start:error.end]
    escaped = [0xDC80 <= ord(c) <= 0xDCFF for c in text]  # surrogateescape's range
    n = next((i for i, e in enumerate(escaped) if e != escaped[0]), len(text))
    if escaped[0]:
        return bytes(ord(c) - 0xDC00 for c in text[:n]), error.start + n
    return codecs.backslashreplace_errors(UnicodeEncodeError(
        error.encoding, error.object, error.start, error.start + n, error.reason))


codecs.register_error(AS_TYPED, _as_typed)


class QuietWhenClosed:
    """A text stream (stdout) that, at the first write or flush that fails with an OSError,
    says so in one line on stderr and from then on writes nothing. Everything else is the
    wrapped stream's."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.closed_by: OSError | None = None  # the error that quieted it

    def write(self, text: str) -> int:
        if self.closed_by is None:
            try:
                return self.stream.write(text)
            except OSError as e:
                self._quiet(e)
        return len(text)

    def flush(self) -> None:
        if self.closed_by is None:
            try:
                self.stream.flush()
            except OSError as e:
                self._quiet(e)

    def _quiet(self, error: OSError) -> None:
        self.closed_by = error
        name = errno.errorcode.get(error.errno, str(error.errno))
        try:
            sys.stderr.write(f"stdout cannot be written ({error.strerror}, {name}): nothing "
                             f"more is shown there, and the script goes on\n")
            sys.stderr.flush()
        except OSError:  # stderr is gone too: there is no one to tell
            pass
        # The stream still holds what it could not write, and Python flushes it at exit:
        # pointed at /dev/null, that flush goes through rather than raise once more.
        try:
            null = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(null, self.stream.fileno())
            finally:
                os.close(null)
        except (OSError, AttributeError, ValueError):  # no descriptor: nothing left to flush
            pass

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def set_up() -> None:
    """stdout and stderr write paths as typed, and stdout goes quiet when it closes."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)  # a TextIOWrapper's
        if reconfigure is not None and getattr(stream, "errors", None) != AS_TYPED:
            try:
                reconfigure(errors=AS_TYPED)
            except (OSError, ValueError):  # closed, or a stream that cannot change
                pass
    if sys.stdout is not None and not isinstance(sys.stdout, QuietWhenClosed):
        sys.stdout = QuietWhenClosed(sys.stdout)
