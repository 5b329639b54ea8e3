"""The KV cache as data: preallocated per-layer keys and values, and what each slot holds."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from vidsight.errors import ConfigError

TEXT, VIDEO = 0, 1


@dataclasses.dataclass
class TokenTable:
    """One row per cached token: the single source of truth for where each token came from.

    Attributes:
        kind: ``TEXT`` or ``VIDEO``, shape ``(n,)``.
        frame_index: Stream frame index of the temporal patch's first frame (-1 for text).
        time_s: Presentation time of that frame in seconds (NaN for text).
        grid: ``(n, 3)`` merged grid cell (t, h, w) of a video token (-1 for text).
        position: ``(n, 3)`` M-RoPE position (temporal, height, width) the key was rotated with.
    """

    kind: torch.Tensor
    frame_index: torch.Tensor
    time_s: torch.Tensor
    grid: torch.Tensor
    position: torch.Tensor

    @classmethod
    def empty(cls) -> "TokenTable":
        return cls(
            kind=torch.empty(0, dtype=torch.int8),
            frame_index=torch.empty(0, dtype=torch.long),
            time_s=torch.empty(0, dtype=torch.float64),
            grid=torch.empty((0, 3), dtype=torch.long),
            position=torch.empty((0, 3), dtype=torch.long),
        )

    @classmethod
    def text(cls, positions: torch.Tensor) -> "TokenTable":
        """Rows for text tokens at ``(3, n)`` positions."""
        n = positions.shape[1]
        return cls(
            kind=torch.full((n,), TEXT, dtype=torch.int8),
            frame_index=torch.full((n,), -1, dtype=torch.long),
            time_s=torch.full((n,), float("nan"), dtype=torch.float64),
            grid=torch.full((n, 3), -1, dtype=torch.long),
            position=positions.T.cpu().long(),
        )

    def __len__(self) -> int:
        return self.kind.shape[0]

    def __getitem__(self, index) -> "TokenTable":
        return TokenTable(*(getattr(self, f.name)[index] for f in dataclasses.fields(self)))

    @staticmethod
    def concat(tables: list["TokenTable"]) -> "TokenTable":
        return TokenTable(*(torch.cat([getattr(t, f.name) for t in tables]) for f in dataclasses.fields(TokenTable)))


class KVCache:
    """Keys and values of every layer in one preallocated buffer.

    ``keys[layer]`` and ``values[layer]`` are ``(1, kv_heads, capacity, head_dim)``; the first
    ``filled[layer]`` slots hold tokens. Layers may hold different tokens (and different
    counts) once pruning has dropped some: ``slot_rows[layer, slot]`` is the row of `tokens`
    a slot holds. Keys are stored rotated at their token's position.

    Args:
        num_layers: Decoder layers.
        num_kv_heads: Key/value heads per layer.
        head_dim: Channels per head.
        capacity: Slots to allocate per layer (kept prompt tokens plus generated tokens).
        dtype: Storage dtype.
        device: Storage device.
    """

    def __init__(self, num_layers: int, num_kv_heads: int, head_dim: int, capacity: int,
                 dtype: torch.dtype, device: torch.device):
        if capacity < 1:
            raise ConfigError(f"KV cache capacity must be positive, got {capacity}")
        shape = (num_layers, 1, num_kv_heads, capacity, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.capacity = capacity
        self.filled = [0] * num_layers
        self.slot_rows = torch.full((num_layers, capacity), -1, dtype=torch.long)
        self.tokens = TokenTable.empty()
        self.shape = (num_kv_heads, head_dim)

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes

    @property
    def length(self) -> int:
        """Tokens fed so far, kept or not (the rows of `tokens`)."""
        return len(self.tokens)

    @property
    def offload(self) -> None:
        """No tiers below the device."""
        return None

    def tokens_by_tier(self) -> dict[str, int]:
        """Cached tokens summed over layers, per tier: all on the device (`TieredKVCache` has more)."""
        return {"device": sum(self.filled), "host": 0, "disk": 0}

    def close(self) -> None:
        """Nothing held outside memory."""

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor | None = None,
              heads: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Store a chunk's ``(1, kv_heads, n, head_dim)`` keys and values after the layer's filled slots.

        Args:
            layer: The layer.
            k: The chunk's keys.
            v: The chunk's values.
            slots: The earlier slots the chunk attends to (None: all).
            heads: ``(kv_heads, len(slots))``: which key heads attend to each slot (None: all).
                This cache reads every head of each slot (attention masks the others out);
                a tiered cache with a per-head layout moves only the wanted ones.

        Returns:
            The keys and values the chunk attends to: those of ``slots`` (all earlier ones when
            None: then views, no copy) followed by the chunk's own.
        """
        begin = self.filled[layer]
        end = begin + k.shape[2]
        if end > self.capacity:
            raise ConfigError(f"KV cache full: {end} tokens exceed its capacity of {self.capacity}")
        self.keys[layer, :, :, begin:end] = k
        self.values[layer, :, :, begin:end] = v
        if slots is None:
            return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]
        past_k, past_v = self.read(layer, slots)
        return torch.cat([past_k, k], dim=2), torch.cat([past_v, v], dim=2)

    def overwrite(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Replace the keys and values of filled ``slots`` (tokens recomputed under a new context)."""
        if len(slots) and int(slots.max()) >= self.filled[layer]:
            raise ConfigError(f"cannot overwrite slot {int(slots.max())} of {self.filled[layer]} filled")
        index = slots.to(self.keys.device)
        self.keys[layer][:, :, index] = k
        self.values[layer][:, :, index] = v

    def read(self, layer: int, slots: torch.Tensor | None = None, heads: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(1, kv_heads, n, head_dim)`` keys and values of ``slots`` of ``layer`` (all filled ones when
        None); every head of each, whatever ``heads`` says (one tier: nothing to save)."""
        if slots is None:
            end = self.filled[layer]
            return self.keys[layer, :, :, :end], self.values[layer, :, :, :end]
        index = slots.to(self.keys.device)
        return self.keys[layer][:, :, index], self.values[layer][:, :, index]

    def rows(self, layer: int) -> torch.Tensor:
        """The token-table row of each of ``layer``'s filled slots."""
        return self.slot_rows[layer, : self.filled[layer]]

    def keep(self, layer: int, written: int, kept: torch.Tensor | None = None,
             offsets: torch.Tensor | None = None) -> None:
        """Settle the ``written`` entries just stored in ``layer``: keep all of them, or the ``kept`` ones.

        Kept entries move to the front of the chunk's slots, in order, so a layer's slots stay dense.

        Args:
            layer: The layer written.
            written: Entries `write` stored for the chunk.
            kept: Indices into those entries to keep (None: all).
            offsets: The chunk offset of each written entry, when earlier layers stopped
                computing some of the chunk's tokens (None: entry i is the chunk's token i).
        """
        begin = self.filled[layer]
        offsets = torch.arange(written) if offsets is None else offsets.to("cpu")
        if kept is not None:
            kept = kept.to("cpu")
            index = kept.to(self.keys.device) + begin
            for buffer in (self.keys, self.values):
                buffer[layer, :, :, begin : begin + len(kept)] = buffer[layer, :, :, index]
            offsets = offsets[kept]
        self.slot_rows[layer, begin : begin + len(offsets)] = offsets + len(self.tokens)
        self.filled[layer] = begin + len(offsets)

    def reserve(self, tokens: int, exact: bool = False) -> None:
        """Make room for ``tokens`` more in every layer, doubling the buffers when they are short
        (unless ``exact``: just that room, for a caller that sizes its own steps).

        Streams grow without a known end; preallocating by doubling keeps the copies rare. An
        answer grows by its own length instead, so a long answer after a long prompt does not
        double the prompt's memory.
        """
        needed = max(self.filled) + tokens
        if needed <= self.capacity:
            return
        with torch.inference_mode(False):  # normal tensors, writable whether or not a step runs
            self._grow(needed if exact else max(needed, 2 * self.capacity))

    def _grow(self, capacity: int) -> None:
        for name in ("keys", "values"):
            old = getattr(self, name)
            grown = torch.zeros((*old.shape[:3], capacity, old.shape[4]), dtype=old.dtype, device=old.device)
            grown[:, :, :, : self.capacity] = old
            setattr(self, name, grown)
        rows = torch.full((self.slot_rows.shape[0], capacity), -1, dtype=torch.long)
        rows[:, : self.capacity] = self.slot_rows
        self.slot_rows, self.capacity = rows, capacity

    def clone(self, room: int = 0, device: torch.device | str | None = None) -> "KVCache":
        """An independent copy (its own buffers), e.g. to branch a stream's memory, with room for
        ``room`` more tokens per layer, on ``device`` (None: this cache's; pinned host memory when
        this cache is on a CUDA device)."""
        capacity = max(self.capacity, max(self.filled) + room)
        used = max(self.filled)
        source = self.keys.device
        target = source if device is None else torch.device(device)
        pin = target.type == "cpu" and source.type == "cuda"
        copy = KVCache.__new__(KVCache)
        with torch.inference_mode(False):  # normal tensors, writable whether or not a step runs
            for name in ("keys", "values"):
                old = getattr(self, name)
                new = torch.zeros((*old.shape[:3], capacity, old.shape[4]), dtype=old.dtype, device=target,
                                  pin_memory=pin)
                new[:, :, :, :used] = old[:, :, :, :used]
                setattr(copy, name, new)
        copy.slot_rows = torch.full((self.slot_rows.shape[0], capacity), -1, dtype=torch.long)
        copy.slot_rows[:, :used] = self.slot_rows[:, :used]
        copy.capacity, copy.filled, copy.tokens, copy.shape = capacity, list(self.filled), self.tokens[:], self.shape
        return copy

    def truncate(self, length: int) -> None:
        """Forget every token from row ``length`` on (e.g. a question and its answer).

        Rows are appended in order, so in every layer the slots of the kept rows come first.
        """
        if not 0 <= length <= len(self.tokens):
            raise ConfigError(f"cannot truncate a cache of {len(self.tokens)} tokens to {length}")
        for layer in range(len(self.filled)):
            rows = self.slot_rows[layer, : self.filled[layer]]
            self.filled[layer] = int((rows < length).sum())
            self.slot_rows[layer, self.filled[layer] :] = -1
        self.tokens = self.tokens[:length]

    def retain(self, rows: torch.Tensor, table: TokenTable,
               rotate: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> None:
        """Keep only the tokens of ``rows`` (ascending), moved to the front of every layer in place,
        and describe them by ``table`` from now on. A layer that dropped one of them keeps the others.

        Args:
            rows: Token-table rows to keep.
            table: What the kept tokens are from now on (e.g. with new positions).
            rotate: Re-rotates each layer's kept keys on the way, ``rotate(keys, kept)`` with keys
                ``(1, kv_heads, n, head_dim)`` and ``kept`` their rows in ``table``, so keys that
                move to new positions are gathered and written once.
        """
        if len(table) != len(rows):
            raise ConfigError(f"{len(rows)} tokens retained but {len(table)} described")
        kept = torch.zeros(len(self.tokens), dtype=torch.bool)
        kept[rows] = True
        renumber = torch.cumsum(kept, 0) - 1
        for layer in range(len(self.filled)):
            slot_rows = self.rows(layer)
            slots = torch.nonzero(kept[slot_rows]).flatten()
            new_rows = renumber[slot_rows[slots]]
            index = slots.to(self.keys.device)
            keys = self.keys[layer, :, :, index]
            self.keys[layer, :, :, : len(slots)] = keys if rotate is None else rotate(keys, new_rows)
            self.values[layer, :, :, : len(slots)] = self.values[layer, :, :, index]
            self.slot_rows[layer, : len(slots)] = new_rows
            self.slot_rows[layer, len(slots) :] = -1
            self.filled[layer] = len(slots)
        self.tokens = table

    def commit(self, rows: TokenTable) -> None:
        """Record what the chunk's tokens are, once every layer has settled it with `keep`."""
        self.tokens = TokenTable.concat([self.tokens, rows])

    def layer_tokens(self, layer: int, slots: torch.Tensor | None = None) -> TokenTable:
        """What ``slots`` of ``layer`` hold (every filled slot when None), in slot order."""
        rows = self.rows(layer)
        return self.tokens[rows if slots is None else rows[slots]]

    def video_slots(self, layer: int, start: int = 0) -> torch.Tensor:
        """The slots of ``layer`` from ``start`` on that hold video tokens, ascending."""
        return video_slots(self.tokens, self.rows(layer), start)


def video_slots(tokens: TokenTable, rows: torch.Tensor, start: int) -> torch.Tensor:
    """Of the slots whose token-table ``rows`` are given, those from ``start`` on holding video."""
    return torch.nonzero(tokens.kind[rows[start:]] == VIDEO).flatten() + start
