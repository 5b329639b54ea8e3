"""How an ask's frames are decoded, apart from the code so the command line reads its defaults without torch."""

from __future__ import annotations

import dataclasses

from vidsight.errors import ConfigError


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
            a GPU preprocessing resizes in float, which can differ by one intensity step). An HDR
            frame over twice that size is mapped after FFmpeg scales it to twice it (a twelfth of
            4K's cost; a third of a level apart on average, `picture.to_rgb_to_resize`).
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
