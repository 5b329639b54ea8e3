"""`bench chat`: every policy timed on the same patches at each history length."""

import pytest

from vidsight.bench.chat import format_chat_report, run_chat_bench
from vidsight.errors import ConfigError


def test_each_policy_is_timed_at_each_history(tmp_path):
    report = run_chat_bench("small", histories=(150, 400), timed_patches=1, dtype="float32", out=tmp_path)
    rows = report["rows"]
    assert [(r["history_tokens"] >= h, r["policy"]) for r, h in zip(rows, (150,) * 3 + (400,) * 3)] == [
        (True, p) for p in ("full", "recent", "rekv")] * 2
    assert all(r["patch_prefill_s"] > 0 and r["question_ttft_s"] > 0 for r in rows)
    full = [r for r in rows if r["policy"] == "full"]
    assert all(r["question_attended_tokens"] > r["history_tokens"] for r in full)  # history + the timed patch
    assert set(report["growth"]) == {"full", "recent", "rekv"} and "ms/patch" in format_chat_report(report)


@pytest.mark.parametrize("settings", [dict(histories=(400, 100)), dict(policies=("everything",)),
                                      dict(shape="huge"), dict(timed_patches=0)])
def test_bad_settings_fail_before_the_long_work(tmp_path, settings):
    with pytest.raises(ConfigError):
        run_chat_bench(**{"out": tmp_path, **settings})
