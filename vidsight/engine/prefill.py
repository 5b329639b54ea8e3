"""Group-wise prefill of a video prompt (QuickPrefill): frames to KV cache one group at a time.

Each group of frames is preprocessed, encoded and prefilled as soon as its frames are out of the
decoder, so activation memory scales with the group and prefill overlaps with decoding. After a
group, each layer may drop part of the group's video KV (`PruneConfig`).
"""

from __future__ import annotations

import dataclasses
import time

import torch
from tqdm import tqdm

from vidsight.engine.cores import CoreSplit
from vidsight.engine.config import PrefillConfig
from vidsight.engine.forward import chunk_bounds, forward
from vidsight.engine.stats import StageClock
from vidsight.errors import ConfigError
from vidsight.ingest.feed import FrameFeed
from vidsight.kv import VIDEO, GroupPruner, KVCache, QueryRecorder, TokenTable
from vidsight.kv.prune import ATTENTION
from vidsight.models.base import VLMAdapter
from vidsight.models.positions import prompt_positions
from vidsight.vision import preprocess_video, video_size


@dataclasses.dataclass
class Prefilled:
    """A prompt in the cache, ready to generate from."""

    cache: KVCache
    logits: torch.Tensor   # (vocab,) of the first answer token
    next_position: int


@dataclasses.dataclass(frozen=True)
class VideoPlan:
    """The shape of a video prompt, fixed before any frame is decoded."""

    frames: int                       # sampled frames (before padding to whole temporal patches)
    size: tuple[int, int]             # resized (height, width)
    grid_thw: tuple[int, int, int]    # temporal patches, patch rows, patch columns
    tokens_per_patch: int             # merged tokens per temporal patch


def plan_video(adapter: VLMAdapter, frames: int, height: int, width: int) -> VideoPlan:
    spec = adapter.vision
    padded = -(-frames // spec.temporal_patch_size) * spec.temporal_patch_size
    size = video_size(spec, padded, height, width)
    grid = (padded // spec.temporal_patch_size, size[0] // spec.patch_size, size[1] // spec.patch_size)
    return VideoPlan(frames, size, grid, grid[1] * grid[2] // spec.merge_size ** 2)


def video_rows(feed: FrameFeed, plan: VideoPlan, spec, positions: torch.Tensor) -> TokenTable:
    """Token-table rows for the video span: frame, time and grid cell of every token."""
    first_frame = torch.clamp(torch.arange(plan.grid_thw[0]) * spec.temporal_patch_size, max=len(feed) - 1)
    merged = (plan.grid_thw[1] // spec.merge_size, plan.grid_thw[2] // spec.merge_size)
    return patch_rows(0, merged, feed.indices[first_frame], feed.pts_s[first_frame], positions)


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


def _question_queries(adapter: VLMAdapter, ids: torch.Tensor, positions: torch.Tensor, video_start: int, video_end: int
                      ) -> list[torch.Tensor]:
    """Each layer's queries of the text after the video, run with the text before it only."""
    keep = torch.cat([torch.arange(video_start), torch.arange(video_end, len(ids))])
    cache = KVCache(adapter.num_layers, adapter.num_kv_heads, adapter.head_dim, len(keep), adapter.dtype,
                    adapter.device)
    recorder = QueryRecorder(len(ids) - video_end)
    with torch.inference_mode():
        forward(adapter, cache, adapter.embed_tokens(ids[keep][None]), positions[:, keep],
                TokenTable.text(positions[:, keep]), recorder)
    return recorder.queries


def prefill_video(adapter: VLMAdapter, feed: FrameFeed, question: str, sampled_fps: float, config: PrefillConfig,
                  max_new_tokens: int, clock: StageClock, progress: bool = False,
                  cores: CoreSplit | None = None) -> Prefilled:
    """Prefill the prompt for ``question`` about ``feed``'s frames, group by group.

    Args:
        adapter: The model's primitives.
        feed: The sampled frames; groups wait for theirs.
        question: The user's question.
        sampled_fps: The rate the frames were sampled at (sets the temporal positions).
        config: Group size and KV pruning.
        max_new_tokens: Room to leave in the cache for the answer.
        clock: Charges waiting for frames to ``decode`` and the rest to its own stage.
        progress: Show a progress bar over groups.
        cores: Told before each group's vision and prefill stages whether ``feed`` is still decoding.
    """
    if config.prune.start_layer >= adapter.num_layers:
        raise ConfigError(f"prune start layer {config.prune.start_layer} is past the model's last layer "
                          f"({adapter.num_layers} layers, numbered 0 to {adapter.num_layers - 1})")
    with clock.memory():
        return _prefill_groups(adapter, feed, question, sampled_fps, config, max_new_tokens, clock, progress,
                               cores)


def _prefill_groups(adapter: VLMAdapter, feed: FrameFeed, question: str, sampled_fps: float, config: PrefillConfig,
                    max_new_tokens: int, clock: StageClock, progress: bool, cores: CoreSplit | None) -> Prefilled:
    spec, stats = adapter.vision, clock.stats
    # Frames the decoder already resized to the plan's size plan to that same size again.
    plan = plan_video(adapter, len(feed), feed.height, feed.width)
    layout = adapter.build_prompt(question, plan.grid_thw[0] * plan.tokens_per_patch)
    ids, video_start = layout.input_ids, layout.video_start
    video_end = video_start + layout.video_tokens
    # The model's temporal positions count seconds between sampled frames.
    vpos = adapter.video_positions(plan.grid_thw, spec.temporal_patch_size / sampled_fps, video_start)
    positions, next_position = prompt_positions(len(ids), video_start, vpos)
    rows = TokenTable.concat([TokenTable.text(positions[:, :video_start]), video_rows(feed, plan, spec, vpos),
                              TokenTable.text(positions[:, video_end:])])

    patches_per_group = -(-config.group_frames // spec.temporal_patch_size) if config.group_frames else plan.grid_thw[0]
    chunks = chunk_bounds(len(ids), video_start, layout.video_tokens, patches_per_group * plan.tokens_per_patch)
    frames_per_group = patches_per_group * spec.temporal_patch_size
    pruner = last_pruner = None  # last_pruner: the hook of the group carrying the question
    if config.prune.active:
        queries = None
        if config.prune.scorer == ATTENTION:
            with clock.stage("prefill"):
                queries = _question_queries(adapter, ids, positions, video_start, video_end)
        pruner = last_pruner = GroupPruner(config.prune, queries)
        if config.prune.skip_pruned:
            # All of the question's group reaches the question at every layer.
            last_pruner = GroupPruner(dataclasses.replace(config.prune, skip_pruned=False), queries)
    cache = KVCache(adapter.num_layers, adapter.num_kv_heads, adapter.head_dim,
                    _capacity(chunks, video_start, video_end, config, max_new_tokens),
                    adapter.dtype, adapter.device)

    for group, (lo, hi) in enumerate(tqdm(chunks, desc="prefill", unit="group", disable=not progress, leave=False)):
        first = group * frames_per_group
        with clock.stage("decode"):
            frames = feed.frames(first, min(first + frames_per_group, len(feed)))
        _split(cores, feed)
        began = time.perf_counter()
        if group == 0:
            stats.fill_s = began - clock.started
        with clock.stage("preprocess"):
            video = preprocess_video(frames.to(adapter.device), spec, adapter.dtype, size=plan.size)
        with clock.stage("vision"), torch.inference_mode():
            video_embeds = adapter.encode_video(video.pixel_values, video.grid_thw)
        _split(cores, feed)
        with clock.stage("prefill"), torch.inference_mode():
            embeds = adapter.embed_tokens(ids[lo:hi][None])
            at = max(video_start, lo) - lo
            embeds[0, at : at + video_embeds.shape[0]] = video_embeds
            hook = last_pruner if group == len(chunks) - 1 else pruner
            hidden = forward(adapter, cache, embeds, positions[:, lo:hi], rows[lo:hi], hook)
        took = time.perf_counter() - began
        if group == 0:
            stats.first_group_s = took
        stats.last_group_s = took
    with clock.stage("prefill"), torch.inference_mode():
        logits = adapter.logits(hidden[0, -1])
    stats.visual_tokens, stats.prompt_tokens = layout.video_tokens, len(ids)
    stats.kept_visual_tokens = int((cache.layer_tokens(adapter.num_layers - 1).kind == VIDEO).sum())
    stats.groups = len(chunks)
    return Prefilled(cache, logits, next_position)


def _split(cores: CoreSplit | None, feed: FrameFeed) -> None:
    """Model threads for the next stage: decoding may have ended during the last one."""
    if cores is not None:
        cores.update(feed.decoding)


def _capacity(chunks, video_start: int, video_end: int, config: PrefillConfig, max_new_tokens: int) -> int:
    """Cache slots the fullest layer needs: a whole group lands before it is pruned."""
    if not config.prune.active or config.prune.start_layer > 0:
        return chunks[-1][1] + max_new_tokens
    kept, need = 0, 0
    for lo, hi in chunks:
        video = max(0, min(hi, video_end) - max(lo, video_start))
        need = max(need, kept + hi - lo)
        kept += hi - lo - video + config.prune.kept(video)
    return max(need, kept + max_new_tokens)
