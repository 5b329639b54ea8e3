"""Residuals recomputed from decoded pixels equal a plain per-pixel computation of their definition."""

import math

import av
import numpy as np
import pytest

from vidsight.ingest.decode import configure_decoder
from vidsight.ingest.judge import frame_type, frame_vectors
from vidsight.ingest.residual import residual_map


def bilinear(image: np.ndarray, y: float, x: float) -> float:
    height, width = image.shape
    y, x = min(max(y, 0.0), height - 1.0), min(max(x, 0.0), width - 1.0)
    y0, x0 = math.floor(y), math.floor(x)
    y1, x1 = min(y0 + 1, height - 1), min(x0 + 1, width - 1)
    fy, fx = y - y0, x - x0
    top = float(image[y0, x0]) * (1 - fx) + float(image[y0, x1]) * fx
    bottom = float(image[y1, x0]) * (1 - fx) + float(image[y1, x1]) * fx
    return top * (1 - fy) + bottom * fy


def plain_residual(luma, vectors, past, future) -> np.ndarray:
    """Each block's SAD against the mean of its predictions, pixel by pixel."""
    height, width = luma.shape
    rows, cols = -(-height // 4), -(-width // 4)
    source = {}  # (direction, block row, block col) -> (dx, dy) in pixels
    for v in vectors if vectors is not None else []:
        direction = 1 if v["source"] > 0 else 0
        if (past, future)[direction] is None:
            continue
        scale = max(int(v["motion_scale"]), 1)
        for y in range(int(v["dst_y"]) - int(v["h"]) // 2, int(v["dst_y"]) + int(v["h"]) // 2, 4):
            for x in range(int(v["dst_x"]) - int(v["w"]) // 2, int(v["dst_x"]) + int(v["w"]) // 2, 4):
                key = (direction, min(max(y // 4, 0), rows - 1), min(max(x // 4, 0), cols - 1))
                source[key] = (v["motion_x"] / scale, v["motion_y"] / scale)
    out = np.zeros((rows, cols))
    for y in range(height):
        for x in range(width):
            predictions = [bilinear(ref, y + source[(d, y // 4, x // 4)][1], x + source[(d, y // 4, x // 4)][0])
                           for d, ref in enumerate((past, future)) if (d, y // 4, x // 4) in source]
            prediction = sum(predictions) / len(predictions) if predictions else float(past[y, x])
            out[y // 4, x // 4] += abs(float(luma[y, x]) - prediction)
    return out


@pytest.mark.parametrize("bframes", [False, True])
def test_residual_equals_the_plain_computation_from_decoded_frames(make_test_video, bframes):
    path, _ = make_test_video(width=64, height=48, fps=8, duration_s=1.5, gop=12, bframes=bframes, square_size=16,
                              seed=4)
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        configure_decoder(stream, True, "AUTO")
        frames = [(frame_type(f), frame_vectors(f), f.to_ndarray(format="gray")) for f in container.decode(stream)]
    anchors = [k for k, (kind, _, _) in enumerate(frames) if kind != "B"]
    checked = {"P": 0, "B": 0}
    for k, (kind, vectors, luma) in enumerate(frames):
        if kind == "I":
            continue
        past = frames[max(a for a in anchors if a < k)][2]
        later = [a for a in anchors if a > k]
        future = frames[later[0]][2] if kind == "B" and later else None
        fast = residual_map(luma, vectors, past, future)
        np.testing.assert_allclose(fast, plain_residual(luma, vectors, past, future), rtol=1e-4, atol=1e-2)
        checked[kind] += 1
    assert checked["P"] >= 3 and (checked["B"] >= 3 or not bframes)
    assert any(residual_map(luma, vectors, frames[0][2]).any() for _, vectors, luma in frames[1:])
