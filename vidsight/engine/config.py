"""The engine's settings, apart from the code that uses them, so the command line reads their
defaults without loading torch."""

from __future__ import annotations

import dataclasses

from vidsight.errors import ConfigError
from vidsight.kv.config import PruneConfig

DEFAULT_MODEL = "Qwen/Qwen2.5-VL-7B-Instruct"
# watch: how KV is reused between windows, and how many Yes windows in a row raise an alert.
REFRESH_MODES = ("full-comp", "anchors", "reuse", "deviation", "all")
ALERT_AFTER = 2


@dataclasses.dataclass(frozen=True)
class GenerationConfig:
    """How answer tokens are chosen.

    Attributes:
        max_new_tokens: Stop after this many tokens if no end-of-sequence token came.
        temperature: 0 for greedy decoding; above 0 samples from the softened distribution.
        top_p: Nucleus sampling mass (only when sampling).
        seed: Seeds sampling, so a sampled answer is reproducible.
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if not 1 <= self.max_new_tokens <= 32768:
            raise ConfigError(f"max_new_tokens must be between 1 and 32768, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclasses.dataclass(frozen=True)
class PrefillConfig:
    """How the prompt is fed.

    Attributes:
        group_frames: Video frames per prefill group (rounded up to whole temporal patches);
            bounds activation memory by the group, not the video (QuickPrefill). 0 feeds the
            whole prompt at once.
        prune: Which of each group's video KV the layers keep afterwards (default: all).
    """

    group_frames: int = 32
    prune: PruneConfig = PruneConfig()

    def __post_init__(self):
        if self.group_frames < 0:
            raise ConfigError(f"group_frames must be 0 (one group) or positive, got {self.group_frames}")
        if self.prune.active and self.group_frames == 0:
            raise ConfigError("KV pruning works group by group; set group_frames > 0")


@dataclasses.dataclass(frozen=True)
class FeedConfig:
    """How an ask's frames are decoded.

    Attributes:
        workers: Concurrent single-threaded decoders over keyframe-aligned spans (QuickCodec);
            ``None`` uses every CPU; 0 runs one sequential decoder with FFmpeg's own threading.
        overlap: Prefill each group as soon as its frames are decoded instead of after the
            whole video (needs ``workers`` >= 1).
        trim_gops: Decode only the packets the sampled frames depend on (`DecodeConfig.trim_gops`;
            exact).
        resize_in_decoder: Resize each frame to the model's input size in the decoding thread,
            with the model's own resize, so the frame buffer holds model-size frames instead of
            full-size ones (exact for a model on the CPU: the pixels its preprocessing gives; on
            a GPU preprocessing resizes in float, which can differ by one intensity step).
        split_cores: While overlapped decoders run, give a model on the CPU only the cores they
            leave instead of oversubscribing them (`CoreSplit`; exact up to float rounding).
    """

    workers: int | None = None
    overlap: bool = True
    trim_gops: bool = True
    resize_in_decoder: bool = True
    split_cores: bool = True

    def __post_init__(self):
        if self.workers is not None and self.workers < 0:
            raise ConfigError(f"workers must be 0 (sequential) or more, got {self.workers}")
        if self.overlap and self.workers == 0:
            raise ConfigError("overlapping decoding with prefill needs parallel decoding (workers >= 1)")
