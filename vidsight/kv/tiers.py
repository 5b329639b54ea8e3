"""A stream's KV cache in blocks that live on the device, in host memory or on disk.

One block per write per layer (a temporal patch, a question, a generated token). Between steps
the device holds at most its budget in tokens, host memory at most its own; past a budget the
least recently used blocks move down a tier (device -> host -> disk), and a block a step attends
to moves back up first, so during a step the device also holds the blocks that step attends to.
When every tier is full the oldest blocks are evicted and counted: attention then skips their
tokens. Disk blocks are memory-mapped files in one directory per session, removed on `close`.
Copies are synchronous here (the CPU is the device on this machine); bytes moved are counted.
"""

from __future__ import annotations

import dataclasses
import logging
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from vidsight.errors import ConfigError
from vidsight.kv.cache import TokenTable

log = logging.getLogger(__name__)
DEVICE, HOST, DISK = "device", "host", "disk"


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
    data: torch.Tensor | None  # (2, kv_heads, length, head_dim) keys and values; None on disk
    path: Path | None = None
    last_used: int = 0


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
        self.bytes_moved = {"up": 0, "down": 0}
        self.evicted_tokens = 0
        self._clock = 0
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
        """Remove the session's disk directory (unless kept)."""
        if self.directory is not None and not self.config.keep_files:
            shutil.rmtree(self.directory, ignore_errors=True)

    # -- moving blocks ------------------------------------------------------------------------
    def _up(self, block: _Block) -> torch.Tensor:
        """The block's data on the device, moving it up a tier or two first."""
        block.last_used = self._clock
        if block.tier != DEVICE:
            data = self._load(block) if block.tier == DISK else block.data
            self.bytes_moved["up"] += data.nbytes
            if block.path is not None:
                block.path.unlink(missing_ok=True)
            block.data, block.tier, block.path = data.to(self.device), DEVICE, None
        return block.data

    def _enforce(self) -> None:
        device, host = self.config.device_tokens, self.config.host_tokens
        while device is not None and self._count(DEVICE) > device:
            self._down(self._least_recent(DEVICE), HOST)
        while host is not None and self._count(HOST) > host:
            block = self._least_recent(HOST)
            if self.directory is None or not self._down(block, DISK):
                self._evict(block)

    def _count(self, tier: str) -> int:
        return sum(b.length for layer in self.blocks for b in layer if b.tier == tier)

    def _least_recent(self, tier: str) -> _Block:
        return min((b for layer in self.blocks for b in layer if b.tier == tier), key=lambda b: (b.last_used, b.start))

    def _down(self, block: _Block, tier: str) -> bool:
        """Move ``block`` to ``tier``; False when the disk is full."""
        if tier == HOST:
            host = block.data.to("cpu")
            block.data = host.pin_memory() if self.device.type == "cuda" else host
        else:
            path = self.directory / f"layer{block.layer}-slot{block.start}.kv"
            raw = block.data.contiguous().view(torch.uint8).reshape(-1).numpy()
            try:
                mapped = np.memmap(path, dtype=np.uint8, mode="w+", shape=raw.shape)
                mapped[:] = raw
                mapped.flush()
            except OSError as exc:
                path.unlink(missing_ok=True)
                log.warning("%s: the KV disk tier is full (%s); evicting the oldest blocks", self.directory, exc)
                return False
            block.data, block.path = None, path
        self.bytes_moved["down"] += block.length * 2 * self.shape[0] * self.shape[1] * self.dtype.itemsize
        block.tier = tier
        return True

    def _load(self, block: _Block) -> torch.Tensor:
        mapped = np.memmap(block.path, dtype=np.uint8, mode="r")
        data = torch.from_numpy(np.array(mapped)).view(self.dtype)
        return data.reshape(2, self.shape[0], block.length, self.shape[1])

    def _evict(self, block: _Block) -> None:
        self.evicted_tokens += block.length
        self._drop(block)

    def _drop(self, block: _Block) -> None:
        if block.path is not None:
            block.path.unlink(missing_ok=True)
        self.blocks[block.layer].remove(block)

