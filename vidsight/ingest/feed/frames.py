"""Sampled frames handed over as they are decoded, so prefill can start on the first group early.

QuickVideo's overlap (section 3.3): many more keyframe-aligned spans than workers, submitted
earliest first; a consumer waits only until the frames it needs next are in the buffer.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from vidsight.errors import ConfigError, VideoError
from vidsight.ingest.decode import DecodeConfig, FrameSink, decode_span
from vidsight.ingest.dynamic import MotionPruneConfig
from vidsight.ingest.parallel import decode_schedule, span_threads
from vidsight.ingest.types import CodecInfo, FrameBatch, VideoInfo

log = logging.getLogger(__name__)

# Spans per worker when a consumer overlaps with decoding: small spans free the first frames early.
OVERLAP_SPANS_PER_WORKER = 16


class FrameFeed:
    """The sampled frames of one video, available in order as decoding proceeds.

    Build one with `FrameFeed.decoded` (all frames already there) or `FrameFeed.background`
    (interval-parallel decoding in worker threads). A frame the decoder could not produce is
    replaced by the nearest earlier one (the next one for the first frame) so the model still
    sees one frame per sample time; ``frames_lost`` counts them.
    """

    def __init__(self, data: torch.Tensor, pts_s: torch.Tensor, indices: torch.Tensor, strategy: str,
                 codec: list[CodecInfo | None], motion: MotionPruneConfig | None):
        self.data, self.pts_s, self.indices, self.strategy = data, pts_s, indices, strategy
        self._codec = codec
        self.motion = motion  # the rule the decoders judged motion by; None when they did not
        self._sink: FrameSink | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._spans: list[tuple[int, Future]] = []  # (last slot the span fills, its task)
        self.decode_s = 0.0
        self._lost = 0
        self._started = time.perf_counter()

    @classmethod
    def decoded(cls, batch: FrameBatch, decode_s: float = 0.0) -> "FrameFeed":
        feed = cls(batch.data, batch.pts_s, batch.indices, batch.strategy, batch.codec, batch.motion)
        feed._lost, feed.decode_s = batch.frames_lost, decode_s
        return feed

    @classmethod
    def background(cls, path: str | Path, indices: np.ndarray, info: VideoInfo,
                   config: DecodeConfig = DecodeConfig(trim_gops=True), workers: int | None = None,
                   on_frame: Callable[[int], None] | None = None) -> "FrameFeed":
        """Start decoding ``indices`` of ``path`` with ``workers`` threads, earliest spans first.

        ``config`` says how (GOP trimming, resizing in the workers); each worker decodes
        single-threaded whatever its ``threads`` says.
        """
        workers = (os.cpu_count() or 1) if workers is None else workers
        if workers < 1:
            raise ConfigError(f"workers must be at least 1, got {workers}")
        sink = FrameSink(path, info, indices, dataclasses.replace(config, threads="NONE"), on_frame)
        strategy, spans = decode_schedule(info, sink.wanted, workers * OVERLAP_SPANS_PER_WORKER)
        feed = cls(sink.data, torch.from_numpy(info.pts_s[sink.wanted]), torch.from_numpy(sink.wanted), strategy,
                   sink.codec, sink.judging)
        feed._sink = sink
        feed._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="vidsight-feed")
        last_slots = np.searchsorted(sink.wanted, [last for _, last in spans], side="right") - 1
        feed._spans = [(int(slot), feed._pool.submit(decode_span, sink, first, last, span_threads(strategy)))
                       for (first, last), slot in zip(spans, last_slots)]
        return feed

    def __len__(self) -> int:
        return self.data.shape[0]

    @property
    def height(self) -> int:
        return self.data.shape[1]

    @property
    def width(self) -> int:
        return self.data.shape[2]

    @property
    def decoding(self) -> bool:
        """Whether background decoders are still at work."""
        return any(not task.done() for _, task in self._spans)

    def frames(self, start: int, stop: int) -> torch.Tensor:
        """``(stop - start, H, W, 3)`` frames, waiting for the decoder if they are not out yet."""
        if self._sink is not None:
            self._wait_through(stop - 1)
            self._fill_lost(start, stop)
        return self.data[start:stop]

    def codec(self, start: int, stop: int) -> list[CodecInfo | None]:
        """The codec signals of frames ``start`` to ``stop - 1`` once `frames` returned them; None
        for a frame the decoder lost (another stands in for it) or when none were collected."""
        return [self._codec[k] if k < len(self._codec) else None for k in range(start, stop)]

    def _wait_through(self, slot: int) -> None:
        for last, task in self._spans:
            task.result()  # re-raises a worker's error
            if last >= slot:
                break
        if all(task.done() for _, task in self._spans) and not self.decode_s:
            self.decode_s = time.perf_counter() - self._started

    def _fill_lost(self, start: int, stop: int) -> None:
        got = self._sink.got
        for slot in np.flatnonzero(~got[start:stop]) + start:
            earlier = np.flatnonzero(got[:slot])
            if len(earlier):
                self.data[slot] = self.data[earlier[-1]]
                continue
            self._wait_through(len(got) - 1)
            later = np.flatnonzero(got)
            if not len(later):
                raise VideoError(f"{self._sink.path}: none of the {len(got)} requested frames could be decoded")
            self.data[slot] = self.data[later[0]]

    @property
    def frames_lost(self) -> int:
        return int((~self._sink.got).sum()) if self._sink is not None else self._lost

    def close(self) -> None:
        """Let the workers finish (or drop their queued spans if one failed) and stop them."""
        if self._pool is None:
            return
        try:
            self._wait_through(len(self) - 1)
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self.frames_lost:
            log.warning("%s: %d of %d requested frames could not be decoded (%d damaged packets); each was "
                        "replaced by the nearest earlier frame", self._sink.path, self.frames_lost, len(self),
                        self._sink.bad_packets)

    def __enter__(self) -> "FrameFeed":
        return self

    def __exit__(self, *exc) -> None:
        if self._pool is not None and exc[0] is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        self.close()
