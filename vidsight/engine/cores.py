"""Sharing the CPU between overlapped decoders and a model that computes on it."""

from __future__ import annotations

import torch


class CoreSplit:
    """While overlapped decoders run, a model on the CPU computes with the cores they leave.

    Decoders and one model thread per core oversubscribe the cores, and a decoder that preempts
    one of the model's OpenMP threads stalls the others at the next barrier. So the model runs
    with the cores the decoders leave, at least one (a single thread has no barrier to stall),
    until decoding ends, then with all it had; the decoders keep every core while the model
    waits for frames. Measured in docs/benchmarks.md. Thread counts change results at most by
    floating-point reassociation in reductions. torch's thread count is process-wide: asks that
    run side by side in one process should turn the split off (`FeedConfig.split_cores`).

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
