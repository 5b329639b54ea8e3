"""A video with a display rotation (a phone's portrait video) or non-square pixels (a DVD's, an HDV
camcorder's) is decoded as it is displayed: the same picture stored plainly, turned and stretched,
frame for frame and block map for block map, on every path."""

from fractions import Fraction

import av
from av.bitstream import BitStreamFilterContext
import numpy as np
import pytest
import torch

from vidsight.ingest import DecodeConfig, SamplingConfig, decode_frames, probe, sample_frames
from vidsight.ingest.dynamic import MotionPruneConfig
from vidsight.ingest.feed import FrameFeed
from vidsight.ingest.parallel import decode_parallel
from vidsight.ingest.stream import StreamSource

FPS, FRAMES, HEIGHT, WIDTH = 10, 30, 96, 160


def record(path):
    """A textured square crossing a noisy still scene, H.264 at ``FPS``, stored plainly."""
    generator = np.random.default_rng(0)
    scene = generator.integers(60, 120, (HEIGHT, WIDTH, 3), dtype=np.uint8)
    texture = generator.integers(0, 256, (32, 32, 3), dtype=np.uint8)   # the moving object's every block changes
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=FPS, options={"g": "10", "bf": "0", "preset": "veryfast"})
        stream.width, stream.height, stream.pix_fmt = WIDTH, HEIGHT, "yuv420p"
        for k in range(FRAMES):
            image = scene.copy()
            image[20:52, 8 + 4 * k : 40 + 4 * k] = texture
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = k, Fraction(1, FPS)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


def restamp(plain, path, rotation: int | None = None, aspect: Fraction | None = None):
    """``plain``'s very packets in ``path``, with a display matrix when ``rotation``, and pixels
    ``aspect`` as wide as high (written into the stream's parameter sets) when given: the same
    coded pictures as ``plain``'s, so any difference in what comes out is vidsight's, not an encoder's."""
    with av.open(str(plain)) as source, av.open(str(path), "w") as out:
        stored = source.streams.video[0]
        stream = out.add_stream_from_template(stored)
        vui = BitStreamFilterContext(f"h264_metadata=sample_aspect_ratio={aspect}" if aspect else "null",
                                     stored, stream)
        if rotation is not None:
            stream.set_display_rotation(rotation)
        for packet in source.demux(stored):
            for written in vui.filter(packet if packet.dts is not None else None):
                written.stream = stream
                out.mux(written)
    return path


@pytest.mark.parametrize("rotation, source", [(90, "codec"), (-90, "codec"), (180, "codec"), (-90, "pixels")])
def test_frames_and_block_maps_come_out_as_displayed(tmp_path, rotation, source):
    turns = rotation // 90 % 4
    plain = record(tmp_path / "plain.mp4")
    turned = restamp(plain, tmp_path / "turned.mp4", rotation)
    info, plain_info = probe(turned), probe(plain)
    assert info.rotation == 90 * turns and plain_info.rotation == 0
    assert (info.height, info.width) == ((WIDTH, HEIGHT) if turns % 2 else (HEIGHT, WIDTH))

    def upright(frames):
        return torch.rot90(frames, turns, dims=(1, 2))

    motion = MotionPruneConfig(tau=0.25, source=source)
    config = DecodeConfig(motion=motion)
    expected = decode_frames(plain, None, config, plain_info)
    everything = decode_frames(turned, None, config, info)
    assert torch.equal(everything.data, upright(expected.data))
    judged = [(a.dynamic, b.dynamic) for a, b in zip(expected.codec, everything.codec) if a.dynamic is not None]
    assert judged and any(a.any() for a, _ in judged)   # the square moved
    assert all(np.array_equal(np.rot90(a, turns), b) for a, b in judged)
    indices = sample_frames(info, SamplingConfig(fps=4.0))
    parallel = decode_parallel(turned, indices, DecodeConfig(trim_gops=True), info, workers=2)
    assert torch.equal(parallel.data, upright(expected.data[torch.from_numpy(indices)]))
    with FrameFeed.background(turned, indices, info, workers=2) as feed:
        assert torch.equal(feed.frames(0, len(feed)), upright(expected.data[torch.from_numpy(indices)]))
    live = list(StreamSource(turned, fps=float(FPS), motion=motion))
    plain_live = list(StreamSource(plain, fps=float(FPS), motion=motion))
    assert torch.equal(torch.stack([f.rgb for f in live]), upright(torch.stack([f.rgb for f in plain_live])))
    assert all(np.array_equal(np.rot90(a.codec.dynamic, turns), b.codec.dynamic)
               for a, b in zip(plain_live, live) if a.codec.dynamic is not None)


@pytest.mark.parametrize("aspect, rotation", [(Fraction(32, 27), None), (Fraction(8, 9), None), (Fraction(2), 90)])
def test_non_square_pixels_are_stretched_to_their_displayed_width(tmp_path, aspect, rotation):
    turns = (rotation or 0) // 90 % 4
    plain = record(tmp_path / "plain.mp4")
    wide = restamp(plain, tmp_path / "wide.mkv", rotation, aspect)
    shown_width = round(WIDTH * aspect)
    info = probe(wide)
    assert info.pixel_aspect == (aspect.numerator, aspect.denominator) and probe(plain).pixel_aspect == (1, 1)
    assert (info.height, info.width) == ((shown_width, HEIGHT) if turns % 2 else (HEIGHT, shown_width))
    with av.open(str(plain)) as container:   # the plain picture scaled by FFmpeg as players scale it
        expected = torch.from_numpy(np.stack([
            np.rot90(frame.to_ndarray(format="rgb24", width=shown_width, height=HEIGHT, interpolation="BICUBIC"), turns)
            for frame in container.decode(video=0)]))

    motion = MotionPruneConfig(tau=0.25)
    plain_frames = decode_frames(plain, None, DecodeConfig(motion=motion))
    everything = decode_frames(wide, None, DecodeConfig(motion=motion), info)
    assert torch.equal(everything.data, expected)
    judged = [(a.dynamic, b.dynamic) for a, b in zip(plain_frames.codec, everything.codec) if a.dynamic is not None]
    assert judged and any(a.any() for a, _ in judged)   # block maps stay on the stored grid, turned
    assert all(np.array_equal(np.rot90(a, turns), b) for a, b in judged)
    indices = sample_frames(info, SamplingConfig(fps=4.0))
    parallel = decode_parallel(wide, indices, DecodeConfig(trim_gops=True), info, workers=2)
    assert torch.equal(parallel.data, expected[torch.from_numpy(indices)])
    with FrameFeed.background(wide, indices, info, workers=2) as feed:
        assert torch.equal(feed.frames(0, len(feed)), expected[torch.from_numpy(indices)])
    live = StreamSource(wide, fps=float(FPS), motion=motion)
    assert torch.equal(torch.stack([f.rgb for f in live]), expected) and live.pixel_aspect == aspect


def test_an_implausible_pixel_aspect_is_shown_square(tmp_path, caplog):
    info = probe(restamp(record(tmp_path / "plain.mp4"), tmp_path / "odd.mkv", aspect=Fraction(40, 1)))
    assert (info.width, info.pixel_aspect) == (WIDTH, (1, 1))
    assert "odd.mkv: declares pixels 40 as wide as high" in caplog.text
