"""``full``: every cached token, the exact reference the other policies are measured against."""

from __future__ import annotations


class FullPolicy:
    """Attends to everything: names no slots."""

    name = "full"

    def report(self) -> dict:
        return {}

    def start(self, cache) -> "FullPolicy":
        return self   # nothing kept per stream

    def select(self, layer, cache, q, step):
        return None
