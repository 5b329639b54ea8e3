"""The retrieval seam: which cached tokens each layer of a step attends to.

A `KVPolicy` is asked before each layer's attention in a step (a temporal patch prefilled into a
stream's cache, a question, a generated token); the engine gathers the slots it names and attends
over them and the step's own tokens, at the tokens' true positions. A policy reads the cache only
through `KVStore` (and its `Offload` capability, when the cache has tiers).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Protocol, runtime_checkable

import torch

from vidsight.errors import ConfigError
from vidsight.kv.store import KVStore

STEP_KINDS = ("frame", "question", "answer")


@dataclasses.dataclass
class Step:
    """One forward step, as policies see it, and what it attended (summed over layers).

    Attributes:
        kind: ``frame`` (a temporal patch prefilled), ``question`` or ``answer`` (a generated token).
        cached: Cached tokens the layers could have attended to.
        attended: Cached tokens they did attend to (averaged over key heads when a policy chooses per head).
        retrieved: Of those, tokens a retrieval chose (beyond sinks and the local window).
        layers: Layers run.
        patches: For temporal patches, each one's first frame index and visual embeddings
            ``(tokens, hidden)`` (the vision tower's merged output), for policies that organise
            memory by what frames look like.
        summaries: Summary entries attended beside the cached tokens (see `Selection`).
        policy_s: Seconds the policy took choosing (its `KVPolicy.select` calls; on a GPU these
            include waiting for the layer's queued work where a policy reads tensors to the host).
        positions: ``(3, L)`` rotary positions of the step's own tokens (set by the forward pass).
        unrotate: Set by the forward pass: takes ``(1, heads, n, head_dim)`` queries or keys rotated
            at ``(3, n)`` positions back to position 0 (what they were before the rotary embedding),
            for policies that compare content regardless of where tokens sit.
    """

    kind: str
    cached: int = 0
    attended: float = 0
    retrieved: int = 0
    layers: int = 0
    patches: list[tuple[int, torch.Tensor]] = dataclasses.field(default_factory=list)
    summaries: int = 0
    policy_s: float = 0.0
    positions: torch.Tensor | None = None
    unrotate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None

    def __post_init__(self):
        if self.kind not in STEP_KINDS:
            raise ConfigError(f"step kind must be one of {', '.join(STEP_KINDS)}, got {self.kind!r}")


@dataclasses.dataclass
class Selection:
    """Cached slots to attend to, maybe per key head, plus summary entries for cached tokens left out.

    Attributes:
        slots: Slots (ascending) among the layer's filled ones.
        keys: ``(1, kv_heads, m, head_dim)`` summary keys, already rotated (they are means of
            rotated keys), attended before the slots, each as one more key; None for none.
        values: ``(1, kv_heads, m, head_dim)`` their values.
        heads: ``(kv_heads, len(slots))`` bool: which of ``slots`` each key head's queries see
            (None: all of them, every head).
    """

    slots: torch.Tensor
    keys: torch.Tensor | None = None
    values: torch.Tensor | None = None
    heads: torch.Tensor | None = None


@runtime_checkable
class KVPolicy(Protocol):
    """Chooses the cached slots a layer attends to in a step."""

    name: str

    def select(self, layer: int, cache: KVStore, q: torch.Tensor, step: Step) -> torch.Tensor | Selection | None:
        """Slots (ascending) among ``cache.filled[layer]`` that the step's queries ``q`` attend to
        (a `Selection` to add summary entries); None: all."""
        ...

    def report(self) -> dict:
        """What the policy's own upkeep did so far (cluster counts, splits, ...); empty for most."""
        ...

    def start(self, cache: KVStore) -> "KVPolicy":
        """The policy a session over ``cache`` uses: this one's settings with no per-stream state
        (a new object for a policy that keeps any), attached to the cache (its offload layout).
        A session owns what this returns; a fork starts another."""
        ...
