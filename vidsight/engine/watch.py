"""The watch workload: a standing Yes/No query over sliding windows of a stream (CodecSight).

Each window's prompt is ``[text before the video][window's video tokens][query]``. At Full-Comp
every window is prefilled from scratch. With KV reuse the previous window's cache stays on the
device: the prefix is kept, the overlapping video tokens keep their values and have their keys
re-rotated to their new positions, a chosen set of them is recomputed under the new context from
their cached visual embeddings (CodecSight's anchors, CacheBlend's most-deviating tokens, all or
none), and only the new frames and the query are prefilled.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import torch

from vidsight.engine.config import ALERT_AFTER, REFRESH_MODES
from vidsight.engine.batch import Chunk
from vidsight.engine.forward import new_cache
from vidsight.engine.prompt import VideoPrompt, build_video_prompt, plan_video
from vidsight.engine.refresh import refresh_policy
from vidsight.engine.stats import StageClock, WindowStats
from vidsight.engine.steps import EncodeRequest, Stepped, drive
from vidsight.engine.window_kv import WindowKV
from vidsight.errors import ConfigError
from vidsight.ingest.queue import FrameQueue
from vidsight.ingest.stream import SampledFrame, StreamSource, as_batch
from vidsight.ingest.windows import WindowConfig, sliding_windows
from vidsight.kv import VIDEO
from vidsight.vision import preprocess_video
from vidsight.vision.motion import MotionMasker, MotionPruneConfig, check_prunable, group_mask
from vidsight.kv.store import KVStore
from vidsight.models.base import VLMAdapter
from vidsight.models.conversation import Conversation, check_question

# full-comp: recompute every window. anchors: CodecSight's selective refresh. reuse: no refresh.
# deviation: CacheBlend's most-deviating tokens. all: refresh every reused token (exact; for tests).


@dataclasses.dataclass(frozen=True)
class WatchConfig:
    """How a `Watcher` judges windows.

    Attributes:
        windows: Window length, stride and sampling rate (CodecSight's defaults).
        refresh: One of ``REFRESH_MODES``; ``full-comp`` is exact.
        deviation_ratio: Share of reused tokens the ``deviation`` mode recomputes (None: CacheBlend's
            15 %); a deeper model loses less to reuse with more (docs/benchmarks.md, "Refresh and depth").
        alert_after: Consecutive Yes windows that raise an alert (CodecSight's rule: 2).
        prune: Motion-vector patch pruning before the encoder (off when None; lossy).
        reuse_in_place: With KV reuse, update the previous window's cache where it lies (CodecSight:
            drop what left the window, re-rotate the kept keys, refresh, append); False copies the
            reused KV into a new cache per window (vidsight's first implementation, for comparison).
        catch_up: A watch of a live source that falls a stride behind judges the newest complete
            window and passes over the ones before it (`Watcher.watch`); False judges every window,
            the source waiting for the model (a network stream's server may then drop it).
    """

    windows: WindowConfig = WindowConfig()
    refresh: str = "full-comp"
    deviation_ratio: float | None = None
    alert_after: int = ALERT_AFTER
    prune: MotionPruneConfig | None = None
    reuse_in_place: bool = True
    catch_up: bool = True

    def __post_init__(self):
        if self.refresh not in REFRESH_MODES:
            raise ConfigError(f"unknown refresh mode {self.refresh!r}; choose one of {', '.join(REFRESH_MODES)}")
        if self.deviation_ratio is not None:
            if self.refresh != "deviation":
                raise ConfigError(f"a refresh share (deviation_ratio {self.deviation_ratio:g}) applies to the "
                                  f"deviation refresh only, not {self.refresh!r}")
            if not 0 < self.deviation_ratio <= 1:
                raise ConfigError(f"the refresh share (deviation_ratio) must be in (0, 1], got {self.deviation_ratio:g}")
        if self.alert_after < 1:
            raise ConfigError(f"alert_after must be at least 1, got {self.alert_after}")

    def open(self, source: str | Path | BinaryIO, realtime: bool = False, follow_idle_s: float | None = None,
             ffmpeg_options: dict | None = None, reconnect_tries: int = 5,
             reconnect_window_s: float = 60.0) -> StreamSource:
        """Open ``source`` the way this watch needs it: at its sampling rate, with motion vectors
        judged by its own motion rule exactly when it prunes by motion (`StreamSource` explains the
        other arguments)."""
        return StreamSource(source, fps=self.windows.fps, realtime=realtime, motion=self.prune,
                            follow_idle_s=follow_idle_s, ffmpeg_options=ffmpeg_options,
                            reconnect_tries=reconnect_tries, reconnect_window_s=reconnect_window_s)


@dataclasses.dataclass
class WindowVerdict:
    """One window's answer to the standing query, and what it cost."""

    window: int
    start_s: float
    end_s: float
    answer: str
    p_yes: float
    yes: bool
    alert: bool
    visual_tokens: int          # before pruning
    kept_tokens: int            # after pruning: what the language model sees
    reused_tokens: int
    refreshed_tokens: int
    refreshed_frames: list[int]  # stream frame index of the first frame of each refreshed temporal patch
    stages_s: dict[str, float]
    carry_s: float               # of prefill: the previous window's cache carried into this one
    logits: torch.Tensor = dataclasses.field(repr=False)
    lag_s: float = 0.0           # from the window's last frame arriving (`SampledFrame.received`) to its verdict
    windows_skipped: int = 0     # live: windows passed over just before this one to keep up

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out.pop("logits")
        return out


@dataclasses.dataclass
class _Pending:
    """A window half judged: what `Watcher._finish` needs once its new frames are encoded."""

    encode: EncodeRequest
    cache: KVStore
    prompt: VideoPrompt
    done: int              # tokens already in the cache (the prefix and the reused patches)
    refreshed: torch.Tensor  # slots of the refreshed tokens
    patches: int           # reused temporal patches
    samples: list[int]
    gop_starts: list[bool]
    patch_tokens: list[int]
    visual_tokens: int     # before pruning


class Watcher:
    """A standing query over one stream's sliding windows.

    Args:
        adapter: A loaded model (`load_model`).
        query: A Yes/No question, e.g. "Is there a red object in the zone? Answer Yes or No."
        config: Windows, refresh mode and alert rule.
    """

    def __init__(self, adapter: VLMAdapter, query: str, config: WatchConfig = WatchConfig()):
        check_question(query, "query")
        tp = adapter.vision.temporal_patch_size
        windows = config.windows
        refresh = refresh_policy(config.refresh, config.deviation_ratio)
        if refresh.reuses and windows.stride_frames % tp:
            raise ConfigError(f"KV reuse needs a stride of whole temporal patches ({tp} frames); a "
                              f"{windows.window_s:g} s window at {windows.fps:g} fps with stride "
                              f"{windows.stride_fraction:g} gives {windows.stride_frames} frame(s); "
                              f"{_nearest_strides(windows, tp)}")
        self.adapter, self.query, self.config = adapter, query, config
        self._prompt = Conversation.of(query).scored()   # its Yes is scored, so after any thinking closes
        self.yes_id = adapter.text_ids("Yes")[0]
        self._kv = WindowKV(adapter, refresh, config.reuse_in_place)
        if config.prune:
            check_prunable(adapter.vision)
        self._masker = MotionMasker() if config.prune else None
        self._masks: dict[int, torch.Tensor] = {}  # sample number -> kept patches
        self.latest: SampledFrame | None = None     # the last frame of the last window judged
        self.windows_skipped = 0   # live: windows passed over to keep up (`watch`)
        self._backlog: FrameQueue | None = None   # live: the frames read ahead of the model

    def watch(self, source: StreamSource, first_window: int = 0, streak: int = 0,
              run: Callable[[Stepped[WindowVerdict]], WindowVerdict] | None = None) -> Iterator[WindowVerdict]:
        """Judge every window of ``source``, in order; ``alert`` marks the alerting windows.

        A live source (`StreamSource.live`: a network stream without a duration, a file replayed in
        real time) cannot wait for the model: with `WatchConfig.catch_up` it is read in a thread as
        it comes, and while a window is judged the frames of the windows after it pile up. The
        watch then judges the newest complete window and passes over the ones before it
        (`windows_skipped`; their motion is still followed), so its verdicts stay about now; a
        backlog past a window and a stride drops the oldest frames (`frames_dropped`). A file, or
        a recording served over the network, is judged window by window, however long that takes.

        Args:
            source: The stream, opened with `WatchConfig.open`.
            first_window: Resume here: earlier windows are read but not judged (their motion
                masks are still followed); a `StreamSource.endless` stream, which cannot be read
                again, goes on from now instead, its windows numbered from ``first_window``. At
                full-comp the verdicts equal an uninterrupted watch's; with KV reuse the window
                before is judged unseen to rebuild the cache, whose keys then lack the drift of
                the earlier chain (logits within about 1e-3).
            streak: Yes windows in a row just before ``first_window`` (for the alert rule).
            run: Runs each window's stepped model work (`judging`) to its verdict, e.g. on a
                server's scheduler beside other windows (default: here, with `steps.drive`).

        Raises:
            ConfigError: ``source`` samples at another rate than the windows, or judges motion by
                another rule than this watch prunes by (open it with `WatchConfig.open`).
        """
        if source.fps != self.config.windows.fps:
            raise ConfigError(f"{source.source}: sampled at {source.fps:g} fps, but the windows count frames at "
                              f"{self.config.windows.fps:g} fps; open it with WatchConfig.open")
        if self.config.prune is not None and source.motion != self.config.prune:
            raise ConfigError(f"{source.source}: motion pruning needs the source's motion vectors judged by its rule "
                              f"({self.config.prune}), but the source was opened with {source.motion}; open it with "
                              "WatchConfig.open")
        return self._verdicts(source, first_window, streak, run or (lambda steps: drive(steps, self.adapter)))

    def _verdicts(self, source: StreamSource, first_window: int, streak: int, run) -> Iterator[WindowVerdict]:
        windows = self.config.windows
        backlog = None
        # Any network stream may be live; whether it is (no duration) is known once it is open.
        if self.config.catch_up and (source.network or source.realtime):
            backlog = FrameQueue(source, capacity=windows.window_frames + windows.stride_frames,
                                 drop_oldest=lambda: source.live, after_gap=_after_gap, stop_source=source.close)
        self._backlog = backlog
        skipped, offset = 0, None
        try:
            clock_start = time.perf_counter()
            for index, window in enumerate(sliding_windows(iter(source if backlog is None else backlog), windows)):
                if offset is None:   # the source is open now
                    offset, first_window = (first_window, 0) if source.endless else (0, first_window)
                number = offset + index
                resuming = number < first_window
                # Live, with a stride's frames waiting: the next window is complete already.
                behind = backlog is not None and source.live and len(backlog) >= windows.stride_frames
                if resuming or behind:
                    self._pass(window, number, rebuild=number == first_window - 1)
                    skipped += not resuming
                    self.windows_skipped += not resuming
                    clock_start = time.perf_counter()
                    continue
                waited = time.perf_counter() - clock_start
                verdict = run(self.judging(window, number))
                verdict.stages_s["decode"] = waited
                verdict.lag_s = time.monotonic() - window[-1].received
                verdict.windows_skipped, skipped = skipped, 0
                streak = streak + 1 if verdict.yes else 0
                verdict.alert = streak == self.config.alert_after
                yield verdict
                clock_start = time.perf_counter()
        finally:
            if backlog is not None:
                backlog.close()

    @property
    def frames_dropped(self) -> int:
        """Live: sampled frames dropped unseen, the model having fallen a window and a stride behind."""
        return 0 if self._backlog is None else self._backlog.dropped

    def judge(self, frames: list[SampledFrame], number: int = 0) -> WindowVerdict:
        """The verdict on one window of sampled frames (reusing the previous window's KV when allowed)."""
        return drive(self.judging(frames, number), self.adapter)

    def judging(self, frames: list[SampledFrame], number: int = 0) -> Stepped[WindowVerdict]:
        """`judge` as stepped work: it yields the encoding of the window's new frames (`steps`)."""
        self.latest = frames[-1]
        clock = StageClock(WindowStats(), self.adapter.device)
        window = self._begin(frames, clock)
        with clock.stage("vision"):   # with other windows' frames too when a scheduler encodes them together
            new_embeds = yield window.encode
        with clock.stage("prefill"):  # with other sequences' tokens too when a scheduler packs them
            hidden = yield self._chunk(window, new_embeds)
        logits, reused, refreshed, tokens, kept = self._finish(window, new_embeds, hidden)
        refreshed_frames = window.cache.tokens.frame_index[refreshed].unique().tolist()
        probs = torch.softmax(logits.float(), dim=-1)
        answer = self.adapter.decode_text([int(logits.argmax())]).strip()
        # A window spans one sample interval per frame, from its first frame on (its last frame
        # stands for the interval up to the next sample).
        end_s = frames[0].pts_s + len(frames) / self.config.windows.fps
        return WindowVerdict(window=number, start_s=frames[0].pts_s, end_s=end_s, answer=answer,
                             p_yes=float(probs[self.yes_id]), yes=answer.lower().startswith("yes"), alert=False,
                             visual_tokens=tokens, kept_tokens=kept, reused_tokens=reused,
                             refreshed_tokens=len(refreshed), refreshed_frames=refreshed_frames,
                             stages_s=dict(clock.stats.stages_s), carry_s=clock.stats.carry_s, logits=logits)

    @torch.inference_mode()   # as `_begin`: the motion masks accumulate in one mode
    def _pass(self, frames: list[SampledFrame], number: int, rebuild: bool) -> None:
        """Follow a window that is not judged (resuming, or passed over to keep up): its motion
        masks, and when ``rebuild`` (with KV reuse) the cache the next window reuses."""
        if rebuild and self._kv.policy.reuses:
            self.judge(frames, number)
        elif self._masker is not None:
            self._keep(frames, plan_video(self.adapter, len(frames), *frames[0].rgb.shape[:2]).grid_thw)

    def _keep(self, frames: list[SampledFrame], grid_thw: tuple[int, int, int]) -> torch.Tensor | None:
        """Kept merge groups ``(T, H/m, W/m)`` of the window, from each frame's stream-level mask."""
        if self._masker is None:
            return None
        grid_hw = (grid_thw[1], grid_thw[2])
        for frame in frames:
            mask = self._masks.get(frame.index)
            if mask is None or mask.shape != grid_hw:
                self._masks[frame.index] = self._masker.frame_mask(frame.codec, grid_hw)
        for old in [k for k in self._masks if k < frames[0].index]:
            del self._masks[old]
        return group_mask([self._masks[f.index] for f in frames], self.adapter.vision)

    # -- prefill ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def _begin(self, frames: list[SampledFrame], clock: StageClock) -> "_Pending":
        """Everything before the vision encoder: the plan, pruning masks, the reused KV, pixels."""
        adapter, spec = self.adapter, self.adapter.vision
        batch = as_batch(frames)
        plan = plan_video(adapter, len(frames), *batch.data.shape[1:3])
        with clock.stage("preprocess"):
            keep = self._keep(frames, plan.grid_thw)
        prompt = build_video_prompt(adapter, self._prompt, plan, batch.indices, batch.pts_s, self.config.windows.fps,
                                    keep.reshape(-1) if keep is not None else None)
        ids, video_start = prompt.ids, prompt.video_start
        patch_tokens = (keep.reshape(plan.grid_thw[0], -1).sum(dim=1).tolist() if keep is not None
                        else [plan.tokens_per_patch] * plan.grid_thw[0])
        samples = [f.index for f in frames]
        patches = self._kv.reusable_patches(samples, patch_tokens, video_start)
        done, refreshed = 0, torch.empty(0, dtype=torch.long)
        if patches:
            cache, done, refreshed = self._kv.reuse(patches, prompt, len(ids) + 1, clock)
        else:
            cache = new_cache(adapter, len(ids) + 1)
        first_new = patches * spec.temporal_patch_size
        with clock.stage("preprocess"):
            pixels = preprocess_video(batch.data[first_new:].to(adapter.device), spec, adapter.dtype, size=plan.size)
        encode = EncodeRequest(pixels.pixel_values, pixels.grid_thw, keep[patches:] if keep is not None else None)
        return _Pending(encode, cache, prompt, done, refreshed, patches, samples, [f.gop_start for f in frames],
                        patch_tokens, plan.video_tokens)

    @torch.inference_mode()
    def _chunk(self, window: "_Pending", new_embeds: torch.Tensor) -> Chunk:
        """The window's tokens past its reused KV (the new frames and the query) for the language model."""
        prompt, done = window.prompt, window.done
        embeds = self.adapter.embed_tokens(prompt.ids[done:][None])
        prompt.fill(embeds, torch.arange(done, len(prompt.ids)), new_embeds, self.adapter.video_suffix())
        return Chunk(window.cache, embeds, prompt.positions[:, done:], prompt.rows[done:])

    @torch.inference_mode()
    def _finish(self, window: "_Pending", new_embeds: torch.Tensor, hidden: torch.Tensor):
        """The first answer token's logits from the chunk's ``hidden`` states; the cache remembered
        for the next window."""
        cache, done, prompt = window.cache, window.done, window.prompt
        video_start, patches = prompt.video_start, window.patches
        logits = self.adapter.logits(hidden[0, -1])
        reused = int((prompt.rows.kind[video_start:done] == VIDEO).sum()) if patches else 0
        self._kv.remember(cache, window.samples, window.gop_starts, reused, new_embeds, video_start, window.patch_tokens)
        return logits, reused, window.refreshed, window.visual_tokens, prompt.kept_tokens


def _after_gap(frame: SampledFrame) -> SampledFrame:
    """A frame whose predecessors were dropped: what moved since the last frame seen is unknown,
    so it is kept whole and the motion rule starts over from it."""
    return dataclasses.replace(frame, codec=None)


def _nearest_strides(windows, temporal_patch: int) -> str:
    """The workable stride fractions nearest the requested one, as advice for an error message."""
    options = range(temporal_patch, windows.window_frames + 1, temporal_patch)
    if not options:
        return f"the window itself is shorter than {temporal_patch} frames"
    wanted = windows.window_frames * windows.stride_fraction
    best = sorted(options, key=lambda frames: abs(frames - wanted))[:2]
    return "use " + " or ".join(f"--stride {frames / windows.window_frames:.4g} ({frames} frames)"
                                for frames in sorted(best))
