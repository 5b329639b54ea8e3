"""What skipping merge groups inside a full-attention tower does to the tokens it keeps.

Qwen's windowed ViTs, Qwen3-VL's full-attention ViT and InternViT all lose the dropped patches when
motion pruning skips them,
so a kept token comes out of the encoder somewhat different from a full encoding. This measures
how different, and how much time skipping saves, on a model shape (random weights: the figures
describe the architecture at its initialisation, not a trained checkpoint).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from vidsight.ingest import SamplingConfig, SyntheticSpec, decode_frames, make_video, probe, sample_frames
from vidsight.models.shapes import build_shape
from vidsight.vision import preprocess_video


def run_encoder_skip(shape: str = "internvl3-1b", shares=(0.75, 0.5, 0.25), frames: int = 4, seed: int = 0,
                     out: str = "out/bench/encoder-skip") -> dict:
    """Encode ``frames`` frames of a generated video whole, then keeping each share of merge groups
    (chosen at random per temporal patch); per share, the kept tokens' relative error and cosine
    similarity against the full encoding (every level of a token's inputs together, DeepStack's
    included), and the encoding time."""
    adapter = build_shape(shape)
    path = f"{out}.mp4"
    make_video(path, SyntheticSpec(width=640, height=360, duration_s=frames, fps=1, gop=frames, square_size=64))
    info = probe(path)
    batch = decode_frames(path, sample_frames(info, SamplingConfig(fps=1.0)), info=info)
    video = preprocess_video(batch.data[:frames], adapter.vision)
    patches, tokens_hw = video.grid_thw[0], adapter.vision.token_hw(video.grid_thw[1:])
    generator = torch.Generator().manual_seed(seed)
    report = {"shape": shape, "frames": video.frames, "temporal_patches": patches,
              "tokens_per_patch": tokens_hw[0] * tokens_hw[1], "shares": {}}
    with torch.inference_mode():
        began = time.perf_counter()
        full = adapter.encode_video(video.pixel_values, video.grid_thw)
        full = full.reshape(len(full), -1)
        report["full_s"] = time.perf_counter() - began
        for share in shares:
            scores = torch.rand(patches, *tokens_hw, generator=generator)
            keep = scores < share
            began = time.perf_counter()
            kept = adapter.encode_video(video.pixel_values, video.grid_thw, keep)
            seconds = time.perf_counter() - began
            kept = kept.reshape(len(kept), -1)
            reference = full[keep.reshape(-1)]
            error = (kept - reference).norm(dim=-1) / reference.norm(dim=-1)
            cosine = torch.nn.functional.cosine_similarity(kept, reference, dim=-1)
            report["shares"][share] = {"kept": int(keep.sum()), "seconds": seconds,
                                       "relative_error_mean": float(error.mean()),
                                       "relative_error_p95": float(np.quantile(error.numpy(), 0.95)),
                                       "cosine_mean": float(cosine.mean()), "cosine_min": float(cosine.min())}
    return report
