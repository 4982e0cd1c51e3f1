"""The scripts' stdout and stderr, as a shell hands them over: under any locale.

- **A path as it was typed.** Python decodes a command line with the locale's encoding, and a
  byte that encoding cannot read becomes a surrogate escape (PEP 383): under `LC_ALL=C`
  with `PYTHONUTF8=0`, `é` in `--out runs/é` is held as `\\udcc3\\udca9`. stdout writes such
  an escape back as its byte, but stderr, where a script's one-line errors go, wrote the
  escape itself. Both streams here write it back as the byte it stands for, and any other
  character their encoding cannot hold as a backslash escape, never an error.

`set_up()` does it, once per process; the scripts call it first thing. The module needs
only the standard library.
"""

from __future__ import annotations

import codecs
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


def set_up() -> None:
    """stdout and stderr write paths as typed."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)  # a TextIOWrapper's
        if reconfigure is not None and getattr(stream, "errors", None) != AS_TYPED:
            try:
                reconfigure(errors=AS_TYPED)
            except (OSError, ValueError):  # closed, or a stream that cannot change
                pass
