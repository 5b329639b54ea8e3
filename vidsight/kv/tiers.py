"""A stream's KV cache in blocks that live on the device, in host memory or on disk.

One block per write per layer (a temporal patch, a question, a generated token). Between steps
the device holds at most its budget in tokens, host memory at most its own; past a budget the
least recently used blocks move down a tier (device -> host -> disk), and a block a step attends
to moves back up first, so during a step the device also holds the blocks that step attends to.
When every tier is full the oldest blocks are evicted and counted: attention then skips their
tokens. Disk blocks are memory-mapped files in one directory per session, removed on `close`.
Copies down run beside the computation (`copies.CopyEngine`): a block being written to disk
keeps its host copy until the write is done, and a write that fails (a full disk) evicts the
block, counted, with one warning.

A policy may lay the blocks below the device out by group (`set_layout`): Mosaic's clusters, one
block per cluster; or, per key head, ReSV's, one block per cluster of one head, so that a head
reading its selected clusters moves just those (the other heads' slots read as zeros, masked).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from vidsight.errors import ConfigError
from vidsight.kv.cache import TokenTable
from vidsight.kv.copies import CopyEngine, Transfer

log = logging.getLogger(__name__)
DEVICE, HOST, DISK = "device", "host", "disk"
# Disk writes in flight at most; past it the oldest is waited for (each holds a host copy).
WRITES_IN_FLIGHT = 64


@dataclasses.dataclass(frozen=True)
class TierConfig:
    """Budgets of the KV tiers, in cached tokens summed over layers.

    Attributes:
        device_tokens: The device's budget (None: unbounded, no offload).
        host_tokens: Host memory's budget (None: unbounded); pinned when the device is CUDA.
        disk_dir: Where a session's disk tier lives (None: no disk tier).
        keep_files: Leave the session's directory when it closes.
    """

    device_tokens: int | None = None
    host_tokens: int | None = None
    disk_dir: Path | None = None
    keep_files: bool = False

    def __post_init__(self):
        for name in ("device_tokens", "host_tokens"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be positive, got {value}")


@dataclasses.dataclass(eq=False)  # blocks are compared by identity
class _Block:
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


class TieredKVCache:
    """`KVCache`'s interface over blocks on the device, in host memory and on disk.

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
        self.blocks: list[list[_Block]] = [[] for _ in range(num_layers)]
        self.filled = [0] * num_layers
        self.slot_rows: list[list[int]] = [[] for _ in range(num_layers)]
        self.tokens = TokenTable.empty()
        self.copies = CopyEngine(self.device)
        # Kept as blocks move rather than summed over every block: a stream holds thousands. In
        # head-slots (a token of one layer is kv_heads of them), since a per-head block holds one.
        self._tier_units = {DEVICE: 0, HOST: 0, DISK: 0}
        # Bytes moved up from host and disk, and of those the bytes of blocks wanted whole (one
        # sequential read serving only wanted tokens; V-Rex's cluster-contiguous layout aims at that).
        self.read_bytes = {HOST: 0, DISK: 0}
        self.whole_read_bytes = {HOST: 0, DISK: 0}
        self._in_flight = 0
        self._abandoned: list[tuple[Transfer, Path]] = []   # writes of blocks that went up first
        # Per layer, ``(kv_heads, slots)``: the index in `blocks` of the block holding each head's
        # slot (-1: evicted); None: stale.
        self._owners: list[torch.Tensor | None] = [None] * num_layers
        self.evicted_tokens = 0
        self.device_peak_tokens = 0  # the most on the device at any moment, steps included
        self._clock = 0
        self._files = 0
        self._disk_full_warned = False
        self._layout = None
        self._per_head = False
        self.directory = self._open_directory(config.disk_dir) if config.disk_dir is not None else None

    @staticmethod
    def _open_directory(root: Path) -> Path:
        try:
            Path(root).mkdir(parents=True, exist_ok=True)
            directory = Path(tempfile.mkdtemp(prefix="session-", dir=root))
        except OSError as exc:
            raise ConfigError(f"{root}: cannot hold the KV disk tier ({exc.strerror or exc})") from None
        return directory

    # -- what the engine calls ----------------------------------------------------------------
    @property
    def bytes_moved(self) -> dict[str, int]:
        return self.copies.bytes

    @property
    def copy_seconds(self) -> dict[str, float]:
        return self.copies.seconds

    @property
    def length(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        """Bytes of keys and values on the device."""
        return sum(b.data.nbytes for layer in self.blocks for b in layer if b.tier == DEVICE)

    def tokens_by_tier(self) -> dict[str, int]:
        return {tier: units // self.shape[0] for tier, units in self._tier_units.items()}

    def reserve(self, tokens: int) -> None:
        """Nothing to do: each write is a block of its own."""

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor | None = None,
              heads: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Store a chunk as a device block; the chosen past slots (all when None) then the chunk, on the device.

        ``heads`` ``(kv_heads, len(slots))`` says which key heads want each slot (see `read`).
        """
        self._clock += 1
        past_k, past_v = self.read(layer, slots, heads)
        slots = torch.arange(self.filled[layer], self.filled[layer] + k.shape[2])
        self._add(_Block(layer, slots, DEVICE, torch.stack([k[0], v[0]]).clone(), last_used=self._clock))
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
        for block, mine in self._holders(layer, slots, heads):
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

    def resident(self, layer: int, slots: torch.Tensor) -> bool:
        """Whether every block holding one of ``slots`` of ``layer`` is on the device."""
        return all(block.tier == DEVICE for block, _ in self._holders(layer, slots))

    def set_layout(self, group_of: Callable[[int, torch.Tensor], torch.Tensor] | None, per_head: bool = False) -> None:
        """Lay blocks below the device out by group, so one group (a cluster) moves as one copy.

        ``group_of(layer, slots)`` names each slot's group (-1: none), ``(len(slots),)``, or with
        ``per_head`` each key head's ``(kv_heads, len(slots))`` (clusters that differ per head, as
        ReSV's): then a host block holds one group of one head. Blocks arriving in host memory are
        regrouped: each group's slots join that group's host block.

        Raises:
            ConfigError: ``per_head`` with a bounded host tier and no disk: evicting one head's
                block would leave the heads with different tokens.
        """
        if per_head and self.config.host_tokens is not None and self.directory is None:
            raise ConfigError("a per-head KV layout needs a disk tier (--kv-disk) or an unbounded host tier")
        self._layout, self._per_head = group_of, per_head

    def prefetch(self, layer: int, slots: torch.Tensor, heads: torch.Tensor | None = None) -> None:
        """Start reading the disk blocks holding ``slots`` of ``layer`` (a coming step attends to them;
        ``heads`` as in `read`)."""
        for block, _ in self._holders(layer, slots, heads):
            if block.tier != DISK:
                continue
            if block.transfer is not None and block.transfer.done() and not block.transfer.reads:
                if not self._settle(block):
                    continue  # its write failed: the host copy stays until the block is evicted
            if block.transfer is None and block.data is None:  # (a write in flight still has its host copy)
                self._begin(block, self.copies.from_disk(block.path, self.dtype, self._data_shape(block)))

    def _holders(self, layer: int, slots: torch.Tensor | None, heads: torch.Tensor | None = None
                 ) -> list[tuple[_Block, torch.Tensor | None]]:
        """The blocks holding any of ``slots`` (every block when None) for a head that wants it
        (``heads`` as in `read`), in storage order, each with a mask of its slots that are
        wanted (None: all of them)."""
        blocks = self.blocks[layer]
        if slots is None:
            return [(block, None) for block in blocks]
        owner, wanted = self._owner_index(layer), slots.cpu()
        ids = owner[:, wanted]                                   # (kv_heads, len(slots))
        if heads is not None:
            ids = ids.where(heads.cpu(), -1)
        counts = torch.bincount(ids[ids >= 0], minlength=len(blocks)).tolist()
        out = []
        for block, count in zip(blocks, counts):
            if not count:
                continue
            if count == self._units(block):
                out.append((block, None))
                continue
            mine = wanted
            if heads is not None:
                mine = wanted[heads.cpu().any(dim=0) if block.head is None else heads[block.head].cpu()]
            out.append((block, torch.isin(block.slots, mine)))
        return out

    def _owner_index(self, layer: int) -> torch.Tensor:
        """``(kv_heads, slots)``: the index in the layer's blocks of the block holding each head's slot."""
        if self._owners[layer] is None:
            blocks = self.blocks[layer]
            owner = torch.full((self.shape[0], self.filled[layer]), -1, dtype=torch.long)
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

    def rows(self, layer: int) -> torch.Tensor:
        """The token-table row of each of ``layer``'s slots."""
        return torch.tensor(self.slot_rows[layer], dtype=torch.long)

    def layer_tokens(self, layer: int) -> TokenTable:
        return self.tokens[self.rows(layer)]

    def truncate(self, length: int) -> None:
        """Forget every token from row ``length`` on (a question and its answer)."""
        if not 0 <= length <= len(self.tokens):
            raise ConfigError(f"cannot truncate a cache of {len(self.tokens)} tokens to {length}")
        for layer, blocks in enumerate(self.blocks):
            keep = sum(1 for row in self.slot_rows[layer] if row < length)
            for block in [b for b in blocks if int(b.slots[-1]) >= keep]:
                if block.start >= keep:
                    self._drop(block)
                else:   # a grouped block reaching past the cut keeps its earlier slots
                    data = self._up(block)
                    stay = block.slots < keep
                    self._tier_units[DEVICE] -= int((~stay).sum()) * self._heads_of(block)
                    block.slots, block.data = block.slots[stay], data[:, :, stay.to(data.device)]
            self.slot_rows[layer] = self.slot_rows[layer][:keep]
            self._owners[layer] = None
            self.filled[layer] = keep
        self.tokens = self.tokens[:length]

    def close(self) -> None:
        """Finish the writes in flight and remove the session's disk directory (unless kept)."""
        self.copies.close()
        self._reap(wait=True)
        if self.directory is not None and not self.config.keep_files:
            shutil.rmtree(self.directory, ignore_errors=True)

    def clone(self) -> "TieredKVCache":
        """An independent copy with the same budgets; its disk blocks in a directory of its own."""
        self._reap(wait=True)
        twin = copy.copy(self)
        twin.copies = CopyEngine(self.device)
        twin.copies.bytes, twin.copies.seconds = dict(self.copies.bytes), dict(self.copies.seconds)
        twin._tier_units, twin._owners = dict(self._tier_units), list(self._owners)
        twin.read_bytes, twin.whole_read_bytes = dict(self.read_bytes), dict(self.whole_read_bytes)
        twin.directory = self._open_directory(self.config.disk_dir) if self.directory is not None else None
        twin.blocks = [[dataclasses.replace(b, data=None if b.data is None else b.data.clone(),
                                            path=None if b.path is None else twin.directory / b.path.name)
                        for b in layer] for layer in self.blocks]
        for block in (b for layer in self.blocks for b in layer if b.path is not None):
            shutil.copyfile(block.path, twin.directory / block.path.name)
        twin.filled, twin.slot_rows, twin.tokens = list(self.filled), [list(r) for r in self.slot_rows], self.tokens[:]
        return twin

    # -- moving blocks ------------------------------------------------------------------------
    def _data_shape(self, block: _Block) -> tuple[int, ...]:
        return (2, self._heads_of(block), block.length, self.shape[1])

    def _heads_of(self, block: _Block) -> int:
        return self.shape[0] if block.head is None else 1

    def _units(self, block: _Block) -> int:
        """Head-slots the block holds."""
        return block.length * self._heads_of(block)

    def _up(self, block: _Block, whole: bool = True) -> torch.Tensor:
        """The block's data on the device, moving it up a tier or two first (``whole``: every
        slot of it is wanted, for the read counters)."""
        block.last_used = self._clock
        if block.tier == DEVICE:
            return block.data
        nbytes = self._units(block) * self.shape[1] * 2 * self.dtype.itemsize
        self.read_bytes[block.tier] += nbytes
        if whole:
            self.whole_read_bytes[block.tier] += nbytes
        transfer = block.transfer
        if transfer is not None and not transfer.reads and block.tier == DISK and block.data is not None:
            # Still being written to disk: its host copy serves, and the file will not be needed.
            # (A copy down to host memory still in flight, as on CUDA's side stream, is waited for.)
            self._abandoned.append((transfer, block.path))
            block.transfer, block.path = None, None
        else:
            self._settle(block)
        if block.data is None:
            data = self.copies.load(block.path, self.dtype, self._data_shape(block))
        else:
            data = self.copies.up(block.data)
        if block.path is not None:
            block.path.unlink(missing_ok=True)
        block.data, block.path = data, None
        self._place(block, DEVICE)
        self._note_device()
        return block.data

    def _note_device(self) -> None:
        self.device_peak_tokens = max(self.device_peak_tokens, self._count(DEVICE))

    def _enforce(self) -> None:
        self._reap()
        device, host = self.config.device_tokens, self.config.host_tokens
        for block in self._by_age(DEVICE) if device is not None else ():
            if self._count(DEVICE) <= device:
                break
            self._down(block, HOST)
        if host is not None and self._count(HOST) > host:
            # Blocks go on to disk: a copy down to host memory still running (CUDA's side stream)
            # must finish first, both to be written whole and to take its place in the layout.
            for block in [b for b in self._by_age(HOST) if b.transfer is not None]:
                self._settle(block)
        if self._layout is not None:
            for layer in range(len(self.blocks)):
                self._regroup_heads(layer) if self._per_head else self._regroup(layer)
        for block in self._by_age(HOST) if host is not None else ():
            if self._count(HOST) <= host:
                break
            if self.directory is None:
                self._evict(block)
            else:
                self._down(block, DISK)

    def _regroup(self, layer: int) -> None:
        """Fold the layer's host blocks into one host block per group: newly arrived blocks, and
        grouped ones whose slots the layout has since given to other groups (a split cluster)."""
        host = [b for b in self.blocks[layer] if b.tier == HOST and b.transfer is None]
        if not host:
            return
        groups_by_block = self._layout(layer, torch.cat([b.slots for b in host])).split([b.length for b in host])
        loose, groups, grouped = [], [], {}
        for block, its_groups in zip(host, groups_by_block):
            if block.grouped and bool((its_groups == block.group).all()):
                grouped[(None, block.group)] = block
            else:
                loose.append(block)
                groups.append(its_groups)
        if not loose:
            return
        slots = torch.cat([b.slots for b in loose])
        data = torch.cat([b.data for b in loose], dim=2)
        used = torch.cat([torch.full((b.length,), b.last_used) for b in loose])
        groups = torch.cat(groups)
        for block in loose:
            self.blocks[layer].remove(block)
        self._owners[layer] = None
        self._file(layer, slots, data, used, groups, grouped, None)

    def _regroup_heads(self, layer: int) -> None:
        """`_regroup` for a per-head layout: each head's slots of the newly arrived blocks (and of
        per-head blocks whose slots the layout has since given to other groups) join that head's
        block of their group."""
        host = [b for b in self.blocks[layer] if b.tier == HOST and b.transfer is None]
        if not host:
            return
        groups = self._layout(layer, torch.cat([b.slots for b in host])).split([b.length for b in host], dim=1)
        loose, grouped = [], {}
        for block, its_groups in zip(host, groups):
            if block.head is not None and bool((its_groups[block.head] == block.group).all()):
                grouped[(block.head, block.group)] = block
            else:
                loose.append((block, its_groups))
        if not loose:
            return
        for block, _ in loose:
            self.blocks[layer].remove(block)
        self._owners[layer] = None
        for head in range(self.shape[0]):
            mine = [(b, g) for b, g in loose if b.head in (None, head)]
            if not mine:
                continue
            slots = torch.cat([b.slots for b, _ in mine])
            data = torch.cat([b.data[:, head : head + 1] if b.head is None else b.data for b, _ in mine], dim=2)
            used = torch.cat([torch.full((b.length,), b.last_used) for b, _ in mine])
            self._file(layer, slots, data, used, torch.cat([g[head] for _, g in mine]), grouped, head)

    def _file(self, layer: int, slots: torch.Tensor, data: torch.Tensor, used: torch.Tensor, groups: torch.Tensor,
              grouped: dict[tuple[int | None, int], _Block], head: int | None) -> None:
        """Each group's slots (their data, last uses) join the host block of ``(head, group)``, made when new."""
        for group in torch.unique(groups).tolist():
            member = groups == group
            block = grouped.get((head, group))
            if block is None:
                block = _Block(layer, slots[:0], HOST, data[:, :, :0], group=group, head=head)
                self.blocks[layer].append(block)
            merged = torch.cat([block.slots, slots[member]])
            order = torch.argsort(merged)
            block.slots, block.data = merged[order], torch.cat([block.data, data[:, :, member]], dim=2)[:, :, order]
            block.last_used = max(block.last_used, int(used[member].max()))

    def _count(self, tier: str) -> float:
        """Tokens (of one layer, every head) the tier holds."""
        return self._tier_units[tier] / self.shape[0]

    def _by_age(self, tier: str) -> list[_Block]:
        """The tier's blocks, least recently used first."""
        return sorted((b for layer in self.blocks for b in layer if b.tier == tier), key=lambda b: (b.last_used, b.start))

    def _add(self, block: _Block) -> None:
        owner = self._owners[block.layer]
        if owner is not None:   # a block of new slots (every head) extends the index
            extra = torch.full((owner.shape[0], block.length), len(self.blocks[block.layer]))
            self._owners[block.layer] = torch.cat([owner, extra], dim=1)
        self.blocks[block.layer].append(block)
        self._tier_units[block.tier] += self._units(block)

    def _place(self, block: _Block, tier: str) -> None:
        self._tier_units[block.tier] -= self._units(block)
        self._tier_units[tier] += self._units(block)
        block.tier = tier

    def _begin(self, block: _Block, transfer: Transfer | None) -> None:
        block.transfer = transfer
        self._in_flight += transfer is not None

    def _down(self, block: _Block, tier: str) -> None:
        """Start moving ``block`` down to ``tier``; the step goes on while the copy runs."""
        if tier == HOST:
            block.data, transfer = self.copies.to_host(block.data)
        else:
            self._settle(block)
            self._files += 1
            block.path = self.directory / f"layer{block.layer}-{self._files}.kv"
            transfer = self.copies.to_disk(block.path, block.data)
        self._begin(block, transfer)
        self._place(block, tier)
        if self._in_flight > WRITES_IN_FLIGHT:
            self._reap(wait=True)

    def _settle(self, block: _Block) -> bool:
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
                log.warning("%s: the KV disk tier is full (%s); evicting the oldest blocks", self.directory, exc)
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
        for block in [b for layer in self.blocks for b in layer if b.transfer is not None]:
            if (wait or (block.transfer.done() and not block.transfer.reads)) and not self._settle(block):
                if block.head is None:
                    self._evict(block)
                else:   # one head's block alone cannot go (the heads would hold different tokens): it stays in memory
                    self._place(block, HOST)
        still = []
        for transfer, path in self._abandoned:
            if wait or transfer.done():
                self._in_flight -= 1
                try:
                    transfer.wait()
                except OSError:
                    pass   # the write failed; nobody needs its file
                path.unlink(missing_ok=True)
            else:
                still.append((transfer, path))
        self._abandoned = still

    def _evict(self, block: _Block) -> None:
        self.evicted_tokens += block.length
        self._drop(block)

    def _drop(self, block: _Block) -> None:
        if block.transfer is not None:
            self._settle(block)
        if block.path is not None:
            block.path.unlink(missing_ok=True)
        self.blocks[block.layer].remove(block)
        self._owners[block.layer] = None
        self._tier_units[block.tier] -= self._units(block)
