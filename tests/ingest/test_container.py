"""Which stream of a file is the video: never a picture listed beside it (cover art, a one-frame
track listed first), whichever path reads it; a file with nothing but such a picture is refused."""

import logging
from fractions import Fraction

import av
import numpy as np
import pytest
import torch

from vidsight.errors import VideoError
from vidsight.ingest import DecodeConfig, SamplingConfig, decode_frames, probe, sample_frames
from vidsight.ingest.container import open_video
from vidsight.ingest.dynamic import MotionPruneConfig
from vidsight.ingest.parallel import decode_parallel
from vidsight.ingest.stream import StreamSource


def add_picture(out: av.container.OutputContainer, attached: bool) -> list[av.Packet]:
    """A one-frame 64x64 JPEG stream, marked as an attached picture when ``attached``; its packets
    (muxed once every stream is added: the header is written with the first)."""
    stream = out.add_stream("mjpeg", rate=1)
    stream.width, stream.height, stream.pix_fmt = 64, 64, "yuvj420p"
    if attached:
        stream.disposition = av.stream.Disposition.attached_pic
    picture = av.VideoFrame.from_ndarray(np.full((64, 64, 3), 200, np.uint8), format="rgb24")
    return [*stream.encode(picture.reformat(format="yuvj420p")), *stream.encode()]


def picture_first(video, path):
    """``video``'s stream remuxed into a Matroska file after a one-frame picture track (as some
    downloads and recorders list a thumbnail before the video)."""
    with av.open(str(video)) as source, av.open(str(path), "w", format="matroska") as out:
        picture = add_picture(out, attached=False)
        copy = out.add_stream_from_template(source.streams.video[0])
        for packet in picture:
            out.mux(packet)
        for packet in source.demux(source.streams.video[0]):
            if packet.dts is not None:
                packet.stream = copy
                out.mux(packet)
    return path


def test_the_video_is_read_whatever_stream_comes_first(make_test_video, tmp_path, caplog):
    video, _ = make_test_video(duration_s=3.0, fps=10, bframes=True)
    listed = picture_first(video, tmp_path / "picture_first.mkv")
    with av.open(str(listed)) as container:
        assert [s.codec_context.name for s in container.streams.video] == ["mjpeg", "h264"]
    with caplog.at_level(logging.WARNING):
        info = probe(listed)
    plain = probe(video)
    assert (info.codec, info.width, info.height, info.frame_count) == ("h264", plain.width, plain.height, 30)
    assert np.allclose(info.pts_s, plain.pts_s, atol=1e-3)
    assert "holds 2 video streams" in caplog.text and "stream #1" in caplog.text

    motion = MotionPruneConfig(tau=0.25)
    expected = decode_frames(video, None, DecodeConfig(motion=motion), plain)
    assert torch.equal(decode_frames(listed, None, DecodeConfig(motion=motion), info).data, expected.data)
    indices = sample_frames(info, SamplingConfig(fps=4.0))
    parallel = decode_parallel(listed, indices, DecodeConfig(), info, workers=2)
    assert torch.equal(parallel.data, expected.data[torch.from_numpy(indices)])
    live = [f.rgb for f in StreamSource(listed, fps=10.0, motion=motion)]
    assert torch.equal(torch.stack(live), torch.stack([f.rgb for f in StreamSource(video, fps=10.0, motion=motion)]))


def test_a_file_whose_only_picture_is_attached_has_no_video(tmp_path):
    song = tmp_path / "song.mp3"
    with av.open(str(song), "w", format="mp3") as out:
        audio = out.add_stream("libmp3lame", rate=44100)
        for packet in add_picture(out, attached=True):
            out.mux(packet)
        for k in range(10):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1152), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts, frame.time_base = 44100, k * 1152, Fraction(1, 44100)
            for packet in audio.encode(frame):
                out.mux(packet)
        for packet in audio.encode():
            out.mux(packet)
    with av.open(str(song)) as container:   # FFmpeg lists the cover as a video stream
        assert [s.type for s in container.streams] == ["audio", "video"]
    with pytest.raises(VideoError, match=r"song\.mp3: no video stream \(the file holds a picture attached"):
        with open_video(song):
            pass
    with pytest.raises(VideoError, match="no video stream"):
        probe(song)


def test_tags_that_are_not_utf8_do_not_stop_any_path(make_test_video, tmp_path):
    """A title in another encoding, or a damaged one, made PyAV's open raise UnicodeDecodeError (a
    traceback from probe, ask and watch alike); the tags are read with replacement characters."""
    path, _ = make_test_video(".mkv", width=128, height=96, duration_s=1.0, fps=8, gop=8)
    tagged = tmp_path / "tagged.mkv"
    with av.open(str(path)) as source, av.open(str(tagged), "w") as out:
        out.metadata["title"] = "camera TAG!"
        stream = source.streams.video[0]
        copy = out.add_stream_from_template(stream)
        for packet in source.demux(stream):
            if packet.dts is not None:
                packet.stream = copy
                out.mux(packet)
    data = tagged.read_bytes()
    assert data.count(b"TAG!") == 1
    tagged.write_bytes(data.replace(b"TAG!", "é".encode("latin-1") + b"\xb1\xff\xfe"))
    with pytest.raises(UnicodeDecodeError):   # as PyAV opens a file by default
        av.open(str(tagged))
    info = probe(tagged)
    assert info.frame_count == 8
    frames = decode_frames(tagged, sample_frames(info, SamplingConfig(fps=8.0)))
    assert torch.equal(frames.data, decode_frames(path, sample_frames(probe(path), SamplingConfig(fps=8.0))).data)
    assert len(list(StreamSource(tagged, fps=8.0))) == 8
