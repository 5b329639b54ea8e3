"""Motion-guided patch pruning inside ask (`PrefillConfig.motion`), alone and with KV pruning."""

import numpy as np
import pytest
import torch

from vidsight.engine import Asker, GenerationConfig, PrefillConfig, PruneConfig
from vidsight.errors import ConfigError
from vidsight.ingest import FeedConfig, SamplingConfig
from vidsight.ingest.dynamic import MotionPruneConfig
from vidsight.ingest.writer import write_video
from vidsight.tasks.scenes import Scene, SceneObject

QUESTION = "What colour is the square?"
SAMPLING = SamplingConfig(fps=4.0)
GENERATION = GenerationConfig(max_new_tokens=6)
FULL_COMPUTE = dict(prefill=PrefillConfig(group_frames=0),
                    feed=FeedConfig(workers=0, overlap=False, trim_gops=False, resize_in_decoder=False))
FPS = 12


def _write(path, scene: Scene, bframes=True, codec="h264") -> str:
    times = np.arange(int(scene.duration_s * FPS)) / FPS
    write_video(path, (scene.render(t) for t in times), times, FPS, gop=24, bframes=bframes, codec=codec)
    return str(path)


@pytest.fixture(scope="module")
def panning_video(tmp_path_factory):
    """The camera pans: every block moves in every frame."""
    return _write(tmp_path_factory.mktemp("pan") / "pan.mp4", Scene(224, 168, 6.0, seed=2, pan=36.0))


@pytest.fixture(scope="module")
def static_camera(tmp_path_factory):
    """A static camera with sensor noise and one object crossing it."""
    crossing = SceneObject("square", "red", 30, 0.0, 10.0, (10.0, 60.0), (40.0, 0.0))
    scene = Scene(224, 168, 6.0, seed=2, noise=3.0, objects=[crossing])
    return _write(tmp_path_factory.mktemp("static") / "static.mp4", scene)


def test_pruning_that_keeps_every_patch_answers_like_full_compute(tiny_adapter, panning_video):
    """Tau 0 under the first rule on a pan keeps every patch: answers and logits are full compute's."""
    asker = Asker(tiny_adapter)
    prefill = PrefillConfig(group_frames=4, motion=MotionPruneConfig(tau=0.0, rule="max"))
    full = asker.ask(panning_video, QUESTION, sampling=SAMPLING, generation=GENERATION, **FULL_COMPUTE)
    pruned = asker.ask(panning_video, QUESTION, sampling=SAMPLING, generation=GENERATION, prefill=prefill)
    assert pruned.stats.encoded_visual_tokens == full.stats.visual_tokens  # nothing was pruned
    assert pruned.token_ids == full.token_ids
    assert torch.allclose(asker.prefill_logits(panning_video, QUESTION, sampling=SAMPLING, prefill=prefill),
                          asker.prefill_logits(panning_video, QUESTION, sampling=SAMPLING, **FULL_COMPUTE), atol=1e-4)


@pytest.mark.parametrize("feed", [FeedConfig(workers=2), FeedConfig(workers=2, overlap=False),
                                  FeedConfig(workers=0, overlap=False, trim_gops=False)],
                         ids=["overlapped intervals", "intervals, then prefill", "one decoder, every frame"])
def test_a_static_camera_encodes_fewer_patches_the_same_way_whatever_decodes_it(tiny_adapter, static_camera, feed):
    asker = Asker(tiny_adapter)
    prefill = PrefillConfig(group_frames=4, motion=MotionPruneConfig())
    reference = asker.ask(static_camera, QUESTION, sampling=SAMPLING, generation=GENERATION, prefill=prefill,
                          feed=FeedConfig(workers=1, overlap=False))
    result = asker.ask(static_camera, QUESTION, sampling=SAMPLING, generation=GENERATION, prefill=prefill, feed=feed)
    stats = result.stats
    assert stats.encoded_visual_tokens < 0.6 * stats.visual_tokens
    assert stats.kept_visual_tokens == stats.encoded_visual_tokens
    assert (stats.encoded_visual_tokens, result.token_ids) == (reference.stats.encoded_visual_tokens,
                                                               reference.token_ids)
    assert stats.motion_source == "codec"   # H.264's vectors, under auto


def test_kv_pruning_chooses_among_the_patches_motion_kept(tiny_adapter, static_camera):
    asker = Asker(tiny_adapter)
    motion = asker.ask(static_camera, QUESTION, sampling=SAMPLING, generation=GENERATION,
                       prefill=PrefillConfig(group_frames=4, motion=MotionPruneConfig()))
    both = asker.ask(static_camera, QUESTION, sampling=SAMPLING, generation=GENERATION,
                     prefill=PrefillConfig(group_frames=4, prune=PruneConfig(rho=0.5), motion=MotionPruneConfig()))
    assert both.stats.encoded_visual_tokens == motion.stats.encoded_visual_tokens
    assert both.stats.kept_visual_tokens < motion.stats.kept_visual_tokens
    assert both.stats.kept_visual_tokens >= motion.stats.encoded_visual_tokens // 2


def test_the_codecs_vectors_only_where_it_exports_none_encodes_every_patch(tiny_adapter, tmp_path, caplog):
    scene = Scene(224, 168, 3.0, seed=2)
    times = np.arange(int(scene.duration_s * FPS)) / FPS
    path = write_video(tmp_path / "v.webm", (scene.render(t) for t in times), times, FPS, codec="vp9")
    result = Asker(tiny_adapter).ask(path, QUESTION, sampling=SAMPLING, generation=GENERATION,
                                     prefill=PrefillConfig(group_frames=4, motion=MotionPruneConfig(source="codec")))
    assert result.stats.encoded_visual_tokens == result.stats.visual_tokens
    assert result.stats.motion_source is None
    assert "motion is not judged" in caplog.text


@pytest.mark.parametrize("codec, suffix", [("hevc", ".mp4"), ("vp9", ".webm")])
def test_a_codec_without_motion_vectors_is_pruned_by_its_pixels(tiny_adapter, tmp_path, caplog, codec, suffix):
    """HEVC and VP9 export no vectors: by default motion comes from the decoded pixels, and a
    static camera's frames encode fewer patches, the moving square's kept."""
    crossing = SceneObject("square", "red", 30, 0.0, 10.0, (10.0, 60.0), (40.0, 0.0))
    path = _write(tmp_path / f"static{suffix}", Scene(224, 168, 6.0, seed=2, noise=3.0, objects=[crossing]),
                  bframes=codec == "hevc", codec=codec)
    asker = Asker(tiny_adapter)
    pruned = asker.ask(path, QUESTION, sampling=SAMPLING, generation=GENERATION,
                       prefill=PrefillConfig(group_frames=4, motion=MotionPruneConfig()))
    whole = asker.ask(path, QUESTION, sampling=SAMPLING, generation=GENERATION,
                      prefill=PrefillConfig(group_frames=4))
    assert "no motion vectors" not in caplog.text
    assert (pruned.stats.motion_source, whole.stats.motion_source) == ("pixels", None)
    assert pruned.stats.visual_tokens == whole.stats.visual_tokens
    assert whole.stats.encoded_visual_tokens // 4 < pruned.stats.encoded_visual_tokens < whole.stats.visual_tokens // 2


def test_dropping_redundant_patches_encodes_fewer_and_keeps_the_first_frame(tiny_adapter, static_camera):
    asker = Asker(tiny_adapter)
    motion = asker.ask(static_camera, QUESTION, sampling=SAMPLING, generation=GENERATION,
                       prefill=PrefillConfig(group_frames=4, motion=MotionPruneConfig()))
    dedup = asker.ask(static_camera, QUESTION, sampling=SAMPLING, generation=GENERATION,
                      prefill=PrefillConfig(group_frames=4, motion=MotionPruneConfig(), dedup_patches=True))
    per_patch = motion.stats.visual_tokens // (motion.stats.frames // 2)
    assert per_patch <= dedup.stats.encoded_visual_tokens < motion.stats.encoded_visual_tokens


def test_dropping_redundant_patches_needs_motion_pruning():
    with pytest.raises(ConfigError, match="motion pruning"):
        PrefillConfig(dedup_patches=True)
