"""The GPU check's dry run: every stage of `vidsight bench device` on the CPU, so it cannot rot while
no GPU is at hand; and the real run's plan fits the lease."""

import json
import time
from pathlib import Path

from vidsight.bench.device import run_device_check
from vidsight.bench.device_stages import PARTS, TEST_FILES, check_stages
from vidsight.bench.forked import StageForker, run_in_subprocess

STAGES = ["tests-float32", "tests-bfloat16", "ask", "decode", "watch", "chat", "serve"]


def test_the_dry_run_passes_every_stage_and_writes_both_summaries(tmp_path):
    report = run_device_check(tmp_path, dry_run=True)
    assert list(report["stages"]) == STAGES
    for name, stage in report["stages"].items():
        assert stage["status"] == "ok", (name, stage["errors"][-2000:])
    for dtype in ("float32", "bfloat16"):
        tests = report["stages"][f"tests-{dtype}"]["tests"]
        assert tests["passed"] >= 2 and tests["failures"] == tests["errors"] == 0
    ask = report["stages"]["ask"]["report"]["runs"]
    assert list(ask) == ["full compute", "overlap, rho=0.2", "overlap, rho=0.2, motion pruning"]
    assert ask["overlap, rho=0.2"]["kept_visual_tokens"] < ask["full compute"]["kept_visual_tokens"]
    assert ask["overlap, rho=0.2, motion pruning"]["encoded_visual_tokens"] < ask["full compute"]["visual_tokens"]
    chat = report["stages"]["chat"]["report"]["rows"]
    assert {row["policy"] for row in chat} == {"full", "rekv", "mosaic", "resv"}
    assert all(row["tokens_by_tier"]["disk"] > 0 for row in chat)  # the tiers really moved blocks down
    assert [level["concurrency"] for level in report["stages"]["serve"]["report"]["completions"]] == [1, 2]
    assert all(stage["headline"] for name, stage in report["stages"].items() if not name.startswith("tests"))
    written = json.loads((tmp_path / "device-check.json").read_text())
    assert written["dry_run"] is True and written["stages_forked"] is True
    markdown = (tmp_path / "device-check.md").read_text()
    assert all(f"## {name}: ok" in markdown for name in STAGES)


def test_each_gpu_call_fits_eight_minutes_and_the_stages_time_the_issues_workloads(tmp_path):
    stages = check_stages(tmp_path, dry_run=False)
    assert [s.name for s in stages] == STAGES == [name for part in PARTS for name in part]
    for part in PARTS:
        assert sum(s.timeout_s for s in stages if s.name in part) <= 8 * 60
    commands = {s.name: " ".join(s.args) for s in stages}
    assert all(s.env["VIDSIGHT_TEST_DEVICE"] == "cuda" and set(TEST_FILES) <= set(s.args) for s in stages[:2])
    assert "--shape qwen2.5-vl-7b" in commands["ask"] and "--video-s 1800" in commands["ask"]
    assert "--workers 16 --group-frames 32" in commands["ask"] and "--rho 0.2" in commands["ask"]
    assert "--window-s 40" in commands["watch"] and "--histories 1000 4000 16000 40000" in commands["chat"]
    assert "--kv-disk" in commands["chat"] and "--concurrency 1 8 32" in commands["serve"]


def test_the_named_test_files_hold_every_device_check_test():
    # Read from the sources (collecting the whole suite in a subprocess took 10 s): a test is marked
    # by a decorator or by its module's pytestmark, both spelt `pytest.mark.device_check`.
    tests = Path(__file__).parents[1]
    marked = {path.relative_to(tests.parent).as_posix() for path in tests.rglob("test_*.py")
              if path != Path(__file__) and "pytest.mark.device_check" in path.read_text()}
    assert marked == set(TEST_FILES)


PROBE = """import os, sys, time
print(os.environ.get("PROBE"), os.getcwd(), "wave" in sys.modules, *sys.argv[1:])
print("on stderr", file=sys.stderr)
if sys.argv[1] == "sleep":
    time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


def test_a_forked_stage_runs_as_its_command_would_and_is_killed_past_its_limit(tmp_path):
    (tmp_path / "probe_stage.py").write_text(PROBE)
    (tmp_path / "noisy_import.py").write_text('print("a banner on stdout")\n')   # not taken for an answer
    with StageForker(tmp_path, preload=("wave", "noisy_import")) as forker:   # wave: nothing else imports it
        assert forker.forks   # no CUDA here, so nothing a fork could lose
        _check_launcher(forker.run, tmp_path, preloaded=True)


def test_without_the_forker_a_stage_runs_as_a_fresh_process_alike(tmp_path):
    (tmp_path / "probe_stage.py").write_text(PROBE)
    _check_launcher(run_in_subprocess, tmp_path, preloaded=False)


def _check_launcher(run, tmp_path, preloaded: bool) -> None:
    out, err = tmp_path / "out.txt", tmp_path / "err.txt"
    assert run(("-m", "probe_stage", "3", "x"), {"PROBE": "set"}, tmp_path, 30, out, err) == 3
    # Its own environment and working directory, its own output files.
    assert out.read_text().split() == ["set", str(tmp_path), str(preloaded), "3", "x"]
    assert err.read_text() == "on stderr\n"
    started = time.monotonic()
    assert run(("-m", "probe_stage", "sleep"), {}, tmp_path, 1, out, err) is None
    assert time.monotonic() - started < 10
    # It goes on after a kill, and a stage's environment was its own.
    assert run(("-m", "probe_stage", "0"), {}, tmp_path, 30, out, err) == 0
    assert out.read_text().split()[0] == "None"
