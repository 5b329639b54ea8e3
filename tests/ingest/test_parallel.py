"""Interval-parallel and seek decoding against sequential decoding, frame for frame."""

import importlib

import numpy as np
import pytest
import torch

from vidsight.errors import ConfigError
from vidsight.ingest import DecodeConfig, SamplingConfig, decode_frames, probe, sample_frames
from vidsight.ingest.dynamic import SOFTWARE_ALPHA, MotionPruneConfig
from vidsight.ingest.parallel import choose_strategy, decode_parallel, gop_spans, plan_spans
from vidsight.ingest.pixel_motion import frame_step
from vidsight.ingest.stream import StreamSource
from vidsight.ingest.types import FrameBatch

from tests.variants import fast_first

VIDEOS = {
    "b-frames": dict(duration_s=5.0, gop=10, bframes=True),
    "vfr, non-zero start": dict(duration_s=5.0, gop=12, bframes=True, variable_frame_rate=True, start_time_s=2.5),
    "last gop cut short": dict(duration_s=4.25, fps=24, gop=16, bframes=False),  # 102 frames: last GOP has 6
}
# Codecs whose decoders export no vectors: motion from pixels, estimated every second frame at 24
# fps, so motion persists through three estimates six frames into a GOP: GOPs long enough for a
# sample (every fifth frame) after that.
PIXEL_VIDEOS = {"hevc, b-frames": dict(duration_s=5.0, gop=20, bframes=True, codec="hevc"),
                "h264, b-frames": dict(duration_s=5.0, gop=20, bframes=True),
                "vp9": dict(duration_s=5.0, gop=12, codec="vp9", suffix=".webm")}
MPEG4 = dict(duration_s=5.0, gop=12, codec="mpeg4", suffix=".mkv")


def assert_same(a, b, with_codec_info):
    assert torch.equal(a.indices, b.indices) and torch.equal(a.pts_s, b.pts_s)
    assert torch.equal(a.data, b.data)
    if with_codec_info:
        for x, y in zip(a.codec, b.codec, strict=True):
            assert (x.frame_type, x.gop_index) == (y.frame_type, y.gop_index)
            np.testing.assert_array_equal(x.motion, y.motion)


@pytest.mark.parametrize("name", fast_first(list(VIDEOS)))
@pytest.mark.parametrize("fps", [None, 2.0])
@pytest.mark.parametrize("strategy", ["intervals", "seek"])
def test_parallel_frames_equal_sequential(make_test_video, name, fps, strategy):
    path, _ = make_test_video(**VIDEOS[name])
    info = probe(path)
    indices = None if fps is None else sample_frames(info, SamplingConfig(fps=fps))
    with_codec_info = strategy == "intervals"
    config = DecodeConfig(with_codec_info=with_codec_info)
    sequential = decode_frames(path, indices, config, info)
    parallel = decode_parallel(path, indices, config, info, workers=3, strategy=strategy)
    assert parallel.strategy == strategy
    assert_same(sequential, parallel, with_codec_info)


@pytest.mark.slow   # a process pool per case: seconds each
@pytest.mark.parametrize("name", list(VIDEOS))
@pytest.mark.parametrize("trim_gops", [False, True])
def test_decoding_processes_give_the_sequential_frames(make_test_video, name, trim_gops, monkeypatch):
    from multiprocessing import shared_memory

    path, _ = make_test_video(**VIDEOS[name])
    info = probe(path)
    indices = sample_frames(info, SamplingConfig(fps=3.0))
    config = DecodeConfig(with_codec_info=True, trim_gops=trim_gops)
    sequential = decode_frames(path, indices, config, info)
    progress, created = [], []

    class Recorded(shared_memory.SharedMemory):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            created.append(self.name)

    monkeypatch.setattr("vidsight.ingest.parallel.shared_memory.SharedMemory", Recorded)
    processes = decode_parallel(path, indices, config, info, workers=2, strategy="intervals",
                                on_frame=progress.append, backend="processes")
    assert_same(sequential, processes, True)
    assert progress and progress[-1] == len(indices)
    assert len(created) == 1
    with pytest.raises(FileNotFoundError):  # this decode's segment is unlinked, whatever others do
        shared_memory.SharedMemory(created[0])


@pytest.mark.slow
def test_decoding_processes_lose_the_same_frames_as_threads_in_a_damaged_file(make_test_video, tmp_path):
    good, _ = make_test_video(duration_s=4.0, bframes=True)
    data = bytearray(good.read_bytes())
    data[len(data) // 3 : len(data) // 3 + 20000] = bytes(20000)
    path = tmp_path / "damaged.mp4"
    path.write_bytes(bytes(data))
    info = probe(path)
    threads = decode_parallel(path, None, DecodeConfig(), info, workers=2)
    processes = decode_parallel(path, None, DecodeConfig(), info, workers=2, backend="processes")
    assert threads.frames_lost > 0 and processes.frames_lost == threads.frames_lost
    assert_same(threads, processes, False)


def test_unknown_backend_is_refused(make_test_video):
    path, _ = make_test_video(**VIDEOS["b-frames"])
    with pytest.raises(ConfigError, match="backend"):
        decode_parallel(path, backend="fibers")


@pytest.mark.parametrize("name", fast_first(list(VIDEOS)))
@pytest.mark.parametrize("fps", [1.0, 3.0, 7.0])
@pytest.mark.parametrize("threads", ["NONE", "AUTO"])
def test_trimmed_gops_give_the_same_frames_with_less_decoding(make_test_video, name, fps, threads):
    path, _ = make_test_video(**VIDEOS[name])
    info = probe(path)
    indices = sample_frames(info, SamplingConfig(fps=fps))
    full = decode_frames(path, indices, DecodeConfig(threads=threads), info)
    trimmed = decode_frames(path, indices, DecodeConfig(threads=threads, trim_gops=True), info)
    parallel = decode_parallel(path, indices, DecodeConfig(trim_gops=True), info, workers=2, strategy="intervals")
    assert full.frames_lost == 0
    assert_same(full, trimmed, False)
    assert_same(full, parallel, False)


def test_trimming_skips_gops_without_wanted_frames(make_test_video, monkeypatch):
    import av

    path, _ = make_test_video(duration_s=6.0, fps=10, gop=5, bframes=True)  # 12 GOPs of 5 frames
    info = probe(path)
    wanted = np.array([1, 27, 28])  # GOPs 0 and 5 only
    sent = []
    original = av.Packet.decode
    monkeypatch.setattr(av.Packet, "decode", lambda packet: sent.append(packet.pts) or original(packet))
    full = decode_frames(path, wanted, DecodeConfig(threads="NONE"), info)
    everything = len(sent)
    sent.clear()
    trimmed = decode_frames(path, wanted, DecodeConfig(threads="NONE", trim_gops=True), info)
    assert_same(full, trimmed, False)
    # Two GOPs of five frames at most, against every packet up to frame 28.
    assert len(sent) <= 10 < everything


def test_trimming_stops_each_gop_once_its_wanted_frames_are_sent(make_test_video, monkeypatch):
    import av

    path, _ = make_test_video(duration_s=6.0, fps=10, gop=5, bframes=True)
    info = probe(path)
    wanted = info.keyframe_indices[::2]  # keyframes only: each needs its own packet and nothing else
    sent = []
    original = av.Packet.decode
    monkeypatch.setattr(av.Packet, "decode", lambda packet: sent.append(packet) or original(packet))
    full = decode_frames(path, wanted, DecodeConfig(threads="NONE"), info)
    assert len(sent) > len(wanted)  # the reorder delay: full decoding sends later packets before a frame is out
    sent.clear()
    trimmed = decode_frames(path, wanted, DecodeConfig(threads="NONE", trim_gops=True), info)
    assert_same(full, trimmed, False)
    assert len(sent) == len(wanted) and all(packet.is_keyframe for packet in sent)


def test_trimming_skips_unwanted_non_reference_pictures(make_test_video, monkeypatch):
    import av

    from vidsight.ingest.nal import is_non_reference

    path, _ = make_test_video(duration_s=6.0, fps=10, gop=5, bframes=True)
    info = probe(path)
    wanted = info.keyframe_indices[1:] - 1  # the last frame of every GOP but the final one
    sent = []
    original = av.Packet.decode
    monkeypatch.setattr(av.Packet, "decode", lambda packet: sent.append(packet) or original(packet))
    full = decode_frames(path, wanted, DecodeConfig(threads="NONE"), info)
    non_reference = list(sent)
    sent.clear()
    trimmed = decode_frames(path, wanted, DecodeConfig(threads="NONE", trim_gops=True), info)
    assert_same(full, trimmed, False)

    def unwanted(packets):
        times = [float(p.pts * p.time_base) for p in packets if p.size and is_non_reference(bytes(p), 4)]
        return [t for t in times if np.abs(info.pts_s[wanted] - t).min() > 1e-6]

    assert unwanted(non_reference)  # the full decode sends them...
    assert not unwanted(sent)  # ...trimming does not


def test_last_gop_is_short_in_the_fixture(make_test_video):
    info = probe(make_test_video(**VIDEOS["last gop cut short"])[0])
    assert info.gop_sizes[-1] < info.gop_sizes[0]


def test_spans_start_at_keyframes_and_cover_every_wanted_frame(make_test_video):
    path, _ = make_test_video(**VIDEOS["b-frames"])
    info = probe(path)
    wanted = np.arange(info.frame_count)
    spans = plan_spans(info, wanted, 4)
    assert 1 < len(spans) <= 4
    assert all(first in info.keyframe_indices for first, _ in spans)
    covered = np.concatenate([np.arange(first, last + 1) for first, last in spans])
    np.testing.assert_array_equal(covered, wanted)


def test_seek_is_chosen_for_samples_sparser_than_gops(make_test_video):
    path, _ = make_test_video(**VIDEOS["b-frames"])
    info = probe(path)
    assert choose_strategy(info, np.arange(0, info.frame_count, 30)) == "seek"
    assert choose_strategy(info, np.arange(0, info.frame_count, 5)) == "intervals"
    assert gop_spans(info, np.array([3, 25, 27])) == [(0, 3), (20, 27)]
    batch = decode_parallel(path, np.arange(0, info.frame_count, 30), info=info, workers=2)
    assert batch.strategy == "seek"


def test_bad_settings_are_refused(make_test_video):
    path, _ = make_test_video(**VIDEOS["b-frames"])
    with pytest.raises(ConfigError):
        decode_parallel(path, workers=0)
    with pytest.raises(ConfigError):
        decode_parallel(path, strategy="fastest")


@pytest.mark.parametrize("backend", [None, "threads", pytest.param("processes", marks=pytest.mark.slow)])
def test_resizing_in_the_decoder_equals_resizing_the_decoded_frames(make_test_video, backend):
    from vidsight.vision import resize_frames  # the model's resize, as `ask` passes it

    path, _ = make_test_video(**VIDEOS["b-frames"])
    info = probe(path)
    indices = sample_frames(info, SamplingConfig(fps=3.0))
    size = (56, 84)
    full = decode_frames(path, indices, DecodeConfig(), info)
    config = DecodeConfig(size=size, resize=resize_frames, trim_gops=True)
    resized = (decode_frames(path, indices, config, info) if backend is None else
               decode_parallel(path, indices, config, info, workers=2, backend=backend))
    assert resized.data.shape == (len(indices), *size, 3)
    assert torch.equal(resized.data, resize_frames(full.data, size).permute(0, 2, 3, 1))
    assert torch.equal(resized.indices, full.indices)


def test_a_resize_function_needs_a_size():
    from vidsight.vision import resize_frames

    with pytest.raises(ConfigError, match="size"):
        DecodeConfig(resize=resize_frames)


def _same_signals(a, b):
    for x, y in zip(a.codec, b.codec, strict=True):
        assert (x.frame_type, x.gop_index) == (y.frame_type, y.gop_index)
        for name in ("motion", "intra", "dynamic"):
            got, want = getattr(x, name), getattr(y, name)
            assert (got is None) == (want is None), name
            if want is not None:
                np.testing.assert_array_equal(got, want, err_msg=name)


@pytest.mark.parametrize("motion", fast_first([MotionPruneConfig(), MotionPruneConfig(alpha=SOFTWARE_ALPHA),
                                                MotionPruneConfig(rule="max")], ids=["persistent", "residuals", "max"]))
@pytest.mark.parametrize("video", fast_first(["b-frames", "last gop cut short"]))
def test_decoders_judge_motion_as_the_live_source_does(make_test_video, motion, video):
    """Each sampled frame's signals (vectors, intra blocks, the rule's dynamic blocks since the
    sample before) are the same from the live source, one sequential decoder, interval decoders
    and per-GOP seeks, with GOP trimming on or off."""
    _judged_alike_by_every_decoder(make_test_video, VIDEOS[video], motion)


@pytest.mark.parametrize("motion, video", fast_first(
    [(MotionPruneConfig(), PIXEL_VIDEOS["hevc, b-frames"]),
     (MotionPruneConfig(alpha=SOFTWARE_ALPHA, rule="max"), PIXEL_VIDEOS["vp9"]),
     (MotionPruneConfig(source="pixels"), PIXEL_VIDEOS["h264, b-frames"])], ids=["hevc", "vp9, residuals, max",
                                                                              "h264 by pixels"],
    unpack=True))
def test_decoders_judge_pixel_motion_as_the_live_source_does(make_test_video, motion, video):
    """Motion estimated from pixels (HEVC and VP9 export no vectors; H.264 asked to use pixels)
    is the same from every decoding path, as codec vectors are."""
    _judged_alike_by_every_decoder(make_test_video, video, motion)


@pytest.mark.slow
def test_a_stream_declaring_no_rate_is_judged_alike_by_every_decoder(make_test_video, monkeypatch):
    """Judging by pixels takes its pace from the rate a stream declares: where it declares none,
    the decoders (whose probe knows the frames over the duration) compare every frame, as the
    live source (which knows nothing more) does."""
    for module in ("vidsight.ingest.probe", "vidsight.ingest.stream"):
        monkeypatch.setattr(importlib.import_module(module), "declared_fps", lambda stream: 0.0)
    video = PIXEL_VIDEOS["hevc, b-frames"]
    info = probe(make_test_video(**video)[0])
    assert info.declared_fps == 0 and info.average_fps == pytest.approx(24) and frame_step(24) == 2
    _judged_alike_by_every_decoder(make_test_video, video, MotionPruneConfig())


@pytest.mark.slow
@pytest.mark.parametrize("source", ["codec", "auto"])
def test_mpeg4_vectors_are_judged_when_asked_for_and_its_pixels_by_default(make_test_video, source):
    """MPEG-4 part 2 exports vectors (16x16 and 8x8 blocks): ``codec`` judges by them, ``auto`` by
    its pixels; either way every decoding path agrees."""
    motion = _judged_alike_by_every_decoder(make_test_video, MPEG4, MotionPruneConfig(source=source))
    if source == "codec":   # MPEG-4's own vectors are reported; estimated ones are the rule's input only
        assert any(m is not None and m.any() for m in motion)
    else:
        assert all(m is None for m in motion)


def _judged_alike_by_every_decoder(make_test_video, fields, motion):
    fields = dict(fields)
    path, _ = make_test_video(fields.pop("suffix", ".mp4"), **fields)
    info = probe(path)
    streamed = list(StreamSource(path, fps=info.average_fps / 5, motion=motion))
    indices = np.array([f.frame_index for f in streamed])
    assert any(f.codec.dynamic is not None and f.codec.dynamic.any() for f in streamed)
    expected = FrameBatch(torch.stack([f.rgb for f in streamed]), torch.tensor([f.pts_s for f in streamed]),
                          torch.from_numpy(indices), [f.codec for f in streamed])
    for trim_gops in (False, True):
        config = DecodeConfig(motion=motion, trim_gops=trim_gops)
        _same_signals(decode_frames(path, indices, config, info), expected)
        for strategy in ("intervals", "seek"):
            _same_signals(decode_parallel(path, indices, config, info, workers=3, strategy=strategy), expected)
    return [f.codec.motion for f in streamed]
