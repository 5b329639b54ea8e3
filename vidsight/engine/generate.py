"""Token selection and the decode loop."""

from __future__ import annotations

from collections.abc import Callable

import torch

from vidsight.engine.config import GenerationConfig
from vidsight.engine.forward import forward
from vidsight.kv import TokenTable
from vidsight.kv.policies import KVPolicy, Step
from vidsight.kv.store import KVStore
from vidsight.models.base import VLMAdapter


class TokenSampler:
    """Greedy or seeded nucleus sampling over last-position logits."""

    def __init__(self, config: GenerationConfig, device: torch.device):
        self.config = config
        self.generator = torch.Generator(device=device).manual_seed(config.seed) if config.temperature > 0 else None

    def __call__(self, logits: torch.Tensor) -> int:
        if self.generator is None:
            return int(logits.argmax())
        probs = torch.softmax(logits.float() / self.config.temperature, dim=-1)
        if self.config.top_p < 1:
            sorted_probs, order = probs.sort(descending=True)
            outside = sorted_probs.cumsum(-1) - sorted_probs > self.config.top_p
            probs = probs.scatter(-1, order, sorted_probs.masked_fill(outside, 0.0))
        return int(torch.multinomial(probs, 1, generator=self.generator))


@torch.inference_mode()
def generate(adapter: VLMAdapter, cache: KVStore, logits: torch.Tensor, next_position: int, config: GenerationConfig,
             on_token: Callable[[list[int]], None] | None = None, policy: KVPolicy | None = None,
             step: Step | None = None) -> list[int]:
    """Decode from the prefill's last logits until an end token or ``max_new_tokens``.

    Args:
        adapter: The model's primitives.
        cache: The prefilled cache; generated tokens are appended to it.
        logits: ``(vocab,)`` logits of the last prompt token.
        next_position: Position index of the first generated token (all three M-RoPE axes).
        config: Selection settings.
        on_token: Called with the ids generated so far after each token (progress bars, streamed text).
        policy: Chooses the cached tokens each generated token attends to (None: all).
        step: An ``answer`` step that counts what the generated tokens attended.

    Returns:
        Generated ids, ending with the end token when one was produced.
    """
    sample = TokenSampler(config, logits.device)
    ids: list[int] = []
    for offset in range(config.max_new_tokens):
        token = sample(logits)
        ids.append(token)
        if on_token is not None:
            on_token(ids)
        if token in adapter.eos_token_ids or offset == config.max_new_tokens - 1:
            break
        positions = torch.full((3, 1), next_position + offset, dtype=torch.long)
        embeds = adapter.embed_tokens(torch.tensor([[token]]))
        cache.reserve(1)
        hidden = forward(adapter, cache, embeds, positions, TokenTable.text(positions), policy=policy, step=step)
        logits = adapter.logits(hidden[0, -1])
    return ids


class TextStream:
    """A `generate` callback that hands ``on_text`` the text each token adds to the answer.

    The pieces join to the final answer exactly (its surrounding white space stripped): white
    space is held back until text follows it, a token that ends inside a character waits, and
    `finish` hands over whatever was still held back.
    """

    def __init__(self, adapter: VLMAdapter, on_text: Callable[[str], None]):
        self.adapter, self.on_text, self.shown = adapter, on_text, ""

    def __call__(self, ids: list[int], final: bool = False) -> None:
        text = self.adapter.decode_text(ids).strip()
        if text.startswith(self.shown) and len(text) > len(self.shown) and (final or not text.endswith("\ufffd")):
            self.on_text(text[len(self.shown):])
            self.shown = text

    def finish(self, ids: list[int]) -> None:
        self(ids, final=True)
