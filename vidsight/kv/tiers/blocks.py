"""The tiered cache's bookkeeping: its blocks, which block holds each head's slot, what each tier holds."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from vidsight.kv.tiers.copies import Transfer

DEVICE, HOST, DISK = "device", "host", "disk"
TIERS = (DEVICE, HOST, DISK)


@dataclasses.dataclass(eq=False)  # blocks are compared by identity
class Block:
    """One layer's span of slots (one write), or one group of them once laid out below the device."""

    layer: int
    slots: torch.Tensor        # (length,) ascending slots of the layer it holds (a span, or a cluster's)
    tier: str
    data: torch.Tensor | None  # (2, kv_heads, length, head_dim) keys and values; None once on disk
    path: Path | None = None
    last_used: int = 0
    transfer: Transfer | None = None  # its copy down, or a prefetch up, while in flight
    group: int | None = None          # the layout's group it holds, once laid out
    head: int | None = None           # the one key head it holds (data (2, 1, length, head_dim)); None: all

    @property
    def length(self) -> int:
        return len(self.slots)

    @property
    def grouped(self) -> bool:
        return self.group is not None

    @property
    def start(self) -> int:
        return int(self.slots[0])


class BlockTable:
    """Every layer's blocks, in storage order, with an index from each head's slot to its block.

    What a tier holds is kept as blocks move rather than summed over every block (a stream holds
    thousands), in head-slots: a token of one layer is ``kv_heads`` of them, a per-head block
    holds one per slot.

    Args:
        num_layers: Decoder layers.
        kv_heads: Key/value heads per layer.
    """

    def __init__(self, num_layers: int, kv_heads: int):
        self.layers: list[list[Block]] = [[] for _ in range(num_layers)]
        self.kv_heads = kv_heads
        self._units = dict.fromkeys(TIERS, 0)
        # Per layer, ``(kv_heads, slots)``: the index in `layers` of the block holding each head's
        # slot (-1: evicted); None: stale.
        self._owners: list[torch.Tensor | None] = [None] * num_layers

    def heads_of(self, block: Block) -> int:
        return self.kv_heads if block.head is None else 1

    def units(self, block: Block) -> int:
        """Head-slots the block holds."""
        return block.length * self.heads_of(block)

    def count(self, tier: str) -> float:
        """Tokens (of one layer, every head) the tier holds."""
        return self._units[tier] / self.kv_heads

    def tokens_by_tier(self) -> dict[str, int]:
        return {tier: units // self.kv_heads for tier, units in self._units.items()}

    def every(self) -> list[Block]:
        return [block for layer in self.layers for block in layer]

    def by_age(self, tier: str) -> list[Block]:
        """The tier's blocks, least recently used first."""
        return sorted((b for b in self.every() if b.tier == tier), key=lambda b: (b.last_used, b.start))

    def add(self, block: Block) -> None:
        """Append a block, counted in its tier."""
        owner = self._owners[block.layer]
        if owner is not None and block.head is None:   # a block of new slots (every head) extends the index
            extra = torch.full((owner.shape[0], block.length), len(self.layers[block.layer]))
            self._owners[block.layer] = torch.cat([owner, extra], dim=1)
        else:
            self._owners[block.layer] = None
        self.layers[block.layer].append(block)
        self._units[block.tier] += self.units(block)

    def remove(self, block: Block) -> None:
        """Take a block out, no longer counted."""
        self.layers[block.layer].remove(block)
        self._owners[block.layer] = None
        self._units[block.tier] -= self.units(block)

    def replace(self, layer: int, old: list[Block], new: list[Block]) -> None:
        """Swap blocks of one tier for others holding the same head-slots (a regrouping)."""
        for block in old:
            self.layers[layer].remove(block)
        self.layers[layer].extend(new)
        self._owners[layer] = None

    def place(self, block: Block, tier: str) -> None:
        """Count a block in ``tier`` from now on."""
        self._units[block.tier] -= self.units(block)
        self._units[tier] += self.units(block)
        block.tier = tier

    def shrink(self, block: Block, stay: torch.Tensor) -> None:
        """Keep only the ``stay`` slots (bool mask) of a device block."""
        self._units[block.tier] -= int((~stay).sum()) * self.heads_of(block)
        block.slots, block.data = block.slots[stay], block.data[:, :, stay.to(block.data.device)]
        self._owners[block.layer] = None

    def forget_index(self, layer: int) -> None:
        self._owners[layer] = None

    def holders(self, layer: int, filled: int, slots: torch.Tensor | None, heads: torch.Tensor | None = None
                ) -> list[tuple[Block, torch.Tensor | None]]:
        """The blocks holding any of ``slots`` (every block when None) for a head that wants it
        (``heads`` ``(kv_heads, len(slots))``), in storage order, each with a mask of its slots
        that are wanted (None: all of them)."""
        blocks = self.layers[layer]
        if slots is None:
            return [(block, None) for block in blocks]
        owner, wanted = self._owner_index(layer, filled), slots.cpu()
        ids = owner[:, wanted]                                   # (kv_heads, len(slots))
        if heads is not None:
            ids = ids.where(heads.cpu(), -1)
        counts = torch.bincount(ids[ids >= 0], minlength=len(blocks)).tolist()
        out = []
        for block, count in zip(blocks, counts):
            if not count:
                continue
            if count == self.units(block):
                out.append((block, None))
                continue
            mine = wanted
            if heads is not None:
                mine = wanted[heads.cpu().any(dim=0) if block.head is None else heads[block.head].cpu()]
            out.append((block, torch.isin(block.slots, mine)))
        return out

    def _owner_index(self, layer: int, filled: int) -> torch.Tensor:
        """``(kv_heads, slots)``: the index in the layer's blocks of the block holding each head's slot."""
        if self._owners[layer] is None:
            blocks = self.layers[layer]
            owner = torch.full((self.kv_heads, filled), -1, dtype=torch.long)
            if blocks:
                lengths = torch.tensor([b.length for b in blocks])
                slots = torch.cat([b.slots for b in blocks])
                ids = torch.repeat_interleave(torch.arange(len(blocks)), lengths)
                head = torch.repeat_interleave(torch.tensor([-1 if b.head is None else b.head for b in blocks]), lengths)
                every = head < 0
                owner[:, slots[every]] = ids[every]
                owner[head[~every], slots[~every]] = ids[~every]
            self._owners[layer] = owner
        return self._owners[layer]

    def copy(self, copy_block) -> "BlockTable":
        """A table of ``copy_block(block)`` for every block, counted the same."""
        twin = BlockTable(len(self.layers), self.kv_heads)
        twin.layers = [[copy_block(b) for b in layer] for layer in self.layers]
        twin._units = dict(self._units)
        return twin
