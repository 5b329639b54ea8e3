"""Peak tensor memory of a block of code, on any device.

CUDA has ``max_memory_allocated``; the CPU allocator keeps no such counter and the process's
resident size never shrinks, so two runs in one process cannot be told apart by it. The meter
watches every tensor an operation creates inside the block and adds up the live storages.
"""

from __future__ import annotations

import threading
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class TensorMemoryMeter(TorchDispatchMode):
    """Counts bytes of tensor storage allocated inside the ``with`` block and still alive.

    Storages created before the block (weights, inputs) and views of them are not counted;
    ``peak_bytes`` is the most that was alive at once. Only the entering thread is metered.

    Example:
        >>> with TensorMemoryMeter() as meter:
        ...     x = torch.ones(1024, 1024)
        >>> meter.peak_bytes
        4194304
    """

    def __init__(self):
        super().__init__()
        self.live_bytes = 0
        self.peak_bytes = 0
        self._live: set[int] = set()
        self._lock = threading.Lock()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor) and t.device.type != "meta"}
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, torch.Tensor) or tensor.device.type == "meta":
                continue
            storage = tensor.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if size == 0 or key in inputs or key in self._live:
                continue
            with self._lock:
                self._live.add(key)
                self.live_bytes += size
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
            weakref.finalize(storage, self._release, key, size)
        return out

    def _release(self, key: int, size: int) -> None:
        with self._lock:
            if key in self._live:
                self._live.discard(key)
                self.live_bytes -= size
