"""Stage timers, counters and peak memory for one request."""

from __future__ import annotations

import contextlib
import dataclasses
import resource
import sys
import time

import torch

from vidsight.engine.memory import TensorMemoryMeter

STAGES = ("decode", "preprocess", "vision", "prefill", "generate")
# A watch window's stages: its first token is its verdict, so nothing is generated.
WINDOW_STAGES = STAGES[:-1]
PATCH_STAGES = ("preprocess", "vision", "prefill")   # a chat stream's temporal patches
ANSWER_STAGES = ("prefill", "generate")              # a chat question: its prefill, then its answer


@dataclasses.dataclass
class WindowStats:
    """Where one watch window's time went.

    Attributes:
        stages_s: Seconds per stage: decode (waiting for the window's new frames), preprocess,
            vision, prefill.
        carry_s: The part of prefill spent carrying the previous window's cache into this one
            (kept tokens gathered and re-rotated, in place or into a new cache; refresh excluded).
    """

    stages_s: dict[str, float] = dataclasses.field(default_factory=lambda: dict.fromkeys(WINDOW_STAGES, 0.0))
    carry_s: float = 0.0


@dataclasses.dataclass
class AskStats:
    """What one `ask` cost.

    Attributes:
        frames: Frames decoded and fed to the model (a picture's tiles, where its family cuts it).
        frames_lost: Requested frames the decoder could not produce.
        still: Whether the file was shown to the model as a picture (`Conversation.still`).
        visual_tokens: Video tokens in the prompt.
        prompt_tokens: All prompt tokens.
        cached_tokens: Prompt tokens whose KV came from the video prefix cache (not prefilled).
        generated_tokens: Answer tokens, including the end token when one was produced.
        encoded_visual_tokens: Video tokens the vision encoder produced: all of them, or those
            motion pruning kept (`PrefillConfig.motion`).
        kept_visual_tokens: Video tokens the last layer's KV cache kept after pruning.
        groups: Prefill groups.
        decode_strategy: ``sequential``, ``intervals`` or ``seek``.
        motion_source: Where motion pruning's motion came from: ``codec`` (the vectors the codec
            exports), ``pixels`` (estimated from the decoded frames), or None (no motion pruning,
            or a codec without vectors where only its vectors were asked for: nothing pruned).
        decode_workers: Concurrent decoders (0: one decoder with FFmpeg's own threads).
        overlap: Whether prefill ran while decoding continued; the ``decode`` stage is then
            only the time spent waiting for frames, and ``decode_busy_s`` how long decoding took.
        decode_busy_s: From the start of decoding to its last frame.
        first_group_s: Preprocess, vision and prefill time of the first prefill group.
        last_group_s: The same for the last group.
        fill_s: From the start until the first group's frames were decoded (probing and
            sampling included): the part of decoding that prefill cannot overlap.
        prefill_peak_bytes: Most tensor memory alive at once during preprocess, vision and
            prefill, above what existed before (weights, frames); ``None`` when not metered
            (`Asker`'s ``meter_memory``).
        stages_s: Seconds per stage: decode, preprocess, vision, prefill, generate.
        wall_s: Seconds from start to answer.
        peak_memory_bytes: Peak device memory on CUDA, else the process's peak resident memory.
        device: Where the model ran.
    """

    frames: int = 0
    frames_lost: int = 0
    still: bool = False
    visual_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    encoded_visual_tokens: int = 0
    kept_visual_tokens: int = 0
    groups: int = 0
    decode_strategy: str = "sequential"
    motion_source: str | None = None
    decode_workers: int = 0
    overlap: bool = False
    decode_busy_s: float = 0.0
    first_group_s: float = 0.0
    last_group_s: float = 0.0
    fill_s: float = 0.0
    prefill_peak_bytes: int | None = None
    stages_s: dict[str, float] = dataclasses.field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))
    wall_s: float = 0.0
    peak_memory_bytes: int = 0
    device: str = "cpu"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class ChatStats:
    """What one answer cost.

    Attributes:
        time_s: Stream time of the last frame seen when the question was asked.
        frames_seen: Sampled frames pushed so far (a frame waiting for its temporal patch's
            partner is not in the cache yet).
        cached_tokens: Tokens in the cache when the question came (the video and the prompt).
        attended_tokens: Cached tokens the question attended to, averaged over layers.
        retrieved_tokens: Of those, tokens a retrieval chose beyond sinks and the local window.
        policy_s: Of ``ttft_s``, the seconds the retrieval policy took choosing (`Step.policy_s`).
        ttft_s: From the question to its first answer token (the ``prefill`` stage).
        answer_s: From the question to the whole answer.
        stages_s: Seconds of the question's ``prefill`` and the answer's ``generate`` (timed as
            ask's and watch's stages are, once the device's queued work is done).
        tokens_by_tier: Cached tokens (summed over layers) on the device, host and disk after the answer.
        bytes_moved: Bytes copied up and down between the tiers since the session began.
        question_bytes_moved: Of those, the bytes copied while this question was answered.
        copy_s: Seconds those copies took, up and down (copies down run beside the computation).
        read_bytes: Bytes read up from host memory and from disk since the session began.
        whole_read_bytes: Of those, the bytes of blocks wanted whole (every token read was
            attended: with a cluster layout, a selected cluster is such a block).
    """

    time_s: float = 0.0
    frames_seen: int = 0
    cached_tokens: int = 0
    attended_tokens: float = 0.0
    retrieved_tokens: float = 0.0
    policy_s: float = 0.0
    ttft_s: float = 0.0
    answer_s: float = 0.0
    stages_s: dict[str, float] = dataclasses.field(default_factory=lambda: dict.fromkeys(ANSWER_STAGES, 0.0))
    tokens_by_tier: dict[str, int] = dataclasses.field(default_factory=dict)
    bytes_moved: dict[str, int] = dataclasses.field(default_factory=dict)
    question_bytes_moved: dict[str, int] = dataclasses.field(default_factory=dict)
    copy_s: dict[str, float] = dataclasses.field(default_factory=dict)
    read_bytes: dict[str, int] = dataclasses.field(default_factory=dict)
    whole_read_bytes: dict[str, int] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class PatchStats:
    """One prefill of temporal patches (``ChatConfig.batch_patches`` of them, or fewer when a
    question flushes them): its time, per stage too, what its layers attended (per layer), and the
    seconds the retrieval policy took choosing it (`Step.policy_s`)."""

    latency_s: float
    cached_tokens: int
    attended_tokens: float
    patches: int = 1
    policy_s: float = 0.0
    stages_s: dict[str, float] = dataclasses.field(default_factory=lambda: dict.fromkeys(PATCH_STAGES, 0.0))

    @property
    def per_patch_s(self) -> float:
        return self.latency_s / self.patches


class StageClock:
    """Times named stages, waiting for queued device work so each stage is charged its own time.

    ``stats`` has a ``stages_s`` dict holding each stage's name. With ``meter_memory``, `memory`
    blocks also record their peak tensor memory; ``reset_peak`` starts the device's peak memory
    counter afresh (a chat patch's clock leaves it to the work around it).
    """

    def __init__(self, stats, device: torch.device, meter_memory: bool = False, reset_peak: bool = True):
        self.stats = stats
        self.device = device
        self.meter_memory = meter_memory
        self.started = time.perf_counter()
        if reset_peak and device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _now(self) -> float:
        """The time once the device's queued work is done."""
        self._sync()
        return time.perf_counter()

    def mark(self) -> float:
        """Now, once the device's queued work is done: the start of a stage timed in parts (`charge`)."""
        return self._now()

    def charge(self, name: str, since: float) -> None:
        """Add the time from ``since`` (a `mark`) to now to stage ``name``."""
        self.stats.stages_s[name] += self._now() - since

    def elapsed(self) -> float:
        """Seconds since the clock started, once the device's queued work is done."""
        return self._now() - self.started

    @contextlib.contextmanager
    def stage(self, name: str):
        start = self._now()
        try:
            yield
        finally:
            self.stats.stages_s[name] += self._now() - start

    @contextlib.contextmanager
    def part(self, field: str):
        """Time a part of a stage on its own: its seconds are added to the stats' ``field`` too."""
        start = self._now()
        try:
            yield
        finally:
            setattr(self.stats, field, getattr(self.stats, field) + self._now() - start)

    @contextlib.contextmanager
    def memory(self):
        """Record the block's peak tensor memory in ``prefill_peak_bytes`` (when metering)."""
        if not self.meter_memory:
            yield
            return
        if self.device.type == "cuda":
            self._sync()
            base = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            yield
            self._sync()
            self.stats.prefill_peak_bytes = int(torch.cuda.max_memory_allocated(self.device) - base)
            return
        with TensorMemoryMeter() as meter:
            yield
        self.stats.prefill_peak_bytes = meter.peak_bytes

    def finish(self) -> AskStats:
        self.stats.wall_s = time.perf_counter() - self.started
        self.stats.peak_memory_bytes = peak_memory_bytes(self.device)
        self.stats.device = device_name(self.device)
        return self.stats


def peak_memory_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{torch.cuda.get_device_name(device)}"
    return "cpu"
