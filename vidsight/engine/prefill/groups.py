"""Group-wise prefill of a video prompt (QuickPrefill): frames to KV cache one group at a time.

Each group of frames is preprocessed, encoded and prefilled as soon as its frames are out of the
decoder, so activation memory scales with the group and prefill overlaps with decoding. After a
group, each layer may drop part of the group's video KV (`PruneConfig`).
"""

from __future__ import annotations

import dataclasses
import logging
import time

import torch
from tqdm import tqdm

from vidsight.engine.cores import CoreSplit
from vidsight.engine.prefill.config import PrefillConfig
from vidsight.engine.batch import Chunk
from vidsight.engine.forward import forward, new_cache
from vidsight.engine.prompt import VideoPlan, VideoPrompt, build_video_prompt, plan_visual
from vidsight.engine.request import Request
from vidsight.engine.steps import Preemptible, run_to_end
from vidsight.engine.stats import AskStats
from vidsight.errors import ConfigError
from vidsight.ingest.feed.frames import FrameFeed
from vidsight.ingest.types import CodecInfo
from vidsight.kv import VIDEO, GroupPruner, QueryRecorder, TokenTable
from vidsight.kv.prune import ATTENTION
from vidsight.kv.store import KVStore
from vidsight.models.base import VisionSpec, VLMAdapter
from vidsight.models.conversation import Conversation
from vidsight.vision import preprocess_video
from vidsight.vision.dedup import RedundantPatches
from vidsight.vision.motion import MotionMasker, check_prunable, group_mask

log = logging.getLogger(__name__)


@dataclasses.dataclass
class Prefilled:
    """A prompt in the cache, ready to generate from."""

    cache: KVStore
    logits: torch.Tensor   # (vocab,) of the first answer token
    next_position: int
    prompt_ids: torch.Tensor   # (L,) the prompt's token ids (video slots hold the placeholder id)


def _question_queries(adapter: VLMAdapter, ids: torch.Tensor, positions: torch.Tensor, video_start: int, video_end: int
                      ) -> list[torch.Tensor]:
    """Each layer's queries of the text after the video, run with the text before it only."""
    keep = torch.cat([torch.arange(video_start), torch.arange(video_end, len(ids))])
    cache = new_cache(adapter, len(keep))
    recorder = QueryRecorder(len(ids) - video_end)
    with torch.inference_mode():
        forward(adapter, cache, adapter.embed_tokens(ids[keep][None]), positions[:, keep],
                TokenTable.text(positions[:, keep]), recorder)
    return recorder.queries


def prefill_video(adapter: VLMAdapter, feed: FrameFeed, question: str | Conversation, sampled_fps: float,
                  config: PrefillConfig,
                  max_new_tokens: int, request: Request, plan: VideoPlan | None = None) -> Prefilled:
    """Prefill the prompt for ``question`` about ``feed``'s frames, group by group (the arguments
    are `prefill_video_steps`')."""
    return run_to_end(prefill_video_steps(adapter, feed, question, sampled_fps, config, max_new_tokens, request, plan),
                      adapter)


def prefill_video_steps(adapter: VLMAdapter, feed: FrameFeed, question: str | Conversation, sampled_fps: float,
                        config: PrefillConfig, max_new_tokens: int, request: Request, plan: VideoPlan | None = None
                        ) -> Preemptible[Prefilled]:
    """`prefill_video` as preemptible work: it pauses between groups, so a server can run other
    work there (`steps.Preemptible`).

    Args:
        adapter: The model's primitives.
        feed: The sampled frames; groups wait for theirs.
        question: The user's question, or a conversation (`Conversation`).
        sampled_fps: The rate the frames were sampled at (sets the temporal positions).
        config: Group size and KV pruning.
        max_new_tokens: Room to leave in the cache for the answer.
        request: Its clock charges waiting for frames to ``decode`` and the rest to its own stage;
            its progress flag shows a bar over groups; its core split is told before each group's
            vision and prefill stages whether ``feed`` is still decoding.
        plan: The video's shape, when the caller planned it already (e.g. to resize in the decoder).
    """
    if config.prune.start_layer >= adapter.num_layers:
        raise ConfigError(f"prune start layer {config.prune.start_layer} is past the model's last layer "
                          f"({adapter.num_layers} layers, numbered 0 to {adapter.num_layers - 1})")
    with request.clock.memory():
        plan = _plan(adapter, feed, question, plan)
        prompt = build_video_prompt(adapter, question, plan, feed.indices, feed.pts_s, sampled_fps)
        cache, hidden = yield from _prefill_groups(adapter, feed, plan, prompt, len(prompt.ids), config,
                                                   max_new_tokens, request)
        with request.clock.stage("prefill"), torch.inference_mode():
            logits = adapter.logits(hidden[0, -1])
    return Prefilled(cache, logits, prompt.next_position, prompt.ids)


def prefill_prefix_steps(adapter: VLMAdapter, feed: FrameFeed, question: str | Conversation, sampled_fps: float,
                         config: PrefillConfig, request: Request, plan: VideoPlan | None = None
                         ) -> Preemptible[VideoPrefix]:
    """Prefill ``question``'s prompt up to the end of its video, for any question whose prompt
    begins the same way (the same text before the video) to continue.

    As `prefill_video_steps`, except that the text after the video is left out (so the last group ends
    with the video's suffix). KV pruning is refused: the last group's pruning happens with the
    question in the group, so its KV depends on the question.
    """
    if config.prune.active:
        raise ConfigError("a video prefix is question-independent only without KV pruning (rho 1)")
    with request.clock.memory():
        plan = _plan(adapter, feed, question, plan)
        prompt = build_video_prompt(adapter, question, plan, feed.indices, feed.pts_s, sampled_fps)
        cache, _ = yield from _prefill_groups(adapter, feed, plan, prompt, prompt.video_end, config, 0, request)
    done = request.clock.stats
    stats = AskStats(frames=len(feed), frames_lost=feed.frames_lost, visual_tokens=done.visual_tokens,
                     kept_visual_tokens=done.kept_visual_tokens, decode_strategy=feed.strategy,
                     motion_source=done.motion_source)
    return VideoPrefix(cache, plan, feed.indices, feed.pts_s, sampled_fps, prompt.ids[:prompt.video_end], stats)


def prefill_question(adapter: VLMAdapter, prefix: VideoPrefix, question: str | Conversation, max_new_tokens: int,
                     request: Request) -> Prefilled:
    """Continue a copy of ``prefix`` with the text after ``question``'s video: the prompt
    `prefill_video` would have prefilled, its text before the video and its video reused (the same
    tokens at the same positions)."""
    prompt = build_video_prompt(adapter, question, prefix.plan, prefix.frame_index, prefix.time_s, prefix.sampled_fps)
    end, stats = prefix.tokens, request.clock.stats
    if not torch.equal(prompt.ids[:end], prefix.ids):
        raise ConfigError(f"{adapter.name}: the prompt's text before the video is not the prefix's")
    for name in ("frames", "frames_lost", "visual_tokens", "kept_visual_tokens", "decode_strategy", "motion_source"):
        setattr(stats, name, getattr(prefix.stats, name))
    stats.prompt_tokens = len(prompt.ids)
    with request.clock.memory(), request.clock.stage("prefill"), torch.inference_mode():
        cache = prefix.cache.clone(room=len(prompt.ids) - end + max_new_tokens)
        hidden = forward(adapter, cache, adapter.embed_tokens(prompt.ids[None, end:]), prompt.positions[:, end:],
                         prompt.rows[end:])
        logits = adapter.logits(hidden[0, -1])
    return Prefilled(cache, logits, prompt.next_position, prompt.ids)


def _plan(adapter: VLMAdapter, feed: FrameFeed, question: str | Conversation, plan: VideoPlan | None) -> VideoPlan:
    plan = plan or plan_visual(adapter, question, len(feed), feed.height, feed.width)
    if plan.frames != len(feed):  # decoded first, frames it could not read dropped: a prompt for the rest
        plan = plan.with_frames(len(feed), adapter.vision.temporal_patch_size)
    return plan


def _prefill_groups(adapter: VLMAdapter, feed: FrameFeed, plan: VideoPlan, prompt: VideoPrompt, end: int,
                    config: PrefillConfig, max_new_tokens: int, request: Request
                    ) -> Preemptible[tuple[KVStore, torch.Tensor]]:
    """Prefill ``prompt``'s tokens up to ``end``, pausing before each group after the first and
    handing each group's chunk to the driver unless a pruning hook must see it; the cache and the
    last group's hidden states."""
    clock, progress, cores = request.clock, request.progress, request.cores
    spec, stats = adapter.vision, clock.stats
    ids, video_start, video_end, positions, rows = (prompt.ids, prompt.video_start, prompt.video_end,
                                                    prompt.positions, prompt.rows)

    patches_per_group = -(-config.group_frames // spec.temporal_patch_size) if config.group_frames else plan.grid_thw[0]
    chunks = chunk_bounds(end, prompt.patch_starts, patches_per_group)
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
    cache = new_cache(adapter, _capacity(chunks, rows.kind == VIDEO, config, max_new_tokens))

    masks = _motion_masks(feed, config, plan, spec)
    stats.encoded_visual_tokens = 0
    for group, (lo, hi) in enumerate(tqdm(chunks, desc="prefill", unit="group", disable=not progress, leave=False)):
        if group:
            yield
        first = group * frames_per_group
        last = min(first + frames_per_group, len(feed))
        with clock.stage("decode"):
            frames = feed.frames(first, last)
        _split(cores, feed)
        began = time.perf_counter()
        if group == 0:
            stats.fill_s = began - clock.started
        with clock.stage("preprocess"):
            video = preprocess_video(frames.to(adapter.device), spec, adapter.dtype, size=plan.size)
            keep = masks.group(feed.codec(first, last), frames) if masks is not None else None
            # The group's tokens the language model sees: its text, and the video tokens kept.
            tokens = torch.arange(lo, hi)
            if keep is not None:
                seen = torch.ones(hi - lo, dtype=torch.bool)
                seen[rows.kind[lo:hi] == VIDEO] = keep.reshape(-1)
                tokens = tokens[seen]
        with clock.stage("vision"), torch.inference_mode():
            video_embeds = adapter.encode_video(video.pixel_values, video.grid_thw, keep)
        stats.encoded_visual_tokens += video_embeds.shape[0]
        _split(cores, feed)
        if not len(tokens):
            continue  # motion pruning left nothing of a group without text
        with clock.stage("prefill"):
            with torch.inference_mode():
                embeds = adapter.embed_tokens(ids[tokens][None])
                prompt.fill(embeds, tokens, video_embeds, adapter.video_suffix())
            hook = last_pruner if group == len(chunks) - 1 else pruner
            if hook is None:   # the driver runs it, maybe packed beside other sequences' tokens
                hidden = yield Chunk(cache, embeds, positions[:, tokens], rows[tokens])
            else:
                with torch.inference_mode():
                    hidden = forward(adapter, cache, embeds, positions[:, tokens], rows[tokens], hook)
        took = time.perf_counter() - began
        if group == 0:
            stats.first_group_s = took
        stats.last_group_s = took
    stats.visual_tokens, stats.prompt_tokens = plan.video_tokens, len(ids)
    # The suffix (a text row, never pruned) counts as the video token it is in `visual_tokens` too.
    stats.kept_visual_tokens = int((cache.layer_tokens(adapter.num_layers - 1).kind == VIDEO).sum()) + plan.suffix_tokens
    stats.groups = len(chunks)
    return cache, hidden


@dataclasses.dataclass
class VideoPrefix:
    """A video prefilled up to its question (`prefill_prefix_steps`); each question continues a copy.

    Attributes:
        cache: The prefix's KV; never fed again.
        plan: The video's shape.
        frame_index: ``(frames,)`` stream index of every sampled frame.
        time_s: ``(frames,)`` their presentation times.
        sampled_fps: The sampling rate.
        ids: ``(tokens,)`` the prefix's prompt ids: the text before the video, the video, its suffix.
        stats: The video's frames and tokens, for the requests that reuse it.
    """

    cache: KVStore
    plan: VideoPlan
    frame_index: torch.Tensor
    time_s: torch.Tensor
    sampled_fps: float
    ids: torch.Tensor
    stats: AskStats

    @property
    def tokens(self) -> int:
        return len(self.ids)

    @property
    def nbytes(self) -> int:
        return self.cache.nbytes


class _GroupMasks:
    """Each prefill group's kept merge groups under motion pruning, following the stream's GOPs."""

    def __init__(self, plan: VideoPlan, spec: VisionSpec, dedup: bool):
        self.masker, self.grid_hw, self.spec = MotionMasker(), plan.grid_thw[1:], spec
        self.redundant = RedundantPatches(plan.token_hw) if dedup else None

    def group(self, codec: list[CodecInfo | None], frames: torch.Tensor) -> torch.Tensor:
        """``(temporal patches, H/m, W/m)`` bool for the group's ``frames``, in stream order."""
        keep = group_mask([self.masker.frame_mask(c, self.grid_hw) for c in codec], self.spec)
        if self.redundant is not None:
            keep = self.redundant.filter(frames, keep, self.spec.temporal_patch_size)
        return keep


def _motion_masks(feed: FrameFeed, config: PrefillConfig, plan: VideoPlan, spec: VisionSpec) -> _GroupMasks | None:
    """Motion pruning's masks, when it is asked for and the decoders judged motion by its rule."""
    if config.motion is None:
        return None
    check_prunable(spec)
    if feed.motion is None:
        log.warning("motion is not judged on this video (its codec exports no vectors, which --motion-source codec "
                    "asks for, or it codes every frame alone, which only --motion-source pixels judges): every patch "
                    "is encoded")
        return None
    if feed.motion != config.motion:
        raise ConfigError(f"motion pruning by {config.motion}, but the decoders judged motion by {feed.motion}")
    return _GroupMasks(plan, spec, config.dedup_patches)


def chunk_bounds(prompt_len: int, patch_starts: list[int], patches_per_chunk: int) -> list[tuple[int, int]]:
    """Split a prompt into prefill groups of ``patches_per_chunk`` temporal patches, cut where a
    patch's part of the video span begins (``patch_starts``).

    The text before the video rides with the first chunk and the text after it with the last.
    """
    if patches_per_chunk <= 0 or len(patch_starts) <= patches_per_chunk:
        return [(0, prompt_len)]
    edges = [0, *patch_starts[patches_per_chunk::patches_per_chunk], prompt_len]
    return list(zip(edges[:-1], edges[1:]))


def _split(cores: CoreSplit | None, feed: FrameFeed) -> None:
    """Model threads for the next stage: decoding may have ended during the last one."""
    if cores is not None:
        cores.update(feed.decoding)


def _capacity(chunks, is_video: torch.Tensor, config: PrefillConfig, max_new_tokens: int) -> int:
    """Cache slots the fullest layer needs: a whole group lands before it is pruned."""
    if not config.prune.active or config.prune.start_layer > 0:
        return chunks[-1][1] + max_new_tokens
    kept, need = 0, 0
    for lo, hi in chunks:
        video = int(is_video[lo:hi].sum())
        need = max(need, kept + hi - lo)
        kept += hi - lo - video + config.prune.kept(video)
    return max(need, kept + max_new_tokens)
