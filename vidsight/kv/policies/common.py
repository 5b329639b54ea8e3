"""What several policies share: the slots every step keeps, new video to index, a question's choice."""

from __future__ import annotations

import torch

from vidsight.kv.cache import VIDEO
from vidsight.kv.store import KVStore


def sink_mask(cache: KVStore, layer: int, first_frame: bool) -> torch.Tensor:
    """``(filled,)`` bool: the slots of the text before the video (the system prompt) and, if asked,
    of the video's first temporal patch: the tokens every later one leans on (attention sinks)."""
    rows = cache.rows(layer)
    video = torch.nonzero(cache.tokens.kind == VIDEO).flatten()
    if len(video) == 0:
        return torch.ones(len(rows), dtype=torch.bool)
    sinks = rows < int(video[0])
    if first_frame:
        first = cache.tokens.frame_index[video[0]]
        first_patch = cache.video_slots(layer)
        first_patch = first_patch[cache.layer_tokens(layer, first_patch).frame_index == first]
        sinks[first_patch] = True
    return sinks


def window_mask(filled: int, tokens: int) -> torch.Tensor:
    """``(filled,)`` bool: the last ``tokens`` slots."""
    return torch.arange(filled) >= filled - tokens


def video_mask(cache: KVStore, layer: int) -> torch.Tensor:
    """``(filled,)`` bool: the slots of ``layer`` that hold video."""
    return cache.tokens.kind[cache.rows(layer)] == VIDEO


class NewVideo:
    """How far a policy has indexed each layer: hands out the video slots written since it last looked.

    A temporal patch is written whole in one step; a question's slots lie past the video and are
    dropped again before the next patch, so an index never runs past the layer's filled slots.
    """

    def __init__(self):
        self._indexed: dict[int, int] = {}

    def take(self, cache: KVStore, layer: int) -> torch.Tensor:
        """The video slots of ``layer`` written since the last call, ascending."""
        filled = cache.filled[layer]
        start = min(self._indexed.get(layer, 0), filled)
        self._indexed[layer] = filled
        return cache.video_slots(layer, start)


class QuestionChoice:
    """Per layer, what a question retrieved, kept for its answer's tokens (as ReKV does): the
    answer attends to it and to every slot from the question on."""

    def __init__(self):
        self._chosen: dict[int, tuple[torch.Tensor, int, tuple]] = {}

    def remember(self, layer: int, slots: torch.Tensor, question_start: int, *summaries) -> None:
        """Keep ``slots`` (and any summary entries) chosen at a question starting at ``question_start``."""
        self._chosen[layer] = (slots, question_start, summaries)

    def recall(self, layer: int, filled: int) -> tuple[torch.Tensor, tuple] | None:
        """``(filled,)`` bool of the question's choice and every slot since it, and its summaries;
        None before any question."""
        if layer not in self._chosen:
            return None
        slots, start, summaries = self._chosen[layer]
        mask = torch.zeros(filled, dtype=torch.bool)
        mask[slots] = True
        mask[start:] = True
        return mask, summaries
