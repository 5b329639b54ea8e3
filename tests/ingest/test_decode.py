import av
import numpy as np
import pytest
import torch

from vidsight.ingest import DecodeConfig, SamplingConfig, decode_frames, probe, sample_frames


def plain_pyav_frames(path) -> list[np.ndarray]:
    with av.open(str(path)) as container:
        return [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]


VIDEOS = [
    dict(width=320, height=240, duration_s=2.0, bframes=False),
    dict(width=320, height=240, duration_s=2.0, bframes=True),
    dict(width=176, height=144, duration_s=1.5, bframes=True, variable_frame_rate=True, start_time_s=0.7),
]


@pytest.mark.parametrize("fields", VIDEOS)
@pytest.mark.parametrize("with_codec_info", [False, True])
def test_decoded_frames_equal_plain_pyav_decode(make_test_video, fields, with_codec_info):
    path, _ = make_test_video(**fields)
    reference = plain_pyav_frames(path)
    batch = decode_frames(path, config=DecodeConfig(with_codec_info=with_codec_info))
    assert batch.data.dtype == torch.uint8
    assert len(batch) == len(reference)
    for got, want in zip(batch.data.numpy(), reference):
        np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(batch.indices.numpy(), np.arange(len(reference)))


def test_sampled_frames_are_the_chosen_indices(make_test_video):
    path, truth = make_test_video(**VIDEOS[1])
    info = probe(path)
    indices = sample_frames(info, SamplingConfig(fps=5))
    batch = decode_frames(path, indices, info=info)
    reference = plain_pyav_frames(path)
    np.testing.assert_array_equal(batch.indices.numpy(), indices)
    np.testing.assert_allclose(batch.pts_s.numpy(), np.asarray(truth["pts_s"])[indices], atol=1e-4)
    for got, index in zip(batch.data.numpy(), indices):
        np.testing.assert_array_equal(got, reference[index])


@pytest.mark.parametrize("fields", VIDEOS)
def test_a_clip_is_decoded_from_the_keyframe_before_it(make_test_video, monkeypatch, fields):
    """A clip late in the file (`SamplingConfig.start_s`) is decoded from its GOP's keyframe, not
    from the file's start, to the same frames a plain decode gives."""
    from vidsight.ingest import decode

    path, _ = make_test_video(**fields, gop=8)
    info = probe(path)
    indices = sample_frames(info, SamplingConfig(fps=5, start_s=1.0))
    spans = []
    monkeypatch.setattr(decode, "decode_span", lambda sink, first, last, threads, _span=decode.decode_span: (
        spans.append(first), _span(sink, first, last, threads)))
    batch = decode_frames(path, indices, info=info)
    keyframe = int(info.keyframe_indices[info.gop_index_of(indices[:1])[0]])
    assert spans == [keyframe] and 0 < keyframe <= indices[0]
    reference = plain_pyav_frames(path)
    for got, index in zip(batch.data.numpy(), indices):
        np.testing.assert_array_equal(got, reference[index])


def test_resize_on_decode(make_test_video):
    path, _ = make_test_video(**VIDEOS[0])
    batch = decode_frames(path, [0, 5], DecodeConfig(size=(120, 160)))
    assert tuple(batch.data.shape) == (2, 120, 160, 3)


def test_codec_info_frame_types_and_gops(make_test_video):
    path, _ = make_test_video(width=320, height=240, fps=24, duration_s=2.0, gop=12, bframes=True)
    batch = decode_frames(path, config=DecodeConfig(with_codec_info=True))
    types = [c.frame_type for c in batch.codec]
    assert [i for i, t in enumerate(types) if t == "I"] == [0, 12, 24, 36]
    assert "B" in types and "P" in types
    assert [c.gop_index for c in batch.codec] == [i // 12 for i in range(48)]
    assert all(c.motion is not None and c.motion.shape == (2, 60, 80) for c in batch.codec)
    assert all(not c.motion.any() for c in batch.codec if c.frame_type == "I")
    # B-frames carry vectors from both directions.
    assert any(c.motion[1].any() for c in batch.codec if c.frame_type == "B")
