"""LLaVA-OneVision: `ask` at full compute against transformers' own `generate`, its preprocessing
against the published formula, and its 1-D key re-rotation."""

import numpy as np
import pytest
import torch
from PIL import Image

from vidsight.engine import Asker, GenerationConfig, PrefillConfig
from vidsight.ingest.dynamic import MotionPruneConfig
from vidsight.errors import ConfigError
from vidsight.ingest import SamplingConfig, decode_frames, probe, sample_frames
from vidsight.models.decoder import apply_rotary
from vidsight.vision import preprocess_video

QUESTION = "What colour is the square?"
NEW_TOKENS = 12
CASES = [
    ("odd frames, B-frames, 320x240", dict(width=320, height=240, duration_s=2.5, bframes=True), 2.0),
    ("even frames, no B-frames, 320x240", dict(width=320, height=240, duration_s=2.0, bframes=False), 4.0),
    ("odd frames, no B-frames, 176x144", dict(width=176, height=144, duration_s=1.5, bframes=False), 2.0),
    ("even frames, B-frames, 176x144", dict(width=176, height=144, duration_s=3.0, bframes=True, seed=2), 4.0),
]


@pytest.fixture
def llava(llava_adapter):
    return llava_adapter


def reference_inputs(adapter, path, sampling):
    """The inputs `ask` builds, in transformers' form: the frames, their pixels and the prompt."""
    info = probe(path)
    frames = decode_frames(path, sample_frames(info, sampling), info=info).data
    video = preprocess_video(frames, adapter.vision)
    rows, columns = adapter.vision.token_hw(video.grid_thw[1:])
    ids = adapter.build_prompt(QUESTION, video.grid_thw[0] * rows * columns + 1).input_ids[None]
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values_videos=video.pixel_values[None]), frames


@pytest.mark.parametrize("name,fields,fps", CASES, ids=[c[0] for c in CASES])
def test_greedy_answer_equals_transformers_generate(llava, make_test_video, name, fields, fps):
    path, _ = make_test_video(**fields)
    sampling = SamplingConfig(fps=fps)
    result = Asker(llava).ask(path, QUESTION, sampling=sampling, prefill=PrefillConfig(group_frames=2),
                              generation=GenerationConfig(max_new_tokens=NEW_TOKENS))
    inputs, frames = reference_inputs(llava, path, sampling)
    assert result.stats.frames == len(frames) and len(frames) % 2 == (0 if "even" in name else 1)
    assert result.stats.visual_tokens == len(frames) * 9 + 1  # 5x5 patches pool to 3x3, then the newline
    out = llava.model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    assert result.token_ids == out[0, inputs["input_ids"].shape[1]:].tolist()


def test_first_token_logits_match_transformers_for_any_group_size(llava, make_test_video):
    path, _ = make_test_video(**CASES[0][1])
    inputs, _ = reference_inputs(llava, path, SamplingConfig(fps=2.0))
    with torch.inference_mode():
        reference = llava.model(**inputs).logits[0, -1]
    for group_frames in [0, 1, 2, 3]:
        ours = Asker(llava).prefill_logits(path, QUESTION, sampling=SamplingConfig(fps=2.0),
                                           prefill=PrefillConfig(group_frames=group_frames))
        torch.testing.assert_close(ours, reference, rtol=1e-4, atol=1e-4)


def test_frames_are_resized_to_the_towers_square_and_normalised_as_published(llava):
    """LLaVA-OneVision's formula: bicubic resize to the tower's square input, x / 255, (x - 0.5) / 0.5."""
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(3, 90, 160, 3), dtype=np.uint8)
    video = preprocess_video(torch.from_numpy(frames), llava.vision)
    side = llava.vision.fixed_size
    assert video.pixel_values.shape == (3, 3, *side) and video.grid_thw == (3, 5, 5)
    for frame, ours in zip(frames, video.pixel_values):
        resized = np.asarray(Image.fromarray(frame).resize(side[::-1], Image.BICUBIC), dtype=np.float32)
        expected = torch.from_numpy((resized / 255.0 - 0.5) / 0.5).permute(2, 0, 1)
        # torch resamples uint8 with PIL's algorithm to within one intensity step
        assert (ours - expected).abs().max() <= 1 / 255 / 0.5 + 1e-6


def test_one_dimensional_re_rotation_equals_rotation_at_the_new_position(llava):
    torch.manual_seed(0)
    raw = torch.randn(1, llava.num_kv_heads, 5, llava.head_dim)
    old = torch.tensor([3, 10, 11, 50, 400]).expand(3, -1)
    new = old - 7
    moved = llava.rerotate_keys(apply_rotary(raw, llava.rotary(old)), old, new)
    torch.testing.assert_close(moved, apply_rotary(raw, llava.rotary(new)), rtol=1e-5, atol=1e-5)


def test_motion_pruning_is_refused_with_a_whole_frame_encoder(llava, make_test_video):
    path, _ = make_test_video(**CASES[0][1])
    with pytest.raises(ConfigError, match="whole frames"):
        Asker(llava).ask(path, QUESTION, prefill=PrefillConfig(motion=MotionPruneConfig()))


def test_a_watch_cannot_prune_patches_of_a_whole_frame_encoder(llava):
    from vidsight.engine.watch import WatchConfig, Watcher
    from vidsight.ingest.stream import WindowConfig

    with pytest.raises(ConfigError, match="whole frames"):
        Watcher(llava, "Is it red?", WatchConfig(WindowConfig(window_s=4.0, fps=2.0), prune=MotionPruneConfig()))
