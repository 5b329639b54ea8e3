"""Prefill of a prompt without a video: a conversation's text alone, in one chunk (a chat client's
small talk or title, which an OpenAI-compatible server answers as its checkpoint would)."""

from __future__ import annotations

import torch

from vidsight.engine.forward import forward, new_cache
from vidsight.engine.prefill.groups import Prefilled
from vidsight.engine.request import Request
from vidsight.kv import TokenTable
from vidsight.models.base import VLMAdapter
from vidsight.models.conversation import Conversation


def prefill_text(adapter: VLMAdapter, conversation: Conversation, answer_room: int, request: Request) -> Prefilled:
    """Prefill ``conversation`` (one without a video) with room for ``answer_room`` answer tokens."""
    ids = adapter.build_prompt(conversation, 0).input_ids
    # (3, L): text advances every rotary axis together (M-RoPE's rule; 1-D families read the first row).
    positions = torch.arange(len(ids)).expand(3, -1)
    request.clock.stats.prompt_tokens = len(ids)
    with request.clock.memory(), request.clock.stage("prefill"), torch.inference_mode():
        cache = new_cache(adapter, len(ids) + answer_room)
        hidden = forward(adapter, cache, adapter.embed_tokens(ids[None]), positions, TokenTable.text(positions))
        logits = adapter.logits(hidden[0, -1])
    return Prefilled(cache, logits, len(ids), ids)
