"""One-line messages: every boundary check of the library says what is wrong on ONE line.

:func:`one_line` is the one helper that keeps a value (a path, a parsed field, an exception's
text) on one line inside such a message. This module imports nothing.
"""

from __future__ import annotations

__all__ = ["one_line"]


def one_line(text: object) -> str:
    """``text`` with every run of whitespace (newlines included) collapsed to one space."""
    return " ".join(str(text).split())
