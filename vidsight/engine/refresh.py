"""What `watch` recomputes of the KV it reuses from the previous window: one policy per refresh mode.

A window that overlaps the previous one reuses the overlap's keys (re-rotated to their new
positions) and values; a policy chooses which of those tokens to recompute under the new context
(`choose`), and may narrow that choice after a layer has been recomputed (`narrow`, CacheBlend).
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class Overlap:
    """The reused temporal patches of a window.

    Attributes:
        patch_tokens: Kept tokens of each reused patch, in order.
        gop_starts: Each reused frame: whether it is the first sampled frame of its GOP.
        temporal_patch: Frames per temporal patch.
    """

    patch_tokens: list[int]
    gop_starts: list[bool]
    temporal_patch: int

    @property
    def tokens(self) -> int:
        return sum(self.patch_tokens)

    def patch_offsets(self, patches: list[int]) -> torch.Tensor:
        """Offsets, within the reused tokens, of the tokens of ``patches``."""
        starts = [sum(self.patch_tokens[:p]) for p in range(len(self.patch_tokens))]
        spans = [torch.arange(starts[p], starts[p] + self.patch_tokens[p]) for p in patches]
        return torch.cat(spans) if spans else torch.empty(0, dtype=torch.long)


class RefreshPolicy:
    """Recompute nothing after the choice: the base of every mode."""

    reuses = True   # False: nothing is reused, every window is computed whole (Full-Comp)
    narrow_layer: int | None = None   # the layer after which `narrow` is asked, if any

    def choose(self, overlap: Overlap) -> torch.Tensor:
        """Offsets (within the reused tokens) to recompute."""
        return torch.empty(0, dtype=torch.long)

    def narrow(self, new_values: torch.Tensor, reused_values: torch.Tensor) -> torch.Tensor:
        """After ``narrow_layer`` is recomputed: indices of the chosen tokens that go on being
        recomputed, from their ``(1, kv_heads, n, head_dim)`` new and reused values."""
        raise NotImplementedError


class FullComp(RefreshPolicy):
    """CodecSight's Full-Comp baseline: every window from scratch (exact)."""

    reuses = False


class Reuse(RefreshPolicy):
    """Reuse the overlap as it is."""


class RefreshAll(RefreshPolicy):
    """Recompute every reused token (equals Full-Comp: the check that reuse is exact)."""

    def choose(self, overlap: Overlap) -> torch.Tensor:
        return torch.arange(overlap.tokens)


class Anchors(RefreshPolicy):
    """CodecSight: recompute the tokens of the overlap's I-frames (their temporal patches). At a
    sampling rate that skips an I-frame, its GOP's first sampled frame stands for it; an overlap
    without a GOP start refreshes nothing (`WindowConfig.align_keyframes` starts overlaps at one)."""

    def choose(self, overlap: Overlap) -> torch.Tensor:
        anchor_frames = [k for k, start in enumerate(overlap.gop_starts) if start]
        return overlap.patch_offsets(sorted({k // overlap.temporal_patch for k in anchor_frames}))


# CacheBlend's share of reused tokens recomputed.
DEVIATION_RATIO = 0.15


@dataclasses.dataclass
class Deviation(RefreshAll):
    """CacheBlend: recompute everything for one layer, then only the ``ratio`` of tokens whose values
    moved most from the reused ones."""

    ratio: float
    narrow_layer: int = 1

    def narrow(self, new_values, reused_values):
        drift = (new_values - reused_values).float().norm(dim=-1).mean(dim=(0, 1))
        return torch.topk(drift, max(1, round(self.ratio * drift.shape[0]))).indices.sort().values


def refresh_policy(mode: str, deviation_ratio: float | None = None) -> RefreshPolicy:
    """The policy of a refresh mode named in `config.REFRESH_MODES` (the names the command line reads
    without torch); ``deviation_ratio`` None is CacheBlend's."""
    policies = {"full-comp": FullComp(), "reuse": Reuse(), "all": RefreshAll(), "anchors": Anchors(),
                "deviation": Deviation(DEVIATION_RATIO if deviation_ratio is None else deviation_ratio)}
    return policies[mode]
