"""Sliding windows over a live source's sampled frames (CodecSight's watch protocol)."""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

from vidsight.errors import ConfigError

if TYPE_CHECKING:
    from vidsight.ingest.stream import SampledFrame


@dataclasses.dataclass(frozen=True)
class WindowConfig:
    """Sliding windows over the sampled frames: ``[k * stride, k * stride + window)``.

    Defaults are CodecSight's: 40-second windows, a stride of 20 % of the window, 2 fps.

    Attributes:
        window_s: Window length in seconds.
        stride_fraction: Stride as a share of the window.
        fps: Sampling rate.
        align_keyframes: Start each window (and so the overlap with the window before) at the
            first sampled frame of a GOP when one falls within a stride of its nominal start
            (CodecSight: "we ensure that the I-frame is the first frame in the overlapped region").
    """

    window_s: float = 40.0
    stride_fraction: float = 0.2
    fps: float = 2.0
    align_keyframes: bool = False

    def __post_init__(self):
        if not 0 < self.fps <= 120:
            raise ConfigError(f"fps must be in (0, 120], got {self.fps}")
        if self.window_frames < 2:
            raise ConfigError(f"a window of {self.window_s} s at {self.fps} fps holds fewer than 2 frames")
        if not 0 < self.stride_fraction <= 1:
            raise ConfigError(f"stride_fraction must be in (0, 1], got {self.stride_fraction}")

    @property
    def window_frames(self) -> int:
        return int(round(self.window_s * self.fps))

    @property
    def stride_frames(self) -> int:
        return max(1, int(round(self.window_frames * self.stride_fraction)))


def sliding_windows(frames: Iterator[SampledFrame], config: WindowConfig) -> Iterator[list[SampledFrame]]:
    """Windows of ``config.window_frames`` sampled frames, the k-th starting at ``k * stride_frames``
    (or, aligned, at the GOP start within a stride after it); a stream shorter than one window
    yields what it had, once."""
    size, stride = config.window_frames, config.stride_frames
    history: deque[SampledFrame] = deque(maxlen=size + stride)
    emitted, number, start = False, 0, None
    for frame in frames:
        history.append(frame)
        while True:
            if start is None:
                start = _window_start(history, number * stride, stride, config.align_keyframes)
            if start is None or history[-1].index < start + size - 1:
                break
            emitted = True
            yield [f for f in history if start <= f.index < start + size]
            number, start = number + 1, None
    if not emitted and history:
        yield list(history)[-size:]


def _window_start(history: deque[SampledFrame], nominal: int, stride: int, align: bool) -> int | None:
    """Where the window due at sample ``nominal`` starts; None until the frames seen decide it."""
    if not align:
        return nominal if history[-1].index >= nominal else None
    for frame in history:
        if nominal <= frame.index < nominal + stride and frame.gop_start:
            return frame.index
    return nominal if history[-1].index >= nominal + stride - 1 else None
