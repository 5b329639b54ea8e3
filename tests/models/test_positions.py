"""M-RoPE positions against transformers' get_rope_index and Qwen's published rule."""

import torch

from vidsight.models.positions import prompt_positions, video_grid_positions


def transformers_positions(adapter, layout, grid_thw, second_per_grid_t):
    ids = layout.input_ids[None]
    mm_types = (ids == adapter.video_token_id).int() * 2
    positions, deltas = adapter.model.model.get_rope_index(
        ids, mm_types, video_grid_thw=torch.tensor([grid_thw]), second_per_grid_ts=torch.tensor([second_per_grid_t]))
    return positions[:, 0], int(deltas[0]) + ids.shape[1]


def ours(adapter, layout, grid_thw, second_per_grid_t):
    vpos = adapter.video_positions(grid_thw, second_per_grid_t, layout.video_start)
    return prompt_positions(len(layout.input_ids), layout.video_start, vpos)


def test_short_video_positions_equal_transformers(tiny_adapter):
    grid = (3, 16, 12)  # temporal span 2*2*1=4 < 8 merged rows: both rules agree
    layout = tiny_adapter.build_prompt("What is it?", 3 * 8 * 6)
    theirs, their_next = transformers_positions(tiny_adapter, layout, grid, 1.0)
    mine, my_next = ours(tiny_adapter, layout, grid, 1.0)
    torch.testing.assert_close(mine, theirs)
    assert my_next == their_next


def test_long_video_follows_qwen_rule(tiny_adapter):
    grid = (20, 8, 8)  # temporal positions reach 38, beyond the 4x4 merged grid
    layout = tiny_adapter.build_prompt("What is it?", 20 * 4 * 4)
    theirs, their_next = transformers_positions(tiny_adapter, layout, grid, 1.0)
    mine, my_next = ours(tiny_adapter, layout, grid, 1.0)
    span = slice(layout.video_start, layout.video_start + layout.video_tokens)
    torch.testing.assert_close(mine[:, : span.stop], theirs[:, : span.stop])
    video_max = int(mine[:, span].max())
    assert video_max == layout.video_start + 19 * 2
    suffix = mine[:, span.stop :]
    assert torch.equal(suffix[0], suffix[1]) and torch.equal(suffix[1], suffix[2])
    assert int(suffix[0, 0]) == video_max + 1
    assert my_next == int(suffix.max()) + 1
    # transformers 5.x starts this text at start + max(h, w) instead, inconsistent with its own
    # decode steps (which continue from the overall maximum): see vidsight/models/positions.py.
    assert int(theirs[0, span.stop]) == layout.video_start + 4 and their_next == video_max + 1


def test_temporal_index_uses_seconds_per_grid():
    pos = video_grid_positions((4, 4, 4), merge_size=2, second_per_grid_t=0.5, tokens_per_second=2, start=10)
    # 4 temporal patches x 2x2 merged cells; t ticks = int(t * 0.5 * 2) = t.
    assert pos.shape == (3, 16)
    assert pos[0].tolist() == [10] * 4 + [11] * 4 + [12] * 4 + [13] * 4
    assert pos[1].tolist()[:4] == [10, 10, 11, 11]
    assert pos[2].tolist()[:4] == [10, 11, 10, 11]
    fractional = video_grid_positions((4, 2, 2), 2, second_per_grid_t=0.75, tokens_per_second=2, start=0)
    assert fractional[0].tolist() == [0, 1, 3, 4]  # int(t * 1.5), no premature truncation
