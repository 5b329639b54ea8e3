"""The KV store interface: what the engine, the policies, watch and the benches may ask of a cache.

Two classes implement it: `KVCache` (one preallocated device buffer; the only one that prunes,
overwrites and retains in place) and `TieredKVCache` (blocks on the device, in host memory and on
disk). Offloading is a capability: ``store.offload`` is None for a cache with one tier, and an
`Offload` (layout, prefetch, residency, traffic) for one with more. ``tests/kv/test_kv_store.py``
checks that every caller uses only what these two protocols declare.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch

from vidsight.kv.cache import TokenTable


@dataclasses.dataclass
class KVTraffic:
    """What moved between tiers since a store began (a snapshot; none for a cache with one tier).

    Attributes:
        bytes_moved: Bytes copied ``up`` (towards the device) and ``down``.
        copy_seconds: Seconds those copies took, per direction (copies down run beside the computation).
        read_bytes: Bytes read up from ``host`` memory and from ``disk``.
        whole_read_bytes: Of those, the bytes of blocks wanted whole (every token read was attended).
        device_peak_tokens: The most cached tokens (summed over layers) the device held at any
            moment since the peak was last reset, steps included.
        evicted_tokens: Tokens dropped because every tier was full.
    """

    bytes_moved: dict[str, int] = dataclasses.field(default_factory=lambda: {"up": 0, "down": 0})
    copy_seconds: dict[str, float] = dataclasses.field(default_factory=lambda: {"up": 0.0, "down": 0.0})
    read_bytes: dict[str, int] = dataclasses.field(default_factory=lambda: {"host": 0, "disk": 0})
    whole_read_bytes: dict[str, int] = dataclasses.field(default_factory=lambda: {"host": 0, "disk": 0})
    device_peak_tokens: int = 0
    evicted_tokens: int = 0

    def since(self, earlier: "KVTraffic") -> "KVTraffic":
        """The traffic between ``earlier`` and this snapshot (the peak and evictions as of now)."""
        def minus(now: dict, then: dict) -> dict:
            return {key: value - then[key] for key, value in now.items()}

        return KVTraffic(minus(self.bytes_moved, earlier.bytes_moved), minus(self.copy_seconds, earlier.copy_seconds),
                         minus(self.read_bytes, earlier.read_bytes),
                         minus(self.whole_read_bytes, earlier.whole_read_bytes),
                         self.device_peak_tokens, self.evicted_tokens)


GroupOf = Callable[[int, torch.Tensor], torch.Tensor]


@runtime_checkable
class Offload(Protocol):
    """The offloading capability of a store with tiers below the device."""

    def set_layout(self, group_of: GroupOf | None, per_head: bool = False) -> None:
        """Lay blocks below the device out by ``group_of(layer, slots)`` (a policy's clusters), so a
        group moves as one copy; ``per_head``: groups differ per key head."""
        ...

    def prefetch(self, layer: int, slots: torch.Tensor, heads: torch.Tensor | None = None) -> None:
        """Start bringing ``slots`` of ``layer`` up for a coming step (``heads`` as in `KVStore.read`)."""
        ...

    def resident(self, layer: int, slots: torch.Tensor) -> bool:
        """Whether every one of ``slots`` of ``layer`` is on the device now."""
        ...

    def traffic(self) -> KVTraffic:
        """A snapshot of what moved so far."""
        ...

    def reset_peak(self) -> None:
        """Start measuring the device's peak again from what it holds now."""
        ...


@runtime_checkable
class KVStore(Protocol):
    """A stream's keys and values per layer, and what each cached token is.

    A layer's *slots* are its cached tokens in order (``0 .. filled[layer]``); pruning can make
    layers hold different tokens, so ``rows(layer)`` maps each slot to its row of ``tokens``.
    Keys are stored rotated at their token's position.
    """

    filled: list[int]        # per layer: slots holding tokens
    tokens: TokenTable       # one row per token fed, kept or not (read it, never write it)
    shape: tuple[int, int]   # (kv_heads, head_dim)

    @property
    def length(self) -> int:
        """Tokens fed so far (the rows of ``tokens``)."""
        ...

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values on the device."""
        ...

    @property
    def offload(self) -> Offload | None:
        """The tiers below the device, or None when the cache has one tier."""
        ...

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor | None = None,
              heads: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Store a chunk's ``(1, kv_heads, n, head_dim)`` keys and values after the layer's slots;
        return the keys and values it attends to: those of ``slots`` (all when None), then its own."""
        ...

    def read(self, layer: int, slots: torch.Tensor | None = None, heads: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(1, kv_heads, n, head_dim)`` keys and values of ``slots`` (all filled ones when None) on
        the device; ``heads`` ``(kv_heads, len(slots))`` says which key heads want each slot."""
        ...

    def keep(self, layer: int, written: int, kept: torch.Tensor | None = None,
             offsets: torch.Tensor | None = None) -> None:
        """Settle the ``written`` entries just stored in ``layer``: all of them, or the ``kept`` ones."""
        ...

    def commit(self, rows: TokenTable) -> None:
        """Record what the step's tokens are, once every layer has settled them."""
        ...

    def rows(self, layer: int) -> torch.Tensor:
        """The token-table row of each of ``layer``'s filled slots."""
        ...

    def layer_tokens(self, layer: int, slots: torch.Tensor | None = None) -> TokenTable:
        """What ``slots`` of ``layer`` hold (every filled slot when None), in slot order."""
        ...

    def video_slots(self, layer: int, start: int = 0) -> torch.Tensor:
        """The slots of ``layer`` from ``start`` on that hold video tokens, ascending."""
        ...

    def tokens_by_tier(self) -> dict[str, int]:
        """Cached tokens summed over layers on the ``device``, in ``host`` memory and on ``disk``."""
        ...

    def reserve(self, tokens: int, exact: bool = False) -> None:
        """Make room for ``tokens`` more in every layer (``exact``: no more than that room, where
        the store would otherwise set more aside for growth to come)."""
        ...

    def overwrite(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Replace the keys and values of filled ``slots`` (tokens recomputed under a new context)."""
        ...

    def retain(self, rows: torch.Tensor, table: TokenTable,
               rotate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> None:
        """Keep only the tokens of ``rows``, described by ``table`` from now on (keys re-rotated by ``rotate``)."""
        ...

    def truncate(self, length: int) -> None:
        """Forget every token from row ``length`` on (a question and its answer)."""
        ...

    def clone(self, room: int = 0, device: torch.device | str | None = None) -> "KVStore":
        """An independent copy, e.g. to branch a stream's memory, with room for ``room`` more tokens
        per layer (one copy, not a copy and a growth), on ``device`` (None: the store's own; host
        memory is pinned when the store is on a CUDA device, so the copy back up can run async)."""
        ...

    def close(self) -> None:
        """Release what the store holds outside memory (a disk tier's files)."""
        ...


def traffic_of(store: KVStore) -> KVTraffic:
    """What moved between ``store``'s tiers so far (nothing, for a cache with one tier)."""
    offload = store.offload
    if offload is None:
        return KVTraffic(device_peak_tokens=store.tokens_by_tier()["device"])
    return offload.traffic()
