"""The families whose tower encodes whole frames at one square size (LLaVA-OneVision, InternVL3):
`ask` at full compute against transformers' own `generate` on the prompt its processor writes, the
preprocessing against the published formula, 1-D key re-rotation, and what they refuse."""

import numpy as np
import pytest
import torch
from PIL import Image

from vidsight.engine import Asker, GenerationConfig, PrefillConfig
from vidsight.engine.watch import WatchConfig, Watcher
from vidsight.errors import ConfigError
from vidsight.ingest import FrameBatch, decode_frames, probe, sample_frames
from vidsight.ingest.dynamic import MotionPruneConfig
from vidsight.ingest.stream import StreamSource
from vidsight.ingest.windows import WindowConfig
from vidsight.models.decoder import apply_rotary
from vidsight.vision import preprocess_video

from tests.models.family_reference import CASE_IDS, CASES, QUESTION, check_first_token_logits, check_greedy_answer

WINDOWS = WindowConfig(window_s=2.0, stride_fraction=0.5, fps=2.0)


@pytest.fixture(params=["llava_onevision", "internvl"])
def family(request):
    return request.getfixturevalue(f"{'llava' if request.param == 'llava_onevision' else 'internvl'}_adapter")


def processor_prompt(adapter, frames: int, tokens_per_frame: int) -> torch.Tensor:
    """The prompt the family's Hugging Face processor writes: its ``<video>`` expanded as published."""
    text = adapter.tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": QUESTION}]}],
        chat_template=adapter.chat_template, add_generation_prompt=True, tokenize=False)
    if adapter.family == "llava_onevision":  # every frame's pooled tokens, then one newline token
        video = "<video>" * (frames * tokens_per_frame + 1)
    else:  # InternVL: each frame labelled, frames on their own lines
        video = "\n".join(f"Frame{k + 1}: <img>{'<IMG_CONTEXT>' * tokens_per_frame}</img>" for k in range(frames))
    return torch.tensor([adapter.tokenizer(text.replace("<video>", video, 1), add_special_tokens=False)["input_ids"]])


def reference_inputs(adapter, path, sampling):
    """transformers' inputs for the frames `ask` samples: the processor's prompt and `ask`'s pixels."""
    info = probe(path)
    frames = decode_frames(path, sample_frames(info, sampling), info=info).data
    video = preprocess_video(frames, adapter.vision)
    rows, columns = adapter.vision.token_hw(video.grid_thw[1:])
    ids = processor_prompt(adapter, len(frames), rows * columns)
    pixels = {"pixel_values_videos": video.pixel_values[None]} if adapter.family == "llava_onevision" else \
        {"pixel_values": video.pixel_values}
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids), **pixels), frames


@pytest.mark.device_check
@pytest.mark.parametrize("name,fields,fps", CASES, ids=CASE_IDS)
def test_greedy_answer_equals_transformers_generate(family, make_test_video, name, fields, fps):
    check_greedy_answer(family, make_test_video, name, fields, fps, reference_inputs)


@pytest.mark.device_check
def test_first_token_logits_match_transformers_for_any_group_size(family, make_test_video):
    check_first_token_logits(family, make_test_video, reference_inputs, [0, 1, 2, 3])


def test_frames_are_resized_to_the_towers_square_and_normalised_as_published(family):
    """The published formula: bicubic resize to the tower's square input, x / 255, (x - mean) / std."""
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(3, 90, 160, 3), dtype=np.uint8)
    spec = family.vision
    video = preprocess_video(torch.from_numpy(frames), spec)
    side = spec.fixed_size
    assert video.pixel_values.shape == (3, 3, *side) and video.grid_thw == (3, side[0] // 14, side[1] // 14)
    mean, std = np.array(spec.image_mean, dtype=np.float32), np.array(spec.image_std, dtype=np.float32)
    for frame, ours in zip(frames, video.pixel_values):
        resized = np.asarray(Image.fromarray(frame).resize(side[::-1], Image.BICUBIC), dtype=np.float32)
        expected = torch.from_numpy((resized / 255.0 - mean) / std).permute(2, 0, 1)
        # torch resamples uint8 with PIL's algorithm to within one intensity step
        assert (ours - expected).abs().max() <= 1 / 255 / min(spec.image_std) + 1e-5


def test_one_dimensional_re_rotation_equals_rotation_at_the_new_position(family):
    torch.manual_seed(0)
    raw = torch.randn(1, family.num_kv_heads, 5, family.head_dim)
    old = torch.tensor([3, 10, 11, 50, 400]).expand(3, -1)
    new = old - 7
    moved = family.rerotate_keys(apply_rotary(raw, family.rotary(old)), old, new)
    torch.testing.assert_close(moved, apply_rotary(raw, family.rotary(new)), rtol=1e-5, atol=1e-5)


def test_motion_pruning_is_refused_where_tokens_pool_across_patch_groups(llava_adapter, make_test_video):
    path, _ = make_test_video(**CASES[0][1])
    with pytest.raises(ConfigError, match="pools patches across groups"):
        Asker(llava_adapter).ask(path, QUESTION, prefill=PrefillConfig(motion=MotionPruneConfig()))
    with pytest.raises(ConfigError, match="pools patches across groups"):
        Watcher(llava_adapter, "Is it red?", WatchConfig(WINDOWS, prune=MotionPruneConfig()))


@pytest.mark.device_check
def test_a_full_comp_watch_judges_each_window_as_ask_does(internvl_adapter, make_test_video):
    path, _ = make_test_video(width=176, height=144, duration_s=4.0, fps=8, gop=16, bframes=False)
    verdicts = list(Watcher(internvl_adapter, QUESTION, WatchConfig(WINDOWS)).watch(StreamSource(path, 2.0)))
    assert len(verdicts) >= 3
    frames = list(StreamSource(path, 2.0))
    stride = WINDOWS.stride_frames
    for number, verdict in enumerate(verdicts):
        window = frames[number * stride : number * stride + WINDOWS.window_frames]
        batch = FrameBatch(torch.stack([f.rgb for f in window]), torch.tensor([f.pts_s for f in window]),
                           torch.tensor([f.frame_index for f in window]))
        alone = Asker(internvl_adapter).ask_frames(batch, QUESTION, WINDOWS.fps,
                                                   generation=GenerationConfig(max_new_tokens=1))
        assert verdict.answer == alone.answer


def test_internvl_skips_merge_groups_inside_its_tower(internvl_adapter):
    """Every group kept through the skipping path is the full encoding; a frame missing a group
    yields its other tokens only, and the frames left whole are untouched."""
    torch.manual_seed(0)
    video = preprocess_video(torch.randint(0, 256, (3, 90, 160, 3), dtype=torch.uint8), internvl_adapter.vision)
    tokens_hw = internvl_adapter.vision.token_hw(video.grid_thw[1:])
    with torch.inference_mode():
        full = internvl_adapter.encode_video(video.pixel_values, video.grid_thw)
        every = internvl_adapter._encode_kept(video.pixel_values, torch.ones(3, *tokens_hw, dtype=torch.bool))
        keep = torch.ones(3, *tokens_hw, dtype=torch.bool)
        keep[1, 0, 0] = False
        part = internvl_adapter.encode_video(video.pixel_values, video.grid_thw, keep)
    torch.testing.assert_close(every, full, rtol=1e-5, atol=1e-5)
    per_frame = tokens_hw[0] * tokens_hw[1]
    assert part.shape[0] == full.shape[0] - 1
    torch.testing.assert_close(part[:per_frame], full[:per_frame])           # frame 0 whole
    torch.testing.assert_close(part[-per_frame:], full[-per_frame:])         # frame 2 whole
    assert not torch.equal(part[per_frame : 2 * per_frame - 1], full[per_frame + 1 : 2 * per_frame])


def test_internvl_motion_pruning_encodes_fewer_tokens_on_a_static_camera(internvl_adapter, make_test_video):
    path, _ = make_test_video(width=320, height=240, duration_s=6.0, fps=8, gop=48, bframes=False)
    pruned = Asker(internvl_adapter).ask(path, QUESTION, prefill=PrefillConfig(group_frames=4, motion=MotionPruneConfig()),
                                         generation=GenerationConfig(max_new_tokens=2))
    assert 0 < pruned.stats.encoded_visual_tokens < pruned.stats.visual_tokens


def test_the_newline_counts_among_visual_and_kept_tokens_alike(llava_adapter, make_test_video):
    path, _ = make_test_video(**CASES[0][1])
    result = Asker(llava_adapter).ask(path, QUESTION, generation=GenerationConfig(max_new_tokens=1))
    assert result.stats.kept_visual_tokens == result.stats.visual_tokens == result.stats.frames * 9 + 1
