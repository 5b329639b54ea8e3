"""Parametrized variants for the fast subset: `-m "not slow"` runs each behaviour once, on its
first variants; the whole suite (`scripts/test`, CI) runs every variant."""

from __future__ import annotations

import pytest


def fast_first(values, ids=None, fast: int = 1, unpack: bool = False) -> list:
    """``values`` as pytest params, every one after the first ``fast`` marked slow (``unpack``:
    each value is a tuple of several arguments)."""
    ids = list(ids) if ids is not None else [None] * len(values)
    return [pytest.param(*(v if unpack else (v,)), id=i, marks=() if n < fast else pytest.mark.slow)
            for n, (v, i) in enumerate(zip(values, ids, strict=True))]
