"""A stream's KV cache in blocks that live on the device, in host memory or on disk.

One block per write per layer (a temporal patch, a question, a generated token). Between steps
the device holds at most its budget in tokens, host memory at most its own; past a budget the
least recently used blocks move down a tier (device -> host -> disk), and a block a step attends
to moves back up first, so during a step the device also holds the blocks that step attends to.
When every tier is full the oldest blocks are evicted and counted: attention then skips their
tokens. Copies down run beside the computation (`copies.CopyEngine`); a disk write that fails (a
full disk) evicts the block, counted, with one warning.

A policy may lay the blocks below the device out by group (`set_layout`, layout.py): Mosaic's
clusters, one block per cluster; or, per key head, ReSV's, so that a head reading its selected
clusters moves just those (the other heads' slots read as zeros, masked).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from collections.abc import Callable

import torch

from vidsight.errors import ConfigError
from vidsight.kv.cache import TokenTable, video_slots
from vidsight.kv.store import GroupOf, KVTraffic
from vidsight.kv.tiers.backends import DiskTier, HostTier, Tier
from vidsight.kv.tiers.blocks import DEVICE, DISK, HOST, Block, BlockTable
from vidsight.kv.tiers.config import TierConfig
from vidsight.kv.tiers.copies import CopyEngine, Transfer
from vidsight.kv.tiers.layout import regroup

log = logging.getLogger(__name__)
# Disk writes in flight at most; past it the oldest is waited for (each holds a host copy).
WRITES_IN_FLIGHT = 64


class TieredKVCache:
    """A `KVStore` over blocks on the device, in host memory and on disk; its own `Offload`.

    Args:
        num_layers: Decoder layers.
        num_kv_heads: Key/value heads per layer.
        head_dim: Channels per head.
        dtype: Storage dtype.
        device: The device attention runs on.
        config: The tiers' budgets.

    Raises:
        ConfigError: the disk directory cannot be created or written.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device, config: TierConfig):
        self.config, self.dtype, self.device = config, dtype, torch.device(device)
        self.shape = (num_kv_heads, head_dim)
        self.table = BlockTable(num_layers, num_kv_heads)
        self.filled = [0] * num_layers
        self.slot_rows: list[list[int]] = [[] for _ in range(num_layers)]
        self.tokens = TokenTable.empty()
        self.copies = CopyEngine(self.device)
        self.host = HostTier(self.copies)
        self.disk = DiskTier(self.copies, config.disk_dir, config.keep_files, dtype, self.shape) \
            if config.disk_dir is not None else None
        # Bytes moved up from host and disk, and of those the bytes of blocks wanted whole (one
        # sequential read serving only wanted tokens; V-Rex's cluster-contiguous layout aims at that).
        self.read_bytes = {HOST: 0, DISK: 0}
        self.whole_read_bytes = {HOST: 0, DISK: 0}
        self._in_flight = 0
        self.evicted_tokens = 0
        self._device_peak = 0  # the most on the device at any moment, steps included
        self._clock = 0
        self._disk_full_warned = False
        self._layout: GroupOf | None = None
        self._per_head = False

    # -- the store ------------------------------------------------------------------------------
    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values on the device."""
        return sum(b.data.nbytes for b in self.table.every() if b.tier == DEVICE)

    @property
    def offload(self) -> "TieredKVCache":
        return self

    def tokens_by_tier(self) -> dict[str, int]:
        return self.table.tokens_by_tier()

    def reserve(self, tokens: int, exact: bool = False) -> None:
        """Nothing to do: each write is a block of its own."""

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor | None = None,
              heads: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Store a chunk as a device block; the chosen past slots (all when None) then the chunk, on the device.

        ``heads`` ``(kv_heads, len(slots))`` says which key heads want each slot (see `read`).
        """
        self._clock += 1
        past_k, past_v = self.read(layer, slots, heads)
        slots = torch.arange(self.filled[layer], self.filled[layer] + k.shape[2])
        self.table.add(Block(layer, slots, DEVICE, torch.stack([k[0], v[0]]).clone(), last_used=self._clock))
        self._note_device()
        return torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)

    def read(self, layer: int, slots: torch.Tensor | None = None, heads: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(1, kv_heads, n, head_dim)`` keys and values of ``slots`` (ascending; all when None), brought to the device.

        Slots of evicted blocks are left out. ``heads`` ``(kv_heads, len(slots))``: which key heads
        want each slot (each slot some head); a head's unwanted slots held in blocks of that head
        alone (a per-head layout) are not moved and read as zeros (attention masks them out).
        None: every head.
        """
        wanted = torch.arange(self.filled[layer]) if slots is None else slots.cpu()
        out = torch.zeros((2, self.shape[0], len(wanted), self.shape[1]), dtype=self.dtype, device=self.device)
        present = torch.zeros(len(wanted), dtype=torch.bool)
        for block, mine in self.table.holders(layer, self.filled[layer], slots, heads):
            data, got = self._up(block, whole=mine is None), block.slots
            if mine is not None:
                data, got = data[:, :, mine.to(data.device)], got[mine]
            at = torch.searchsorted(wanted, got)
            rows = slice(None) if block.head is None else slice(block.head, block.head + 1)
            out[:, rows, at.to(out.device)] = data   # grouped blocks interleave slots: each goes to its place
            present[at] = True
        if not present.all():
            out = out[:, :, present.to(out.device)]
        return out[0][None], out[1][None]

    def keep(self, layer: int, written: int, kept: torch.Tensor | None = None,
             offsets: torch.Tensor | None = None) -> None:
        if kept is not None or offsets is not None:
            raise ConfigError("KV pruning is not available with tiered KV memory")
        self.slot_rows[layer] += list(range(len(self.tokens), len(self.tokens) + written))
        self.filled[layer] += written

    def commit(self, rows: TokenTable) -> None:
        """Record the step's tokens, then bring every tier back within its budget."""
        self.tokens = TokenTable.concat([self.tokens, rows])
        self._enforce()

    def rows(self, layer: int) -> torch.Tensor:
        """The token-table row of each of ``layer``'s slots."""
        return torch.tensor(self.slot_rows[layer], dtype=torch.long)

    def layer_tokens(self, layer: int, slots: torch.Tensor | None = None) -> TokenTable:
        rows = self.rows(layer)
        return self.tokens[rows if slots is None else rows[slots]]

    def video_slots(self, layer: int, start: int = 0) -> torch.Tensor:
        return video_slots(self.tokens, self.rows(layer), start)

    def overwrite(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        raise ConfigError("recomputing cached tokens in place is not available with tiered KV memory")

    def retain(self, rows: torch.Tensor, table: TokenTable,
               rotate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> None:
        raise ConfigError("retaining a subset of the cached tokens is not available with tiered KV memory")

    def truncate(self, length: int) -> None:
        """Forget every token from row ``length`` on (a question and its answer)."""
        if not 0 <= length <= len(self.tokens):
            raise ConfigError(f"cannot truncate a cache of {len(self.tokens)} tokens to {length}")
        for layer, blocks in enumerate(self.table.layers):
            keep = sum(1 for row in self.slot_rows[layer] if row < length)
            for block in [b for b in blocks if int(b.slots[-1]) >= keep]:
                if block.start >= keep:
                    self._drop(block)
                else:   # a grouped block reaching past the cut keeps its earlier slots
                    self._up(block)
                    self.table.shrink(block, block.slots < keep)
            self.slot_rows[layer] = self.slot_rows[layer][:keep]
            self.table.forget_index(layer)
            self.filled[layer] = keep
        self.tokens = self.tokens[:length]

    def close(self) -> None:
        """Finish the writes in flight and remove the session's disk directory (unless kept)."""
        self.copies.close()
        self._reap(wait=True)
        if self.disk is not None:
            self.disk.close()

    def clone(self, room: int = 0, device: torch.device | str | None = None) -> "TieredKVCache":
        """An independent copy with the same budgets, its device tier on ``device`` (None: this
        cache's); its disk blocks in a directory of its own (``room`` needs nothing: each write is
        a block of its own)."""
        self._reap(wait=True)
        twin = copy.copy(self)
        twin.device = self.device if device is None else torch.device(device)
        twin.copies = CopyEngine(twin.device)
        twin.copies.bytes, twin.copies.seconds = dict(self.copies.bytes), dict(self.copies.seconds)
        twin.host = HostTier(twin.copies)
        twin.read_bytes, twin.whole_read_bytes = dict(self.read_bytes), dict(self.whole_read_bytes)
        twin.table = self.table.copy(lambda b: dataclasses.replace(b, data=None if b.data is None else (
            b.data.to(twin.device, copy=True) if b.tier == DEVICE else b.data.clone())))
        twin.disk = self.disk.twin(twin.copies, twin.table.every()) if self.disk is not None else None
        twin.filled, twin.slot_rows, twin.tokens = list(self.filled), [list(r) for r in self.slot_rows], self.tokens[:]
        return twin

    # -- the offload capability -------------------------------------------------------------------
    def traffic(self) -> KVTraffic:
        return KVTraffic(dict(self.copies.bytes), dict(self.copies.seconds), dict(self.read_bytes),
                         dict(self.whole_read_bytes), self._device_peak, self.evicted_tokens)

    def reset_peak(self) -> None:
        self._device_peak = self.tokens_by_tier()[DEVICE]

    def resident(self, layer: int, slots: torch.Tensor) -> bool:
        """Whether every block holding one of ``slots`` of ``layer`` is on the device."""
        return all(block.tier == DEVICE for block, _ in self.table.holders(layer, self.filled[layer], slots))

    def set_layout(self, group_of: GroupOf | None, per_head: bool = False) -> None:
        """Lay blocks below the device out by group (layout.py), so one group (a cluster) moves as one copy.

        Raises:
            ConfigError: ``per_head`` with a bounded host tier and no disk: evicting one head's
                block would leave the heads with different tokens.
        """
        if per_head and self.config.host_tokens is not None and self.disk is None:
            raise ConfigError("a per-head KV layout needs a disk tier (--kv-disk) or an unbounded host tier")
        self._layout, self._per_head = group_of, per_head

    def prefetch(self, layer: int, slots: torch.Tensor, heads: torch.Tensor | None = None) -> None:
        """Start reading the disk blocks holding ``slots`` of ``layer`` (a coming step attends to them;
        ``heads`` as in `read`)."""
        for block, _ in self.table.holders(layer, self.filled[layer], slots, heads):
            if block.tier != DISK:
                continue
            if block.transfer is not None and block.transfer.done() and not block.transfer.reads:
                if not self._settle(block):
                    continue  # its write failed: the host copy stays until the block is evicted
            if block.transfer is None:
                self._begin(block, self.disk.prefetch(block))

    # -- placement --------------------------------------------------------------------------------
    def _tier(self, name: str) -> Tier:
        return self.host if name == HOST else self.disk

    def _up(self, block: Block, whole: bool = True) -> torch.Tensor:
        """The block's data on the device, moving it up a tier or two first (``whole``: every
        slot of it is wanted, for the read counters)."""
        block.last_used = self._clock
        if block.tier == DEVICE:
            return block.data
        nbytes = self.table.units(block) * self.shape[1] * 2 * self.dtype.itemsize
        self.read_bytes[block.tier] += nbytes
        if whole:
            self.whole_read_bytes[block.tier] += nbytes
        transfer = block.transfer
        if transfer is not None and not transfer.reads and block.tier == DISK and block.data is not None:
            # Still being written to disk: its host copy serves, and the file will not be needed.
            # (A copy down to host memory still in flight, as on CUDA's side stream, is waited for.)
            self.disk.abandon(block)
        else:
            self._settle(block)
        block.data = self._tier(block.tier).bring_up(block)
        self.table.place(block, DEVICE)
        self._note_device()
        return block.data

    def _note_device(self) -> None:
        self._device_peak = max(self._device_peak, self.table.count(DEVICE))

    def _enforce(self) -> None:
        self._reap()
        device, host = self.config.device_tokens, self.config.host_tokens
        for block in self.table.by_age(DEVICE) if device is not None else ():
            if self.table.count(DEVICE) <= device:
                break
            self._down(block, HOST)
        if host is not None and self.table.count(HOST) > host:
            # Blocks go on to disk: a copy down to host memory still running (CUDA's side stream)
            # must finish first, both to be written whole and to take its place in the layout.
            for block in [b for b in self.table.by_age(HOST) if b.transfer is not None]:
                self._settle(block)
        if self._layout is not None:
            for layer in range(len(self.filled)):
                regroup(self.table, layer, self._layout, self._per_head)
        for block in self.table.by_age(HOST) if host is not None else ():
            if self.table.count(HOST) <= host:
                break
            if self.disk is None:
                self._evict(block)
            else:
                self._down(block, DISK)

    def _down(self, block: Block, tier: str) -> None:
        """Start moving ``block`` down to ``tier``; the step goes on while the copy runs."""
        self._settle(block)   # a block goes on to disk once its copy to host memory has landed
        self._begin(block, self._tier(tier).receive(block))
        self.table.place(block, tier)
        if self._in_flight > WRITES_IN_FLIGHT:
            self._reap(wait=True)

    def _begin(self, block: Block, transfer: Transfer | None) -> None:
        block.transfer = transfer
        self._in_flight += transfer is not None

    def _settle(self, block: Block) -> bool:
        """Wait for the block's copy in flight; False (and the host copy kept) when a disk write failed."""
        transfer, block.transfer = block.transfer, None
        if transfer is None:
            return True
        self._in_flight -= 1
        try:
            data = transfer.wait()
        except OSError as exc:
            if transfer.reads:   # a prefetch that failed: the file is read again when needed
                return True
            if not self._disk_full_warned:
                log.warning("%s: the KV disk tier is full (%s); evicting the oldest blocks", self.disk.directory, exc)
                self._disk_full_warned = True
            block.path = None
            return False
        if transfer.reads:
            block.data = data      # read ahead: the step that needs it finds it in memory
        elif block.tier == DISK:
            block.data = None      # on disk now: the host copy goes
        return True

    def _reap(self, wait: bool = False) -> None:
        """Finish the disk writes that are done (every copy, with ``wait``); a block whose disk write
        failed is evicted. Prefetches are left for the step that needs their blocks."""
        for block in [b for b in self.table.every() if b.transfer is not None]:
            if (wait or (block.transfer.done() and not block.transfer.reads)) and not self._settle(block):
                if block.head is None:
                    self._evict(block)
                else:   # one head's block alone cannot go (the heads would hold different tokens): it stays in memory
                    self.table.place(block, HOST)
        if self.disk is not None:
            self._in_flight -= self.disk.reap(wait)

    def _evict(self, block: Block) -> None:
        self.evicted_tokens += block.length
        self._drop(block)

    def _drop(self, block: Block) -> None:
        if block.transfer is not None:
            self._settle(block)
        if self.disk is not None:
            self.disk.release(block)
        self.table.remove(block)
