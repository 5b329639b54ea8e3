import numpy as np
import pytest

from vidsight.ingest import probe


@pytest.mark.parametrize("bframes", [False, True])
def test_probe_reports_layout_of_generated_video(make_test_video, bframes):
    path, truth = make_test_video(width=320, height=240, fps=24, duration_s=2.0, gop=10, bframes=bframes)
    info = probe(path)
    assert (info.codec, info.width, info.height) == ("h264", 320, 240)
    assert info.frame_count == 48
    assert info.average_fps == pytest.approx(24.0)
    assert info.duration_s == pytest.approx(2.0)
    assert info.has_b_frames is bframes
    np.testing.assert_allclose(info.pts_s, truth["pts_s"], atol=1e-4)
    np.testing.assert_array_equal(info.keyframe_indices, [0, 10, 20, 30, 40])
    np.testing.assert_array_equal(info.gop_sizes, [10, 10, 10, 10, 8])
    np.testing.assert_allclose(info.keyframe_times_s, np.array([0, 10, 20, 30, 40]) / 24, atol=1e-4)


def test_probe_keeps_nonzero_start_and_variable_frame_rate(make_test_video):
    path, truth = make_test_video(duration_s=2.0, variable_frame_rate=True, start_time_s=3.25, seed=5)
    info = probe(path)
    assert info.start_time_s == pytest.approx(3.25, abs=1e-4)
    np.testing.assert_allclose(info.pts_s, truth["pts_s"], atol=1e-4)
    steps = np.diff(info.pts_s)
    assert steps.max() > 1.3 * steps.min()


def test_gop_index_of_frames(make_test_video):
    path, _ = make_test_video(fps=24, duration_s=2.0, gop=10)
    info = probe(path)
    np.testing.assert_array_equal(info.gop_index_of(np.array([0, 9, 10, 47])), [0, 0, 1, 4])


def test_a_stream_appearing_mid_file_ends_the_demux_like_damage(make_test_video, monkeypatch, caplog):
    """PyAV raises IndexError for a packet of a stream it did not list (damaged bytes in MPEG-TS)."""
    import av

    from vidsight.ingest import DecodeConfig, decode_frames

    path, _ = make_test_video(duration_s=2.0, gop=12)
    real_demux = av.container.InputContainer.demux

    def breaks_after_30(self, *args, **kwargs):
        for k, packet in enumerate(real_demux(self, *args, **kwargs)):
            if k == 30:
                raise IndexError("list index out of range")
            yield packet

    monkeypatch.setattr(av.container.InputContainer, "demux", breaks_after_30)
    info = probe(path)
    assert 0 < info.frame_count <= 30 and "container damaged" in caplog.text
    batch = decode_frames(path, None, DecodeConfig(), info)
    assert 0 < len(batch) <= info.frame_count


def test_a_raw_stream_cut_inside_its_first_frame_is_refused_naming_it(make_test_video, tmp_path):
    """A raw HEVC stream cut inside its first frame: decoding it and a live source both say what is
    wrong with which file (the server and every command start from one or the other)."""
    from vidsight.errors import VideoError
    from vidsight.ingest import decode_frames
    from vidsight.ingest.stream import StreamSource

    path, _ = make_test_video(width=160, height=120, fps=12, duration_s=1.0, gop=6, codec="hevc", suffix=".hevc")
    cut = tmp_path / "cut.hevc"
    cut.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(VideoError, match=f"{cut}: (the video stream declares no frame size|none of the)"):
        decode_frames(cut, None)   # refused by the probe, or when no frame comes out
    with pytest.raises(VideoError, match=f"{cut}: no frame of its video stream could be decoded"):
        list(StreamSource(cut, fps=2.0))


def test_pictures_are_still_images_and_videos_are_not(picture, make_test_video, tmp_path):
    """A one-frame file of each picture format users bring is a still (an AVIF image too, whose
    codec is AV1's); a video is not, an MJPEG or AV1 one included; nor is a file that cannot be opened."""
    from PIL import Image

    from vidsight.ingest import is_still_image

    image = Image.open(picture)
    for suffix in ("png", "jpg", "webp", "bmp", "tiff", "gif", "avif"):
        image.save(tmp_path / f"square.{suffix}")
        assert is_still_image(tmp_path / f"square.{suffix}"), suffix
    mjpeg, _ = make_test_video(suffix=".avi", duration_s=1.0, codec="mjpeg")
    h264, _ = make_test_video(duration_s=1.0)
    av1, _ = make_test_video(suffix=".mp4", duration_s=1.0, codec="av1")
    (tmp_path / "empty.png").write_bytes(b"")
    assert not any(is_still_image(path) for path in (mjpeg, h264, av1, tmp_path / "empty.png", tmp_path / "gone.jpg"))
