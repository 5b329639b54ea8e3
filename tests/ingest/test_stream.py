"""Live sources: growing files and dropped network streams, each frame decoded once."""

import io
import os
import threading
import time

import av
import numpy as np
import pytest
import torch

from vidsight.bench.fuzz import pipe_of as fuzz_pipe_of
from vidsight.errors import VideoError
from vidsight.ingest import SyntheticSpec
from vidsight.ingest.stream import PROTOCOL_WHITELIST, StreamSource
from vidsight.ingest.synthetic import background, render_frame, square_track
from vidsight.ingest.writer import write_video


def write_part(path, spec, first, last):
    """Frames ``first..last-1`` of ``spec`` as a standalone MPEG-TS with continuing timestamps."""
    bg, track = background(spec), square_track(spec)
    times = np.arange(first, last) / spec.fps
    write_video(path, (render_frame(spec, bg, track[k]) for k in range(first, last)), times, spec.fps, gop=8)


@pytest.mark.slow   # waits in real time for the file to grow
def test_a_followed_file_is_read_as_it_grows(tmp_path):
    spec = SyntheticSpec(width=160, height=120, fps=8, duration_s=4.0, gop=8)
    write_part(tmp_path / "a.ts", spec, 0, 16)
    write_part(tmp_path / "b.ts", spec, 16, 32)
    growing = tmp_path / "live.ts"
    growing.write_bytes((tmp_path / "a.ts").read_bytes())

    def recorder():
        time.sleep(0.6)
        with open(growing, "ab") as f:
            f.write((tmp_path / "b.ts").read_bytes())

    writer = threading.Thread(target=recorder)
    writer.start()
    source = StreamSource(growing, fps=2.0, follow_idle_s=1.5)
    samples = list(source)
    writer.join()
    assert [round(s.pts_s - samples[0].pts_s, 3) for s in samples] == [k / 2 for k in range(8)]
    assert source.frames_decoded == 32  # both parts, every frame once


def two_parts(tmp_path):
    spec = SyntheticSpec(width=160, height=120, fps=8, duration_s=4.0, gop=8)
    write_part(tmp_path / "a.ts", spec, 0, 16)
    write_part(tmp_path / "b.ts", spec, 16, 32)
    return (tmp_path / "a.ts").read_bytes(), (tmp_path / "b.ts").read_bytes()


@pytest.mark.slow
def test_a_followed_file_may_start_empty(tmp_path):
    a, b = two_parts(tmp_path)
    growing = tmp_path / "live.ts"
    growing.write_bytes(b"")  # the recorder has just created it

    def recorder():
        for part in (a[:1000], a[1000:], b):  # the first burst is too short to open
            time.sleep(0.4)
            with open(growing, "ab") as f:
                f.write(part)

    writer = threading.Thread(target=recorder)
    writer.start()
    source = StreamSource(growing, fps=2.0, follow_idle_s=1.5)
    samples = list(source)
    writer.join()
    assert len(samples) == 8 and source.frames_decoded == 32


def test_growth_while_a_pass_decodes_is_not_missed(tmp_path):
    a, b = two_parts(tmp_path)
    growing = tmp_path / "live.ts"
    growing.write_bytes(a)

    class AppendsDuringFirstPass(StreamSource):
        appended = False

        def _decoded(self, resume_after):
            yield from super()._decoded(resume_after)
            if not self.appended:  # the recorder's next burst lands as this pass ends
                self.appended = True
                with open(growing, "ab") as f:
                    f.write(b)

    source = AppendsDuringFirstPass(growing, fps=2.0, follow_idle_s=0.3)
    assert len(list(source)) == 8 and source.frames_decoded == 32


@pytest.mark.parametrize("codec, suffix, source, expected", [
    ("h264", ".mp4", "auto", "codec"), ("h264", ".mp4", "pixels", "pixels"), ("hevc", ".mp4", "auto", "pixels"),
    ("vp9", ".webm", "auto", "pixels"), ("h264", ".mp4", None, None)])
def test_a_source_says_where_its_motion_comes_from_once_open(make_test_video, codec, suffix, source, expected):
    from vidsight.ingest.dynamic import MotionPruneConfig

    path, _ = make_test_video(suffix, width=128, height=96, duration_s=1.0, codec=codec)
    stream = StreamSource(path, fps=4.0, motion=None if source is None else MotionPruneConfig(source=source))
    assert stream.motion_source is None   # not open yet: the codec is unknown
    assert len(list(stream)) == 4
    assert (stream.codec, stream.motion_source) == (codec, expected)


def test_a_codec_without_vectors_refuses_a_watch_asking_for_them(make_test_video):
    from vidsight.errors import ConfigError
    from vidsight.ingest.dynamic import MotionPruneConfig

    path, _ = make_test_video(".mp4", width=128, height=96, duration_s=1.0, codec="hevc")
    with pytest.raises(ConfigError, match="hevc carries no motion vectors"):
        list(StreamSource(path, fps=4.0, motion=MotionPruneConfig(source="codec")))


@pytest.mark.parametrize("idle", [0.0, -1.0])
def test_a_follow_time_that_is_not_positive_is_refused(make_test_video, idle):
    from vidsight.errors import ConfigError

    with pytest.raises(ConfigError, match="follow"):
        StreamSource(make_test_video(duration_s=1.0)[0], fps=2.0, follow_idle_s=idle)


class _Dropping:
    """An opened stream whose connection dies after ``drop_at`` packets (None: it does not); ``live``:
    declaring no duration, as a live stream does (else the file's)."""

    def __init__(self, container, drop_at: int | None, live: bool = False):
        self.container, self.streams, self.drop_at = container, container.streams, drop_at
        self.duration = None if live else container.duration

    def demux(self, stream):
        sent = 0
        for packet in self.container.demux(stream):
            if packet.size and sent == self.drop_at:   # (the empty packet at the end flushes the decoder)
                raise av.error.EOFError(5, "connection reset")
            sent += packet.size > 0
            yield packet

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.container.close()


def _open_dropping(monkeypatch, path, drop_at, live: bool = False) -> list:
    """Make every open of a stream open ``path`` instead, from its start, dying after ``drop_at(opens
    so far)`` packets; returns the URLs opened."""
    real_open, opened = av.open, []

    def fake_open(url, mode="r", timeout=None, options=None, **kwargs):
        opened.append(url)
        return _Dropping(real_open(str(path), mode), drop_at(len(opened)), live)

    monkeypatch.setattr("vidsight.ingest.stream.av.open", fake_open)
    monkeypatch.setattr(StreamSource, "_pause", lambda self, s: False)
    return opened


def test_a_dropped_stream_reconnects_and_resumes_after_the_last_frame(make_test_video, monkeypatch):
    path, _ = make_test_video(width=160, height=120, fps=8, duration_s=3.0, gop=8)
    opened = _open_dropping(monkeypatch, path, lambda opens: 10 if opens == 1 else None)   # the first dies after 10
    source = StreamSource("rtsp://camera.invalid/live", fps=2.0)
    samples = list(source)
    assert len(opened) == 2
    assert [s.index for s in samples] == list(range(6))
    assert source.frames_decoded == 24  # 10 before the drop, 14 after: none twice
    assert not source.live   # a recording served over the network: it has a duration


def test_a_live_rtsp_camera_whose_clock_starts_over_when_it_reconnects_goes_on(make_test_video, monkeypatch,
                                                                              caplog):
    """FFmpeg times RTSP from each connection's first packet: after a drop, a live camera's frames
    came timed from 0 again, before the last one seen, and were skipped (a watch silent for as long
    as it had run). They are timed on from the last frame, each connection's frames all new."""
    path, _ = make_test_video(width=160, height=120, fps=8, duration_s=3.0, gop=8)
    opened = _open_dropping(monkeypatch, path, lambda opens: 10 if opens == 1 else None, live=True)
    source = StreamSource("rtsp://camera.invalid/live", fps=2.0)
    with caplog.at_level("WARNING", logger="vidsight.ingest.stream"):
        samples = list(source)
    times = [s.pts_s for s in samples]
    before = source.frames_decoded - 24   # the second connection's 3 s are all new
    assert len(opened) == 2 and 6 <= before <= 10
    assert all(b > a for a, b in zip(times, times[1:])) and times[-1] > 3.0 and len(samples) >= 8
    assert sum("clock started over" in r.getMessage() for r in caplog.records) == 1
    assert source.live


def test_a_stream_that_keeps_failing_gives_up_with_a_clear_error(monkeypatch):
    def failing_open(url, mode="r", timeout=None, options=None, **kwargs):
        raise av.error.ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr("vidsight.ingest.stream.av.open", failing_open)
    monkeypatch.setattr(StreamSource, "_pause", lambda self, s: False)
    with pytest.raises(VideoError, match="rtsp://camera.invalid/live: stream failed"):
        list(StreamSource("rtsp://camera.invalid/live", fps=2.0, reconnect_tries=2))


def test_sampling_counts_from_the_first_frame_when_the_stream_starts_late(make_test_video):
    path, truth = make_test_video(width=160, height=120, fps=8, duration_s=3.0, gop=8, start_time_s=1.25)
    samples = list(StreamSource(path, fps=2.0))
    assert samples[0].pts_s == pytest.approx(1.25)
    assert [round(s.pts_s - 1.25, 3) for s in samples] == [k / 2 for k in range(6)]


def test_residuals_keep_presentation_order_with_b_frames(make_test_video):
    from vidsight.ingest.dynamic import SOFTWARE_ALPHA, MotionPruneConfig

    path, _ = make_test_video(width=160, height=120, fps=12, duration_s=2.0, gop=12, bframes=True, seed=6)
    plain = list(StreamSource(path, fps=12.0, motion=MotionPruneConfig()))
    judged = list(StreamSource(path, fps=12.0, motion=MotionPruneConfig(alpha=SOFTWARE_ALPHA)))
    assert [f.frame_index for f in judged] == [f.frame_index for f in plain] == list(range(24))
    assert "B" in {f.codec.frame_type for f in judged}
    assert all(torch.equal(a.rgb, b.rgb) for a, b in zip(plain, judged))


@pytest.fixture
def hls_server(tmp_path, make_test_video):
    """``playlist(segment_uri) -> url``: an HTTP server on loopback serving a one-segment HLS
    playlist that names ``segment_uri``; the segment itself is at ``url``'s ``/seg.ts`` and at the
    ``segment_file`` path on disk."""
    import functools
    import http.server

    path, _ = make_test_video(".ts", width=160, height=120, fps=8, duration_s=3.0, gop=8, bframes=False, seed=6)
    (tmp_path / "seg.ts").write_bytes(path.read_bytes())
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    http.server.SimpleHTTPRequestHandler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"

    def playlist(segment_uri: str) -> str:
        (tmp_path / "list.m3u8").write_text("#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:3\n"
                                            f"#EXTINF:3.0,\n{segment_uri}\n#EXT-X-ENDLIST\n")
        return f"{base}/list.m3u8"

    playlist.base, playlist.segment_file = base, tmp_path / "seg.ts"
    yield playlist
    server.shutdown()


def _frames(url: str) -> int:
    try:
        return sum(1 for _ in StreamSource(url, fps=2.0, reconnect_tries=0))
    except (VideoError, av.error.FFmpegError):
        return 0


def test_an_hls_playlist_cannot_make_ffmpeg_read_a_local_file(hls_server, monkeypatch):
    assert _frames(hls_server(f"{hls_server.base}/seg.ts")) > 0   # the same segment over HTTP plays
    for scheme in ("concat:", "subfile,,start,0,end,0,,:"):
        assert _frames(hls_server(f"{scheme}{hls_server.segment_file}")) == 0
    assert _frames(hls_server(f"file://{hls_server.segment_file}")) == 0
    # The whitelist reaches FFmpeg (this FFmpeg's HLS demuxer also refuses file segments itself):
    # with http left out of it, the same playable playlist cannot open.
    url = hls_server(f"{hls_server.base}/seg.ts")
    monkeypatch.setitem(PROTOCOL_WHITELIST, "http", "tcp")
    assert _frames(url) == 0


def test_failures_are_counted_in_a_row_and_a_frame_starts_the_count_again(make_test_video, monkeypatch):
    path, _ = make_test_video(width=160, height=120, fps=8, duration_s=3.0, gop=8)
    opened = _open_dropping(monkeypatch, path, lambda opens: opens * 6)   # each dies after 6 more packets
    source = StreamSource("rtsp://camera.invalid/live", fps=2.0, reconnect_tries=1)
    assert len(list(source)) == 6 and len(opened) == 4   # three drops, each after new frames: never two in a row


def test_a_recording_served_over_http_is_watched_window_by_window_however_slow_the_model(hls_server,
                                                                                          make_test_video,
                                                                                          tiny_adapter):
    """A network stream with a duration is a recording: read ahead only as far as the watch's
    backlog holds, never dropped, every window judged (a live stream's watch would catch up)."""
    from vidsight.engine.steps import drive
    from vidsight.engine.watch import WatchConfig, Watcher
    from vidsight.ingest.windows import WindowConfig

    recording, _ = make_test_video(width=160, height=120, fps=8, duration_s=3.0, gop=8, bframes=False, seed=6)
    (hls_server.segment_file.parent / "recording.mp4").write_bytes(recording.read_bytes())
    config = WatchConfig(WindowConfig(window_s=1.0, stride_fraction=0.5, fps=2.0))   # 2 frames, stride 1
    source = config.open(f"{hls_server.base}/recording.mp4")
    watcher = Watcher(tiny_adapter, "Is there a red object? Answer Yes or No.", config)
    verdicts = list(watcher.watch(source, run=lambda steps: time.sleep(0.3) or drive(steps, tiny_adapter)))
    assert source.network and not source.live
    assert [v.window for v in verdicts] == list(range(5)) and (watcher.windows_skipped, watcher.frames_dropped) == (0, 0)


def test_a_resumed_watch_reads_a_recording_again_and_goes_on_from_now_in_an_endless_stream(hls_server,
                                                                                           make_test_video,
                                                                                           tiny_adapter, monkeypatch):
    """The server resumes a watch after a restart: a recording served over HTTP is read again from
    its start, its judged windows passed over; an endless stream cannot be, so it goes on from now,
    its windows numbered after the stored ones (every network stream was taken for endless)."""
    from vidsight.engine.watch import WatchConfig, Watcher
    from vidsight.ingest.windows import WindowConfig

    recording, _ = make_test_video(width=160, height=120, fps=8, duration_s=3.0, gop=8, bframes=False, seed=6)
    (hls_server.segment_file.parent / "recording.mp4").write_bytes(recording.read_bytes())
    config = WatchConfig(WindowConfig(window_s=1.0, stride_fraction=0.5, fps=2.0), catch_up=False)
    query = "Is there a red object? Answer Yes or No."
    whole = list(Watcher(tiny_adapter, query, config).watch(config.open(recording)))
    served = list(Watcher(tiny_adapter, query, config).watch(config.open(f"{hls_server.base}/recording.mp4"),
                                                              first_window=3))
    assert [v.window for v in whole] == list(range(5)) and [v.window for v in served] == [3, 4]
    assert all(torch.equal(a.logits, b.logits) for a, b in zip(whole[3:], served, strict=True))
    _open_dropping(monkeypatch, recording, lambda opens: None, live=True)
    camera = config.open("http://camera.invalid/live")
    resumed = list(Watcher(tiny_adapter, query, config).watch(camera, first_window=3))
    assert camera.endless and [v.window for v in resumed] == [3, 4, 5, 6, 7]
    assert all(torch.equal(a.logits, b.logits) for a, b in zip(whole, resumed, strict=True))


def test_a_stream_failing_longer_than_its_window_gives_up_whatever_the_count(monkeypatch):
    clock = [0.0]

    def failing_open(url, mode="r", timeout=None, options=None, **kwargs):
        raise av.error.ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr("vidsight.ingest.stream.av.open", failing_open)
    monkeypatch.setattr(StreamSource, "_pause", lambda self, s: clock.__setitem__(0, clock[0] + s))
    monkeypatch.setattr("vidsight.ingest.stream.time.monotonic", lambda: clock[0])
    with pytest.raises(VideoError, match="failed 4 times in a row over 7 s"):
        list(StreamSource("rtsp://camera.invalid/live", fps=2.0, reconnect_tries=100, reconnect_window_s=5.0))


def test_a_network_source_that_is_not_video_fails_at_once(tmp_path):
    import functools
    import http.server

    (tmp_path / "page.html").write_text("<html><body>" + "not a video " * 500 + "</body></html>")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    http.server.SimpleHTTPRequestHandler.log_message = lambda *args: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        started = time.monotonic()
        with pytest.raises(VideoError, match="not a video stream"):
            list(StreamSource(f"http://127.0.0.1:{server.server_address[1]}/page.html", fps=2.0))
        assert time.monotonic() - started < 5   # no reconnect back-off
    finally:
        server.shutdown()


def test_a_stream_whose_frame_size_changes_keeps_its_first_size(tmp_path, caplog):
    """An adaptive stream switching renditions (here MPEG-TS parts of 320x240 then 160x120, with
    continuing timestamps): every frame comes out at the first's size, the later ones scaled as
    FFmpeg scales them, so a window or a session sees one size; said once."""
    large, small = (SyntheticSpec(width=w, height=h, fps=8, duration_s=4.0, seed=3) for w, h in ((320, 240), (160, 120)))
    write_part(tmp_path / "a.ts", large, 0, 16)
    write_part(tmp_path / "b.ts", small, 16, 32)
    joined = tmp_path / "joined.ts"
    joined.write_bytes((tmp_path / "a.ts").read_bytes() + (tmp_path / "b.ts").read_bytes())
    frames = list(StreamSource(joined, fps=8.0))
    assert len(frames) == 32 and {tuple(f.rgb.shape) for f in frames} == {(240, 320, 3)}
    with av.open(str(tmp_path / "b.ts")) as container:
        scaled = [f.to_ndarray(format="rgb24", width=320, height=240, interpolation="BICUBIC")
                  for f in container.decode(video=0)]
    assert all(np.array_equal(f.rgb.numpy(), s) for f, s in zip(frames[16:], scaled))
    assert caplog.text.count("frame size changed mid-stream from 320x240 to 160x120") == 1


def test_timestamps_that_go_back_in_a_file_or_a_network_stream_are_timed_on(tmp_path, hls_server, caplog):
    """MPEG-TS parts joined whose second restarts its clock (a camera's segments, a capture
    resumed; an encoder restarted under a network stream): the second part's frames come after the
    first's, one frame on, not skipped as past (a network stream's were, until its time caught up)."""
    spec = SyntheticSpec(width=160, height=120, fps=8, duration_s=4.0, seed=3)
    write_part(tmp_path / "a.ts", spec, 0, 16)
    write_part(tmp_path / "b.ts", spec, 0, 16)   # its clock starts over at 0
    joined = tmp_path / "joined.ts"
    joined.write_bytes((tmp_path / "a.ts").read_bytes() + (tmp_path / "b.ts").read_bytes())
    frames = list(StreamSource(joined, fps=8.0))
    assert len(frames) == 32
    assert [f.pts_s for f in frames] == pytest.approx([k / 8 for k in range(32)])
    second = list(StreamSource(tmp_path / "b.ts", fps=8.0))
    assert all(torch.equal(f.rgb, s.rgb) for f, s in zip(frames[16:], second))
    assert caplog.text.count("timestamps go back") == 1
    served = list(StreamSource(f"{hls_server.base}/joined.ts", fps=8.0))   # one connection
    assert [f.pts_s for f in served] == [f.pts_s for f in frames]
    assert caplog.text.count("timestamps go back") == 2


def test_a_live_stream_reconnected_after_its_clock_went_back_goes_on_from_where_it_was(tmp_path, monkeypatch,
                                                                                       caplog):
    """A live HTTP stream's timestamps went back (an HLS discontinuity, an encoder restarted) and were
    timed on; then the connection dropped. The next connection sends timestamps of the same clock
    as those after the jump, some frames again: they are timed on by the same shift (the repeated
    ones skipped), not taken for frames from before the jump and skipped until time caught up."""
    spec = SyntheticSpec(width=160, height=120, fps=8, duration_s=6.0, seed=3)
    write_part(tmp_path / "a.ts", spec, 0, 16)
    write_part(tmp_path / "b.ts", spec, 0, 16)    # its clock starts over at 0
    write_part(tmp_path / "c.ts", spec, 4, 32)    # b's clock: its frames 4-15 again, then 16-31
    joined = tmp_path / "joined.ts"
    joined.write_bytes((tmp_path / "a.ts").read_bytes() + (tmp_path / "b.ts").read_bytes())
    alone = list(StreamSource(tmp_path / "c.ts", fps=8.0))
    real_open, connections = av.open, [(joined, 26), (tmp_path / "c.ts", None)]   # the first dies in b

    def reconnecting_open(url, mode="r", timeout=None, options=None, **kwargs):
        path, drop_at = connections.pop(0)
        return _Dropping(real_open(str(path), mode), drop_at, live=True)

    monkeypatch.setattr("vidsight.ingest.stream.av.open", reconnecting_open)
    monkeypatch.setattr(StreamSource, "_pause", lambda self, s: False)
    with caplog.at_level("WARNING", logger="vidsight.ingest.stream"):
        frames = list(StreamSource("http://camera.invalid/live.m3u8", fps=8.0))
    assert not connections and "timestamps go back" in caplog.text and "stream dropped" in caplog.text
    assert [f.pts_s for f in frames] == pytest.approx([k / 8 for k in range(48)])
    assert all(torch.equal(f.rgb, c.rgb) for f, c in zip(frames[-16:], alone[-16:]))


def test_a_live_source_refuses_a_stream_ffmpeg_cannot_decode_naming_it(tmp_path, monkeypatch):
    """What `bench fuzz` found once it ran `watch`: a damaged MPEG-PS whose video stream FFmpeg
    cannot decode (PyAV gives it no codec context) ended in an AttributeError; the live source now
    makes the checks the probe makes (`video_stream`)."""
    import types

    class Undecodable:   # what PyAV opens: a video stream without a codec context
        streams = types.SimpleNamespace(video=[types.SimpleNamespace(codec_context=None, disposition=0)])

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    path = tmp_path / "damaged.mpg"
    path.write_bytes(b"\x00\x00\x01\xba" + bytes(2048))
    monkeypatch.setattr(av, "open", lambda *args, **kwargs: Undecodable())
    with pytest.raises(VideoError, match=f"{path}: video stream uses a codec FFmpeg cannot decode"):
        list(StreamSource(path, fps=2.0))


def pipe_of(path) -> io.BufferedReader:
    """A pipe's reading end (it cannot seek) that a thread fills with ``path``'s bytes, as a shell
    pipeline's standard input is filled."""
    return os.fdopen(fuzz_pipe_of(path), "rb")


@pytest.mark.parametrize("suffix, codec", [(".ts", "h264"), (".mkv", "hevc"), (".h264", "h264")])
def test_a_pipe_is_read_as_the_file_it_carries(make_test_video, suffix, codec):
    """Standard input or a named pipe gives the samples the file gives: the same frames, times and
    judged motion (pixels, so that the rule runs on HEVC too), read once from the front."""
    from vidsight.ingest.dynamic import MotionPruneConfig

    path, _ = make_test_video(suffix, width=128, height=96, duration_s=2.0, fps=8, gop=8, codec=codec, seed=3)
    motion = MotionPruneConfig(source="pixels")
    from_file = list(StreamSource(path, fps=4.0, motion=motion))
    with pipe_of(path) as pipe:
        assert not pipe.seekable()
        source = StreamSource(pipe, fps=4.0, motion=motion)
        from_pipe = list(source)
    # (A raw stream has no timestamps: both are timed at FFmpeg's 25 fps, 3 samples of its 16 frames.)
    assert source.source == "<pipe>" and source.codec == codec and len(from_pipe) == len(from_file) >= 3
    for a, b in zip(from_pipe, from_file):
        assert (a.index, a.frame_index, a.pts_s, a.gop_start) == (b.index, b.frame_index, b.pts_s, b.gop_start)
        assert torch.equal(a.rgb, b.rgb)
        assert a.codec.frame_type == b.codec.frame_type
        assert np.array_equal(a.codec.dynamic, b.codec.dynamic)


def test_an_mp4_from_a_pipe_is_refused_saying_what_can_be_piped(make_test_video):
    # Its index written last, 200 kB in: more than FFmpeg's read buffer lets it seek back over.
    path, _ = make_test_video(".mp4", width=320, height=240, duration_s=4.0, fps=8, gop=8)
    with pipe_of(path) as pipe, pytest.raises(VideoError, match=r"<pipe>: .*needs seeking.*MPEG-TS"):
        list(StreamSource(pipe, fps=2.0))
    with open(path, "rb") as seekable:   # standard input redirected from the file can seek: read as the file
        assert [f.pts_s for f in StreamSource(seekable, fps=2.0)] == [f.pts_s for f in StreamSource(path, fps=2.0)]


def test_following_a_pipe_is_refused(make_test_video):
    from vidsight.errors import ConfigError

    with pipe_of(make_test_video(".ts", duration_s=1.0)[0]) as pipe, pytest.raises(ConfigError, match="pipe"):
        StreamSource(pipe, fps=2.0, follow_idle_s=1.0)


def test_a_packet_the_decoder_rejects_is_skipped_and_counted(make_test_video, tmp_path, caplog):
    """A damaged packet (a bit flipped in a file, a datagram lost from a camera) made the whole
    watch fail; it is skipped, counted, said once, and every other frame comes out as before."""
    path, _ = make_test_video(".mkv", width=128, height=96, duration_s=2.0, fps=8, gop=8)
    damaged = tmp_path / "damaged.mkv"
    with av.open(str(path)) as source, av.open(str(damaged), "w") as out:
        stream = source.streams.video[0]
        copy = out.add_stream_from_template(stream)
        for number, packet in enumerate(p for p in source.demux(stream) if p.dts is not None):
            if number == 5:   # a P-frame's NAL length past the packet's end: FFmpeg's decoder refuses it
                data = bytearray(bytes(packet))
                data[:4] = b"\x7f\xff\xff\xff"
                bad = av.Packet(bytes(data))
                bad.pts, bad.dts, bad.time_base, bad.is_keyframe = packet.pts, packet.dts, packet.time_base, False
                packet = bad
            packet.stream = copy
            out.mux(packet)
    whole = list(StreamSource(path, fps=8.0))
    source = StreamSource(damaged, fps=8.0)
    with caplog.at_level("WARNING", logger="vidsight.ingest.stream"):
        kept = list(source)
    assert source.damaged_packets == 1 and len(kept) == len(whole) - 1 == 15
    assert sum("rejected a damaged packet" in r.getMessage() for r in caplog.records) == 1
    times = [f.pts_s for f in whole]
    assert [f.pts_s for f in kept] == times[:5] + times[6:]
    assert all(torch.equal(a.rgb, b.rgb) for a, b in zip(kept[:5], whole[:5]))


def test_a_closed_stream_ends_at_its_next_frame_and_is_not_reopened(make_test_video, monkeypatch):
    """A watch or a session stopped while its reader waits on a camera: the reader's source ends,
    and a camera that drops then is not reconnected to on its behalf."""
    path, _ = make_test_video(width=160, height=120, fps=8, duration_s=3.0, gop=8)
    opened = _open_dropping(monkeypatch, path, lambda opens: 10, live=True)   # every connection dies after 10
    source = StreamSource("rtsp://camera.invalid/live", fps=8.0)
    frames = iter(source)
    next(frames)
    source.close()
    assert list(frames) == [] and len(opened) == 1
    going_on = iter(StreamSource("rtsp://camera.invalid/live", fps=8.0))
    assert len([next(going_on) for _ in range(20)]) == 20 and len(opened) >= 3   # not closed: reopened after drops


def test_closing_a_real_time_replay_ends_its_wait_for_the_next_frame(make_test_video):
    """A replay waits for each frame's time (seconds apart here, hours in a recording whose
    timestamps are damaged): a close from another thread ends the wait at once, not at the frame."""
    path, _ = make_test_video(width=160, height=120, fps=0.25, duration_s=12.0, gop=1)
    source = StreamSource(path, fps=0.25, realtime=True)
    got, ended = [], threading.Event()

    def read():
        got.extend(source)
        ended.set()

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 10
    while not got and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(got) == 1   # the next frame is due 4 s later
    closed_at = time.monotonic()
    source.close()
    assert ended.wait(2.0) and time.monotonic() - closed_at < 1.0 and len(got) == 1
