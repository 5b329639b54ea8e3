"""Parametrized variants for the fast subset: `-m "not slow"` runs each behaviour once, on its
first variant; the whole suite (`scripts/test`, CI) runs every variant."""

from __future__ import annotations

import pytest


def fast_first(values, ids=None) -> list:
    """``values`` as pytest params, every one after the first marked slow."""
    ids = list(ids) if ids is not None else [None] * len(values)
    return [pytest.param(v, id=i, marks=() if n == 0 else pytest.mark.slow)
            for n, (v, i) in enumerate(zip(values, ids, strict=True))]
