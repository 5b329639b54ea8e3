"""What KV pruning keeps: settings only, so the command line reads them without loading torch."""

from __future__ import annotations

import dataclasses
import math

from vidsight.errors import ConfigError

KEY_NORM_SMALL, VALUE_NORM, ATTENTION = "key-norm-small", "value-norm", "attention"
ATTENTION_RECEIVED = "attention-received"
SCORERS = (KEY_NORM_SMALL, VALUE_NORM, ATTENTION, ATTENTION_RECEIVED)


@dataclasses.dataclass(frozen=True)
class PruneConfig:
    """Which video KV each layer keeps after a prefill group.

    Attributes:
        rho: Retention ratio in (0, 1]; 1 keeps everything (exact).
        scorer: ``key-norm-small`` (QuickVideo's default), ``value-norm``, ``attention`` (the
            question's queries, from a pass over the text alone, against the group's keys) or
            ``attention-received`` (the attention each key receives from the group's own queries
            in the real pass, as H2O's heavy hitters; no question needed).
        start_layer: Layers below this keep all their KV.
        skip_pruned: Choose the kept tokens once, at ``start_layer``, and let the others skip the
            layers above it, so pruning saves their compute as well as their KV (the layers above
            then hold the same tokens). The group carrying the question is exempt: all of it
            reaches the question, then each layer prunes it as below. Off: QuickVideo's rule,
            every layer scores and keeps its own share and every token passes every layer.
    """

    rho: float = 1.0
    scorer: str = KEY_NORM_SMALL
    start_layer: int = 0
    skip_pruned: bool = False

    def __post_init__(self):
        if not 0 < self.rho <= 1:
            raise ConfigError(f"rho must be in (0, 1], got {self.rho}")
        if self.scorer not in SCORERS:
            raise ConfigError(f"unknown KV scorer {self.scorer!r}; choose one of {', '.join(SCORERS)}")
        if self.start_layer < 0:
            raise ConfigError(f"start_layer must be non-negative, got {self.start_layer}")

    @property
    def active(self) -> bool:
        return self.rho < 1

    def kept(self, video_tokens: int) -> int:
        """How many of a group's ``video_tokens`` a pruned layer keeps (at least one)."""
        if not self.active or video_tokens == 0:
            return video_tokens
        return max(1, math.ceil(self.rho * video_tokens))
