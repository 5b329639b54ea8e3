"""Synthetic H.264 test videos with known content: moving shapes over a static textured background."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np

from vidsight.errors import ConfigError
from vidsight.ingest.writer import write_video


@dataclasses.dataclass(frozen=True)
class SyntheticSpec:
    """A generated video.

    Attributes:
        width: Frame width (even, for yuv420p).
        height: Frame height (even).
        fps: Nominal frame rate.
        duration_s: Length in seconds.
        gop: Keyframe interval in frames (scene-cut keyframes are disabled so GOPs are exact).
        bframes: Use up to two B-frames between references.
        variable_frame_rate: Jitter each frame's duration between 0.5x and 1.5x the nominal one.
        start_time_s: Presentation time of the first frame.
        square_size: Side of the moving square in pixels.
        seed: Seeds the background texture, the frame-time jitter and the square's path.
        codec: Encoder (see `writer.ENCODERS`); the container follows the file's suffix.
    """

    width: int = 320
    height: int = 240
    fps: float = 24.0
    duration_s: float = 2.0
    gop: int = 12
    bframes: bool = False
    variable_frame_rate: bool = False
    start_time_s: float = 0.0
    square_size: int = 32
    seed: int = 0
    codec: str = "h264"

    def __post_init__(self):
        if self.width % 2 or self.height % 2 or not (16 <= self.width <= 4096 and 16 <= self.height <= 4096):
            raise ConfigError(f"video size {self.width}x{self.height} must be even and between 16 and 4096")
        if self.fps <= 0 or self.duration_s <= 0 or self.gop < 1:
            raise ConfigError("fps, duration and gop must be positive")
        if not 0 < self.square_size < min(self.width, self.height):
            raise ConfigError(f"square_size {self.square_size} must fit in the frame")

    @property
    def frame_count(self) -> int:
        return max(1, round(self.duration_s * self.fps))


def smooth_texture(rng: np.random.Generator, height: int, width: int, low: float, high: float) -> np.ndarray:
    """Random colours on a 16-pixel lattice, bilinearly interpolated: ``(height, width, 3)`` float."""
    coarse = rng.uniform(low, high, size=(height // 16 + 2, width // 16 + 2, 3))
    ys = np.linspace(0, coarse.shape[0] - 1.001, height)
    xs = np.linspace(0, coarse.shape[1] - 1.001, width)
    y0, x0 = ys.astype(int), xs.astype(int)
    fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    return (coarse[y0][:, x0] * (1 - fy) * (1 - fx) + coarse[y0 + 1][:, x0] * fy * (1 - fx)
            + coarse[y0][:, x0 + 1] * (1 - fy) * fx + coarse[y0 + 1][:, x0 + 1] * fy * fx)


def background(spec: SyntheticSpec) -> np.ndarray:
    """A static texture with detail at every scale, so any wrong motion vector costs the encoder bits."""
    rng = np.random.default_rng(spec.seed)
    smooth = smooth_texture(rng, spec.height, spec.width, 40, 215)
    grain = rng.normal(0, 12, size=(spec.height, spec.width, 1))
    return np.clip(smooth + grain, 0, 255).astype(np.uint8)


def square_track(spec: SyntheticSpec) -> np.ndarray:
    """Top-left corner ``(x, y)`` of the square in each frame: a bounce along a straight line."""
    rng = np.random.default_rng(spec.seed + 1)
    t = np.arange(spec.frame_count, dtype=np.float64)
    span_x, span_y = spec.width - spec.square_size, spec.height - spec.square_size
    speed = rng.uniform(2.0, 4.0, size=2)
    start = rng.uniform(0, 1, size=2) * (span_x, span_y)

    def bounce(pos: np.ndarray, span: int) -> np.ndarray:
        period = 2 * span
        pos = np.mod(pos, period)
        return np.where(pos > span, period - pos, pos)

    x = bounce(start[0] + speed[0] * t, span_x)
    y = bounce(start[1] + speed[1] * t, span_y)
    return np.stack([x, y], axis=1).round().astype(np.int64)


def frame_times(spec: SyntheticSpec) -> np.ndarray:
    """Presentation time of each frame in seconds."""
    step = np.full(spec.frame_count, 1.0 / spec.fps)
    if spec.variable_frame_rate:
        step *= np.random.default_rng(spec.seed + 2).uniform(0.5, 1.5, size=spec.frame_count)
    return spec.start_time_s + np.concatenate([[0.0], np.cumsum(step[:-1])])


def render_frame(spec: SyntheticSpec, bg: np.ndarray, corner: np.ndarray) -> np.ndarray:
    img = bg.copy()
    x, y = corner
    img[y : y + spec.square_size, x : x + spec.square_size] = (230, 30, 30)
    return img


def make_video(path: str | Path, spec: SyntheticSpec = SyntheticSpec()) -> dict:
    """Render ``spec`` to a video at ``path`` (container from its suffix) and return its ground truth.

    Returns:
        ``{"spec": ..., "pts_s": [...], "square_xy": [[x, y], ...], "square_size": n}``, one
        entry per frame in presentation order; also written as JSON next to the video.
    """
    bg, times, track = background(spec), frame_times(spec), square_track(spec)
    path = write_video(path, (render_frame(spec, bg, corner) for corner in track), times, spec.fps,
                       gop=spec.gop, bframes=spec.bframes, codec=spec.codec)
    truth = {
        "spec": dataclasses.asdict(spec),
        "pts_s": times.tolist(),
        "square_xy": track.tolist(),
        "square_size": spec.square_size,
    }
    path.with_suffix(".json").write_text(json.dumps(truth))
    return truth
