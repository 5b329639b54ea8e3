"""The prompt around one video span (or a still image's), built once for ask and watch: its shape
(`VideoPlan`), its token ids, positions and token-table rows (`VideoPrompt`). Chat builds its rows
patch by patch with `patch_rows`, and with `interleave` for a family that writes text around each
patch."""

from __future__ import annotations

import dataclasses

import torch

from vidsight.errors import ConfigError
from vidsight.kv import VIDEO, TokenTable
from vidsight.models.base import VisionSpec, VLMAdapter
from vidsight.models.conversation import Conversation
from vidsight.models.positions import prompt_positions
from vidsight.vision import video_size
from vidsight.vision.tiles import tile_count

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

    def with_frames(self, frames: int, temporal_patch_size: int) -> "VideoPlan":
        """The same frame size for another frame count (the frames a decoder could not read dropped)."""
        return dataclasses.replace(self, frames=frames, grid_thw=(-(-frames // temporal_patch_size), *self.grid_thw[1:]))


def plan_video(adapter: VLMAdapter, frames: int, height: int, width: int) -> VideoPlan:
    """The plan of ``frames`` frames of ``height`` x ``width`` pixels for ``adapter``'s model."""
    return plan_for(adapter.vision, frames, height, width)


def plan_visual(adapter: VLMAdapter, question: str | Conversation, frames: int, height: int, width: int,
                pixel_bounds: dict[str, int] | None = None) -> VideoPlan:
    """`plan_video`, or for a conversation about a still image (`Conversation.still`) its one
    frame's plan in the model's image bounds (`VLMAdapter.still_vision`), or its tiles' where the
    family cuts a picture into tiles (`vidsight.vision.tiles`); ``pixel_bounds`` (``min_pixels``,
    ``max_pixels``, ``total_pixels``; `SamplingConfig.pixel_bounds`) in place of the checkpoint's."""
    if not Conversation.of(question).still:
        return plan_for(_bounded(adapter, adapter.vision, pixel_bounds), frames, height, width)
    if adapter.still_vision is None:
        raise ConfigError(f"{adapter.name}: vidsight does not show a {adapter.family} model a still image (its "
                          "image processor tiles a picture its own way); give it as a video")
    if frames != 1:
        raise ConfigError(f"a still image is one frame, not {frames}")
    spec = _bounded(adapter, adapter.still_vision, pixel_bounds)
    spec = dataclasses.replace(spec, total_pixels=spec.max_pixels)   # one picture: its own bound is its budget
    return plan_for(spec, tile_count(spec, height, width), height, width)


def _bounded(adapter: VLMAdapter, spec: VisionSpec, pixel_bounds: dict[str, int] | None) -> VisionSpec:
    """``spec`` with the pixel bounds given in place of its own."""
    if not pixel_bounds:
        return spec
    if spec.fixed_size is not None:
        raise ConfigError(f"{adapter.name}: a {adapter.family} model takes every frame at its tower's "
                          f"{spec.fixed_size[1]}x{spec.fixed_size[0]}; {', '.join(pixel_bounds)} apply to Qwen's "
                          "resize rule only")
    spec = dataclasses.replace(spec, **pixel_bounds)
    if spec.min_pixels > spec.max_pixels:
        raise ConfigError(f"min_pixels ({spec.min_pixels}) is above max_pixels ({spec.max_pixels}) (the bounds "
                          f"given, over {adapter.name}'s own)")
    return spec


def plan_for(spec: VisionSpec, frames: int, height: int, width: int) -> VideoPlan:
    """`plan_video` for a vision tower's preprocessing alone (no model needed)."""
    padded = -(-frames // spec.temporal_patch_size) * spec.temporal_patch_size
    size = video_size(spec, padded, height, width)
    grid = (padded // spec.temporal_patch_size, size[0] // spec.patch_size, size[1] // spec.patch_size)
    return VideoPlan(frames, size, grid, spec.token_hw(grid[1:]), spec.suffix_tokens)


@dataclasses.dataclass
class VideoPrompt:
    """A prompt with one video span, ready to prefill.

    The span holds each temporal patch's tokens, with the family's text around each patch when it
    has some (`VLMAdapter.patch_text`), then the family's suffix.

    Attributes:
        ids: ``(L,)`` token ids, the span's video and suffix slots filled with the placeholder id.
        video_start: Index of the span's first token.
        video_tokens: Tokens in the span (video tokens kept under motion pruning, text, suffix).
        positions: ``(3, L)`` positions of every token; kept video tokens keep their grid's.
        rows: What every token is (`TokenTable`).
        next_position: The position the answer's first token takes.
        patch_starts: Index of the first token of each temporal patch's part of the span.
        suffix: ``(first, end)`` indices of the suffix's slots.
    """

    ids: torch.Tensor
    video_start: int
    video_tokens: int
    positions: torch.Tensor
    rows: TokenTable
    next_position: int
    patch_starts: list[int]
    suffix: tuple[int, int]

    @property
    def video_end(self) -> int:
        return self.video_start + self.video_tokens

    @property
    def kept_tokens(self) -> int:
        """The span's video tokens (kept ones, under motion pruning) and suffix, without its text."""
        return int((self.rows.kind == VIDEO).sum()) + self.suffix[1] - self.suffix[0]

    def fill(self, embeds: torch.Tensor, tokens: torch.Tensor, video_embeds: torch.Tensor,
             suffix: torch.Tensor) -> None:
        """Put the encoder's outputs into ``embeds`` ``(1, len(tokens), hidden)``, the embedded
        prompt tokens ``tokens``: ``video_embeds`` at their video tokens in order, and ``suffix``
        ``(suffix tokens, hidden)`` at the suffix's slots among them."""
        embeds[0, self.rows.kind[tokens] == VIDEO] = video_embeds
        at_suffix = (tokens >= self.suffix[0]) & (tokens < self.suffix[1])
        if bool(at_suffix.any()):
            embeds[0, at_suffix] = suffix[tokens[at_suffix] - self.suffix[0]]


def build_video_prompt(adapter: VLMAdapter, question: str | Conversation, plan: VideoPlan, frame_index: torch.Tensor,
                       time_s: torch.Tensor, sampled_fps: float, keep: torch.Tensor | None = None) -> VideoPrompt:
    """The prompt asking ``question`` about a video of ``plan``'s shape.

    Args:
        adapter: The model.
        question: The question (the text after the video), or a conversation (`Conversation`).
        plan: The video's shape.
        frame_index: ``(frames,)`` stream index of every sampled frame.
        time_s: ``(frames,)`` their presentation times.
        sampled_fps: The sampling rate (the model's temporal positions count seconds).
        keep: ``(patch tokens,)`` bool: the tokens motion pruning keeps (None: all).
    """
    question = Conversation.of(question)
    spec, patches = adapter.vision, plan.grid_thw[0]
    first_frame = torch.clamp(torch.arange(patches) * spec.temporal_patch_size, max=len(frame_index) - 1)
    last_frame = torch.clamp(first_frame + spec.temporal_patch_size - 1, max=len(frame_index) - 1)
    keep = torch.ones(plan.patch_tokens, dtype=torch.bool) if keep is None else keep.reshape(-1)
    kept_per_patch = keep.view(patches, -1).sum(dim=1).tolist()
    # A patch's time is counted from the video's first frame, as Qwen's processors time a clip.
    middle = (time_s[first_frame] + time_s[last_frame]) / 2 - time_s[0]
    if question.still:   # the family's marks around the picture's tokens (its tiles') as one
        before, after = adapter.still_text()
        texts = [([], [])] * patches
        texts[0] = (before, texts[0][1])
        texts[-1] = (texts[-1][0], after)
    else:
        texts = [adapter.patch_text(k, float(middle[k])) for k in range(patches)]
    text_tokens = sum(len(before) + len(after) for before, after in texts)
    span = sum(kept_per_patch) + text_tokens + plan.suffix_tokens
    layout = adapter.build_prompt(question, span)
    start, placeholder = layout.video_start, int(layout.input_ids[layout.video_start])
    seconds_per_patch = spec.temporal_patch_size / sampled_fps
    video = patch_rows(0, plan.token_hw, frame_index[first_frame], time_s[first_frame],
                       adapter.video_positions(plan.grid_thw, seconds_per_patch, start))
    if not text_tokens:
        # The patches' tokens run on, at their grid's positions (Qwen's rule: temporal index from time).
        span_positions = video.position.T[:, keep]
        rows, span_ids, lengths = [video[keep]], [torch.full((span - plan.suffix_tokens,), placeholder)], kept_per_patch
    else:
        rows, span_ids, lengths, span_positions = interleave(adapter, plan.grid_thw[1:], texts, video, keep, start,
                                                             placeholder, seconds_per_patch)
    patch_starts = [start + n for n in [0, *torch.tensor(lengths).cumsum(0)[:-1].tolist()]]
    ids = layout.input_ids.clone()
    ids[start : start + span - plan.suffix_tokens] = torch.cat(span_ids)
    # The suffix (a separator the model reads after every video) takes positions as the text
    # after the video does, and is never pruned: it counts as text.
    positions, next_position = prompt_positions(len(ids), start, span_positions)
    suffix_at = start + span_positions.shape[1]
    table = TokenTable.concat([TokenTable.text(positions[:, :start]), *rows, TokenTable.text(positions[:, suffix_at:])])
    return VideoPrompt(ids, start, span, positions, table, next_position, patch_starts,
                       (suffix_at, suffix_at + plan.suffix_tokens))


def interleave(adapter: VLMAdapter, grid_hw: tuple[int, int], texts: list[tuple[list[int], list[int]]],
               video: TokenTable, keep: torch.Tensor, start: int, placeholder: int, seconds_per_patch: float):
    """Consecutive temporal patches with the family's text around each, segment by segment: text
    tokens take the next position, and each patch is a one-patch grid placed after what came
    before it (the video span of a family with `VLMAdapter.patch_text`, or a chat step of one).

    Args:
        adapter: The model.
        grid_hw: Patch rows and columns of one temporal patch.
        texts: Each patch's ``(before, after)`` token ids.
        video: The patches' video rows, patch after patch (their positions are replaced).
        keep: ``(video rows,)`` bool: the tokens kept.
        start: The position of the first token.
        placeholder: The id video tokens carry.
        seconds_per_patch: Seconds one temporal patch covers.

    Returns:
        ``(rows, ids, lengths, positions)``: token-table rows and ids of the segments (lists to
        concatenate), each patch's segment length, and ``(3, n)`` positions.
    """
    rows, ids, lengths, positions = [], [], [], []
    per_patch, at = len(video) // len(texts), start
    for k, (before, after) in enumerate(texts):
        if before:
            positions.append((torch.arange(len(before)) + at).expand(3, -1))
            rows.append(TokenTable.text(positions[-1]))
            at += len(before)
        chosen = keep[k * per_patch : (k + 1) * per_patch]
        grid = adapter.video_positions((1, *grid_hw), seconds_per_patch, at)[:, chosen]
        patch = video[k * per_patch : (k + 1) * per_patch][chosen]
        patch.position = grid.T.cpu().long()
        positions.append(grid)
        rows.append(patch)
        at = int(grid.max()) + 1 if grid.numel() else at
        if after:
            positions.append((torch.arange(len(after)) + at).expand(3, -1))
            rows.append(TokenTable.text(positions[-1]))
            at += len(after)
        ids += [torch.tensor(before, dtype=torch.long), torch.full((int(chosen.sum()),), placeholder),
                torch.tensor(after, dtype=torch.long)]
        lengths.append(len(before) + int(chosen.sum()) + len(after))
    return rows, ids, lengths, torch.cat(positions, dim=1)


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
