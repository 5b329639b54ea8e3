"""Interlaced video (broadcast, DVD, DV) is shown by its top field on every path: a moving square
woven from two pictures a field apart comes out as the first picture, not combed."""

import av
import numpy as np
import pytest
import torch

from vidsight.errors import ConfigError
from vidsight.ingest import DecodeConfig, decode_frames, probe
from vidsight.ingest.parallel import decode_parallel
from vidsight.ingest.picture import top_field
from vidsight.ingest.stream import StreamSource
from vidsight.ingest.writer import weave, write_video

HEIGHT, WIDTH, FRAMES, FPS = 96, 320, 8, 25


def picture(field: int) -> np.ndarray:
    """A smooth still background and a shaded square moving 16 pixels a field."""
    rows, cols = np.mgrid[0:HEIGHT, 0:WIDTH]
    image = np.stack([60 + cols * 0.5, 80 + rows * 0.6, np.full((HEIGHT, WIDTH), 120.0)], axis=-1)
    shade = np.mgrid[0:32, 0:32].sum(axis=0)
    square = np.stack([230 - shade, 120 + shade, 200 - shade // 2], axis=-1)
    left = 4 + 16 * field
    image[32:64, left : left + 32] = square[:, : max(0, min(32, WIDTH - left))]
    return image.astype(np.uint8)


def test_top_field_keeps_even_rows_and_fills_odd_rows_between_them():
    rgb = np.random.default_rng(1).integers(0, 256, (7, 5, 3)).astype(np.uint8)
    for rows in (7, 6):
        shown = top_field(rgb[:rows].copy())
        assert np.array_equal(shown[0::2], rgb[:rows][0::2])
        for row in range(1, rows, 2):
            below = rgb[row + 1] if row + 1 < rows else rgb[row - 1]
            expected = (rgb[row - 1].astype(int) + below.astype(int) + 1) // 2
            assert np.array_equal(shown[row], expected)


@pytest.mark.parametrize("codec, suffix", [("h264", ".mp4"), ("mpeg2video", ".mpg")])
def test_an_interlaced_video_is_shown_by_its_top_field_on_every_path(tmp_path, codec, suffix):
    path = write_video(tmp_path / f"woven{suffix}", [weave(picture(2 * k), picture(2 * k + 1)) for k in range(FRAMES)],
                       np.arange(FRAMES) / FPS, FPS, gop=6, crf=8, codec=codec, interlaced=True)
    info = probe(path)
    assert info.interlaced
    frames = decode_frames(path, None, DecodeConfig(), info).data
    with av.open(str(path)) as container:
        decoded = [frame for frame in container.decode(video=0)]
    assert all(frame.interlaced_frame for frame in decoded)
    stored = [frame.to_ndarray(format="rgb24") for frame in decoded]
    assert all(np.array_equal(frames[k].numpy(), top_field(stored[k].copy())) for k in range(FRAMES))
    for k in (3, 6):   # around the square, against the first field's picture: combed as stored, whole as shown
        near = np.s_[28:68, 32 * k - 4 : 32 * k + 56]
        truth = picture(2 * k)[near].astype(int)
        coding = np.abs(stored[k][near].astype(int) - weave(picture(2 * k), picture(2 * k + 1))[near]).mean()
        combed = np.abs(stored[k][near].astype(int) - truth).mean()
        shown = np.abs(frames[k].numpy()[near].astype(int) - truth).mean()
        assert shown < coding + 1.5 and combed > coding + 5
    parallel = decode_parallel(path, np.arange(1, FRAMES, 2), DecodeConfig(trim_gops=True), info, workers=2)
    assert torch.equal(parallel.data, frames[1::2])
    live = StreamSource(path, fps=float(FPS))
    assert torch.equal(torch.stack([f.rgb for f in live]), frames)
    resized = decode_frames(path, np.array([5]), DecodeConfig(size=(48, 80)), info).data[0]
    expected = av.VideoFrame.from_ndarray(frames[5].numpy(), format="rgb24").to_ndarray(
        format="rgb24", height=48, width=80, interpolation="BICUBIC")   # fields first, then scaled
    assert np.array_equal(resized.numpy(), expected)


def test_progressive_video_is_not_taken_for_interlaced(make_test_video):
    video, _ = make_test_video(width=64, height=48, fps=8, duration_s=0.5)
    info = probe(video)
    with av.open(str(video)) as container:
        first = next(container.decode(video=0)).to_ndarray(format="rgb24")
    assert not info.interlaced and np.array_equal(decode_frames(video, np.array([0]), DecodeConfig(), info).data[0].numpy(),
                                                  first)


def test_interlaced_writing_is_refused_for_a_codec_without_it(tmp_path):
    with pytest.raises(ConfigError, match="interlaced"):
        write_video(tmp_path / "x.webm", [picture(0)], [0.0], FPS, codec="vp9", interlaced=True)
