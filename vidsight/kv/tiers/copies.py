"""Copies between KV tiers that run beside the computation: a CUDA copy stream, a disk-writer thread.

Moving a block down a tier is never on a step's critical path, so it starts and the step goes
on: device to host on a side CUDA stream into pinned memory (an event marks it done), host to
disk on one disk thread (memory-mapped files). A copy up is needed by the step that asks for
it, so it runs at once, unless a prefetch started reading it from disk earlier. Bytes are counted
once per block moved, per direction; seconds are the copies' own (the disk thread's for writes
and prefetches).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

UP, DOWN = "up", "down"


class Transfer:
    """One copy in flight: ``wait`` returns when it is done (raising the copy's error, if any).

    ``reads`` marks a prefetch from disk, whose ``wait`` returns the data read.
    """

    def __init__(self, future: Future | None = None, event=None, keep_alive: torch.Tensor | None = None,
                 reads: bool = False):
        self._future, self._event, self._keep_alive = future, event, keep_alive
        self.reads = reads

    def done(self) -> bool:
        if self._future is not None:
            return self._future.done()
        return self._event is None or self._event.query()

    def wait(self) -> torch.Tensor | None:
        result = None
        if self._future is not None:
            result = self._future.result()
        elif self._event is not None:
            self._event.synchronize()
        self._keep_alive = None  # the source may go once the copy has finished
        return result


class CopyEngine:
    """Starts tier copies and counts them.

    Args:
        device: The device attention runs on.
    """

    def __init__(self, device: torch.device):
        self.device = torch.device(device)
        self.bytes = {UP: 0, DOWN: 0}
        self.seconds = {UP: 0.0, DOWN: 0.0}
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self._writer: ThreadPoolExecutor | None = None

    def to_host(self, data: torch.Tensor) -> tuple[torch.Tensor, Transfer | None]:
        """A host copy of device ``data`` and its transfer (None: done, as when the device is the CPU)."""
        self.bytes[DOWN] += data.nbytes
        if self._stream is None:
            return data.to("cpu"), None
        host = torch.empty(data.shape, dtype=data.dtype, pin_memory=True)
        self._stream.wait_stream(torch.cuda.current_stream(self.device))  # the data is written
        with torch.cuda.stream(self._stream):
            host.copy_(data, non_blocking=True)
            event = torch.cuda.Event()
            event.record(self._stream)
        return host, Transfer(event=event, keep_alive=data)

    def to_disk(self, path: Path, data: torch.Tensor) -> Transfer:
        """Write host ``data`` to ``path`` as a memory-mapped file on the disk thread."""
        self.bytes[DOWN] += data.nbytes
        return Transfer(self._disk().submit(self._write, path, data))

    def from_disk(self, path: Path, dtype: torch.dtype, shape: tuple[int, ...]) -> Transfer:
        """Read a file written by `to_disk` into host memory on the disk thread (a prefetch)."""
        return Transfer(self._disk().submit(self._read, path, dtype, shape), reads=True)

    def _disk(self) -> ThreadPoolExecutor:
        if self._writer is None:
            self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kv-disk")
        return self._writer

    def _read(self, path: Path, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        started = time.perf_counter()
        data = torch.from_numpy(np.fromfile(path, dtype=np.uint8)).view(dtype).reshape(shape)
        self.seconds[UP] += time.perf_counter() - started
        return data

    def _write(self, path: Path, data: torch.Tensor) -> None:
        started = time.perf_counter()
        raw = data.contiguous().view(torch.uint8).reshape(-1).numpy()
        try:
            mapped = np.memmap(path, dtype=np.uint8, mode="w+", shape=raw.shape)
            mapped[:] = raw
            mapped.flush()
            del mapped
        except OSError:
            path.unlink(missing_ok=True)
            raise
        finally:
            self.seconds[DOWN] += time.perf_counter() - started

    def load(self, path: Path, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """A file written by `to_disk`, on the device."""
        return self.up(self._read(path, dtype, shape))

    def up(self, data: torch.Tensor) -> torch.Tensor:
        """Host ``data`` on the device."""
        started = time.perf_counter()
        moved = data.to(self.device)
        self.bytes[UP] += data.nbytes
        self.seconds[UP] += time.perf_counter() - started
        return moved

    def close(self) -> None:
        """Wait for the writes in flight and stop the writer."""
        if self._writer is not None:
            self._writer.shutdown(wait=True)
            self._writer = None
