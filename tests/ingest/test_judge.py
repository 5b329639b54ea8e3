"""The motion rule stops for the rest of a GOP once every block moved: the masks stay the same."""

import numpy as np
import torch

from vidsight.ingest import DecodeConfig, SamplingConfig, decode_frames, probe, sample_frames
from vidsight.ingest.dynamic import BlockMotion, MotionPruneConfig
from vidsight.ingest.judge import SampleSignals
from vidsight.ingest.writer import write_video
from vidsight.tasks.scenes import Scene, SceneObject
from vidsight.vision.motion import MotionMasker


def _masks_and_rule_calls(path, monkeypatch, saturation: bool):
    calls = []
    update = BlockMotion.update
    monkeypatch.setattr(BlockMotion, "update", lambda self, *a, **k: calls.append(1) or update(self, *a, **k))
    if not saturation:
        monkeypatch.setattr(SampleSignals, "saturated", property(lambda self: False))
    info = probe(path)
    batch = decode_frames(path, sample_frames(info, SamplingConfig(fps=3.0)), DecodeConfig(motion=MotionPruneConfig()),
                          info)
    masker = MotionMasker()
    masks = [masker.frame_mask(codec, (12, 16)) for codec in batch.codec]
    monkeypatch.undo()
    return torch.stack(masks), len(calls)


def _write(path, scene, fps=12):
    times = np.arange(int(scene.duration_s * fps)) / fps
    return write_video(path, (scene.render(t) for t in times), times, fps, gop=24, bframes=True)


def test_a_pan_stops_the_rule_early_in_each_gop_and_keeps_the_same_masks(tmp_path, monkeypatch):
    path = _write(tmp_path / "pan.mp4", Scene(224, 168, 6.0, seed=2, pan=36.0))
    masks, calls = _masks_and_rule_calls(path, monkeypatch, saturation=True)
    unsaturated, all_calls = _masks_and_rule_calls(path, monkeypatch, saturation=False)
    assert torch.equal(masks, unsaturated) and masks.all()
    assert calls < all_calls / 2


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
                if vectors is not None:
                    still += int(((vectors["motion_x"] == 0) & (vectors["motion_y"] == 0)).sum())
                    vectors = vectors[(vectors["motion_x"] != 0) | (vectors["motion_y"] != 0)]
                kept = moving.update(kind, vectors, motion_map(vectors, frame.height, frame.width), None,
                                     fine_shape=shape)
                assert (judged is None and kept is None) or np.array_equal(judged, kept)
                dynamic += 0 if judged is None else int(judged.sum())
        assert still > 0 and dynamic > 0
