"""Sharing a CPU between the background decoders and the model."""

from __future__ import annotations

import torch

from vidsight.ingest.feed import FrameFeed


class CoreSplit:
    """While ``feed`` is still decoding, the model runs on the cores the decoders leave free.

    The model's parallel regions wait for their slowest thread, so a decoder preempting one of
    them stalls every core the model uses; on a CPU-only run the decoders and the model get
    cores of their own until decoding ends, then the model takes them all back.

    Args:
        feed: The frames being decoded in the background.
        model_threads: The model's threads while decoding runs.
    """

    def __init__(self, feed: FrameFeed, model_threads: int):
        self.feed = feed
        self.model_threads = max(1, model_threads)
        self.all_threads = torch.get_num_threads()

    def update(self) -> None:
        """Give the model its share for what the decoders are doing now."""
        threads = self.model_threads if self.feed.decoding else self.all_threads
        if threads != torch.get_num_threads():
            torch.set_num_threads(threads)

    def __enter__(self) -> "CoreSplit":
        self.update()
        return self

    def __exit__(self, *exc) -> None:
        torch.set_num_threads(self.all_threads)
