"""Interval-parallel decoding (QuickVideo's QuickCodec): keyframe-aligned spans decoded side by side.

The wanted frames' GOPs are grouped into contiguous spans, each starting at a keyframe, so every
span decodes on its own; several single-threaded decoders fill one preallocated frame buffer.
When samples are much sparser than GOPs, each GOP is decoded only up to its last wanted frame
after a seek (QuickVideo's appendix B), and the choice is reported in ``FrameBatch.strategy``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from vidsight.errors import ConfigError
from vidsight.ingest.decode import DecodeConfig, FrameSink, decode_span
from vidsight.ingest.probe import probe
from vidsight.ingest.types import FrameBatch, VideoInfo

# Seek when the mean gap between samples exceeds this many GOPs: most of each GOP is then unwanted.
SEEK_GAP_GOPS = 2.0
# More spans than workers keeps every worker busy to the end and lets early frames finish first.
SPANS_PER_WORKER = 4


def gop_spans(info: VideoInfo, wanted: np.ndarray) -> list[tuple[int, int]]:
    """``(keyframe index, last wanted index)`` of every GOP holding a wanted frame, in order."""
    gops = info.gop_index_of(wanted)
    starts = np.flatnonzero(np.diff(gops, prepend=-1))
    ends = np.append(starts[1:], len(wanted)) - 1
    return [(int(info.keyframe_indices[gops[s]]), int(wanted[e])) for s, e in zip(starts, ends)]


def plan_spans(info: VideoInfo, wanted: np.ndarray, spans: int) -> list[tuple[int, int]]:
    """Group the GOPs into at most ``spans`` contiguous spans of about equal decoding work."""
    per_gop = gop_spans(info, wanted)
    # Frames decoded per GOP in a contiguous run: from its keyframe to the next GOP's keyframe.
    firsts = np.array([f for f, _ in per_gop])
    work = np.diff(np.append(firsts, per_gop[-1][1] + 1))
    bounds = np.searchsorted(np.cumsum(work), np.linspace(0, work.sum(), spans + 1)[1:-1], side="right")
    groups = np.split(np.arange(len(per_gop)), np.unique(bounds))
    return [(per_gop[g[0]][0], per_gop[g[-1]][1]) for g in groups if len(g)]


def choose_strategy(info: VideoInfo, wanted: np.ndarray) -> str:
    """``"seek"`` when samples are far sparser than GOPs, else ``"intervals"``."""
    if len(wanted) < 2:
        return "seek"
    gap = float(np.mean(np.diff(wanted)))
    return "seek" if gap > SEEK_GAP_GOPS * float(np.mean(info.gop_sizes)) else "intervals"


def decode_schedule(info: VideoInfo, wanted: np.ndarray, spans: int, strategy: str = "auto"
                    ) -> tuple[str, list[tuple[int, int]]]:
    """The strategy (``auto`` resolved) and the ``(keyframe, last wanted)`` spans to decode.

    Seeking gives one span per GOP; intervals group the GOPs into at most ``spans`` spans.
    """
    if strategy == "auto":
        strategy = choose_strategy(info, wanted)
    return strategy, gop_spans(info, wanted) if strategy == "seek" else plan_spans(info, wanted, spans)


def decode_parallel(
    path: str | Path,
    indices: np.ndarray | None = None,
    config: DecodeConfig = DecodeConfig(),
    info: VideoInfo | None = None,
    workers: int | None = None,
    strategy: str = "auto",
    on_frame: Callable[[int], None] | None = None,
) -> FrameBatch:
    """Decode the frames at ``indices`` with ``workers`` decoders at once; same frames as `decode_frames`.

    Args:
        path: Video file.
        indices: Frame indices to keep; ``None`` keeps every frame.
        config: Output size and codec information, as for `decode_frames`.
        info: The file's `probe` result, if known.
        workers: Concurrent decoders (default: the CPU count).
        strategy: ``"intervals"``, ``"seek"`` or ``"auto"`` (chosen from the sampling gap and GOP size).
        on_frame: Called with the number of wanted frames produced so far.
    """
    workers = (os.cpu_count() or 1) if workers is None else workers
    if workers < 1:
        raise ConfigError(f"workers must be at least 1, got {workers}")
    if strategy not in ("auto", "intervals", "seek"):
        raise ConfigError(f"strategy must be auto, intervals or seek, got {strategy!r}")
    info = info or probe(path)
    sink = FrameSink(path, info, indices, config, on_frame)
    strategy, spans = decode_schedule(info, sink.wanted, workers * SPANS_PER_WORKER, strategy)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vidsight-decode") as pool:
        # Submitted earliest first, so the start of the video is ready first.
        list(pool.map(lambda span: decode_span(sink, *span, threads="NONE"), spans))
    return sink.batch(strategy)
