"""How a token is chosen from the last position's logits: greedily, or sampled with a seed after
temperature, top-k, nucleus and min-p (in transformers' order)."""

from __future__ import annotations

import torch

from vidsight.engine.config import GenerationConfig


class TokenSampler:
    """Greedy or seeded sampling over last-position logits (temperature, top-k, nucleus, min-p)."""

    def __init__(self, config: GenerationConfig, device: torch.device):
        self.config = config
        self.generator = torch.Generator(device=device).manual_seed(config.seed) if config.temperature > 0 else None

    def __call__(self, logits: torch.Tensor) -> int:
        if self.generator is None:
            return int(logits.argmax())
        return int(torch.multinomial(sampling_distribution(logits, self.config), 1, generator=self.generator))


def sampling_distribution(logits: torch.Tensor, config: GenerationConfig) -> torch.Tensor:
    """``(vocab,)`` probabilities a sampled token is drawn from: the softmax of ``logits`` at the
    temperature, then cut to the top-k, to the nucleus of the renormalised rest and to min-p, in
    transformers' order (its warpers' filters; vLLM's keep the same tokens), renormalised."""
    probs = torch.softmax(logits.float() / config.temperature, dim=-1)
    if 0 < config.top_k < probs.numel():
        probs = probs.masked_fill(probs < probs.topk(config.top_k).values[-1], 0.0)
        probs = probs / probs.sum()
    if config.top_p < 1:
        sorted_probs, order = probs.sort(descending=True)
        outside = sorted_probs.cumsum(-1) - sorted_probs > config.top_p
        probs = probs.scatter(-1, order, sorted_probs.masked_fill(outside, 0.0))
    if config.min_p > 0:
        probs = probs.masked_fill(probs < config.min_p * probs.max(), 0.0)
    return probs / probs.sum()
