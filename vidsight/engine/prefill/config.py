"""How a prompt is prefilled, apart from the code so the command line reads its defaults without torch."""

from __future__ import annotations

import dataclasses

from vidsight.errors import ConfigError
from vidsight.ingest.dynamic import MotionPruneConfig
from vidsight.kv.config import PruneConfig


@dataclasses.dataclass(frozen=True)
class PrefillConfig:
    """How the prompt is fed.

    Attributes:
        group_frames: Video frames per prefill group (rounded up to whole temporal patches);
            bounds activation memory by the group, not the video (QuickPrefill). 0 feeds the
            whole prompt at once.
        prune: Which of each group's video KV the layers keep afterwards (default: all).
        motion: Motion-guided patch pruning before the vision encoder (CodecSight's, with
            vidsight's noise-robust rule): merge groups no motion reached since their GOP's first
            sampled frame skip the encoder and the language model, the kept ones keep their
            positions, and ``prune`` then chooses among them. The decoders judge every frame by
            this rule. Off when None (lossy).
        dedup_patches: With ``motion``, also drop the kept merge groups whose pixels stayed within
            the frame's noise floor since they were last encoded (`RedundantPatches`): a GOP's
            first sampled frame then re-encodes only what changed (lossy).
    """

    group_frames: int = 32
    prune: PruneConfig = PruneConfig()
    motion: MotionPruneConfig | None = None
    dedup_patches: bool = False

    def __post_init__(self):
        if self.group_frames < 0:
            raise ConfigError(f"group_frames must be 0 (one group) or positive, got {self.group_frames}")
        if self.prune.active and self.group_frames == 0:
            raise ConfigError("KV pruning works group by group; set group_frames > 0")
        if self.dedup_patches and self.motion is None:
            raise ConfigError("dropping redundant patches refines motion pruning; turn motion pruning on too")
