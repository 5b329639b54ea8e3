"""Text streamed before the answer is whole: a tail that may be the start of a mark still to
come (a stop string, a reasoning model's tag, a tool call's) is held back until it is known."""

from __future__ import annotations


def without_partial_mark(text: str, marks) -> str:
    """``text`` without its longest tail that begins one of ``marks`` (and is not all of it)."""
    for length in range(min(len(text), max(map(len, marks), default=1) - 1), 0, -1):
        if any(mark.startswith(text[-length:]) for mark in marks):
            return text[:-length]
    return text
