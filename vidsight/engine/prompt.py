"""The prompt around one video span, built once for ask and watch: its shape (`VideoPlan`), its
token ids, positions and token-table rows (`VideoPrompt`). Chat builds its rows patch by patch
with `patch_rows`."""

from __future__ import annotations

import dataclasses

import torch

from vidsight.kv import VIDEO, TokenTable
from vidsight.models.base import VisionSpec, VLMAdapter
from vidsight.models.positions import prompt_positions
from vidsight.vision import video_size


@dataclasses.dataclass(frozen=True)
class VideoPlan:
    """The shape of a video prompt, fixed before any frame is decoded."""

    frames: int                       # sampled frames (before padding to whole temporal patches)
    size: tuple[int, int]             # resized (height, width)
    grid_thw: tuple[int, int, int]    # temporal patches, patch rows, patch columns
    token_hw: tuple[int, int]         # language-model token rows and columns per temporal patch
    suffix_tokens: int = 0            # tokens after the last patch (LLaVA-OneVision's newline)

    @property
    def tokens_per_patch(self) -> int:
        return self.token_hw[0] * self.token_hw[1]

    @property
    def patch_tokens(self) -> int:
        """Tokens of the temporal patches, without the suffix."""
        return self.grid_thw[0] * self.tokens_per_patch

    @property
    def video_tokens(self) -> int:
        return self.patch_tokens + self.suffix_tokens


def plan_video(adapter: VLMAdapter, frames: int, height: int, width: int) -> VideoPlan:
    """The plan of ``frames`` frames of ``height`` x ``width`` pixels for ``adapter``'s model."""
    return plan_for(adapter.vision, frames, height, width)


def plan_for(spec: VisionSpec, frames: int, height: int, width: int) -> VideoPlan:
    """`plan_video` for a vision tower's preprocessing alone (no model needed)."""
    padded = -(-frames // spec.temporal_patch_size) * spec.temporal_patch_size
    size = video_size(spec, padded, height, width)
    grid = (padded // spec.temporal_patch_size, size[0] // spec.patch_size, size[1] // spec.patch_size)
    return VideoPlan(frames, size, grid, spec.token_hw(grid[1:]), spec.suffix_tokens)


@dataclasses.dataclass
class VideoPrompt:
    """A prompt with one video span, ready to prefill.

    Attributes:
        ids: ``(L,)`` token ids, the video span filled with the placeholder id.
        video_start: Index of the first video token.
        video_tokens: Video tokens in the prompt (the kept ones, under motion pruning).
        positions: ``(3, L)`` positions of every token; kept video tokens keep their grid's.
        rows: What every token is (`TokenTable`).
        next_position: The position the answer's first token takes.
    """

    ids: torch.Tensor
    video_start: int
    video_tokens: int
    positions: torch.Tensor
    rows: TokenTable
    next_position: int

    @property
    def video_end(self) -> int:
        return self.video_start + self.video_tokens


def build_video_prompt(adapter: VLMAdapter, question: str, plan: VideoPlan, frame_index: torch.Tensor,
                       time_s: torch.Tensor, sampled_fps: float, keep: torch.Tensor | None = None) -> VideoPrompt:
    """The prompt asking ``question`` about a video of ``plan``'s shape.

    Args:
        adapter: The model.
        question: The text after the video.
        plan: The video's shape.
        frame_index: ``(frames,)`` stream index of every sampled frame.
        time_s: ``(frames,)`` their presentation times.
        sampled_fps: The sampling rate (the model's temporal positions count seconds).
        keep: ``(patch tokens,)`` bool: the tokens motion pruning keeps (None: all).
    """
    spec = adapter.vision
    kept = plan.video_tokens if keep is None else int(keep.sum()) + plan.suffix_tokens
    layout = adapter.build_prompt(question, kept)
    grid_positions = adapter.video_positions(plan.grid_thw, spec.temporal_patch_size / sampled_fps,
                                             layout.video_start)
    # The suffix (a separator the model reads after every video) takes positions as the text
    # after the video does, and is never pruned: it counts as text.
    video_positions = grid_positions if keep is None else grid_positions[:, keep]
    positions, next_position = prompt_positions(len(layout.input_ids), layout.video_start, video_positions)
    first_frame = torch.clamp(torch.arange(plan.grid_thw[0]) * spec.temporal_patch_size, max=len(frame_index) - 1)
    video = patch_rows(0, plan.token_hw, frame_index[first_frame], time_s[first_frame], grid_positions)
    video = video if keep is None else video[keep]
    suffix_at = layout.video_start + video_positions.shape[1]
    rows = TokenTable.concat([TokenTable.text(positions[:, :layout.video_start]), video,
                              TokenTable.text(positions[:, suffix_at:])])
    return VideoPrompt(layout.input_ids, layout.video_start, kept, positions, rows, next_position)


def patch_rows(first_patch: int, merged_hw: tuple[int, int], frame_index: torch.Tensor, time_s: torch.Tensor,
               positions: torch.Tensor) -> TokenTable:
    """Token-table rows for consecutive temporal patches, from ``first_patch`` on.

    Args:
        first_patch: Temporal grid index of the first patch.
        merged_hw: Token rows and columns per patch (after the spatial merge).
        frame_index: ``(patches,)`` stream index of each patch's first frame.
        time_s: ``(patches,)`` its presentation time.
        positions: ``(3, tokens)`` positions the tokens' keys are rotated with.
    """
    patches = torch.arange(first_patch, first_patch + len(frame_index))
    grid = torch.stack(torch.meshgrid(patches, torch.arange(merged_hw[0]), torch.arange(merged_hw[1]),
                                      indexing="ij"), -1).reshape(-1, 3)
    patch = grid[:, 0] - first_patch
    return TokenTable(
        kind=torch.full((grid.shape[0],), VIDEO, dtype=torch.int8),
        frame_index=frame_index[patch].long(),
        time_s=time_s[patch].double(),
        grid=grid,
        position=positions.T.cpu().long(),
    )
