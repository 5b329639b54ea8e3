"""Frames to the vision encoder's input, in torch: resize to the model's grid, normalise, patchify.

transformers' own video processors need torchvision, which has no CPU build here, so this is
vidsight's; it is tested frame by frame against transformers' PIL image processor.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from vidsight.errors import VideoError
from vidsight.models.base import VisionSpec

MAX_ASPECT_RATIO = 200  # Qwen's limit; beyond it the patch grid degenerates.
RESIZE_CHUNK_FRAMES = 32  # bounds the float32 working set while resizing


@dataclasses.dataclass
class VideoInput:
    """A video ready for the vision encoder.

    Attributes:
        pixel_values: ``(T/tp * gh * gw, 3 * tp * p * p)`` float patches, rows ordered by
            temporal patch, then merge group (row-major), then patch inside the group; or
            ``(T, 3, h, w)`` whole frames for a spec with a ``fixed_size``.
        grid_thw: ``(T/tp, gh, gw)``: temporal patches and patch rows/columns.
        resized_hw: Frame size after resizing, in pixels.
        frames: Frames fed in, after padding to a whole number of temporal patches.
    """

    pixel_values: torch.Tensor
    grid_thw: tuple[int, int, int]
    resized_hw: tuple[int, int]
    frames: int


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen's resize rule: sides multiples of ``factor``, area within bounds, aspect ratio kept."""
    if min(height, width) <= 0:
        raise VideoError(f"frame size {width}x{height} is empty")
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise VideoError(f"frame size {width}x{height}: aspect ratio above {MAX_ASPECT_RATIO} is unsupported")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def frame_pixel_budget(spec: VisionSpec, frames: int) -> int:
    """Per-frame pixel cap for a video of ``frames`` frames (qwen-vl-utils' video rule)."""
    share = spec.total_pixels / max(frames, 1) * spec.temporal_patch_size
    return int(max(min(spec.max_pixels, share), spec.min_pixels * 1.05))


def video_size(spec: VisionSpec, frames: int, height: int, width: int) -> tuple[int, int]:
    """The resized ``(height, width)`` of every frame of a ``frames``-frame video (padded count)."""
    if spec.fixed_size is not None:
        if min(height, width) <= 0:
            raise VideoError(f"frame size {width}x{height} is empty")
        return spec.fixed_size
    return smart_resize(height, width, spec.factor, spec.min_pixels, frame_pixel_budget(spec, frames))


def resize_frames(frames: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Bicubic antialiased resize of ``(T, H, W, 3)`` uint8 frames to ``(T, 3, h, w)`` uint8.

    On the CPU torch resamples uint8 with PIL's own fixed-point algorithm (within one intensity
    step of PIL, which Qwen's image processor uses); on other devices it resamples in float.
    """
    chw = frames.permute(0, 3, 1, 2)
    if tuple(chw.shape[-2:]) == tuple(size):
        return chw.contiguous()
    out = torch.empty((chw.shape[0], 3, *size), dtype=torch.uint8, device=frames.device)
    for i in range(0, chw.shape[0], RESIZE_CHUNK_FRAMES):
        chunk = chw[i : i + RESIZE_CHUNK_FRAMES]
        if frames.device.type == "cpu":
            out[i : i + RESIZE_CHUNK_FRAMES] = F.interpolate(chunk, size=size, mode="bicubic", antialias=True)
        else:
            resized = F.interpolate(chunk.float(), size=size, mode="bicubic", antialias=True, align_corners=False)
            out[i : i + RESIZE_CHUNK_FRAMES] = resized.round_().clamp_(0, 255).to(torch.uint8)
    return out


def normalize(frames: torch.Tensor, spec: VisionSpec, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Rescale ``(T, 3, h, w)`` uint8 to [0, 1] and normalise with the model's mean and std."""
    mean = torch.tensor(spec.image_mean, dtype=torch.float32, device=frames.device).view(1, 3, 1, 1)
    std = torch.tensor(spec.image_std, dtype=torch.float32, device=frames.device).view(1, 3, 1, 1)
    return ((frames.float() / 255.0 - mean) / std).to(dtype)


def patchify(frames: torch.Tensor, spec: VisionSpec) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """``(T, 3, h, w)`` normalised frames, T a multiple of tp, to flat patches and their grid."""
    t, c, h, w = frames.shape
    p, m, tp = spec.patch_size, spec.merge_size, spec.temporal_patch_size
    gt, gh, gw = t // tp, h // p, w // p
    x = frames.reshape(gt, tp, c, gh // m, m, p, gw // m, m, p)
    # -> (gt, gh/m, gw/m, m, m, c, tp, p, p): merge groups contiguous, as the merger expects.
    x = x.permute(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return x.reshape(gt * gh * gw, c * tp * p * p), (gt, gh, gw)


def preprocess_video(
    frames: torch.Tensor,
    spec: VisionSpec,
    dtype: torch.dtype = torch.float32,
    size: tuple[int, int] | None = None,
) -> VideoInput:
    """Turn decoded frames into encoder input.

    Args:
        frames: ``(T, H, W, 3)`` uint8 frames.
        spec: The model's vision settings.
        dtype: Dtype of the returned pixel values.
        size: Resized ``(height, width)``; default `video_size` of these frames. A group of a
            longer video passes the whole video's size.

    Returns:
        Patches and grid. The frame count is padded to a multiple of the temporal patch size by
        repeating the last frame, as Qwen's processors do.
    """
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.shape[0] == 0:
        raise VideoError(f"expected (T, H, W, 3) frames, got shape {tuple(frames.shape)}")
    pad = -frames.shape[0] % spec.temporal_patch_size
    if pad:
        frames = torch.cat([frames, frames[-1:].expand(pad, -1, -1, -1)])
    size = size or video_size(spec, frames.shape[0], frames.shape[1], frames.shape[2])
    normalised = normalize(resize_frames(frames, size), spec, dtype)
    if spec.fixed_size is not None:
        pixels, grid = normalised, (frames.shape[0] // spec.temporal_patch_size, size[0] // spec.patch_size,
                                    size[1] // spec.patch_size)
    else:
        pixels, grid = patchify(normalised, spec)
    return VideoInput(pixel_values=pixels, grid_thw=grid, resized_hw=size, frames=frames.shape[0])
