"""`vidsight bench chat`: per-patch prefill and question latency against cached history, per policy.

One stream, one random-weight model shape (or a checkpoint), one question. The history is built in
bulk: the stream is prefilled with a cheap bounded policy (``recent`` with a 1024-token window; with
random weights the cached values do not matter, only their number) until the cache holds each
history length; there the session is forked once per policy and the same next temporal patches go
through each policy's own per-patch path (its selection included), then the same question is
asked (the shape of V-Rex's Fig. 13: per-frame latency against cache length).

Accuracy on the chat suite is `bench.chat_accuracy`.
"""

from __future__ import annotations

import itertools
import os
import platform
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from vidsight.bench.decode import bench_video
from vidsight.bench.report import save_figure, write_report
from vidsight.engine.chat import MAX_BATCH_PATCHES, ChatConfig, ChatSession
from vidsight.engine.config import GenerationConfig
from vidsight.errors import ConfigError
from vidsight.ingest.stream import StreamSource
from vidsight.ingest.synthetic import SyntheticSpec
from vidsight.kv.policies import RecentConfig, RecentPolicy, make_policy
from vidsight.kv.store import traffic_of
from vidsight.kv.tiers import TierConfig
from vidsight.models import load_model
from vidsight.models.shapes import MODEL_SHAPES, build_shape

HISTORY_TOKENS = (1000, 4000, 16000, 40000)
POLICY_NAMES = ("full", "recent", "rekv")
TIMED_PATCHES = 4
QUESTION = "What colour was the square at the start?"
STREAM_FPS = 1.0
HISTORY_WINDOW = 1024
STREAM_BUILT = ("mosaic", "resv")


def chat_video(directory: str | Path, seconds: int) -> Path:
    """A generated 320x240 stream long enough for ``seconds`` samples at 1 fps, made once and reused."""
    return bench_video(directory, SyntheticSpec(width=320, height=240, fps=4, duration_s=seconds, gop=16,
                                                square_size=24))


def run_chat_bench(shape: str = "small", histories: tuple[int, ...] = HISTORY_TOKENS,
                   policies: tuple[str, ...] = POLICY_NAMES, timed_patches: int = TIMED_PATCHES,
                   dtype: str = "bfloat16", out: str | Path = "out/bench", progress: bool = False,
                   settings: dict[str, dict] | None = None, tiers: TierConfig | None = None,
                   model: str | Path | None = None, history_batch: int = 1,
                   on_point: Callable[[dict], None] | None = None) -> dict:
    """Time each policy's per-patch prefill and question at each history length.

    Args:
        shape: A random-weight model shape (`MODEL_SHAPES`); ignored when ``model`` is given.
        histories: Cached tokens at which to time, ascending.
        policies: Policy names with their default settings.
        timed_patches: Temporal patches timed per policy and history.
        dtype: ``bfloat16`` or ``float32``.
        out: Where the generated stream is kept.
        progress: Print each history as it is reached.
        settings: Per policy name, its config's fields to change from the defaults.
        tiers: KV tiers for the stream (its forks copy them); None keeps all KV in one device buffer.
        model: A checkpoint to time instead of a shape (trained keys cluster and select as random
            ones do not: the point for policies that retrieve by content at frame steps).
        history_batch: Temporal patches prefilled together while the history is built (Mosaic's
            batched execution: fewer, larger steps, which a GPU lease needs to reach 40k tokens
            with the policies that follow the whole stream); the timed patches go one by one.
        on_point: Called with the report so far after each history length (a run cut off
            early keeps the points it reached).
    """
    settings = settings or {}
    if model is None and shape not in MODEL_SHAPES:
        raise ConfigError(f"unknown model shape {shape!r}; choose one of {', '.join(MODEL_SHAPES)}")
    if not histories or list(histories) != sorted(histories) or histories[0] < 1 or timed_patches < 1:
        raise ConfigError("histories must be positive and ascending, and timed_patches positive")
    if not 1 <= history_batch <= MAX_BATCH_PATCHES:
        raise ConfigError(f"history_batch must be in [1, {MAX_BATCH_PATCHES}], got {history_batch}")
    for name in policies:
        make_policy(name, **settings.get(name.partition(":")[0], {}))  # a bad name or setting fails before the long work
    torch_dtype = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    adapter = build_shape(shape, dtype=torch_dtype) if model is None else load_model(model, dtype=torch_dtype)
    spec = adapter.vision
    tokens_per_patch = spec.max_tokens_per_patch
    # Frames resized within the shape's pixel bound hold at most tokens_per_patch, often fewer: half
    # as many frames again as that bound implies (a fifth more left the small shape's 40k fill short of margin).
    frames_needed = int(1.5 * spec.temporal_patch_size * (histories[-1] // tokens_per_patch
                                                       + len(histories) * (timed_patches + history_batch) + 2))
    video = chat_video(Path(out) / "chat-stream", int(frames_needed / STREAM_FPS) + 2)
    frames = iter(StreamSource(video, fps=STREAM_FPS))
    session = ChatSession(adapter, RecentPolicy(RecentConfig(window_tokens=HISTORY_WINDOW)), ChatConfig(fps=STREAM_FPS),
                          tiers)
    # A policy that organises memory as the stream arrives (Mosaic's clusters) cannot start from a
    # fork of a history it never saw: it follows the whole stream in a session of its own.
    own = {name: ChatSession(adapter, make_policy(name, **settings.get(name.partition(":")[0], {})),
                             ChatConfig(fps=STREAM_FPS), tiers)
           for name in policies if name.partition(":")[0] in STREAM_BUILT}
    header = {"shape": shape if model is None else None, "model": None if model is None else str(model), "dtype": dtype,
              "tokens_per_patch": tokens_per_patch, "timed_patches": timed_patches, "history_batch": history_batch,
              "tiers": None if tiers is None else {"device_tokens": tiers.device_tokens,
                                                    "host_tokens": tiers.host_tokens, "disk": tiers.disk_dir is not None},
              "settings": {name: settings.get(name.partition(":")[0], {}) for name in policies},
              "device": str(adapter.device), "cpu_count": os.cpu_count(),
              "machine": platform.processor() or platform.machine()}
    rows = []
    for history in histories:
        while session.cache.length < history:
            before = session.frames_seen
            # No more patches than the history still needs (each holds at most tokens_per_patch):
            # each point lands within a patch of its length, as one patch a step does.
            batch = min(history_batch, -(-(history - session.cache.length) // tokens_per_patch))
            chunk = list(itertools.islice(frames, spec.temporal_patch_size * batch))
            for follower in (session, *own.values()):
                follower.push(chunk, batch_patches=batch)
            if session.frames_seen == before:
                raise ConfigError(f"{video}: the stream ended at {session.cache.length} cached tokens")
        timed = list(itertools.islice(frames, spec.temporal_patch_size * timed_patches))
        for name in policies:
            fork = own.get(name) or session.fork(make_policy(name, **settings.get(name.partition(":")[0], {})))
            first_patch = len(fork.patches)
            if fork.cache.offload is not None:
                fork.cache.offload.reset_peak()
            before = traffic_of(fork.cache)
            fork.push(timed)
            answer = fork.ask(QUESTION, GenerationConfig(max_new_tokens=1))
            timed_steps, moved = fork.patches[first_patch:], traffic_of(fork.cache).since(before)
            rows.append({
                "history_tokens": session.cache.length, "policy": name,
                "patch_prefill_s": float(np.median([p.per_patch_s for p in timed_steps])),
                "patch_attended_tokens": float(np.mean([p.attended_tokens for p in timed_steps])),
                "patch_policy_s": float(np.median([p.policy_s / p.patches for p in timed_steps])),
                "question_policy_s": answer.stats.policy_s,
                "question_ttft_s": answer.stats.ttft_s, "question_attended_tokens": answer.stats.attended_tokens,
                "question_retrieved_tokens": answer.stats.retrieved_tokens,
                "cache_bytes": fork.cache.nbytes,
                "device_peak_tokens": moved.device_peak_tokens if tiers is not None else None,
                "tokens_by_tier": fork.cache.tokens_by_tier(),
                "bytes_moved": moved.bytes_moved, "read_bytes": moved.read_bytes,
                "whole_read_bytes": moved.whole_read_bytes,
                "policy_report": fork.policy.report(),
            })
            if name not in own:
                fork.close()
            if progress:
                print(f"{session.cache.length:>6} tokens, {name:<6}: {rows[-1]['patch_prefill_s'] * 1000:7.0f} ms "
                      f"per patch, question {answer.stats.ttft_s * 1000:7.0f} ms", flush=True)
        session.push(timed)  # the timed frames become history, as in a stream (own sessions have them)
        report = {**header, "rows": rows, "growth": _growth(rows, policies)}
        if on_point is not None:
            on_point(report)
    for follower in (session, *own.values()):
        follower.close()
    return report


def _growth(rows: list[dict], policies) -> dict[str, float]:
    """Per policy: per-patch latency at the longest history over the shortest."""
    growth = {}
    for name in policies:
        mine = [r for r in rows if r["policy"] == name]
        growth[name] = mine[-1]["patch_prefill_s"] / mine[0]["patch_prefill_s"]
    return growth


def _timed(report: dict) -> str:
    return f"model {report['model']}" if report.get("model") else f"shape {report['shape']}"


def format_chat_report(report: dict) -> str:
    changed = "; ".join(f"{name} {s}" for name, s in report["settings"].items() if s) or "defaults"
    lines = [f"{_timed(report)} ({report['dtype']}), {report['tokens_per_patch']} tokens per temporal patch, "
             f"{report['timed_patches']} patches timed per point (median), history built "
             f"{report['history_batch']} patch{'es' if report['history_batch'] > 1 else ''} a step, on "
             f"{report['device']} with {report['cpu_count']} CPUs; policy settings: {changed}", "",
             f"{'history':>8} {'policy':<7} {'ms/patch':>9} {'choosing':>8} {'attended':>9} {'TTFT ms':>8} "
             f"{'choosing':>8} {'q attended':>10} "
             f"{'retrieved':>9} {'device MiB':>10} {'peak tok':>9} {'moved MiB':>9}"
             + (f" {'whole':>7}" if report["tiers"] else "")]
    for r in report["rows"]:
        peak = "" if r["device_peak_tokens"] is None else r["device_peak_tokens"]
        lines.append(f"{r['history_tokens']:>8} {r['policy']:<7} {r['patch_prefill_s'] * 1000:9.0f} "
                     f"{r['patch_policy_s'] * 1000:8.1f} {r['patch_attended_tokens']:9.0f} "
                     f"{r['question_ttft_s'] * 1000:8.0f} {r['question_policy_s'] * 1000:8.1f} "
                     f"{r['question_attended_tokens']:10.0f} {r['question_retrieved_tokens']:9.0f} "
                     f"{r['cache_bytes'] / 2**20:10.1f} {peak:>9} {sum(r['bytes_moved'].values()) / 2**20:9.1f}"
                     + (f" {_whole_share(r):>7}" if report["tiers"] else ""))
    if report["tiers"]:
        lines.insert(1, f"KV tiers: {report['tiers']} (device MiB: the device tier after the question; peak tok: "
                        "the most tokens, summed over layers, on the device at any moment of the timed work; "
                        "whole: the share of bytes read up from host and disk in blocks wanted whole)")
    lines.insert(1, "choosing: of the ms before it, the policy's own upkeep and choice (its select calls)")
    lines.append("")
    lines += [f"{name}: per-patch latency at the longest history / the shortest = {g:.2f}x"
              for name, g in report["growth"].items()]
    return "\n".join(lines)


def _whole_share(row: dict) -> str:
    read = sum(row["read_bytes"].values())
    return f"{sum(row['whole_read_bytes'].values()) / read:.0%}" if read else "-"


def plot_chat_report(report: dict, path: str | Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (patch, question) = plt.subplots(1, 2, figsize=(11, 4))
    for name in report["growth"]:
        mine = [r for r in report["rows"] if r["policy"] == name]
        x = [r["history_tokens"] for r in mine]
        patch.plot(x, [r["patch_prefill_s"] * 1000 for r in mine], marker="o", label=name)
        question.plot(x, [r["question_ttft_s"] * 1000 for r in mine], marker="o", label=name)
    for axis, title in ((patch, "per-patch prefill"), (question, "question time to first token")):
        axis.set(xscale="log", xlabel="cached tokens", ylabel="ms", title=f"{title}, {_timed(report)}")
        axis.legend()
    return save_figure(fig, path)


def write_chat_report(report: dict, out: str | Path) -> tuple[Path, Path]:
    return write_report(report, out, "chat", plot_chat_report)
