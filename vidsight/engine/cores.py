"""Sharing the CPU between overlapped decoders and a model that computes on it."""

from __future__ import annotations

import os

import torch


def split_decoders(device: torch.device, workers: int | None) -> int:
    """Decoders to overlap with a model on ``device``: ``workers``, or by default half the cores on a
    CPU model (`CoreSplit` gives it the rest) and every core otherwise."""
    if workers is not None:
        return workers
    cores = os.cpu_count() or 1
    return max(1, cores // 2) if device.type == "cpu" else cores


class CoreSplit:
    """While overlapped decoders run, a model on the CPU computes with the cores they leave.

    Decoders and one model thread per core oversubscribe the cores, and a decoder that preempts
    one of the model's OpenMP threads stalls the others at the next barrier: on two cores that
    cost more than overlapping saved (docs/benchmarks.md). So the model runs with the cores the
    decoders leave (at least one) until decoding ends, then with all it had. Thread counts do not
    change results beyond floating-point reassociation in reductions.

    Args:
        device: Where the model runs; only a CPU model is affected.
        decoders: Decoders running beside the model.
        enabled: False leaves the thread count alone.
    """

    def __init__(self, device: torch.device, decoders: int, enabled: bool = True):
        self.enabled = enabled and device.type == "cpu" and decoders > 0
        self.full = torch.get_num_threads()
        self.shared = max(1, self.full - decoders)

    def update(self, decoding: bool) -> None:
        """Set the model's threads for the next stretch of work."""
        if self.enabled:
            wanted = self.shared if decoding else self.full
            if torch.get_num_threads() != wanted:
                torch.set_num_threads(wanted)

    def __enter__(self) -> "CoreSplit":
        return self

    def __exit__(self, *exc) -> None:
        self.update(decoding=False)
