"""The device check's stages (`bench/device.py`): on a GPU, the issue's workloads on the 7B shape
sized to fit the lease; in a dry run, the same commands on the CPU at sizes that take seconds."""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Stage:
    """One subprocess of the check.

    Attributes:
        name: The stage's name in the report.
        args: Arguments after the Python executable.
        timeout_s: Seconds before the stage is stopped and the next one starts.
        env: Variables added to the environment.
        report: The JSON report the command writes, folded into the check's.
        junit: The JUnit XML a pytest stage writes (its counts and failures are reported).
    """

    name: str
    args: tuple[str, ...]
    timeout_s: float
    env: dict = dataclasses.field(default_factory=dict)
    report: Path | None = None
    junit: Path | None = None


# The files holding the `device_check` tests: named, not found by collecting all of tests/, because
# the GPU image lacks what other test files import (Ray, Selenium, the OpenAI client).
TEST_FILES = ("tests/engine/test_ask_exact.py", "tests/engine/test_ask_still.py", "tests/engine/test_batch.py",
              "tests/engine/test_chat.py", "tests/engine/test_constrain.py", "tests/engine/test_prefix_cache.py",
              "tests/engine/test_watch.py",
              "tests/kv/test_tiers.py", "tests/kv/test_resv.py", "tests/kv/test_policies_on_families.py",
              "tests/models/test_qwen3_vl.py", "tests/models/test_whole_frame_families.py")
SHAPE = "qwen2.5-vl-7b"
# QuickVideo's setting (seed 000, section 4): 30 minutes at 1 fps, 16 decoders, groups of 32, rho 0.2.
ASK_VIDEO_S, ASK_VIDEO_FPS = 1800, 4   # 4 fps keeps generating 30 minutes of 1280x720 within the lease
ASK_GOP = 32   # a keyframe every 8 s, as x264's default 250 frames at 30 fps
# CodecSight's windows (seed 001): 40 s, stride 20 %, 2 fps; videos long enough for four windows.
WATCH_WINDOW_S, WATCH_VIDEO_S = 40, 64
CHAT_HISTORIES = (1000, 4000, 16000, 40000)
CHAT_POLICIES = ("full", "rekv", "mosaic", "resv")
# The H200's first check reached 4k cached tokens in 70 s one patch a step: Mosaic and ReSV follow
# the whole stream (about 450 patches to 40k on the 7B shape), so the history goes in steps of 8.
CHAT_HISTORY_BATCH = 8
SERVE_CLIENTS = (1, 8, 32)
# Two device calls of at most 8 minutes each (`--part`): on an H200 the tests took 54 s (float32)
# and over 80 s (bfloat16), and ask 168 s with its video's generation, so all seven stages at
# these sizes do not fit one call's 8 minutes.
PARTS = (("tests-float32", "tests-bfloat16", "ask"), ("decode", "watch", "chat", "serve"))
GPU_LIMITS_S = {"tests-float32": 90, "tests-bfloat16": 150, "ask": 240,
                "decode": 150, "watch": 100, "chat": 150, "serve": 80}


def check_stages(out: Path, dry_run: bool) -> list[Stage]:
    """Every stage, in the order the issue asks for; on a GPU each part's (`PARTS`) time limits sum
    to at most 8 minutes, in a dry run all of them do."""
    from vidsight.models.paths import TASK_MODEL

    vidsight = ("-m", "vidsight")
    device = "cpu" if dry_run else "cuda"
    shape = "tiny" if dry_run else SHAPE
    # The dry run times the shipped task model (2.3 M parameters) where a bench takes a checkpoint.
    model = str(TASK_MODEL) if dry_run else f"shape:{SHAPE}"
    # The dry run: two of the tests, from their files only (collecting all ten took most of its time).
    tests = (("tests/engine/test_ask_exact.py", "tests/kv/test_tiers.py",
              "-k", "(tiny and odd and 320x240) or test_offloading_to_host") if dry_run else TEST_FILES)
    # The stage forker imported anyio (with httpx) before pytest loads it as a plugin: it warns that
    # it cannot rewrite anyio's asserts, which no test here needs.
    stages = [Stage(f"tests-{dtype}",
                    ("-m", "pytest", "-q", *tests, "-m", "device_check", "-p", "no:cacheprovider",
                     "-W", "ignore::pytest.PytestAssertRewriteWarning",
                     f"--junitxml={out / f'tests-{dtype}.xml'}"),
                    60 if dry_run else GPU_LIMITS_S[f"tests-{dtype}"],
                    {"VIDSIGHT_TEST_DEVICE": device, "VIDSIGHT_TEST_DTYPE": dtype},
                    junit=out / f"tests-{dtype}.xml")
              for dtype in ("float32", "bfloat16")]
    ask = (("--video-s", "4", "--video-fps", "4", "--workers", "2", "--group-frames", "2") if dry_run else
           ("--video-s", str(ASK_VIDEO_S), "--video-fps", str(ASK_VIDEO_FPS), "--workers", "16",
            "--group-frames", "32"))
    stages.append(Stage("ask", (*vidsight, "bench", "ask", "--shape", shape, "--headline", "--rho", "0.2",
                                "--fps", "1", "--gop", str(ASK_GOP), *ask, "--out", str(out / "ask")),
                        60 if dry_run else GPU_LIMITS_S["ask"], report=out / "ask" / "ask.json"))
    workers = ("1", "2") if dry_run else ("1", "4", "8", "16")
    # ask's video, made again (the same file) when a fresh machine runs this part without ask.
    video = ("--video-s", "4", "--video-fps", "4") if dry_run else (
        "--video-s", str(ASK_VIDEO_S), "--video-fps", str(ASK_VIDEO_FPS))
    stages.append(Stage("decode", (*vidsight, "bench", "decode", *video, "--gop", str(ASK_GOP), "--fps", "1",
                                   "--repeats", "1", "--worker-counts", *workers, "--out", str(out / "ask")),
                        30 if dry_run else GPU_LIMITS_S["decode"], report=out / "ask" / "decode.json"))
    watch = (("--dtype", "float32", "--video-s", "6", "--window-s", "4") if dry_run else
             ("--dtype", "bfloat16", "--video-s", str(WATCH_VIDEO_S), "--window-s", str(WATCH_WINDOW_S)))
    stages.append(Stage("watch", (*vidsight, "bench", "watch", "--model", model, "--suite", "hard", "--videos", "1",
                                  "--flop-videos", "0", *watch, "--root", str(out / "suites"),
                                  "--out", str(out / "watch")),
                        60 if dry_run else GPU_LIMITS_S["watch"], report=out / "watch" / "watch.json"))
    histories = ("200",) if dry_run else tuple(map(str, CHAT_HISTORIES))
    # Budgets count cached tokens summed over layers: the device keeps about a fifth of the longest
    # history (the 7B has 28 layers), host memory as much again, the disk the rest, so every copy runs.
    device_budget = 400 if dry_run else 28 * CHAT_HISTORIES[-1] // 5
    stages.append(Stage("chat", (*vidsight, "bench", "chat", "--model", model, "--policies", *CHAT_POLICIES,
                                 "--histories", *histories, "--timed-patches", "2",
                                 "--history-batch", str(CHAT_HISTORY_BATCH),
                                 "--kv-device-budget", str(device_budget), "--kv-host-budget", str(device_budget),
                                 "--kv-disk", str(out / "kv"), "--out", str(out / "chat")),
                        60 if dry_run else GPU_LIMITS_S["chat"], report=out / "chat" / "chat.json"))
    clients = ("1", "2") if dry_run else tuple(map(str, SERVE_CLIENTS))
    stages.append(Stage("serve", (*vidsight, "bench", "serve", "--model", model, "--device", device,
                                  "--concurrency", *clients, "--requests", clients[-1], "--max-tokens", "8", "--watches", "0",
                                  # Every completion prefills its video, as different videos would.
                                  "--prefix-cache-bytes", "0", "--out", str(out / "serve")),
                        60 if dry_run else GPU_LIMITS_S["serve"], report=out / "serve" / "serve.json"))
    return stages
