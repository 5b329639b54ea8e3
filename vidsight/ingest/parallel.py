"""Interval-parallel decoding (QuickVideo's QuickCodec): keyframe-aligned spans decoded side by side.

The wanted frames' GOPs are grouped into contiguous spans, each starting at a keyframe, so every
span decodes on its own; several single-threaded decoders fill one preallocated frame buffer:
threads by default, or processes writing into private shared memory (``backend="processes"``).
When samples are much sparser than GOPs, each GOP is decoded only up to its last wanted frame
after a seek (QuickVideo's appendix B), and the choice is reported in ``FrameBatch.strategy``.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np

from vidsight.errors import ConfigError, VideoError
from vidsight.ingest.decode import DecodeConfig, FrameSink, decode_span
from vidsight.ingest.probe import probe
from vidsight.ingest.types import FrameBatch, VideoInfo

# Seek when the mean gap between samples exceeds this many GOPs: most of each GOP is then unwanted.
SEEK_GAP_GOPS = 2.0
# More spans than workers keeps every worker busy to the end and lets early frames finish first.
SPANS_PER_WORKER = 4
BACKENDS = ("threads", "processes")


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

    Seeking gives one span per GOP; intervals group the GOPs into at most ``spans`` spans. A stream
    without timestamps has nothing to seek by: one ``sequential`` span from its start.
    """
    if not info.timed:
        return "sequential", [(0, int(wanted[-1]))]
    if strategy == "auto":
        strategy = choose_strategy(info, wanted)
    return strategy, gop_spans(info, wanted) if strategy == "seek" else plan_spans(info, wanted, spans)


def span_threads(strategy: str) -> str:
    """FFmpeg's threading in each span's decoder: one thread each where decoders work side by
    side, FFmpeg's own threads for a lone sequential pass."""
    return "AUTO" if strategy == "sequential" else "NONE"


def decode_parallel(
    path: str | Path,
    indices: np.ndarray | None = None,
    config: DecodeConfig = DecodeConfig(),
    info: VideoInfo | None = None,
    workers: int | None = None,
    strategy: str = "auto",
    on_frame: Callable[[int], None] | None = None,
    backend: str = "threads",
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
        backend: ``"threads"`` (FFmpeg releases the GIL while decoding) or ``"processes"``
            (started by a fork server, so POSIX only; frames go through shared memory, unlinked
            however the decode ends).
    """
    workers = (os.cpu_count() or 1) if workers is None else workers
    if workers < 1:
        raise ConfigError(f"workers must be at least 1, got {workers}")
    if strategy not in ("auto", "intervals", "seek"):
        raise ConfigError(f"strategy must be auto, intervals or seek, got {strategy!r}")
    if backend not in BACKENDS:
        raise ConfigError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "processes" and "forkserver" not in multiprocessing.get_all_start_methods():
        raise ConfigError("decoding in processes needs a fork server, which this platform lacks; use threads")
    info = info or probe(path)
    if backend == "processes":
        return _decode_in_processes(path, indices, config, info, workers, strategy, on_frame)
    sink = FrameSink(path, info, indices, config, on_frame)
    strategy, spans = decode_schedule(info, sink.wanted, workers * SPANS_PER_WORKER, strategy)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vidsight-decode") as pool:
        # Submitted earliest first, so the start of the video is ready first.
        list(pool.map(lambda span: decode_span(sink, *span, threads=span_threads(strategy)), spans))
    return sink.batch(strategy)


_CHILD: tuple[FrameSink, shared_memory.SharedMemory] | None = None  # a decoding process's sink and buffer


def _adopt(path, info: VideoInfo, indices: np.ndarray, config: DecodeConfig, buffer_name: str) -> None:
    global _CHILD
    # Attaching registers the name with the parent's resource tracker once more; the parent unlinks it.
    buffer = shared_memory.SharedMemory(buffer_name)
    _CHILD = FrameSink(path, info, indices, config, buffer=buffer.buf), buffer


def _decode_in_child(first: int, last: int) -> tuple[np.ndarray, list, int]:
    """Decode one span into the shared buffer; what the parent's sink needs to know about it."""
    sink = _CHILD[0]
    before, bad_before = sink.got.copy(), sink.bad_packets
    decode_span(sink, first, last, "NONE")
    slots = np.flatnonzero(sink.got & ~before)
    return slots, [sink.codec[slot] for slot in slots], sink.bad_packets - bad_before


def _decode_in_processes(path, indices, config: DecodeConfig, info: VideoInfo, workers: int, strategy: str,
                         on_frame) -> FrameBatch:
    # A fork server, not plain fork: forking a process whose other threads hold locks can deadlock.
    context = multiprocessing.get_context("forkserver")
    # The server imports this module (torch, PyAV) once, so a pool's workers start in milliseconds
    # rather than two seconds each call; no effect once the server runs.
    context.set_forkserver_preload(["__main__", __name__])
    buffer = shared_memory.SharedMemory(create=True, size=max(1, FrameSink.frame_bytes(info, indices, config)))
    sink = None
    try:
        sink = FrameSink(path, info, indices, config, on_frame, buffer=buffer.buf)
        strategy, spans = decode_schedule(info, sink.wanted, workers * SPANS_PER_WORKER, strategy)
        setup = (path, info, sink.wanted, config, buffer.name)
        try:
            with ProcessPoolExecutor(workers, mp_context=context, initializer=_adopt, initargs=setup) as pool:
                for result in pool.map(_decode_in_child, *zip(*spans)):
                    sink.absorb(*result)
        except BrokenProcessPool as exc:
            raise VideoError(f"{path}: a decoding process died ({exc})") from exc
        batch = sink.batch(strategy)
        batch.data = batch.data.clone()  # out of the segment, which goes now
        return batch
    finally:
        sink = None  # drops the views of the segment, so it can close
        try:
            buffer.close()
        except BufferError:  # a traceback on its way out still holds a view; the mapping goes with it
            pass
        buffer.unlink()
