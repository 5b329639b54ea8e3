"""``recent``: a StreamingLLM-style local window with attention sinks (Xiao et al., ICLR 2024)."""

from __future__ import annotations

import torch

from vidsight.kv.policies.common import sink_mask, window_mask
from vidsight.kv.policies.configs import RecentConfig


class RecentPolicy:
    """Sinks (the system prompt and the first temporal patch) plus the last ``window_tokens``."""

    name = "recent"

    def __init__(self, config: RecentConfig = RecentConfig()):
        self.config = config

    def report(self) -> dict:
        return {}

    def start(self, cache) -> "RecentPolicy":
        return self   # nothing kept per stream

    def select(self, layer, cache, q, step):
        filled = cache.filled[layer]
        keep = sink_mask(cache, layer, first_frame=True) | window_mask(filled, self.config.window_tokens)
        return torch.nonzero(keep).flatten()
