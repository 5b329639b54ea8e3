"""Group-wise prefill, KV pruning and decoding overlapped with prefill."""

import math

import pytest
import torch

from vidsight.engine import Asker, GenerationConfig, PrefillConfig, PruneConfig
from vidsight.ingest import FeedConfig
from vidsight.engine.prompt import build_video_prompt, plan_video
from vidsight.engine.request import Request
from vidsight.ingest import SamplingConfig, decode_frames, probe, sample_frames
from vidsight.ingest.feed import FrameFeed
from vidsight.kv import VIDEO
from vidsight.vision import preprocess_video

QUESTION = "What colour is the square?"
# The plain path: every frame decoded at full size, resized during preprocessing.
FULL_COMPUTE = dict(prefill=PrefillConfig(group_frames=0),
                    feed=FeedConfig(workers=0, overlap=False, trim_gops=False, resize_in_decoder=False))
VIDEO_SPEC = dict(width=320, height=240, duration_s=6.0, fps=10, gop=8, bframes=True, seed=5)


@pytest.fixture(scope="module")
def long_video(make_test_video):
    return make_test_video(**VIDEO_SPEC)[0]


@pytest.mark.parametrize("prefill,feed", [
    (PrefillConfig(group_frames=4), FeedConfig(workers=2, overlap=True)),
    (PrefillConfig(group_frames=3), FeedConfig(workers=1, overlap=True)),
    (PrefillConfig(group_frames=6), FeedConfig(workers=2, overlap=False)),
    (PrefillConfig(group_frames=4, prune=PruneConfig(rho=1.0)), FeedConfig(workers=0, overlap=False)),
])
def test_rho_one_group_prefill_answers_token_for_token_like_full_compute(tiny_adapter, long_video, prefill, feed):
    asker = Asker(tiny_adapter)
    generation = GenerationConfig(max_new_tokens=10)
    sampling = SamplingConfig(fps=2.0)
    full = asker.ask(long_video, QUESTION, sampling=sampling, generation=generation, **FULL_COMPUTE)
    grouped = asker.ask(long_video, QUESTION, sampling=sampling, generation=generation, prefill=prefill, feed=feed)
    assert grouped.token_ids == full.token_ids
    assert grouped.stats.groups > 1 and full.stats.groups == 1
    assert grouped.stats.kept_visual_tokens == full.stats.visual_tokens
    assert torch.allclose(asker.prefill_logits(long_video, QUESTION, sampling=sampling, prefill=prefill, feed=feed),
                          asker.prefill_logits(long_video, QUESTION, sampling=sampling, **FULL_COMPUTE), atol=1e-4)


def test_pruned_layers_keep_rho_of_each_group_at_their_true_positions(tiny_adapter, long_video):
    from vidsight.engine.prefill import prefill_video
    from vidsight.engine.stats import AskStats, StageClock

    info = probe(long_video)
    batch = decode_frames(long_video, sample_frames(info, SamplingConfig(fps=2.0)), info=info)

    def run(prefill):
        clock = StageClock(AskStats(), tiny_adapter.device)
        return prefill_video(tiny_adapter, FrameFeed.decoded(batch), QUESTION, 2.0, prefill, 1, Request(clock)), clock.stats

    full, full_stats = run(PrefillConfig(group_frames=4))
    pruned, stats = run(PrefillConfig(group_frames=4, prune=PruneConfig(rho=0.3, start_layer=1)))
    per_group = full_stats.visual_tokens * 4 // (len(batch) + len(batch) % 2)  # tokens of 4 frames
    groups = math.ceil(full_stats.visual_tokens / per_group)
    assert stats.kept_visual_tokens == groups * math.ceil(0.3 * per_group)
    # Layer 0 is below start_layer: untouched, identical to the unpruned cache.
    assert pruned.cache.filled[0] == full.cache.filled[0]
    last = tiny_adapter.num_layers - 1
    kept = pruned.cache.layer_tokens(last)
    video = kept.kind == VIDEO
    # Every kept token carries the position it had in the full prompt, and text is all kept.
    all_rows = full.cache.layer_tokens(last)
    full_positions = {tuple(p) for p in all_rows.position.tolist()}
    assert {tuple(p) for p in kept.position.tolist()} <= full_positions
    assert int((~video).sum()) == int((all_rows.kind != VIDEO).sum())
    # The first group's keys are computed before any pruning: kept ones are its smallest by norm.
    first = torch.nonzero(all_rows.kind == VIDEO).flatten()[:per_group]
    norms = full.cache.keys[last, 0, :, first].norm(dim=-1).mean(0)
    expected = first[torch.topk(-norms, math.ceil(0.3 * per_group)).indices].sort().values
    slots = torch.nonzero(video).flatten()[: len(expected)]
    assert torch.equal(pruned.cache.slot_rows[last, slots], expected)
    assert torch.allclose(pruned.cache.keys[last, 0, :, slots], full.cache.keys[last, 0, :, expected])


@pytest.mark.parametrize("scorer,skip", [("key-norm-small", False), ("value-norm", False), ("attention", False),
                                         ("key-norm-small", True), ("attention", True)])
def test_pruned_ask_answers_with_a_smaller_cache(tiny_adapter, long_video, scorer, skip):
    prefill = PrefillConfig(group_frames=4, prune=PruneConfig(rho=0.5, scorer=scorer, skip_pruned=skip))
    result = Asker(tiny_adapter).ask(long_video, QUESTION, sampling=SamplingConfig(fps=2.0),
                                     generation=GenerationConfig(max_new_tokens=4), prefill=prefill)
    assert 0 < result.stats.kept_visual_tokens <= result.stats.visual_tokens // 2 + result.stats.groups
    assert len(result.token_ids) >= 1


@pytest.mark.parametrize("spec,fps,strategy", [
    (VIDEO_SPEC, 5.0, "intervals"),
    (dict(width=176, height=144, duration_s=5.0, fps=12, gop=10, bframes=True, variable_frame_rate=True,
          start_time_s=1.25, seed=2), 3.0, "intervals"),
    (dict(width=176, height=144, duration_s=9.0, fps=8, gop=4, bframes=False, seed=3), 0.25, "seek"),
])
def test_background_feed_frames_equal_sequential_decoding(make_test_video, spec, fps, strategy):
    path, _ = make_test_video(**spec)
    info = probe(path)
    indices = sample_frames(info, SamplingConfig(fps=fps))
    expected = decode_frames(path, indices, info=info)
    with FrameFeed.background(path, indices, info, workers=2) as feed:
        got = torch.cat([feed.frames(lo, min(lo + 3, len(feed))) for lo in range(0, len(feed), 3)])
    assert feed.strategy == strategy and feed.frames_lost == 0 and feed.decode_s > 0
    assert torch.equal(got, expected.data)
    assert torch.equal(feed.indices, expected.indices)
    assert torch.equal(feed.pts_s, expected.pts_s)


def test_plan_matches_whole_video_preprocessing(tiny_adapter, long_video):
    info = probe(long_video)
    batch = decode_frames(long_video, sample_frames(info, SamplingConfig(fps=2.0)), info=info)
    video = preprocess_video(batch.data, tiny_adapter.vision)
    plan = plan_video(tiny_adapter, len(batch), batch.data.shape[1], batch.data.shape[2])
    assert plan.grid_thw == tuple(video.grid_thw) and plan.size == video.resized_hw
    # Frames the decoder resized plan to the same size again.
    assert plan_video(tiny_adapter, len(batch), *plan.size) == plan


def test_the_video_prompt_records_frame_time_grid_and_position(tiny_adapter, make_test_video):
    path, truth = make_test_video(width=320, height=240, duration_s=2.5, bframes=True)
    info = probe(path)
    feed = FrameFeed.decoded(decode_frames(path, sample_frames(info, SamplingConfig(fps=2.0)), info=info))
    plan = plan_video(tiny_adapter, len(feed), feed.height, feed.width)  # 5 frames: 3 temporal patches
    prompt = build_video_prompt(tiny_adapter, QUESTION, plan, feed.indices, feed.pts_s, sampled_fps=2.0)
    positions = tiny_adapter.video_positions(plan.grid_thw, 1.0, start=prompt.video_start)   # 2 frames at 2 fps
    rows = prompt.rows[prompt.video_start:prompt.video_end]
    per_patch = plan.tokens_per_patch
    assert len(rows) == 3 * per_patch and bool((rows.kind == VIDEO).all())
    assert bool((prompt.rows.kind != VIDEO).sum() == len(prompt.ids) - 3 * per_patch)
    expected_frames = feed.indices[[0, 2, 4]].repeat_interleave(per_patch)
    assert torch.equal(rows.frame_index, expected_frames)
    assert torch.allclose(rows.time_s, torch.tensor(truth["pts_s"], dtype=torch.float64)[expected_frames])
    assert rows.grid[:, 0].tolist() == [0] * per_patch + [1] * per_patch + [2] * per_patch
    assert torch.equal(rows.position, positions.T) and torch.equal(prompt.positions[:, prompt.video_start:
                                                                                    prompt.video_end], positions)
    # Motion pruning: the kept tokens keep their rows and their positions in the full grid.
    keep = torch.arange(3 * per_patch) % 3 == 0
    pruned = build_video_prompt(tiny_adapter, QUESTION, plan, feed.indices, feed.pts_s, 2.0, keep)
    assert pruned.video_tokens == int(keep.sum()) and len(pruned.ids) == len(prompt.ids) - int((~keep).sum())
    kept_rows = pruned.rows[pruned.video_start:pruned.video_end]
    assert torch.equal(kept_rows.position, positions.T[keep]) and torch.equal(kept_rows.grid, rows.grid[keep])


@pytest.mark.parametrize("bad", [dict(workers=-1), dict(workers=0, overlap=True)])
def test_feed_config_rejects_bad_values(bad):
    from vidsight.errors import ConfigError

    with pytest.raises(ConfigError):
        FeedConfig(**bad)
