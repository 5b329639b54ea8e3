"""A fixed-seed sample of the fuzz corpus: every damaged or hostile input ends in exit 0 or 2."""

import collections

import pytest

from vidsight.bench.damage import DAMAGE, make_case, make_sources
from vidsight.api.cli import main
from vidsight.bench.fuzz import run_fuzz, summarise


@pytest.fixture(scope="module")
def fuzz_root(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz")


def test_a_fixed_seed_sample_exits_0_or_2_naming_the_input(fuzz_root, tiny_model_dir):
    outcomes = run_fuzz(main, 48, seed=20261123, model=tiny_model_dir, root=fuzz_root, workers=2, time_limit_s=120)
    report = summarise(outcomes)
    assert report["runs"] == 96 and not report["failures"], report["failures"]
    kinds = collections.Counter(o.case.kind for o in outcomes)
    assert len(kinds) >= 8  # the sample covers many kinds of damage, not one
    assert report["verdicts"].get("exit 0", 0) > 0 and report["verdicts"].get("exit 2", 0) > 0


def test_the_same_seed_makes_the_same_damage(tmp_path):
    import numpy as np

    sources = make_sources(tmp_path / "sources")
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a_rng, b_rng = np.random.default_rng(5), np.random.default_rng(5)
    for k in range(12):
        a, b = make_case(k, tmp_path / "a", sources, a_rng), make_case(k, tmp_path / "b", sources, b_rng)
        assert a.kind == b.kind
        if a.kind in DAMAGE:
            assert open(a.path, "rb").read() == open(b.path, "rb").read()


def test_a_traceback_and_a_hang_are_caught(fuzz_root, tiny_model_dir, monkeypatch):
    import time

    import vidsight.api.ask_cli as ask_cli
    import vidsight.api.tools_cli as tools_cli

    def crash(args):
        raise ZeroDivisionError("float division by zero")

    def stall(args):
        time.sleep(30)
        return 0

    # The forked children inherit the patches; each parser names its command's function when built.
    monkeypatch.setattr(tools_cli, "run_probe", crash)
    monkeypatch.setattr(ask_cli, "run_ask", stall)
    outcomes = run_fuzz(main, 2, seed=1, model=tiny_model_dir, root=fuzz_root, workers=2, time_limit_s=3)
    verdicts = {(o.command, o.verdict) for o in outcomes if o.case.kind in DAMAGE}
    assert verdicts <= {("probe", "traceback"), ("ask", "hang")} and verdicts
