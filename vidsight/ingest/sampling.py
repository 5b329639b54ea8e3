"""Choosing which frames to decode: requested times mapped onto the real timestamp table."""

from __future__ import annotations

import dataclasses

import numpy as np

from vidsight.errors import ConfigError
from vidsight.ingest.types import VideoInfo

# Qwen2.5-VL's own video defaults (qwen-vl-utils): 2 fps, at most 768 frames.
DEFAULT_FPS = 2.0
DEFAULT_MAX_FRAMES = 768
# A bound past this is nonsense: no frame vidsight decodes holds more (8192 pixels a side), and a
# whole video's budget past it would be millions of tokens.
MAX_PIXELS = 1 << 31


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How to pick frames from a video.

    Attributes:
        fps: Requested samples per second of video time.
        max_frames: Upper bound on samples; past it the samples are spread evenly over the clip.
        start_s: Where the clip asked about begins, in seconds from the video's first frame (as a
            player's timeline counts; qwen-vl-utils' ``video_start``): only its frames are decoded,
            from the keyframe before it.
        end_s: Where the clip ends (None, or past the video's end: at the end; ``video_end``).
        min_pixels: Fewest pixels a frame (or a picture) is resized to, in place of the
            checkpoint's bound (qwen-vl-utils' and vLLM's ``mm_processor_kwargs`` name; Qwen's
            resize rule only). None: the checkpoint's.
        max_pixels: Most pixels a frame (or a picture) is resized to, likewise.
        total_pixels: The whole video's pixel budget, which shrinks each frame of a long video,
            likewise (a picture has none but ``max_pixels``).
    """

    fps: float = DEFAULT_FPS
    max_frames: int = DEFAULT_MAX_FRAMES
    start_s: float = 0.0
    end_s: float | None = None
    min_pixels: int | None = None
    max_pixels: int | None = None
    total_pixels: int | None = None

    def __post_init__(self):
        if not np.isfinite(self.fps) or self.fps <= 0:
            raise ConfigError(f"fps must be a positive number, got {self.fps}")
        if self.fps > 1000:
            raise ConfigError(f"fps {self.fps} is absurd; at most 1000 samples per second are supported")
        if self.max_frames < 1:
            raise ConfigError(f"max_frames must be at least 1, got {self.max_frames}")
        if not np.isfinite(self.start_s) or self.start_s < 0:
            raise ConfigError(f"the clip's start must be 0 s or later, got {self.start_s}")
        if self.end_s is not None and not (np.isfinite(self.end_s) and self.end_s > self.start_s):
            raise ConfigError(f"the clip's end ({self.end_s} s) must come after its start ({self.start_s} s)")
        for name, value in self.pixel_bounds.items():
            if not isinstance(value, int) or not 1 <= value <= MAX_PIXELS:
                raise ConfigError(f"{name} must be a whole number of pixels from 1 to {MAX_PIXELS}, got {value}")

    @property
    def pixel_bounds(self) -> dict[str, int]:
        """The pixel bounds given (`min_pixels`, `max_pixels`, `total_pixels`), by name."""
        named = {"min_pixels": self.min_pixels, "max_pixels": self.max_pixels, "total_pixels": self.total_pixels}
        return {name: value for name, value in named.items() if value is not None}

    def clip(self, info: VideoInfo) -> tuple[float, float]:
        """The clip's ``(start, length)`` in seconds from ``info``'s first frame, within the video.

        Raises:
            ConfigError: the clip starts at or past the video's end.
        """
        if self.start_s >= info.duration_s:
            raise ConfigError(f"{info.path}: the clip starts at {self.start_s:g} s, at or past the video's end "
                              f"({info.duration_s:.3f} s)")
        end = info.duration_s if self.end_s is None else min(self.end_s, info.duration_s)
        return self.start_s, end - self.start_s


def nearest_frames(info: VideoInfo, times_s: np.ndarray) -> np.ndarray:
    """Index of the frame whose presentation time is nearest each requested time (ties go earlier)."""
    pts = info.pts_s
    if len(pts) == 1:
        return np.zeros(len(times_s), dtype=np.int64)
    right = np.clip(np.searchsorted(pts, times_s, side="left"), 1, len(pts) - 1)
    left = right - 1
    take_right = np.abs(pts[right] - times_s) < np.abs(times_s - pts[left])
    return np.where(take_right, right, left).astype(np.int64)


def sample_frames(info: VideoInfo, config: SamplingConfig) -> np.ndarray:
    """Frame indices to decode, ascending and unique.

    Samples are taken at ``k / fps`` from the clip's start (the video's first frame unless
    ``start_s`` says otherwise); if that gives more than ``max_frames``, the ``max_frames`` times
    are spread evenly over the clip instead. Each time is mapped to the
    frame nearest it in the file's timestamp table, so variable frame rate and a non-zero start
    time are handled exactly.
    """
    start, length = config.clip(info)
    count = max(1, int(np.floor(length * config.fps + 1e-9)))
    if count <= config.max_frames:
        times = info.start_time_s + start + np.arange(count) / config.fps
    else:
        step = length / config.max_frames
        times = info.start_time_s + start + (np.arange(config.max_frames) + 0.5) * step
    return np.unique(nearest_frames(info, times))
