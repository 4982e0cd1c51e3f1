"""Refusal tests check the facts a message carries, not its wording.

A refusal is right when it has the right type and names what the user must know to act: the
value refused, the flag or field to change, the file at fault. Its phrasing may be improved
at any time, so a test names those facts, each a literal substring, never a regex:

    with raises(ValueError, "--seq-len", "65", "max_position_embeddings=64"):
        check(...)

    assert_carries(stderr, "--eval", str(path))   # a script's message, read from its stderr

A number is checked in a message that also names a temporary folder with that folder taken
out (`without`), so that it cannot match a digit of the folder's name.
"""

import contextlib
import os

import pytest


def assert_carries(text: str, *facts: str) -> None:
    """Fail, showing the whole text, unless each fact occurs in it verbatim."""
    for fact in facts:
        if not isinstance(fact, str) or not fact:
            raise TypeError(f"a fact is a non-empty string, got {fact!r}")
    missing = [fact for fact in facts if fact not in text]
    assert not missing, f"the message lacks {missing!r}:\n{text}"


@contextlib.contextmanager
def raises(exc_type, *facts: str):
    """`pytest.raises(exc_type)` that also checks each fact occurs in str(error).

    Yields pytest's ExceptionInfo, for tests that check more (the exception's attributes, or
    a fact that must be absent)."""
    with pytest.raises(exc_type) as info:
        yield info
    assert_carries(str(info.value), *facts)


def without(text: str, *folders: "str | os.PathLike") -> str:
    """`text` with each of `folders` (and what lies under it) written as <path>."""
    for folder in folders:
        text = text.replace(str(folder), "<path>")
    return text
