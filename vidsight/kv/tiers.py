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
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import shutil
import tempfile
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


@dataclasses.dataclass
class _Block:
    layer: int
    start: int                 # first slot of the layer it holds
    length: int
    tier: str
    data: torch.Tensor | None  # (2, kv_heads, length, head_dim) keys and values; None once on disk
    path: Path | None = None
    last_used: int = 0
    transfer: Transfer | None = None  # its copy down, while in flight


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
        self.evicted_tokens = 0
        self.device_peak_tokens = 0  # the most on the device at any moment, steps included
        self._clock = 0
        self._disk_full_warned = False
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
        counts = {DEVICE: 0, HOST: 0, DISK: 0}
        for layer in self.blocks:
            for block in layer:
                counts[block.tier] += block.length
        return counts

    def reserve(self, tokens: int) -> None:
        """Nothing to do: each write is a block of its own."""

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store a chunk as a device block; the chosen past slots (all when None) then the chunk, on the device."""
        self._clock += 1
        past_k, past_v = self.read(layer, slots)
        block = _Block(layer, self.filled[layer], k.shape[2], DEVICE, torch.stack([k[0], v[0]]).clone(),
                       last_used=self._clock)
        self.blocks[layer].append(block)
        self._note_device()
        return torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)

    def read(self, layer: int, slots: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(1, kv_heads, n, head_dim)`` keys and values of ``slots`` (all when None), brought to the device.

        Slots of evicted blocks are left out.
        """
        wanted = None if slots is None else set(slots.tolist())
        parts = []
        for block in self.blocks[layer]:
            span = range(block.start, block.start + block.length)
            if wanted is not None and not wanted.intersection(span):
                continue
            data = self._up(block)
            if wanted is not None and not set(span) <= wanted:
                data = data[:, :, [s - block.start for s in span if s in wanted]]
            parts.append(data)
        if not parts:
            empty = torch.empty((1, *self.shape[:1], 0, self.shape[1]), dtype=self.dtype, device=self.device)
            return empty, empty
        data = torch.cat(parts, dim=2)
        return data[0][None], data[1][None]

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
        wanted = set(slots.tolist())
        return all(b.tier == DEVICE for b in self.blocks[layer]
                   if wanted.intersection(range(b.start, b.start + b.length)))

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
            for block in [b for b in blocks if b.start >= keep]:
                self._drop(block)
            self.slot_rows[layer] = self.slot_rows[layer][:keep]
            self.filled[layer] = keep
        self.tokens = self.tokens[:length]

    def close(self) -> None:
        """Finish the writes in flight and remove the session's disk directory (unless kept)."""
        self.copies.close()
        if self.directory is not None and not self.config.keep_files:
            shutil.rmtree(self.directory, ignore_errors=True)

    def clone(self) -> "TieredKVCache":
        """An independent copy with the same budgets; its disk blocks in a directory of its own."""
        self._reap(wait=True)
        twin = copy.copy(self)
        twin.copies = CopyEngine(self.device)
        twin.copies.bytes, twin.copies.seconds = dict(self.copies.bytes), dict(self.copies.seconds)
        twin.directory = self._open_directory(self.config.disk_dir) if self.directory is not None else None
        twin.blocks = [[dataclasses.replace(b, data=None if b.data is None else b.data.clone(),
                                            path=None if b.path is None else twin.directory / b.path.name)
                        for b in layer] for layer in self.blocks]
        for block in (b for layer in self.blocks for b in layer if b.path is not None):
            shutil.copyfile(block.path, twin.directory / block.path.name)
        twin.filled, twin.slot_rows, twin.tokens = list(self.filled), [list(r) for r in self.slot_rows], self.tokens[:]
        return twin

    # -- moving blocks ------------------------------------------------------------------------
    def _up(self, block: _Block) -> torch.Tensor:
        """The block's data on the device, moving it up a tier or two first."""
        block.last_used = self._clock
        if block.tier == DEVICE:
            return block.data
        self._settle(block)
        if block.data is None:
            data = self.copies.load(block.path, self.dtype, (2, self.shape[0], block.length, self.shape[1]))
        else:
            data = self.copies.up(block.data)
        if block.path is not None:
            block.path.unlink(missing_ok=True)
        block.data, block.tier, block.path = data, DEVICE, None
        self._note_device()
        return block.data

    def _note_device(self) -> None:
        self.device_peak_tokens = max(self.device_peak_tokens, self._count(DEVICE))

    def _enforce(self) -> None:
        self._reap()
        device, host = self.config.device_tokens, self.config.host_tokens
        while device is not None and self._count(DEVICE) > device:
            self._down(self._least_recent(DEVICE), HOST)
        while host is not None and self._count(HOST) > host:
            block = self._least_recent(HOST)
            if self.directory is None:
                self._evict(block)
            else:
                self._down(block, DISK)

    def _count(self, tier: str) -> int:
        return sum(b.length for layer in self.blocks for b in layer if b.tier == tier)

    def _least_recent(self, tier: str) -> _Block:
        return min((b for layer in self.blocks for b in layer if b.tier == tier), key=lambda b: (b.last_used, b.start))

    def _down(self, block: _Block, tier: str) -> None:
        """Start moving ``block`` down to ``tier``; the step goes on while the copy runs."""
        if tier == HOST:
            block.data, block.transfer = self.copies.to_host(block.data)
        else:
            self._settle(block)
            block.path = self.directory / f"layer{block.layer}-slot{block.start}.kv"
            block.transfer = self.copies.to_disk(block.path, block.data)
        block.tier = tier
        if sum(b.transfer is not None for layer in self.blocks for b in layer) > WRITES_IN_FLIGHT:
            self._reap(wait=True)

    def _settle(self, block: _Block) -> bool:
        """Wait for the block's copy in flight; False (and the host copy kept) when a disk write failed."""
        transfer, block.transfer = block.transfer, None
        if transfer is None:
            return True
        try:
            transfer.wait()
        except OSError as exc:
            if not self._disk_full_warned:
                log.warning("%s: the KV disk tier is full (%s); evicting the oldest blocks", self.directory, exc)
                self._disk_full_warned = True
            block.path = None
            return False
        if block.tier == DISK:
            block.data = None  # on disk now: the host copy goes
        return True

    def _reap(self, wait: bool = False) -> None:
        """Finish the copies that are done (all, with ``wait``); a block whose disk write failed is evicted."""
        for block in [b for layer in self.blocks for b in layer if b.transfer is not None]:
            if (wait or block.transfer.done()) and not self._settle(block):
                self._evict(block)

    def _evict(self, block: _Block) -> None:
        self.evicted_tokens += block.length
        self._drop(block)

    def _drop(self, block: _Block) -> None:
        if block.transfer is not None:
            self._settle(block)
        if block.path is not None:
            block.path.unlink(missing_ok=True)
        self.blocks[block.layer].remove(block)
