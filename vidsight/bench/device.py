"""`vidsight bench device`: the GPU check, one command that proves the CUDA paths and times the
seeds' headline workloads on the 7B shape within a GPU lease (DEVELOPERS.md: about 15 minutes a
session, start included, at most 10 minutes a command).

Stages run in this order, each a process of its own with a time limit, so a hang or a crash
costs one stage, not the rest (forked from one that imported torch and transformers once,
`bench/forked.py`); the JSON and the markdown summary are rewritten after every stage, so a run
cut off early still reports what it finished; each stage's whole output is in ``out/logs/``:

1. ``tests-float32`` and ``tests-bfloat16``: the exactness tests (``-m device_check``) on the device
   through the tests' one switch (``VIDSIGHT_TEST_DEVICE``, ``VIDSIGHT_TEST_DTYPE``);
2. ``ask``: QuickVideo's setting on the Qwen2.5-VL-7B shape (bfloat16): a generated 30-minute
   1280x720 H.264 video sampled at 1 fps (Qwen's own frame-size rule keeps each frame under
   448x448 at this length), 16 decode workers, groups of 32 frames, key-norm-small at rho 0.2;
   full compute against QuickVideo's pipeline and against it with motion pruning;
3. ``decode``: decoding the same file at 1, 4, 8 and 16 workers beside the other decoders that load;
4. ``watch``: CodecSight's windows (40 s, stride 20 %, 2 fps), Full-Comp against pruning + refresh;
5. ``chat``: per-patch prefill and question latency at 1k-40k cached tokens for full, rekv, mosaic
   and resv with tiers on (a device budget below the history, host memory and disk);
6. ``serve``: completions per second at 1, 8 and 32 clients against a server on loopback.

``dry_run`` runs the same stages on the CPU with the ``small`` shape, short videos and a few
tests, in about half a minute, so the check cannot rot while no GPU is at hand (the test suite runs it).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from vidsight.bench.device_stages import Stage, check_stages
from vidsight.bench.forked import StageForker

TAIL_CHARS = 4000


def run_device_check(out: str | Path, dry_run: bool = False, only: tuple[str, ...] = (),
                     limits: dict[str, float] | None = None, progress=lambda line: None) -> dict:
    """Run every stage (or those named in ``only``, with ``limits`` replacing their time limits in
    seconds); writes ``out/device-check.json`` and ``.md`` after each."""
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    report = {"dry_run": dry_run, "machine": _machine(), "stages": {}}
    stages = [dataclasses.replace(s, timeout_s=(limits or {}).get(s.name, s.timeout_s))
              for s in check_stages(out, dry_run) if not only or s.name in only]
    with StageForker(_repository_root()) as forker:
        report["stages_forked"] = forker.forks
        for stage in stages:
            progress(f"{stage.name}: up to {stage.timeout_s:.0f} s")
            report["stages"][stage.name] = result = _run_stage(stage, out, forker)
            progress(f"{stage.name}: {result['status']} in {result['seconds']:.1f} s")
            _write(report, out)
    return report


def _machine() -> dict:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cpu_count": os.cpu_count(),
            "cuda": torch.cuda.is_available()}
    for name in ("transformers", "av", "fastapi"):
        try:
            info[name] = __import__(name).__version__
        except ImportError:
            info[name] = None
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        info.update(gpu=properties.name, gpu_memory_gib=round(properties.total_memory / 2**30, 1),
                    cuda_runtime=torch.version.cuda)
    return info


def _run_stage(stage: Stage, out: Path, forker: StageForker) -> dict:
    for stale in (stage.report, stage.junit):   # an earlier run's files must not pass for this one's
        if stale is not None:
            stale.unlink(missing_ok=True)
    logs = out / "logs"
    logs.mkdir(exist_ok=True)
    stdout_path, stderr_path = logs / f"{stage.name}.out", logs / f"{stage.name}.err"
    start = time.perf_counter()
    try:
        code = forker.run(stage.args, stage.env, _repository_root(), stage.timeout_s, stdout_path, stderr_path)
        status = (f"timed out after {stage.timeout_s:.0f} s" if code is None else
                  "ok" if code == 0 else f"failed (exit {code})")
    except RuntimeError as exc:
        status = f"failed ({exc})"
    stdout, stderr = (path.read_text(errors="replace") if path.exists() else "" for path in (stdout_path, stderr_path))
    result = {"status": status, "seconds": time.perf_counter() - start, "command": " ".join(stage.args),
              "output": stdout[-TAIL_CHARS:], "errors": stderr[-TAIL_CHARS:]}
    if stage.junit is not None and stage.junit.exists():
        result["tests"] = _junit_counts(stage.junit)
    if stage.report is not None and stage.report.exists():
        result["report"] = json.loads(stage.report.read_text())
        result["headline"] = HEADLINES[stage.name](result["report"])
    return result


def _repository_root() -> Path:
    """Where ``tests/`` is: the tests stages run pytest from there."""
    return Path(__file__).resolve().parents[2]


def _junit_counts(path: Path) -> dict:
    suite = ElementTree.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    failed = [f"{case.get('classname')}::{case.get('name')}" for case in suite.iter("testcase")
              if case.find("failure") is not None or case.find("error") is not None]
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    return {**counts, "passed": counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"],
            "failed": failed}


def _ask_headline(report: dict) -> list[str]:
    runs = report["runs"]
    return [f"{name}: {run['wall_s']:.1f} s end to end ({run['speedup']:.2f}x full compute), prefill peak "
            f"{run['prefill_peak_bytes'] / 2**30:.1f} GiB, {run['kept_visual_tokens']}/{run['visual_tokens']} "
            f"visual tokens kept, stages " + ", ".join(f"{k} {v:.1f}" for k, v in run["stages_s"].items())
            for name, run in runs.items()]


def _decode_headline(report: dict) -> list[str]:
    lines = []
    for run in report["runs"]:
        for name, method in run["methods"].items():
            efficiency = f", {method['parallel_efficiency']:.0%} of ideal" if "parallel_efficiency" in method else ""
            lines.append(f"{run['sampled_frames']} frames, {name}: {method['seconds']:.2f} s "
                         f"({method['speedup']:.2f}x one thread{efficiency}), identical {method['identical']}")
    return lines + [f"{name}: {why}" for name, why in report.get("unavailable", {}).items()]


def _watch_headline(report: dict) -> list[str]:
    stride_s = report["window_s"] * report["stride_fraction"]
    lines = []
    for name, config in report["configs"].items():
        window = config["mean_per_window"]
        busy = sum(window[stage] for stage in ("decode", "preprocess", "vision", "prefill", "carry"))
        # A real-time stream needs one window judged per stride; windows of several streams take turns.
        lines.append(f"{name}: vision + prefill {1000 * config['vision_prefill_s']:.0f} ms per window "
                     f"({config['speedup_vision_prefill']:.2f}x Full-Comp), {1000 * busy:.0f} ms in all, so "
                     f"{int(stride_s // busy)} real-time streams per {stride_s:g}-s stride, F1 {config['f1']:.2f}")
    return lines


def _chat_headline(report: dict) -> list[str]:
    rows, frames_per_patch = report["rows"], 2
    lines = []
    for policy in dict.fromkeys(row["policy"] for row in rows):
        mine = [row for row in rows if row["policy"] == policy]
        first, last = mine[0], mine[-1]
        lines.append(f"{policy}: per-patch prefill {1000 * first['patch_prefill_s']:.1f} ms at "
                     f"{first['history_tokens']} cached tokens, {1000 * last['patch_prefill_s']:.1f} ms at "
                     f"{last['history_tokens']} ({last['patch_prefill_s'] / first['patch_prefill_s']:.2f}x; "
                     f"{1000 * last['patch_prefill_s'] / frames_per_patch:.1f} ms per frame, "
                     f"the policy choosing {1000 * last['patch_policy_s']:.1f} ms a patch), question "
                     f"{1000 * last['question_ttft_s']:.0f} ms; tiers {last['tokens_by_tier']}")
    return lines


def _serve_headline(report: dict) -> list[str]:
    return [f"{level['concurrency']} clients: {level['requests_per_s']:.2f} completions/s, TTFT p50 "
            f"{1000 * level['ttft_s']['p50']:.0f} ms, {level['errors']} errors" for level in report["completions"]]


HEADLINES = {"ask": _ask_headline, "decode": _decode_headline, "watch": _watch_headline, "chat": _chat_headline,
             "serve": _serve_headline}


def _write(report: dict, out: Path) -> None:
    (out / "device-check.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "device-check.md").write_text(format_device_report(report))


def format_device_report(report: dict) -> str:
    """The markdown summary: the machine, then each stage's status and its bench's own table."""
    machine = report["machine"]
    lines = [f"# vidsight device check{' (dry run)' if report['dry_run'] else ''}", "",
             ", ".join(f"{k} {v}" for k, v in machine.items()), ""]
    if report.get("stages_forked") is False:
        lines += ["Stages ran as fresh processes: a child forked after the imports could not use CUDA.", ""]
    for name, stage in report["stages"].items():
        lines += [f"## {name}: {stage['status']}, {stage['seconds']:.1f} s", "", f"`{stage['command']}`", ""]
        if "tests" in stage:
            t = stage["tests"]
            lines += [f"{t['passed']} passed, {t['failures']} failed, {t['errors']} errors, {t['skipped']} skipped",
                      *(f"- FAILED {name}" for name in t["failed"]), ""]
        lines += [*(f"- {line}" for line in stage.get("headline", [])), ""]
        text = stage["output"] if stage["status"] == "ok" else stage["output"] + stage["errors"]
        lines += ["```", text.strip()[-TAIL_CHARS:], "```", ""]
    return "\n".join(lines)


def stage_names(dry_run: bool = False) -> list[str]:
    return [stage.name for stage in check_stages(Path("."), dry_run)]

