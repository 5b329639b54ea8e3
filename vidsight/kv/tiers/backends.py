"""The tiers below the device, behind one small interface, so another tier (a remote store) is one class.

A tier takes a block from the tier above (`receive`, a copy that may still be running when it
returns) and gives its data back to the device (`bring_up`); the disk tier also reads ahead
(`prefetch`) and lets go of a block's file (`release`). Both start their copies through one
`CopyEngine`.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Protocol

import torch

from vidsight.errors import ConfigError
from vidsight.kv.tiers.blocks import DISK, HOST, Block
from vidsight.kv.tiers.copies import CopyEngine, Transfer


class Tier(Protocol):
    """A storage tier below the device."""

    name: str

    def receive(self, block: Block) -> Transfer | None:
        """Start storing the block's data (on the tier above) here; None when already done."""
        ...

    def bring_up(self, block: Block) -> torch.Tensor:
        """The block's data on the device; the tier's copy is let go."""
        ...


class HostTier:
    """Host memory, pinned when the device is CUDA (copies down on a side stream)."""

    name = HOST

    def __init__(self, copies: CopyEngine):
        self.copies = copies

    def receive(self, block: Block) -> Transfer | None:
        block.data, transfer = self.copies.to_host(block.data)
        return transfer

    def bring_up(self, block: Block) -> torch.Tensor:
        return self.copies.up(block.data)


class DiskTier:
    """Memory-mapped files, one per block, in one directory per session (removed on `close`).

    A block being written keeps its host copy until the write is done (the placement settles it);
    a block wanted back while its write is in flight is served from that copy and its write is
    abandoned: finished later, its file removed.

    Args:
        copies: Starts the writes and reads on the disk thread.
        root: The directory the session's directory is made in.
        keep_files: Leave the session's directory on `close`.
        dtype: The keys' and values' dtype (files hold raw bytes).
        shape: ``(kv_heads, head_dim)``.

    Raises:
        ConfigError: ``root`` cannot be created or written.
    """

    name = DISK

    def __init__(self, copies: CopyEngine, root: Path, keep_files: bool, dtype: torch.dtype, shape: tuple[int, int]):
        self.copies, self.root, self.keep_files = copies, Path(root), keep_files
        self.dtype, self.shape = dtype, shape
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            self.directory = Path(tempfile.mkdtemp(prefix="session-", dir=self.root))
        except OSError as exc:
            raise ConfigError(f"{root}: cannot hold the KV disk tier ({exc.strerror or exc})") from None
        self._files = 0
        self._abandoned: list[tuple[Transfer, Path]] = []

    def receive(self, block: Block) -> Transfer:
        self._files += 1
        block.path = self.directory / f"layer{block.layer}-{self._files}.kv"
        return self.copies.to_disk(block.path, block.data)

    def prefetch(self, block: Block) -> Transfer | None:
        if block.data is not None:   # a write in flight still has its host copy
            return None
        return self.copies.from_disk(block.path, self.dtype, self._data_shape(block))

    def bring_up(self, block: Block) -> torch.Tensor:
        if block.data is None:
            data = self.copies.load(block.path, self.dtype, self._data_shape(block))
        else:
            data = self.copies.up(block.data)
        self.release(block)
        return data

    def _data_shape(self, block: Block) -> tuple[int, ...]:
        return (2, self.shape[0] if block.head is None else 1, block.length, self.shape[1])

    def release(self, block: Block) -> None:
        if block.path is not None:
            block.path.unlink(missing_ok=True)
            block.path = None

    def abandon(self, block: Block) -> None:
        """Leave the block's write in flight to finish on its own; its file is removed then."""
        self._abandoned.append((block.transfer, block.path))
        block.transfer, block.path = None, None

    def reap(self, wait: bool = False) -> int:
        """Finish the abandoned writes that are done (all with ``wait``); how many finished."""
        still, finished = [], 0
        for transfer, path in self._abandoned:
            if wait or transfer.done():
                finished += 1
                try:
                    transfer.wait()
                except OSError:
                    pass   # the write failed; nobody needs its file
                path.unlink(missing_ok=True)
            else:
                still.append((transfer, path))
        self._abandoned = still
        return finished

    def twin(self, copies: CopyEngine, blocks: list[Block]) -> "DiskTier":
        """A tier in a directory of its own holding copies of ``blocks``' files (paths moved there)."""
        twin = DiskTier(copies, self.root, self.keep_files, self.dtype, self.shape)
        twin._files = self._files
        for block in blocks:
            if block.path is not None:
                shutil.copyfile(block.path, twin.directory / block.path.name)
                block.path = twin.directory / block.path.name
        return twin

    def close(self) -> None:
        if not self.keep_files:
            shutil.rmtree(self.directory, ignore_errors=True)
