"""Every decoding path gives the sequential frames in every container, indexed or not.

MPEG-TS and MPEG-PS carry no index and FFmpeg seeks in them only approximately: before seeks were
verified, interval and seek decoding lost most GOPs of these files without a damaged packet.
"""

from fractions import Fraction

import numpy as np
import pytest
import torch

from vidsight.ingest import DecodeConfig, SamplingConfig, decode_frames, probe, sample_frames
from vidsight.ingest.feed import FrameFeed
from vidsight.ingest.parallel import decode_parallel
from vidsight.ingest.synthetic import SyntheticSpec, background, render_frame, square_track

from tests.variants import fast_first

# The containers the acceptance names, MPEG-4 part 2 in AVI, and small MPEG-2 frames in MPEG-PS:
# several share one PES packet, so most carry no timestamp of their own and the demuxer
# interpolates theirs, differently after a seek.
CONTAINERS = {
    "h264-mp4": dict(suffix=".mp4", codec="h264", bframes=True),
    "h264-mkv": dict(suffix=".mkv", codec="h264", bframes=True),
    "h264-mpegts": dict(suffix=".ts", codec="h264", bframes=True),
    "mpeg2-mpegps": dict(suffix=".mpg", codec="mpeg2video", bframes=True),
    "mpeg2-mpegps-small": dict(suffix=".mpg", codec="mpeg2video", bframes=True, width=160, height=120,
                               square_size=16, gop=15),
    "mpeg4-avi": dict(suffix=".avi", codec="mpeg4", bframes=False),
    "hevc-mkv": dict(suffix=".mkv", codec="hevc", bframes=True),
    "vp9-webm": dict(suffix=".webm", codec="vp9"),
    "av1-mp4": dict(suffix=".mp4", codec="av1"),
    # Raw elementary streams, as cameras dump them: no container, no timestamps (`VideoInfo.timed`).
    "h264-raw": dict(suffix=".h264", codec="h264", bframes=True),
    "hevc-raw": dict(suffix=".hevc", codec="hevc", bframes=True),
}


def container_video(make_test_video, name):
    return make_test_video(**{"duration_s": 6.0, "fps": 25, "gop": 25, **CONTAINERS[name]})[0]


def assert_same_frames(a, b):
    assert torch.equal(a.indices, b.indices) and torch.equal(a.pts_s, b.pts_s)
    assert torch.equal(a.data, b.data)


@pytest.mark.parametrize("name", list(CONTAINERS))
@pytest.mark.parametrize("strategy", ["intervals", "seek"])
def test_parallel_and_seek_decoding_equal_sequential(make_test_video, name, strategy):
    path = container_video(make_test_video, name)
    info = probe(path)
    assert info.codec == CONTAINERS[name]["codec"]   # the format, not the decoder (AV1's is libdav1d)
    assert len(info.keyframe_indices) >= 5
    indices = sample_frames(info, SamplingConfig(fps=2.0))
    sequential = decode_frames(path, indices, DecodeConfig(), info)
    assert sequential.frames_lost == 0 and len(sequential) == len(indices)
    parallel = decode_parallel(path, indices, DecodeConfig(trim_gops=True), info, workers=3, strategy=strategy)
    assert parallel.frames_lost == 0
    assert_same_frames(sequential, parallel)


@pytest.mark.parametrize("name", fast_first(["h264-mpegts", "mpeg2-mpegps", "mpeg2-mpegps-small"]))
def test_every_frame_and_the_overlapped_feed_equal_sequential(make_test_video, name):
    path = container_video(make_test_video, name)
    info = probe(path)
    everything = decode_frames(path, None, DecodeConfig(), info)
    assert len(everything) == info.frame_count
    assert_same_frames(everything, decode_parallel(path, None, DecodeConfig(), info, workers=2))
    indices = sample_frames(info, SamplingConfig(fps=2.0))
    with FrameFeed.background(path, indices, info, workers=2) as feed:
        frames = feed.frames(0, len(feed)).clone()
        assert feed.frames_lost == 0
    assert torch.equal(frames, everything.data[torch.from_numpy(np.searchsorted(info.pts_s, info.pts_s[indices]))])


@pytest.mark.parametrize("name", fast_first(list(CONTAINERS), fast=2))
def test_sequential_decoding_gives_the_source_frames(make_test_video, name):
    """Every frame the file was made from comes back once, at its time, in its place: each decoded
    frame is close to its own source frame (PSNR above 20 dB: MPEG-2 and MPEG-4 at a fixed quantiser
    reach 24 dB on the grainy background by a GOP's end) and further from the source frames either
    side of it, whose square stands elsewhere."""
    path, truth = make_test_video(**{"duration_s": 6.0, "fps": 25, "gop": 25, **CONTAINERS[name]})
    spec = SyntheticSpec(**truth["spec"])
    texture = background(spec)
    # float32 holds each frame's sum of squared errors closely enough for a 20 dB bound.
    sources = np.stack([render_frame(spec, texture, corner) for corner in square_track(spec)]).astype(np.float32)
    decoded = decode_frames(path, None, DecodeConfig(), probe(path))
    assert len(decoded) == len(sources) == spec.frame_count
    np.testing.assert_allclose(decoded.pts_s.numpy() - decoded.pts_s[0].item(),
                               np.array(truth["pts_s"]) - truth["pts_s"][0], atol=1e-3)
    frames = decoded.data.numpy().astype(np.float32)
    error = ((frames - sources) ** 2).mean(axis=(1, 2, 3))
    assert (10 * np.log10(255**2 / error)).min() > 20, name
    for k in range(1, len(sources) - 1):
        if (truth["square_xy"][k - 1] != truth["square_xy"][k]) and (truth["square_xy"][k + 1] != truth["square_xy"][k]):
            assert error[k] < min(((frames[k] - sources[j]) ** 2).mean() for j in (k - 1, k + 1)), (name, k)


@pytest.mark.parametrize("name", ["h264-raw", "hevc-raw"])
def test_a_stream_without_timestamps_is_timed_by_its_frames_order(make_test_video, name, tmp_path):
    """The same bitstream in a container and bare: every decoding path, the live source's too,
    gives the contained stream's frames in its order, each at its place over the rate."""
    import av

    from vidsight.ingest.stream import StreamSource

    contained = make_test_video(**{"duration_s": 4.0, "fps": 25, "gop": 25, **CONTAINERS[name], "suffix": ".mkv"})[0]
    bare = tmp_path / f"bare{CONTAINERS[name]['suffix']}"
    with av.open(str(contained)) as source, av.open(str(bare), "w") as out:   # remuxed: the same packets
        stream = out.add_stream_from_template(source.streams.video[0])
        for packet in source.demux(source.streams.video[0]):
            if packet.size:
                packet.stream = stream
                out.mux(packet)
    info, reference = probe(bare), probe(contained)
    assert not info.timed and reference.timed and info.frame_count == reference.frame_count
    assert info.has_b_frames and info.declared_fps == 25   # the encoder's B-frames; its rate, or the raw demuxer's
    expected = decode_frames(contained, None, DecodeConfig(), reference)
    everything = decode_frames(bare, None, DecodeConfig(), info)
    assert torch.equal(everything.data, expected.data) and everything.strategy == "sequential"
    np.testing.assert_allclose(everything.pts_s.numpy(), np.arange(info.frame_count) / 25, atol=1e-6)
    indices = sample_frames(info, SamplingConfig(fps=2.0))
    for strategy in ("intervals", "seek"):   # nothing to seek by: one pass from the start
        parallel = decode_parallel(bare, indices, DecodeConfig(trim_gops=True), info, workers=3, strategy=strategy)
        assert parallel.strategy == "sequential" and parallel.frames_lost == 0
        assert torch.equal(parallel.data, expected.data[torch.from_numpy(indices)])
    with FrameFeed.background(bare, indices, info, workers=2) as feed:
        assert torch.equal(feed.frames(0, len(feed)), expected.data[torch.from_numpy(indices)])
    live = list(StreamSource(bare, fps=25.0))
    assert [f.pts_s for f in live] == pytest.approx(list(np.arange(info.frame_count) / 25))
    assert torch.equal(torch.stack([f.rgb for f in live]), expected.data)


def test_joined_segments_whose_clock_restarts_are_timed_on(make_test_video, tmp_path):
    """Two MPEG-TS segments with B-frames joined, the second's clock starting over (a camera's
    files, a capture resumed): every path gives the segments' frames in order, timed on past the
    jump, where the file's own timestamps would put the second segment on top of the first."""
    first = make_test_video(**{"duration_s": 3.0, "fps": 25, "gop": 25, **CONTAINERS["h264-mpegts"]})[0]
    second = make_test_video(**{"duration_s": 3.0, "fps": 25, "gop": 25, "seed": 7, **CONTAINERS["h264-mpegts"]})[0]
    joined = tmp_path / "joined.ts"
    joined.write_bytes(first.read_bytes() + second.read_bytes())
    info = probe(joined)
    assert not info.timed and info.frame_count == 150 and len(info.keyframe_indices) == 6
    np.testing.assert_allclose(np.diff(info.pts_s), 1 / 25, atol=1e-6)
    expected = torch.cat([decode_frames(path, None).data for path in (first, second)])
    everything = decode_frames(joined, None, DecodeConfig(), info)
    assert torch.equal(everything.data, expected) and everything.strategy == "sequential"
    indices = sample_frames(info, SamplingConfig(fps=2.0))
    parallel = decode_parallel(joined, indices, DecodeConfig(trim_gops=True), info, workers=3, strategy="seek")
    assert parallel.frames_lost == 0 and torch.equal(parallel.data, expected[torch.from_numpy(indices)])
    with FrameFeed.background(joined, indices, info, workers=2) as feed:
        assert torch.equal(feed.frames(0, len(feed)), expected[torch.from_numpy(indices)])


def test_a_seek_that_lands_past_its_keyframe_is_retried_from_earlier(make_test_video, monkeypatch):
    import av

    path = container_video(make_test_video, "h264-mpegts")
    info = probe(path)
    seeks = []
    original = av.container.InputContainer.seek
    monkeypatch.setattr(av.container.InputContainer, "seek",
                        lambda self, offset, **kw: seeks.append(offset) or original(self, offset, **kw))
    key = int(info.keyframe_indices[3])
    batch = decode_parallel(path, np.array([key]), DecodeConfig(), info, workers=1, strategy="seek")
    assert torch.equal(batch.data, decode_frames(path, np.array([key]), DecodeConfig(), info).data)
    assert len(seeks) >= 2 and seeks[1] < seeks[0]  # the first landing was checked and found late


def test_a_container_that_refuses_to_seek_is_decoded_from_the_start(make_test_video, monkeypatch, caplog):
    import av

    path = container_video(make_test_video, "h264-mp4")
    info = probe(path)

    def refuse(self, *args, **kwargs):
        raise av.error.PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(av.container.InputContainer, "seek", refuse)
    indices = sample_frames(info, SamplingConfig(fps=2.0))
    parallel = decode_parallel(path, indices, DecodeConfig(), info, workers=2, strategy="seek")
    monkeypatch.undo()
    assert_same_frames(decode_frames(path, indices, DecodeConfig(), info), parallel)
    assert caplog.text.count("decoded from the start") == 1  # said once, not once per span


def test_a_trimmed_mp4_is_shown_from_its_cut(make_test_video, tmp_path):
    """An MP4 trimmed without re-encoding (a phone's or an editor's trim) keeps the GOP before its
    cut and an edit list saying where the video starts; FFmpeg flags those packets to be decoded as
    references and dropped. The probe counted them as frames: times before the cut that no decoder
    gives, each warned about as lost. Every path now gives the frames from the cut on, timed from it,
    as the untrimmed file gives them."""
    import av

    from vidsight.ingest.dynamic import MotionPruneConfig
    from vidsight.ingest.stream import StreamSource

    source = container_video(make_test_video, "h264-mp4")
    cut, trimmed = 10, tmp_path / "trimmed.mp4"
    with av.open(str(source)) as original, av.open(str(trimmed), "w") as out:   # the same packets, 10 frames earlier
        stream = original.streams.video[0]
        copy = out.add_stream_from_template(stream)
        shift = cut * round(1 / (25 * float(stream.time_base)))
        for packet in original.demux(stream):
            if packet.dts is not None:
                packet.pts, packet.dts, packet.stream = packet.pts - shift, packet.dts - shift, copy
                out.mux(packet)
    with av.open(str(trimmed)) as container:
        assert sum(p.is_discard for p in container.demux(video=0)) >= cut   # FFmpeg drops the GOP's start
    reference, info = probe(source), probe(trimmed)
    assert info.frame_count == reference.frame_count - cut and info.start_time_s == 0
    np.testing.assert_allclose(info.pts_s, reference.pts_s[cut:] - reference.pts_s[cut], atol=1e-6)
    motion = MotionPruneConfig(tau=0.25)
    expected = decode_frames(source, None, DecodeConfig(motion=motion), reference)
    everything = decode_frames(trimmed, None, DecodeConfig(motion=motion), info)
    assert everything.frames_lost == 0 and torch.equal(everything.data, expected.data[cut:])
    indices = sample_frames(info, SamplingConfig(fps=2.0))
    for strategy in ("intervals", "seek"):
        parallel = decode_parallel(trimmed, indices, DecodeConfig(trim_gops=True), info, workers=3, strategy=strategy)
        assert parallel.frames_lost == 0 and torch.equal(parallel.data, expected.data[cut:][torch.from_numpy(indices)])
    judged = decode_parallel(trimmed, indices, DecodeConfig(motion=motion), info, workers=3)
    sampled = decode_frames(trimmed, indices, DecodeConfig(motion=motion), info)
    assert any(c.dynamic is not None and c.dynamic.any() for c in sampled.codec)
    assert all((a.dynamic is None and b.dynamic is None) or np.array_equal(a.dynamic, b.dynamic)
               for a, b in zip(sampled.codec, judged.codec))
    with FrameFeed.background(trimmed, indices, info, workers=2) as feed:
        assert torch.equal(feed.frames(0, len(feed)), expected.data[cut:][torch.from_numpy(indices)])
    live = list(StreamSource(trimmed, fps=25.0))
    assert torch.equal(torch.stack([f.rgb for f in live]), expected.data[cut:])


def test_a_recording_with_a_gap_keeps_its_times(tmp_path):
    """A camera that records on motion leaves gaps in one file's clock. With B-frames, the frame
    after a gap is sent before the B-frames shown before it, a timestamp going back over the gap
    that the probe took for a restarted clock (and timed the rest on past it: 120 s for 64). Every
    path now keeps the file's times, and the live source samples the gap's far side at its rate
    (it had taken every frame there until its count caught up with the clock)."""
    import av

    from vidsight.ingest.stream import StreamSource

    times = np.concatenate([np.arange(100) / 25, 60 + np.arange(100) / 25])   # 4 s, 56 s of nothing, 4 s
    path = tmp_path / "gap.mkv"
    with av.open(str(path), "w") as out:
        stream = out.add_stream("libx264", rate=25, options={"g": "25", "bf": "3"})
        stream.width, stream.height, stream.pix_fmt, stream.time_base = 128, 96, "yuv420p", Fraction(1, 1000)
        for k, time_s in enumerate(times):
            image = np.zeros((96, 128, 3), np.uint8)
            image[:, (3 * k) % 120 : (3 * k) % 120 + 8] = 255
            frame = av.VideoFrame.from_ndarray(image, format="rgb24")
            frame.pts, frame.time_base = round(time_s * 1000), Fraction(1, 1000)
            for packet in stream.encode(frame):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    with av.open(str(path)) as container:   # a frame after the gap sent before frames shown before it
        sent = [p.pts for p in container.demux(video=0) if p.size]
        assert any(later > 60_000 > earlier for later, earlier in zip(sent, sent[1:]))
    info = probe(path)
    assert info.timed and info.frame_count == 200
    np.testing.assert_allclose(info.pts_s, times, atol=1e-6)
    everything = decode_frames(path, None, DecodeConfig(), info)
    np.testing.assert_allclose(everything.pts_s.numpy(), times, atol=1e-6)
    indices = sample_frames(info, SamplingConfig(fps=2.0))
    parallel = decode_parallel(path, indices, DecodeConfig(trim_gops=True), info, workers=3, strategy="seek")
    assert parallel.frames_lost == 0 and torch.equal(parallel.data, everything.data[torch.from_numpy(indices)])
    live = list(StreamSource(path, fps=2.0))
    grid = [t for t in np.arange(0, 64, 0.5) if t < 4 or t >= 60]   # the sample times that have frames
    assert [f.pts_s for f in live] == pytest.approx([times[np.searchsorted(times, t - 1e-9)] for t in grid])
    assert torch.equal(torch.stack([f.rgb for f in live]), everything.data[[int(np.searchsorted(times, t - 1e-9))
                                                                          for t in grid]])


def test_an_intra_only_stream_is_judged_in_groups_of_frames(make_test_video, caplog):
    """MJPEG (as many IP cameras and webcams send) codes every frame as an I-frame, so every sample
    started a GOP and was kept whole: motion pruning pruned nothing. Judged by its pixels, its
    frames are now grouped (`INTRA_ONLY_GOP`), judged within a group, and every path gives the
    sequential decoder's frames and signals; the moving square is found where it is. ``auto``
    leaves such a stream whole, saying so."""
    from vidsight.ingest.dynamic import MotionPruneConfig
    from vidsight.ingest.probe import INTRA_ONLY_GOP
    from vidsight.ingest.stream import StreamSource

    path, truth = make_test_video(suffix=".avi", codec="mjpeg", width=160, height=120, fps=25, duration_s=24.0,
                                  square_size=24)
    info = probe(path)
    assert info.intra_only and info.frame_count == 600
    assert info.keyframe_indices.tolist() == [0, INTRA_ONLY_GOP, 2 * INTRA_ONLY_GOP]
    indices = sample_frames(info, SamplingConfig(fps=2.0))
    whole = decode_frames(path, indices, DecodeConfig(motion=MotionPruneConfig(tau=0.25)), info)   # auto
    assert whole.motion is None and all(c.frame_type == "I" and c.dynamic is None for c in whole.codec)
    watched = list(StreamSource(path, fps=2.0, motion=MotionPruneConfig(tau=0.25)))
    assert all(f.codec.frame_type == "I" and f.codec.dynamic is None for f in watched)
    assert "mjpeg codes every frame alone; --motion-source auto does not prune it" in caplog.text
    motion = MotionPruneConfig(tau=0.25, source="pixels")
    everything = decode_frames(path, None, DecodeConfig(motion=motion), info)
    assert [k for k, c in enumerate(everything.codec) if c.frame_type == "I"] == info.keyframe_indices.tolist()
    judged = [k for k, c in enumerate(everything.codec)   # estimates a group into it, the square moving
              if c.dynamic is not None and k % INTRA_ONLY_GOP > 6 and truth["square_xy"][k - 2] != truth["square_xy"][k]]
    assert len(judged) > 200
    on_square = [everything.codec[k].dynamic[y // 4 : (y + 24) // 4 + 1, x // 4 : (x + 24) // 4 + 1].any()
                 for k in judged for x, y in [truth["square_xy"][k]]]
    assert np.mean(on_square) > 0.95 and max(everything.codec[k].dynamic.mean() for k in judged) < 0.5
    sampled = decode_frames(path, indices, DecodeConfig(motion=motion), info)
    assert sum(c.dynamic is None for c in sampled.codec) == 3   # one kept whole a group
    for strategy in ("intervals", "seek"):
        parallel = decode_parallel(path, indices, DecodeConfig(motion=motion), info, workers=3, strategy=strategy)
        assert torch.equal(parallel.data, sampled.data)
        assert all((a.dynamic is None and b.dynamic is None) or np.array_equal(a.dynamic, b.dynamic)
                   for a, b in zip(sampled.codec, parallel.codec))
    live = list(StreamSource(path, fps=2.0, motion=motion))   # its samples: the first frame at or after each time
    same = decode_frames(path, np.array([f.frame_index for f in live]), DecodeConfig(motion=motion), info)
    assert [f.codec.frame_type for f in live] == [c.frame_type for c in same.codec]
    assert all((a.dynamic is None and b.codec.dynamic is None) or np.array_equal(a.dynamic, b.codec.dynamic)
               for a, b in zip(same.codec, live))


@pytest.mark.parametrize("name", ["h264-mpegts", "hevc-mkv", "h264-raw"])
def test_a_capture_cut_mid_gop_starts_at_its_first_keyframe(make_test_video, tmp_path, name):
    """A recording of a live stream, or a camera's segment, often starts inside a GOP: no decoder
    shows the frames before the first keyframe (their references are not in the file), and the
    probe counted them, so every decode warned of frames lost. Every path now gives the frames from
    the first keyframe on, as the uncut file gives them."""
    import av

    source = container_video(make_test_video, name)
    cut = tmp_path / f"cut{CONTAINERS[name]['suffix']}"
    with av.open(str(source)) as original, av.open(str(cut), "w") as out:   # the packets from the 11th on
        stream = out.add_stream_from_template(original.streams.video[0])
        for k, packet in enumerate(p for p in original.demux(original.streams.video[0]) if p.size):
            if k >= 10:
                packet.stream = stream
                out.mux(packet)
    reference, info = probe(source), probe(cut)
    first_key = int(reference.keyframe_indices[1])
    assert info.frame_count == reference.frame_count - first_key
    expected = decode_frames(source, None, DecodeConfig(), reference).data[first_key:]
    everything = decode_frames(cut, None, DecodeConfig(), info)
    assert everything.frames_lost == 0 and torch.equal(everything.data, expected)
    indices = sample_frames(info, SamplingConfig(fps=2.0))
    for strategy in ("intervals", "seek"):
        parallel = decode_parallel(cut, indices, DecodeConfig(trim_gops=True), info, workers=3, strategy=strategy)
        assert parallel.frames_lost == 0 and torch.equal(parallel.data, expected[torch.from_numpy(indices)])


def leading_pictures(path) -> int:
    """Packets of an HEVC file in MKV or MP4 whose pictures are RASL (NAL types 8 and 9): shown
    before the CRA keyframe they follow in coding order, and referring to the GOP before it."""
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        length = (stream.codec_context.extradata[21] & 3) + 1   # hvcC's lengthSizeMinusOne
        count = 0
        for packet in container.demux(stream):
            data, at = bytes(packet), 0
            while at + length < len(data):
                kind = (data[at + length] >> 1) & 0x3F
                if kind < 32:   # the packet's first slice
                    count += kind in (8, 9)
                    break
                at += length + int.from_bytes(data[at:at + length], "big")
    return count


@pytest.mark.parametrize("strategy", ["intervals", "seek"])
def test_hevc_open_gops_give_their_leading_pictures_on_every_path(make_test_video, strategy):
    """x265's GOPs are open by default: a keyframe after the first is a CRA picture, and B-frames
    shown before it but coded after it (RASL) refer to the GOP before, so a decoder that starts at
    the CRA drops them. Every frame, and sparse samples next to the keyframes, come out of interval
    and seek decoding as sequential decoding gives them."""
    path, _ = make_test_video(duration_s=6.0, fps=25, gop=50, suffix=".mkv", codec="hevc", bframes=True)
    assert leading_pictures(path) >= 2
    info = probe(path)
    keyframes = info.keyframe_indices.tolist()
    near = sorted({k + d for k in keyframes[1:] for d in (-3, -2, -1, 0, 1)})
    for indices in (None, np.array(near), np.arange(0, info.frame_count, 7)):
        sequential = decode_frames(path, indices, DecodeConfig(), info)
        assert sequential.frames_lost == 0 and len(sequential) == (info.frame_count if indices is None else len(indices))
        parallel = decode_parallel(path, indices, DecodeConfig(trim_gops=True), info, workers=2, strategy=strategy)
        assert parallel.frames_lost == 0
        assert_same_frames(sequential, parallel)
