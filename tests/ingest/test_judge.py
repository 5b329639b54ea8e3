"""The motion rule stops for the rest of a GOP once every block moved: the masks stay the same."""

import av
import numpy as np
import pytest
import torch

from vidsight.bench.motion import sample_photograph
from vidsight.ingest import DecodeConfig, SamplingConfig, decode_frames, probe, sample_frames
from vidsight.ingest.dynamic import BlockMotion, MotionPruneConfig
from vidsight.ingest import judge as judging
from vidsight.ingest.judge import FrameJudge, SampleSignals, frame_type
from vidsight.ingest.writer import write_video
from vidsight.tasks.scenes import Scene, SceneObject
from vidsight.vision.motion import MotionMasker


def _masks_and_rule_calls(path, monkeypatch, saturation: bool, motion: MotionPruneConfig = MotionPruneConfig()):
    calls = []
    update = BlockMotion.update
    monkeypatch.setattr(BlockMotion, "update", lambda self, *a, **k: calls.append(1) or update(self, *a, **k))
    if not saturation:
        monkeypatch.setattr(SampleSignals, "saturated", property(lambda self: False))
    info = probe(path)
    batch = decode_frames(path, sample_frames(info, SamplingConfig(fps=3.0)), DecodeConfig(motion=motion),
                          info)
    masker = MotionMasker()
    masks = [masker.frame_mask(codec, (12, 16)) for codec in batch.codec]
    monkeypatch.undo()
    return torch.stack(masks), len(calls)


def _write(path, scene, fps=12):
    times = np.arange(int(scene.duration_s * fps)) / fps
    return write_video(path, (scene.render(t) for t in times), times, fps, gop=24, bframes=True)


@pytest.mark.parametrize("source", ["codec", "pixels"])
def test_a_pan_stops_the_rule_early_in_each_gop_and_keeps_the_same_masks(tmp_path, monkeypatch, source):
    path = _write(tmp_path / "pan.mp4", Scene(224, 168, 6.0, seed=2, pan=36.0, photo=sample_photograph()))
    motion = MotionPruneConfig(source=source)
    masks, calls = _masks_and_rule_calls(path, monkeypatch, saturation=True, motion=motion)
    unsaturated, all_calls = _masks_and_rule_calls(path, monkeypatch, saturation=False, motion=motion)
    # A pan moves everything: H.264 codes a vector for every block; estimated motion misses at most
    # a flat patch (a GOP's first sample after its keyframe has three frames to persist through).
    assert torch.equal(masks, unsaturated) and (masks.all() if source == "codec" else masks.float().mean() > 0.99)
    assert calls < all_calls / 2 if source == "codec" else calls < 0.6 * all_calls   # pixels: a batch later


def test_a_static_camera_runs_the_rule_on_every_frame(tmp_path, monkeypatch):
    crossing = SceneObject("square", "red", 30, 0.0, 10.0, (10.0, 60.0), (40.0, 0.0))
    path = _write(tmp_path / "static.mp4", Scene(224, 168, 4.0, seed=2, noise=3.0, objects=[crossing]))
    masks, calls = _masks_and_rule_calls(path, monkeypatch, saturation=True)
    unsaturated, all_calls = _masks_and_rule_calls(path, monkeypatch, saturation=False)
    assert torch.equal(masks, unsaturated) and not masks.all()
    assert calls == all_calls


def test_still_vectors_change_no_verdict_so_the_judge_leaves_them_out(tmp_path):
    """`FrameJudge` drops zero vectors (most of a camera's blocks) before the rule: fed every
    vector instead, the rule marks the same blocks on every frame of a noisy scene with B-frames."""
    import av

    from vidsight.ingest.decode import configure_decoder
    from vidsight.ingest.judge import frame_type, frame_vectors
    from vidsight.ingest.motion import grid_shape, motion_map

    crossing = SceneObject("square", "red", 30, 0.0, 10.0, (10.0, 60.0), (40.0, 0.0))
    path = _write(tmp_path / "static.mp4", Scene(224, 168, 3.0, seed=2, noise=3.0, objects=[crossing]))
    for config in (MotionPruneConfig(), MotionPruneConfig(rule="paper", persist_frames=1)):
        every, moving, still, dynamic = BlockMotion(config), BlockMotion(config), 0, 0
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            configure_decoder(stream, with_motion=True, threads="AUTO")
            for frame in container.decode(stream):
                kind, vectors = frame_type(frame), frame_vectors(frame)
                shape = grid_shape(frame.height, frame.width)
                judged = every.update(kind, vectors, motion_map(vectors, frame.height, frame.width), None,
                                      fine_shape=shape)
                judged = None if judged is None else judged.blocks()
                if vectors is not None:
                    still += int(((vectors["motion_x"] == 0) & (vectors["motion_y"] == 0)).sum())
                    vectors = vectors[(vectors["motion_x"] != 0) | (vectors["motion_y"] != 0)]
                kept = moving.update(kind, vectors, motion_map(vectors, frame.height, frame.width), None,
                                     fine_shape=shape)
                kept = None if kept is None else kept.blocks()
                assert (judged is None and kept is None) or np.array_equal(judged, kept)
                dynamic += 0 if judged is None else int(judged.sum())
        assert still > 0 and dynamic > 0


@pytest.mark.parametrize("fps", [12, 30])
def test_pixel_motion_estimated_in_batches_judges_each_frame_as_alone(tmp_path, monkeypatch, fps):
    crossing = SceneObject("square", "red", 30, 0.0, 10.0, (10.0, 60.0), (40.0, 0.0))
    path = _write(tmp_path / "static.mp4", Scene(224, 168, 4.0, seed=2, noise=3.0, objects=[crossing]), fps=fps)

    def verdicts():
        judge, out = FrameJudge(MotionPruneConfig(source="pixels"), "pixels", probe(path).average_fps), {}
        with av.open(str(path)) as container:
            for index, frame in enumerate(container.decode(video=0)):
                out.update(judge.push(frame, frame_type(frame), index))
                assert len(out) > index - judging.PIXEL_BATCH   # held for at most a batch
        out.update(judge.finish())
        return [None if signals[2] is None else signals[2].blocks() for _, signals in sorted(out.items())]

    batched = verdicts()
    monkeypatch.setattr(judging, "PIXEL_BATCH", 1)
    alone = verdicts()
    assert len(batched) == len(alone) == 4 * fps
    assert all((a is None and b is None) or np.array_equal(a, b) for a, b in zip(batched, alone))
    assert 0 < sum(int(b.sum()) for b in batched if b is not None) < 0.5 * sum(b.size for b in batched if b is not None)
    # 24-frame GOPs: at 30 fps motion is estimated from every second frame; at 12, from each.
    judged = [k % 24 for k, verdict in enumerate(batched) if verdict is not None]
    assert set(judged) == (set(range(2, 24, 2)) if fps == 30 else set(range(1, 24)))


@pytest.mark.parametrize("source, codec, intra_only, expected", [
    ("auto", "h264", False, "codec"), ("auto", "hevc", False, "pixels"), ("codec", "hevc", False, None),
    ("auto", "mjpeg", True, None), ("pixels", "mjpeg", True, "pixels"), ("codec", "mjpeg", True, None),
    ("pixels", "h264", False, "pixels"),
])
def test_where_motion_comes_from_by_codec_and_setting(source, codec, intra_only, expected):
    from vidsight.ingest.judge import motion_source

    assert motion_source(MotionPruneConfig(source=source), codec, intra_only) == expected
    assert motion_source(None, codec, intra_only) is None
