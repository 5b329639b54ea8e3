"""Wilson intervals and McNemar's exact test against values worked by hand and their definitions."""

import math

import pytest

from vidsight.bench.intervals import mcnemar, wilson


def test_wilson_intervals_are_the_textbook_values():
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)      # sound at no successes
    assert wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    low, high = wilson(57, 60)
    assert low < 57 / 60 < high <= 1
    assert wilson(285, 300)[1] - wilson(285, 300)[0] < high - low     # more questions, a narrower interval
    assert all(math.isnan(v) for v in wilson(0, 0))


def test_mcnemar_counts_only_the_questions_answered_differently():
    first = [True] * 5 + [True, False] * 10
    second = [False] * 5 + [True, False] * 10
    result = mcnemar(first, second)
    assert (result["only_first"], result["only_second"]) == (5, 0)
    assert result["p_value"] == pytest.approx(2 / 2**5)    # all five splits one way: 2 * 0.5**5
    assert mcnemar([True, False], [False, True])["p_value"] == 1.0
    assert mcnemar([True] * 4, [True] * 4) == {"only_first": 0, "only_second": 0, "p_value": 1.0}
    with pytest.raises(ValueError, match="paired"):
        mcnemar([True], [True, False])
