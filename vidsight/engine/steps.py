"""Work that pauses, so a scheduler can run other work in between or encode several at once.

A stepped piece of work is a generator: it yields an `EncodeRequest` where it needs visual
embeddings and a `Chunk` where it wants tokens run through the language model, is sent the
embeddings or the hidden states back, and returns its result. `drive` runs one alone; a scheduler
that holds several can gather their requests and answer them together (`encode_together`, and
`forward_packed` beside the running answers' decode step).

Preemptible work (a long prefill) yields None where other work may run before it goes on (between
prefill groups), and a `Chunk` where it wants the chunk run through the language model (a
scheduler packs it with other sequences' tokens, `DecodeBatch.step_beside`) and sent its hidden
states back; `run_to_end` runs it alone without pausing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Generator
from typing import Any, TypeVar

import torch

from vidsight.engine.batch import Chunk
from vidsight.models.base import VLMAdapter

T = TypeVar("T")


@dataclasses.dataclass
class EncodeRequest:
    """Frames a piece of work needs encoded: `encode_video`'s arguments."""

    pixel_values: torch.Tensor
    grid_thw: tuple[int, int, int]
    keep: torch.Tensor | None = None

    @torch.inference_mode()
    def run(self, adapter: VLMAdapter) -> torch.Tensor:
        return adapter.encode_video(self.pixel_values, self.grid_thw, self.keep)


Stepped = Generator[EncodeRequest | Chunk, torch.Tensor, T]
Preemptible = Generator[Chunk | None, torch.Tensor | None, T]


def drive(steps: Stepped[T], adapter: VLMAdapter) -> T:
    """Run stepped work to its result, each request (an encoding, a chunk) run alone as it comes."""
    try:
        request = next(steps)
        while True:
            request = steps.send(request.run(adapter))
    except StopIteration as stop:
        return stop.value


def run_to_end(steps: Preemptible[T], adapter: VLMAdapter) -> T:
    """Run preemptible work to its result without pausing, each chunk through the model alone."""
    try:
        request = next(steps)
        while True:
            request = steps.send(None if request is None else request.run(adapter))
    except StopIteration as stop:
        return stop.value


@torch.inference_mode()
def encode_together(adapter: VLMAdapter, requests: list[EncodeRequest]) -> list[Any]:
    """Every request's embeddings: the unpruned ones in one vision call (each attends within
    itself, so the result is each one's own), pruned ones alone (their kept patches differ)."""
    results: list[Any] = [None] * len(requests)
    whole = [k for k, r in enumerate(requests) if r.keep is None or bool(r.keep.all())]
    if len(whole) > 1:
        encoded = adapter.encode_videos([(requests[k].pixel_values, requests[k].grid_thw) for k in whole])
        for k, embeds in zip(whole, encoded):
            results[k] = embeds
    for k, request in enumerate(requests):
        if results[k] is None:
            results[k] = request.run(adapter)
    return results
