"""Qwen3-VL: `ask` at full compute against transformers' own `generate` on the prompt Qwen's
processors write (timestamps per temporal patch, DeepStack, interleaved M-RoPE), the preprocessing
against qwen-vl-utils' published rule, re-rotation, and motion pruning inside its tower."""

import math

import numpy as np
import pytest
import torch
from PIL import Image

from vidsight.engine import Asker, GenerationConfig, PrefillConfig
from vidsight.ingest import SamplingConfig, decode_frames, probe, sample_frames
from vidsight.models.decoder import apply_rotary
from vidsight.vision import preprocess_video, video_size

from tests.models.family_reference import CASE_IDS, CASES, QUESTION, check_first_token_logits, check_greedy_answer


def processor_prompt(adapter, indices: list[int], fps: float, tokens_per_patch: int) -> torch.Tensor:
    """The prompt as Qwen3-VL's processors write it (vLLM's, and transformers' before 5.x): the
    template's ``<|vision_start|><|video_pad|><|vision_end|>`` replaced by, for each temporal
    patch, ``<{t:.1f} seconds>`` (t the mean of its first and last frame's index / fps, the last
    frame repeated to fill a patch) and its own vision start, tokens and end."""
    text = adapter.tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": QUESTION}]}],
        chat_template=adapter.chat_template, add_generation_prompt=True, tokenize=False)
    padded = indices + indices[-1:] * (len(indices) % 2)
    seconds = [(padded[i] / fps + padded[i + 1] / fps) / 2 for i in range(0, len(padded), 2)]
    video = "".join(f"<{t:.1f} seconds><|vision_start|>{'<|video_pad|>' * tokens_per_patch}<|vision_end|>"
                    for t in seconds)
    text = text.replace("<|vision_start|><|video_pad|><|vision_end|>", video, 1)
    return torch.tensor([adapter.tokenizer(text, add_special_tokens=False)["input_ids"]])


def reference_inputs(adapter, path, sampling):
    info = probe(path)
    indices = sample_frames(info, sampling)
    frames = decode_frames(path, indices, info=info)
    video = preprocess_video(frames.data, adapter.vision)
    _, gh, gw = video.grid_thw
    ids = processor_prompt(adapter, frames.indices.tolist(), info.average_fps, gh * gw // 4)
    return dict(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values_videos=video.pixel_values,
                video_grid_thw=torch.tensor([video.grid_thw]),
                mm_token_type_ids=(ids == adapter.video_token_id).int() * 2), frames


@pytest.mark.device_check
@pytest.mark.parametrize("name,fields,fps", CASES, ids=CASE_IDS)
def test_greedy_answer_equals_transformers_generate(qwen3_adapter, make_test_video, name, fields, fps):
    check_greedy_answer(qwen3_adapter, make_test_video, name, fields, fps, reference_inputs)


@pytest.mark.device_check
def test_first_token_logits_match_transformers_for_any_group_size(qwen3_adapter, make_test_video):
    check_first_token_logits(qwen3_adapter, make_test_video, reference_inputs, [0, 2, 4])


def test_deepstack_reaches_the_answer(qwen3_adapter, make_test_video):
    """The DeepStack levels are not inert: zeroing the features changes the answer's logits."""
    path, _ = make_test_video(**CASES[0][1])
    sampling = SamplingConfig(fps=2.0)
    asker = Asker(qwen3_adapter)
    full = asker.prefill_logits(path, QUESTION, sampling=sampling)
    mergers = qwen3_adapter.model.model.visual.deepstack_merger_list
    saved = {name: value.clone() for name, value in mergers.state_dict().items()}
    try:
        with torch.no_grad():
            for merger in mergers:
                merger.linear_fc2.weight.zero_()
                merger.linear_fc2.bias.zero_()
        without = asker.prefill_logits(path, QUESTION, sampling=sampling)
    finally:
        mergers.load_state_dict(saved)
    assert not torch.allclose(full, without, atol=1e-4)


def test_frames_are_resized_by_qwen_vl_utils_rule_with_16_pixel_patches(qwen3_adapter):
    """qwen-vl-utils' published rule for Qwen3-VL: sides rounded to multiples of 32, per-frame
    pixels within [min, max(min(max, total / frames * 2), 1.05 * min)], bicubic, (x/255 - 0.5) / 0.5."""
    spec = qwen3_adapter.vision
    assert (spec.patch_size, spec.merge_size, spec.factor) == (16, 2, 32)
    for frames, height, width in [(4, 240, 320), (2, 144, 176), (8, 1080, 1920), (2, 40, 30)]:
        budget = max(min(spec.max_pixels, spec.total_pixels / frames * 2), int(spec.min_pixels * 1.05))
        h, w = max(32, round(height / 32) * 32), max(32, round(width / 32) * 32)
        if h * w > budget:
            beta = math.sqrt(height * width / budget)
            h, w = max(32, math.floor(height / beta / 32) * 32), max(32, math.floor(width / beta / 32) * 32)
        elif h * w < spec.min_pixels:
            beta = math.sqrt(spec.min_pixels / (height * width))
            h, w = math.ceil(height * beta / 32) * 32, math.ceil(width * beta / 32) * 32
        assert video_size(spec, frames, height, width) == (h, w)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, size=(2, 90, 160, 3), dtype=np.uint8)
    video = preprocess_video(torch.from_numpy(frames), spec)
    h, w = video.resized_hw
    first = video.pixel_values.view(h // 32, w // 32, 2, 2, 3, 2, 16, 16)[..., 0, :, :]  # frame 0 of each patch
    ours = first.permute(4, 0, 2, 5, 1, 3, 6).reshape(3, h, w)
    resized = np.asarray(Image.fromarray(frames[0]).resize((w, h), Image.BICUBIC), dtype=np.float32)
    expected = torch.from_numpy((resized / 255.0 - 0.5) / 0.5).permute(2, 0, 1)
    assert (ours - expected).abs().max() <= 1 / 255 / 0.5 + 1e-5


def test_interleaved_mrope_re_rotation_equals_rotation_at_the_new_position(qwen3_adapter):
    torch.manual_seed(0)
    raw = torch.randn(1, qwen3_adapter.num_kv_heads, 6, qwen3_adapter.head_dim)
    old = torch.tensor([[4, 4, 4, 9, 9, 30], [4, 5, 6, 9, 10, 30], [4, 6, 5, 11, 9, 30]])
    new = old - 7
    new[1:, 3:5] += 2  # the axes moved by different amounts
    moved = qwen3_adapter.rerotate_keys(apply_rotary(raw, qwen3_adapter.rotary(old)), old, new)
    torch.testing.assert_close(moved, apply_rotary(raw, qwen3_adapter.rotary(new)), rtol=1e-5, atol=1e-5)
    # interleaved: the height axis drives frequency 1, not a contiguous block after the temporal ones
    cos, _ = qwen3_adapter.rotary(torch.tensor([[0], [5], [0]]))
    assert cos[0, 0, 1] != 1 and cos[0, 0, 0] == 1


def test_every_group_kept_equals_the_full_encoding_and_pruned_groups_are_left_out(qwen3_adapter, make_test_video):
    path, _ = make_test_video(**CASES[1][1])
    info = probe(path)
    video = preprocess_video(decode_frames(path, sample_frames(info, SamplingConfig(fps=2.0)), info=info).data,
                             qwen3_adapter.vision)
    t, gh, gw = video.grid_thw
    with torch.inference_mode():
        full = qwen3_adapter.encode_video(video.pixel_values, video.grid_thw)
        keep = torch.ones(t, gh // 2, gw // 2, dtype=torch.bool)
        torch.testing.assert_close(qwen3_adapter.encode_video(video.pixel_values, video.grid_thw, keep), full)
        keep[0, 0] = False
        kept = qwen3_adapter.encode_video(video.pixel_values, video.grid_thw, keep)
        # keep only the first temporal patch's groups: its encoding equals that patch alone
        only_first = torch.zeros_like(keep)
        only_first[0] = True
        first_alone = qwen3_adapter.encode_video(video.pixel_values[: gh * gw], (1, gh, gw))
        torch.testing.assert_close(qwen3_adapter.encode_video(video.pixel_values, video.grid_thw, only_first),
                                   first_alone)
    assert full.shape == (t * gh * gw // 4, 1 + qwen3_adapter.vision.deepstack_layers, 64)
    assert kept.shape[0] == full.shape[0] - gw // 2
    # later temporal patches attend only within themselves: untouched by the first patch's pruning
    torch.testing.assert_close(kept[-(gh * gw // 4) * (t - 1):], full[-(gh * gw // 4) * (t - 1):])


class _DropAtFirstLayer:
    """Keeps the chunk offsets ``kept`` at layer 0; the rest skip every later layer."""

    skip_pruned = True

    def __init__(self, kept: torch.Tensor):
        self.kept = kept

    def after_attention(self, layer, q, k, v, rows):
        return self.kept if layer == 0 else None


def test_tokens_that_skip_later_layers_carry_their_own_deepstack_features(qwen3_adapter, make_test_video):
    """Against transformers' own decoder layers and DeepStack step: the whole chunk through layer 0
    and its features, then only the kept tokens, each with its own features, through the rest."""
    from vidsight.engine.forward import forward
    from vidsight.kv import KVCache, TokenTable

    adapter, lm = qwen3_adapter, qwen3_adapter.model.model.language_model
    path, _ = make_test_video(**CASES[1][1])
    info = probe(path)
    video = preprocess_video(decode_frames(path, sample_frames(info, SamplingConfig(fps=2.0)), info=info).data,
                             adapter.vision)
    with torch.inference_mode():
        visual = adapter.encode_video(video.pixel_values, video.grid_thw)
        text = adapter.embed_tokens(torch.tensor(adapter.text_ids("a b c")))
        embeds = torch.cat([text[:3], visual, text[3:]])[None]  # (1, L, levels, hidden)
        length = embeds.shape[1]
        positions = torch.arange(length).expand(3, -1)
        kept = torch.cat([torch.arange(3), torch.arange(3, 3 + len(visual), 2), torch.arange(3 + len(visual), length)])
        cache = KVCache(adapter.num_layers, adapter.num_kv_heads, adapter.head_dim, length, adapter.dtype, adapter.device)
        ours = forward(adapter, cache, embeds, positions, TokenTable.text(positions), _DropAtFirstLayer(kept))

        hidden, levels = embeds[:, :, 0], embeds[:, :, 1:]
        rotary = lm.rotary_emb(hidden, positions[:, None, :])
        for layer, block in enumerate(lm.layers):
            hidden = block(hidden, attention_mask=None, position_embeddings=rotary)
            if layer < levels.shape[2]:
                hidden = hidden + levels[:, :, layer]
            if layer == 0:
                hidden, levels = hidden[:, kept], levels[:, kept]
                rotary = tuple(part[:, kept] for part in rotary)
    assert adapter.vision.deepstack_layers == 2 < adapter.num_layers
    torch.testing.assert_close(ours, hidden, rtol=1e-5, atol=1e-5)


def test_motion_pruning_encodes_fewer_tokens_on_a_static_camera(qwen3_adapter, make_test_video):
    from vidsight.ingest.dynamic import MotionPruneConfig

    path, _ = make_test_video(width=320, height=240, duration_s=6.0, fps=8, gop=48, bframes=False)
    pruned = Asker(qwen3_adapter).ask(path, QUESTION, prefill=PrefillConfig(group_frames=4, motion=MotionPruneConfig()),
                                      generation=GenerationConfig(max_new_tokens=2))
    assert 0 < pruned.stats.encoded_visual_tokens < pruned.stats.visual_tokens
    assert pruned.stats.kept_visual_tokens == pruned.stats.encoded_visual_tokens  # every encoded token prefilled
