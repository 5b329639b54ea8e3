"""How sure an accuracy is: Wilson score intervals, and McNemar's exact test for two policies
answering the same questions.

Two formulas, written out rather than pulling SciPy and statsmodels into the base install.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Z_95 = 1.959963984540054   # the normal quantile of a two-sided 95 % interval


def wilson(correct: int, total: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of ``correct`` out of ``total`` (95 % by default): unlike the
    normal approximation, it stays inside [0, 1] and is sound at 0 or ``total`` correct.

    Returns:
        ``(low, high)``; ``(nan, nan)`` for no questions.
    """
    if total == 0:
        return math.nan, math.nan
    share = correct / total
    denominator = 1 + z * z / total
    centre = (share + z * z / (2 * total)) / denominator
    half = z * math.sqrt(share * (1 - share) / total + z * z / (4 * total * total)) / denominator
    # At none or all correct the bound is exactly 0 or 1; the formula leaves a rounding error there.
    return (0.0 if correct == 0 else centre - half), (1.0 if correct == total else centre + half)


def mcnemar(first: Sequence[bool], second: Sequence[bool]) -> dict:
    """McNemar's exact test on paired answers (the same questions, in the same order).

    Only the questions the two answer differently count: under "no difference" each such
    question is equally likely to favour either, so the p-value is a two-sided binomial tail.

    Returns:
        ``{"only_first": n, "only_second": m, "p_value": p}``: questions only the first (only the
        second) answered correctly, and the probability of a split at least this uneven by chance.
    """
    if len(first) != len(second):
        raise ValueError(f"paired answers differ in number: {len(first)} and {len(second)}")
    only_first = sum(bool(a) and not bool(b) for a, b in zip(first, second))
    only_second = sum(bool(b) and not bool(a) for a, b in zip(first, second))
    differ = only_first + only_second
    tail = sum(math.comb(differ, k) for k in range(min(only_first, only_second) + 1)) / 2**differ
    return {"only_first": only_first, "only_second": only_second, "p_value": min(1.0, 2 * tail)}
